"""router_container's hand-over (_router/container.py) against a fake Docker Engine API: a running router replaced or
restarted by a new container started next to it (`<name>-next`), the old one stopped only once the new one's log says
it serves, then removed and the new one renamed; a new one that never serves removed with the old one untouched; an
old container without the hand-over label stopped first, as before; leftovers of an interrupted run. The daemon's
own behaviour (create, rename, labels) is tried by tests/unit/plugins/modules/test_router_container.py."""
import copy

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import NotFound
from ansible_collections.narwhal.deploy.plugins.module_utils._router import container
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import PLAN_HASH_LABEL

NAME = "narwhal-router"
NEXT = NAME + "-next"
LABELED = {container.HANDOVER_LABEL: container.HANDOVER_VALUE}
SERVES = (b"narwhal_router: TCP front on 10.0.0.5 port 30000\n"
          b"narwhal_router: serving: vllm-router pid 9 ready in 1.2 s\n")


class FakeAPI:
    """The Client methods started() calls, on containers held here. `serves_after`: how many log reads of a new
    container pass before its log holds the serving line (None: never); `exits`: a new container ends at once."""

    def __init__(self, serves_after=1, exits=False):
        self.by_id, self.calls, self.count = {}, [], 0
        self.serves_after, self.exits, self.reads = serves_after, exits, {}

    def add(self, name, digest, labels=None, running=True, log=b""):
        self.count += 1
        ref = "%02x" % self.count * 32
        self.by_id[ref] = {"Id": ref, "Name": "/" + name, "State": {"Running": running, "ExitCode": 0},
                           "RestartCount": 0, "Config": {"Labels": dict(labels or {}, **{PLAN_HASH_LABEL: digest})},
                           "log": log, "created": False}
        return ref

    def _find(self, ref):
        for found in self.by_id.values():
            if ref in (found["Id"], found["Name"][1:]):
                return found
        raise NotFound("No such container: %s" % ref, 404)

    def container(self, ref):
        found = self._find(ref)
        if found["created"] and self.exits and found["State"]["Running"]:
            found["State"].update(Running=False, ExitCode=1)
        return copy.deepcopy({k: v for k, v in found.items() if k not in ("log", "created")})

    def logs(self, ref, tail="all", **_kw):
        found = self._find(ref)
        if found["created"]:
            self.reads[found["Id"]] = self.reads.get(found["Id"], 0) + 1
            if self.serves_after is not None and self.reads[found["Id"]] > self.serves_after:
                found["log"] = SERVES
                self.calls.append(("serves", found["Name"][1:]))
        lines = found["log"].splitlines(keepends=True)
        return b"".join(lines if tail == "all" else lines[-int(tail):])

    def create(self, name, body):
        ref = self.add(name, body["Labels"][PLAN_HASH_LABEL], body["Labels"], running=False,
                       log=b"narwhal_router: TCP front on 10.0.0.5 port 30000\nnarwhal_router: vllm-router (pid 9) "
                           b"does not serve yet: not answering /health: http://10.0.0.7:8000\n")
        self.by_id[ref].update(created=True, body=body)
        self.calls.append(("create", name))
        return {"Id": ref}

    def start(self, ref):
        found = self._find(ref)
        found["State"]["Running"] = True
        self.calls.append(("start", found["Name"][1:]))

    def stop(self, ref, timeout=10):
        found = self._find(ref)
        found["State"]["Running"] = False
        self.calls.append(("stop", found["Name"][1:], timeout))

    def remove(self, ref, force=False):
        found = self._find(ref)
        del self.by_id[found["Id"]]
        self.calls.append(("remove", found["Name"][1:]))

    def rename(self, ref, name):
        found = self._find(ref)
        self.calls.append(("rename", found["Name"][1:], name))
        found["Name"] = "/" + name


class FakeModule:
    def __init__(self, restart=False, check_mode=False, ready_timeout=30):
        self.check_mode = check_mode
        self.params = {"restart": restart, "ready_timeout": ready_timeout}


