# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The router's worker set on a router host: router_members' work (the module file, plugins/modules/router_members.py,
holds the documentation, the argument spec and main()). An I/O edge: it reads and writes NARWHAL_ROUTER_DIR/
workers.json, asks the router (GET /workers, POST /remove_worker) and signals its container through the Docker
Engine API (_docker/engine_api.py).

What vllm-router 0.1.17 can change at runtime in --vllm-pd-disaggregation mode (tried against fake workers):
`POST /remove_worker?url=<url>` takes a prefill or decode worker out at once (no connection dropped); adding is not
possible (`/add_worker` and `POST /workers` answer 400 "PD router requires specific add_prefill_server or
add_decode_server methods"). So a removal is that call, and anything else is a reload: workers.json written, SIGHUP
to the container's main process (narwhal_router.py starts a vllm-router with the new set, switches new connections
to it once it serves and drains the previous one), done when /workers reports exactly the new set, all healthy."""

from __future__ import annotations

import json
import os
import tempfile
import time
from urllib.parse import quote

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import Client, EngineAPIError
from ansible_collections.narwhal.deploy.plugins.module_utils._router.client import check_ca, read_key
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import RANKED_URL, config_text

__metaclass__ = type

ROLES = ("prefill", "decode")
KV_EVENTS = "kv_events"
WORKERS_FILE = "workers.json"
POLL_S = 0.5


def _url(url, where):
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise PlanError("%s: %r is not an engine URL (http(s)://host:port)" % (where, url), where)
    return url.rstrip("/")


def normal(doc, where):
    """{"prefill": [url], "decode": [url]} of a workers document (the `workers` option, workers.json): URLs without a
    trailing slash, each once, refused by name otherwise; with its "kv_events" map ({prefill url: [endpoint, ...]},
    _router/plan.py::workers_doc) when it has one."""
    if not isinstance(doc, dict) or not set(doc) <= set(ROLES + (KV_EVENTS,)):
        raise PlanError("%s must be {prefill: [url, ...], decode: [url, ...]}, not %r" % (where, doc), where)
    out, seen = {role: [] for role in ROLES}, {}
    for role in ROLES:
        for url in doc.get(role) or []:
            url = _url(url, where)
            if url in seen:
                raise PlanError("%s: %s is listed as %s and as %s" % (where, url, seen[url], role), where)
            seen[url] = role
            out[role].append(url)
    if KV_EVENTS in doc:
        kv = doc[KV_EVENTS]
        if not isinstance(kv, dict) or not all(isinstance(eps, list) and eps and all(isinstance(e, str) for e in eps)
                                               for eps in kv.values()):
            raise PlanError("%s: kv_events must be {prefill url: [endpoint, ...]}, not %r" % (where, kv), where)
        out[KV_EVENTS] = dict((_url(u, where), list(eps)) for u, eps in kv.items())
    return out


def desired(params, held, reported):
    """The worker set the router is to hold: the `workers` option, or workers.json (else what the router reports) less
    `remove`, plus `add` ({role, url}); refuses a set without a prefill or a decode worker."""
    if params.get("workers") is not None:
        want = normal(params["workers"], "workers")
    else:
        base = held if held is not None else reported
        want = {role: list(base[role]) for role in ROLES}
        for url in params.get("remove") or []:
            url = _url(url, "remove")
            for role in ROLES:
                want[role] = [u for u in want[role] if u != url]
        for item in params.get("add") or []:
            if not isinstance(item, dict) or item.get("role") not in ROLES:
                raise PlanError("add: %r needs role prefill or decode and url" % (item,), "add")
            url = _url(item.get("url"), "add")
            other = [r for r in ROLES if r != item["role"] and url in want[r]]
            if other:
                raise PlanError("add: %s is in the router as %s, not %s; remove it first"
                                % (url, other[0], item["role"]), "add")
            if url not in want[item["role"]]:
                want[item["role"]].append(url)
    for role in ROLES:
        if not want[role]:
            raise PlanError("the router would hold no %s worker, but vllm-router's P/D mode needs at least one prefill "
                            "and one decode worker: keep one %s engine in the router (or stop the router instead)"
                            % (role, role), "remove" if params.get("remove") else "workers")
    # the KV events endpoints of every prefill engine of the fleet stay as the router stage wrote them (the `workers`
    # option's, else workers.json's): a worker moved out and back in is subscribed to again
    kv = want.get(KV_EVENTS) if KV_EVENTS in want else (held or {}).get(KV_EVENTS)
    if kv is not None:
        want[KV_EVENTS] = kv
    return want


def pairs(workers):
    return set((role, url) for role in ROLES for url in workers[role])


def method_for(want, reported, force=False):
    """none (the router holds `want`), remove (`want` is what it holds less some workers: /remove_worker) or reload
    (anything else: adding is not possible at runtime in P/D mode)."""
    if force:
        return "reload"
    if pairs(want) == pairs(reported):
        return "none"
    return "remove" if pairs(want) < pairs(reported) else "reload"


def reported_set(answer):
    """The router's GET /workers answer -> ({"prefill": [url], "decode": [url]}, {url: [listed url, ...]}, healthy):
    each DP rank's <url>@<rank> counted for its URL (_router/plan.py::worker_report)."""
    listed = answer.get("workers") if isinstance(answer, dict) else None
    workers, entries, healthy = {role: [] for role in ROLES}, {}, True
    for entry in listed if isinstance(listed, list) else []:
        if not isinstance(entry, dict):
            continue
        raw = str(entry.get("url", ""))
        url = RANKED_URL.sub("", raw).rstrip("/")
        role = entry.get("worker_type")
        if role in ROLES and url not in workers[role]:
            workers[role].append(url)
        entries.setdefault(url, []).append(raw)
        healthy = healthy and entry.get("is_healthy") is True
    return workers, entries, healthy


