"""image_delivery against a fake Docker Engine API (the calls _deliver/image_host.py makes through
_docker/engine_api.py): the read, a pull with the registry's X-Registry-Auth (never in the result), a pull the host
needs no more, the tag, an archive's sha256 check and load, check mode, and each failed pull refused by the input
that fixes it."""
import base64
import hashlib
import json

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver import image_host
from ansible_collections.narwhal.deploy.plugins.module_utils._docker import engine_api as _engine_api
from ansible_collections.narwhal.deploy.plugins.modules import image_delivery

REG = "registry.example:5000"
REF = REG + "/vllm/vllm-openai:v0.33.0"
ID_A, ID_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
DIGEST_A = REG + "/vllm/vllm-openai@sha256:" + "1" * 64
PASSWORD = "s3cret-registry-pass"


class FakeDaemon:
    """Images by name or ID; pulls put `registry[name:tag or digest]` in place (or raise `refuse`)."""

    def __init__(self, images=(), registry=None, refuse=None, in_stream=True):
        self.images_ = {}
        for attrs in images:
            self._add(attrs)
        self.registry = registry or {}
        self.refuse, self.in_stream = refuse, in_stream
        self.calls = []

    def _add(self, attrs):
        attrs = dict({"RepoTags": [], "RepoDigests": []}, **attrs)
        self.images_[attrs["Id"]] = attrs
        return attrs

    def _find(self, ref):
        for attrs in self.images_.values():
            if ref in (attrs["Id"],) + tuple(attrs["RepoTags"]) + tuple(attrs["RepoDigests"]):
                return attrs
        return None

    def image(self, ref):
        self.calls.append(("image", ref))
        found = self._find(ref)
        if found is None:
            raise _engine_api.NotFound("404 Not Found (GET /images/%s/json): No such image: %s" % (ref, ref), 404)
        return found

    def images(self):
        return [{"Id": i} for i in sorted(self.images_)]

    def pull(self, name, tag, auth=None, timeout=None):
        self.calls.append(("pull", name, tag, auth))
        if self.refuse:
            kind = _engine_api.StreamError if self.in_stream else _engine_api.EngineAPIError
            raise kind("POST /images/create: %s" % self.refuse, None if self.in_stream else 500, self.refuse)
        ref = "%s@%s" % (name, tag) if tag.startswith("sha256:") else "%s:%s" % (name, tag)
        attrs = self._find(self.registry[ref]["Id"]) or self._add(dict(self.registry[ref]))
        if not tag.startswith("sha256:"):
            for other in self.images_.values():
                other["RepoTags"] = [t for t in other["RepoTags"] if t != ref]
            attrs["RepoTags"].append(ref)
        attrs["RepoDigests"] = sorted(set(attrs["RepoDigests"]) | set(self.registry[ref].get("RepoDigests", [])))

    def tag(self, ref, repo, tag):
        self.calls.append(("tag", ref, repo, tag))
        for other in self.images_.values():
            other["RepoTags"] = [t for t in other["RepoTags"] if t != "%s:%s" % (repo, tag)]
        self._find(ref)["RepoTags"].append("%s:%s" % (repo, tag))

    def load(self, archive, size, timeout=None):
        data = archive.read()
        self.calls.append(("load", size, len(data)))
        self._add({"Id": ID_A, "RepoTags": []})


@pytest.fixture
def daemon(monkeypatch):
    box = {}

    def use(fake):
        box["fake"] = fake
        return fake

    monkeypatch.setattr(image_host, "make_client", lambda docker_host, timeout: box["fake"])
    return use


def run(module_runner, args, check=False):
    return module_runner(image_delivery.main, dict(args, _ansible_check_mode=check))


def test_read_reports_each_reference_and_the_ids_held(module_runner, daemon):
    daemon(FakeDaemon([{"Id": ID_A, "RepoTags": [REF], "RepoDigests": [DIGEST_A]}, {"Id": ID_B}]))
    status, result = run(module_runner, {"state": "read", "references": [
        {"reference": REF}, {"reference": "other:1", "key": "NARWHAL_ROUTER_IMAGE"}]})
    assert status == "exit" and not result["changed"] and result["held"] == [ID_A, ID_B]
    assert result["images"] == [
        {"key": "NARWHAL_IMAGE", "reference": REF, "present": True, "image_id": ID_A, "repo_digests": [DIGEST_A],
         "repo_tags": [REF]},
        {"key": "NARWHAL_ROUTER_IMAGE", "reference": "other:1", "present": False, "image_id": None,
         "repo_digests": [], "repo_tags": []}]