class Clock:
    """time.monotonic and time.sleep for container.py: a sleep moves the clock on."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(container, "time", fake)
    return fake


def _plan(digest="b" * 64):
    return {"name": NAME, "image": "sha256:" + "1" * 64, "entrypoint": ["python3"],
            "command": ["/narwhal/narwhal_router.py", "/narwhal/router.json"], "dir": "/opt/narwhal/router",
            "hash": digest, "labels": {"org.narwhal.role": "router", PLAN_HASH_LABEL: digest},
            "stop_timeout": 135, "log": {"Type": "local", "Config": {"max-size": "100m", "max-file": "5"}}}


def test_a_replaced_router_is_handed_over_the_old_one_stopped_only_once_the_new_one_serves():
    api = FakeAPI(serves_after=3)
    api.add(NAME, "a" * 64, LABELED)
    action, found, report = container.started(FakeModule(), api, _plan())
    assert api.calls == [("create", NEXT), ("start", NEXT), ("serves", NEXT), ("stop", NAME, 135), ("remove", NAME),
                         ("rename", NEXT, NAME)]
    assert action == "replaced" and report["used"] is True and report["seconds"] >= 3 * container.POLL_S
    assert found["Name"] == "/" + NAME and found["Config"]["Labels"][PLAN_HASH_LABEL] == "b" * 64
    assert found["Config"]["Labels"][container.HANDOVER_LABEL] == "reuseport"
    (body,) = [c["body"] for c in api.by_id.values()]  # the plan's container: host network, mount, log, StopTimeout
    assert body["HostConfig"]["NetworkMode"] == "host" and body["StopTimeout"] == 135
    assert body["HostConfig"]["Mounts"] == [{"Target": "/narwhal", "Source": "/opt/narwhal/router", "Type": "bind",
                                             "ReadOnly": True}]
    assert body["HostConfig"]["LogConfig"] == _plan()["log"]
    # a second run: kept, nothing called
    api.calls.clear()
    assert container.started(FakeModule(), api, _plan())[::2] == ("kept", {})
    assert api.calls == []


def test_a_restart_is_a_hand_over_to_a_new_container_of_the_same_plan():
    api = FakeAPI()
    old = api.add(NAME, "b" * 64, LABELED)
    action, found, report = container.started(FakeModule(restart=True), api, _plan())
    assert [c[0] for c in api.calls] == ["create", "start", "serves", "stop", "remove", "rename"]
    assert action == "restarted" and report["used"] and found["Id"] != old


LAST_LINES = ("narwhal_router: TCP front on 10.0.0.5 port 30000 | narwhal_router: vllm-router (pid 9) does not serve "
              "yet: not answering /health: http://10.0.0.7:8000")


@pytest.mark.parametrize("exits, words", [
    (False, "did not serve within 30 s: " + LAST_LINES),
    (True, "ended (exit status 1) before it served: " + LAST_LINES),
])
def test_a_new_container_that_does_not_serve_is_removed_and_the_old_one_serves_on(exits, words):
    api = FakeAPI(serves_after=None, exits=exits)
    old = api.add(NAME, "a" * 64, LABELED)
    with pytest.raises(container.HandoverFailed) as err:
        container.started(FakeModule(), api, _plan())
    assert api.calls == [("create", NEXT), ("start", NEXT), ("stop", NEXT, 135), ("remove", NEXT)]
    assert "the new router container %s %s; it was removed and %s (%s) serves on" % (NEXT, words, NAME, old[:12]) \
        in str(err.value)
    assert list(api.by_id) == [old] and api.by_id[old]["State"]["Running"]


def test_an_old_container_without_the_label_is_stopped_first_and_the_result_says_why():
    api = FakeAPI()
    api.add(NAME, "a" * 64)  # started by the module before the hand-over: no label, ports without SO_REUSEPORT
    action, found, report = container.started(FakeModule(), api, _plan())
    assert api.calls == [("stop", NAME, 135), ("remove", NAME), ("create", NAME), ("start", NAME)]
    assert action == "replaced" and report["used"] is False
    assert "no label org.narwhal.router.handover=reuseport" in report["why"] and "without SO_REUSEPORT" in report["why"]
    assert found["Config"]["Labels"][container.HANDOVER_LABEL] == "reuseport"  # the next replacement is a hand-over
    api = FakeAPI()
    old = api.add(NAME, "b" * 64)
    action, found, report = container.started(FakeModule(restart=True), api, _plan())
    assert api.calls == [("stop", NAME, 135), ("start", NAME)] and found["Id"] == old
    assert action == "restarted" and report["used"] is False


def test_a_stopped_or_absent_router_is_started_or_created_without_a_hand_over():
    api = FakeAPI()
    api.add(NAME, "a" * 64, LABELED, running=False)
    assert container.started(FakeModule(), api, _plan())[::2] == ("replaced", {})
    assert api.calls == [("stop", NAME, 135), ("remove", NAME), ("create", NAME), ("start", NAME)]
    api = FakeAPI()
    assert container.started(FakeModule(), api, _plan())[::2] == ("created", {})
    assert api.calls == [("create", NAME), ("start", NAME)]


def test_check_mode_changes_nothing_and_leaves_a_leftover():
    api = FakeAPI()
    api.add(NAME, "a" * 64, LABELED)
    api.add(NEXT, "b" * 64, LABELED)
    assert container.started(FakeModule(check_mode=True), api, _plan())[::2] == ("replaced", {})
    assert container.started(FakeModule(check_mode=True, restart=True), api, _plan("a" * 64))[0] == "restarted"
    assert api.calls == []


def test_a_leftover_next_container_that_does_not_serve_is_removed():
    api = FakeAPI()
    old = api.add(NAME, "b" * 64, LABELED)
    api.add(NEXT, "b" * 64, LABELED, log=b"narwhal_router: TCP front on 10.0.0.5 port 30000\n")
    action, found, report = container.started(FakeModule(), api, _plan())
    assert api.calls == [("stop", NEXT, 135), ("remove", NEXT)]
    assert action == "kept" and found["Id"] == old
    assert report == {"leftover": "%s, left by an interrupted hand-over, was removed" % NEXT}


@pytest.mark.parametrize("with_old", [True, False])
def test_a_leftover_next_container_that_serves_or_is_alone_takes_the_place_of_the_router(with_old):
    api = FakeAPI()
    if with_old:
        api.add(NAME, "a" * 64, LABELED)
    new = api.add(NEXT, "b" * 64, LABELED, log=SERVES if with_old else b"")
    action, found, report = container.started(FakeModule(), api, _plan())
    assert api.calls == ([("stop", NAME, 135), ("remove", NAME)] if with_old else []) + [("rename", NEXT, NAME)]
    assert action == "kept" and found["Id"] == new
    assert report["leftover"] == "%s, left by an interrupted hand-over, serves: it took the place of %s" % (NEXT, NAME)


def test_the_module_reports_the_hand_over_and_fails_naming_why(monkeypatch, module_runner):
    from ansible_collections.narwhal.deploy.plugins.modules import router_container

    api = FakeAPI()
    api.add(NAME, "a" * 64, LABELED)
    monkeypatch.setattr(container.Client, "from_env", classmethod(lambda cls, timeout: api))
    status, result = module_runner(router_container.main, {"state": "started", "plan": _plan()})
    assert status == "exit" and result["changed"] and result["action"] == "replaced"
    assert result["handover"]["used"] is True
    assert result["container"]["Config"]["Labels"][container.HANDOVER_LABEL] == "reuseport"
    never = FakeAPI(serves_after=None)
    never.add(NAME, "a" * 64, LABELED)
    monkeypatch.setattr(container.Client, "from_env", classmethod(lambda cls, timeout: never))
    status, result = module_runner(router_container.main, {"state": "started", "plan": _plan(), "ready_timeout": 5})
    assert status == "fail"
    assert result["msg"].startswith("the router's hand-over failed: the new router container %s did not serve "
                                    "within 5 s: " % NEXT)