def read_held(directory):
    """workers.json of the router directory -> (its set or None when there is none, its text)."""
    path = os.path.join(directory, WORKERS_FILE)
    if not os.path.isdir(directory):
        raise PlanError("the router directory %s is not on this host; rerun the router stage" % directory, "dir")
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None, ""
    except OSError as exc:
        raise PlanError("cannot read %s: %s" % (path, exc.strerror or exc), "dir")
    try:
        return normal(json.loads(text), path), text
    except ValueError:
        raise PlanError("%s is not JSON; rerun the router stage, which writes it" % path, "dir")


def write_held(directory, want):
    """workers.json, 0600, replaced at once (a reload reads the whole old or the whole new file)."""
    path = os.path.join(directory, WORKERS_FILE)
    fd, tmp = tempfile.mkstemp(prefix=".workers-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(config_text(want))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def ask(url, key, ca, timeout):
    """The router's /workers -> reported_set's triple; fails when it does not answer."""
    status, answer = call(url + "/workers", key, timeout=timeout, cafile=ca)
    if status != 200:
        raise PlanError("the router at %s does not answer /workers (%s); start it with the router stage"
                        % (url, "HTTP %s: %s" % (status, str(answer)[:200]) if status else str(answer)[:200]), "url")
    return reported_set(answer)


def remove_workers(url, key, ca, urls, entries, timeout):
    """POST /remove_worker for each listed entry of each URL (every <url>@<rank> of a data-parallel worker)."""
    for gone in urls:
        for entry in entries.get(gone) or [gone]:
            status, answer = call("%s/remove_worker?url=%s" % (url, quote(entry, safe="")), key, {}, timeout=timeout,
                                  cafile=ca)
            if status != 200:
                raise PlanError("the router at %s refused to remove %s: HTTP %s: %s"
                                % (url, entry, status, str(answer)[:200]), "remove")


def send_hup(container, timeout):
    """SIGHUP to the router container's main process (narwhal_router.py reloads), through the Docker Engine API."""
    try:
        Client.from_env(timeout=timeout).kill(container, signal="HUP")
    except EngineAPIError as exc:
        raise PlanError("the Docker daemon refused to signal the router container %s: %s; start it with the router "
                        "stage" % (container, exc), "container")


def router_log(container, lines=40):
    """The start script's own lines of the container's recent log (why a reload failed), or ''."""
    try:
        raw = Client.from_env(timeout=10).logs(container, tail=lines).decode("utf-8", "replace")
    except (EngineAPIError, OSError):
        return ""
    return " | ".join(line.strip() for line in raw.splitlines() if line.startswith("narwhal_router:"))[-1500:]


def wait_for(url, key, ca, want, p):
    """Until /workers reports exactly `want`, all healthy -> the report; PlanError after `timeout` seconds."""
    deadline = time.time() + p["timeout"]
    while True:
        status, answer = call(url + "/workers", key, timeout=10, cafile=ca)
        now = reported_set(answer) if status == 200 else None
        if now and pairs(now[0]) == pairs(want) and now[2]:
            return now[0]
        if time.time() > deadline:
            raise PlanError("the router at %s did not report the new worker set within %d s (timeout): it reports %s; "
                            "its log: %s" % (url, p["timeout"], now[0] if now else "nothing (HTTP %s)" % status,
                                             router_log(p["container"]) or "-"), "timeout")
        time.sleep(POLL_S)


def refuse_silent(want, reported, ca):
    """A reload that would not come up is refused before workers.json changes: every worker the router does not hold
    yet must answer its /health now (the start script switches only once every worker answers: narwhal_router.py)."""
    new = [(role, u) for role in ROLES for u in want[role] if u not in reported[role]]
    down = []
    for role, worker in new:
        status, answer = call(worker + "/health", timeout=10, cafile=ca)
        if status != 200:
            down.append("%s %s (%s)" % (role, worker, ("HTTP %s" % status) if status else str(answer)[:120]))
    if down:
        raise PlanError("not answering /health: %s; the router would not switch to a set with them: start the "
                        "engines (or leave them out), then rerun" % ", ".join(down), "add")


def apply(p, url, key, ca, want, method, reported):
    """Make the change -> (the router's set after it, seconds it took)."""
    started = time.time()
    if method == "remove":
        gone = [u for u in reported[1] if (u not in want["prefill"] and u not in want["decode"])]
        remove_workers(url, key, ca, gone, reported[1], p["timeout"])
        write_held(p["dir"], want)
        after = ask(url, key, ca, p["timeout"])[0]
    elif method == "reload":
        refuse_silent(want, reported[0], ca)
        write_held(p["dir"], want)
        send_hup(p["container"], p["timeout"])
        after = wait_for(url, key, ca, want, p)
    else:
        write_held(p["dir"], want)
        after = reported[0]
    return after, round(time.time() - started, 2)


def run_module(module):
    """router_members: the worker set asked, on this router host -> exit_json, or fail_json naming what is wrong."""
    p = module.params
    url = p["url"].rstrip("/")
    try:
        key = read_key(p["api_key_file"])
        ca = check_ca(p["ca_file"])
        held, text = read_held(p["dir"])
        reported = ask(url, key, ca, 10)
        want = desired(p, held, reported[0])
        method = method_for(want, reported[0], p["reload"])
        changed = method != "none" or held != want or text != config_text(want)
        result = dict(changed=changed, method=method, before=reported[0], after=want, seconds=0.0)
        if module._diff:
            path = os.path.join(p["dir"], WORKERS_FILE)
            result["diff"] = {"before": text, "after": config_text(want), "before_header": path, "after_header": path}
        if changed and not module.check_mode:
            result["after"], result["seconds"] = apply(p, url, key, ca, want, method, reported)
    except PlanError as exc:
        module.fail_json(msg="router_members: %s" % exc, input=exc.key)
    module.exit_json(**result)