def _auth_file(tmp_path):
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"auths": {REG: {"auth": base64.b64encode(("narwhal:" + PASSWORD).encode()).decode()}}}))
    return str(path)


def test_a_resolver_pulls_the_tag_with_the_registrys_credentials(module_runner, daemon, tmp_path):
    fake = daemon(FakeDaemon(registry={REF: {"Id": ID_A, "RepoDigests": [DIGEST_A]}}))
    status, result = run(module_runner, {"state": "pull", "image": REF, "reference": REF, "host": "engine-1",
                                         "auth_file": _auth_file(tmp_path)})
    assert status == "exit" and result["changed"] and result["pulled"]
    assert (result["image_id"], result["digest"], result["host"]) == (ID_A, DIGEST_A, "engine-1")
    (pull,) = [c for c in fake.calls if c[0] == "pull"]
    assert pull[1:3] == (REG + "/vllm/vllm-openai", "v0.33.0")
    assert json.loads(base64.urlsafe_b64decode(pull[3]))["password"] == PASSWORD
    assert PASSWORD not in json.dumps(result) and pull[3] not in json.dumps(result)


def test_a_digest_the_host_holds_is_not_pulled_again_only_tagged(module_runner, daemon):
    fake = daemon(FakeDaemon([{"Id": ID_A, "RepoDigests": [DIGEST_A]}]))
    args = {"state": "pull", "image": DIGEST_A, "reference": REF, "tag": True, "image_id": ID_A}
    status, result = run(module_runner, args)
    assert status == "exit" and result["changed"] and not result["pulled"]
    assert ("tag", ID_A, REG + "/vllm/vllm-openai", "v0.33.0") in fake.calls
    assert not [c for c in fake.calls if c[0] == "pull"]
    status, again = run(module_runner, args)
    assert not again["changed"]


def test_a_pull_by_digest_then_the_tag(module_runner, daemon):
    fake = daemon(FakeDaemon(registry={DIGEST_A: {"Id": ID_A, "RepoDigests": [DIGEST_A]}}))
    status, result = run(module_runner, {"state": "pull", "image": DIGEST_A, "reference": REF, "tag": True,
                                         "image_id": ID_A})
    assert status == "exit" and result["changed"] and result["pulled"] and result["digest"] == DIGEST_A
    assert [c[:3] for c in fake.calls if c[0] == "pull"] == [("pull", REG + "/vllm/vllm-openai", "sha256:" + "1" * 64)]
    assert fake.image(REF)["Id"] == ID_A


def test_a_pull_that_gives_another_image_than_the_pin_is_refused(module_runner, daemon):
    daemon(FakeDaemon(registry={DIGEST_A: {"Id": ID_B, "RepoDigests": [DIGEST_A]}}))
    status, result = run(module_runner, {"state": "pull", "image": DIGEST_A, "reference": REF, "image_id": ID_A,
                                         "host": "engine-2"})
    assert status == "fail" and result["msg"].startswith("engine-2: pulling %s gave image %s, and the pin is %s"
                                                         % (DIGEST_A, ID_B, ID_A))


def test_check_mode_pulls_and_tags_nothing(module_runner, daemon):
    fake = daemon(FakeDaemon([{"Id": ID_A}], registry={REF: {"Id": ID_B}}))
    status, result = run(module_runner, {"state": "pull", "image": REF, "reference": REF}, check=True)
    assert status == "exit" and result["changed"] and result["image_id"] is None
    status, result = run(module_runner, {"state": "tag", "image": ID_A, "reference": REF, "image_id": ID_A},
                         check=True)
    assert result["changed"] and not [c for c in fake.calls if c[0] in ("pull", "tag")]


@pytest.mark.parametrize("words, in_stream, with_auth, names", [
    ("unauthorized: authentication required", True, True, "refused the credentials of NARWHAL_REGISTRY_AUTH_FILE"),
    ("no basic auth credentials", False, False, "none were sent: set NARWHAL_REGISTRY_AUTH_FILE"),
    ("Get https://x/v2/: x509: certificate signed by unknown authority", False, True, "NARWHAL_REGISTRY_CA_FILE"),
    ("manifest unknown", True, True, "correct NARWHAL_NODE_2_IMAGE"),
    ("dial tcp 10.0.0.9:5000: connect: connection refused", False, False, "cannot reach the registry"),
])
def test_a_failed_pull_is_refused_by_the_input_that_fixes_it(module_runner, daemon, tmp_path, words, in_stream,
                                                             with_auth, names):
    daemon(FakeDaemon(refuse=words, in_stream=in_stream))
    args = {"state": "pull", "image": REF, "reference": REF, "key": "NARWHAL_NODE_2_IMAGE", "host": "engine-2"}
    if with_auth:
        args["auth_file"] = _auth_file(tmp_path)
    status, result = run(module_runner, args)
    assert status == "fail" and names in result["msg"] and PASSWORD not in result["msg"]
    assert result["msg"].startswith("engine-2: pulling %s (NARWHAL_NODE_2_IMAGE) from registry %s failed: %s"
                                    % (REF, REG, words))


def test_a_malformed_auth_file_is_refused_without_its_content(module_runner, daemon, tmp_path):
    daemon(FakeDaemon())
    bad = tmp_path / "auth.json"
    bad.write_text('{"auths": {"%s": {"auth": "%s"}}}' % (REG, PASSWORD))
    status, result = run(module_runner, {"state": "pull", "image": REF, "reference": REF, "auth_file": str(bad)})
    assert status == "fail" and result["msg"].startswith("NARWHAL_REGISTRY_AUTH_FILE: the \"auth\" of registry")
    assert PASSWORD not in result["msg"]


def test_the_daemon_not_answering_is_named(module_runner, daemon):
    class Down(FakeDaemon):
        def image(self, ref):
            raise _engine_api.DaemonUnreachable("the Docker daemon does not answer at unix:///x (refused)")

    daemon(Down())
    status, result = run(module_runner, {"state": "read", "references": [{"reference": REF}], "host": "engine-1"})
    assert status == "fail" and result["msg"].startswith("engine-1: the Docker daemon at unix:///var/run/docker.sock "
                                                         "does not answer")


def _archive(tmp_path, data=b"docker save bytes"):
    path = tmp_path / "vllm.tar"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def test_an_archive_is_checked_loaded_tagged_and_removed(module_runner, daemon, tmp_path):
    fake = daemon(FakeDaemon())
    path, digest = _archive(tmp_path)
    args = {"state": "load", "path": str(path), "sha256": digest, "image_id": ID_A, "reference": REF, "tag": True}
    status, result = run(module_runner, args)
    assert status == "exit" and result["changed"] and result["loaded"]
    assert ("load", 17, 17) in fake.calls and not path.exists()  # the whole file, its size announced
    assert fake.image(REF)["Id"] == ID_A
    path, digest = _archive(tmp_path)
    status, again = run(module_runner, args)  # the host holds it: nothing loaded, the copy removed
    assert not again["changed"] and not again["loaded"] and not path.exists()
    assert len([c for c in fake.calls if c[0] == "load"]) == 1


def test_a_damaged_archive_is_refused_and_removed(module_runner, daemon, tmp_path):
    fake = daemon(FakeDaemon())
    path, digest = _archive(tmp_path)
    status, result = run(module_runner, {"state": "load", "path": str(path), "sha256": "0" * 64, "image_id": ID_A,
                                         "host": "engine-3"})
    assert status == "fail" and result["msg"].startswith("engine-3: the archive's copy %s has sha256 %s, and the "
                                                         "archive's is %s" % (path, digest, "0" * 64))
    assert not path.exists() and not [c for c in fake.calls if c[0] == "load"]


def test_check_mode_loads_nothing(module_runner, daemon, tmp_path):
    fake = daemon(FakeDaemon())
    status, result = run(module_runner, {"state": "load", "path": str(tmp_path / "absent.tar"), "sha256": "0" * 64,
                                         "image_id": ID_A}, check=True)
    assert status == "exit" and result["changed"] and not [c for c in fake.calls if c[0] == "load"]
