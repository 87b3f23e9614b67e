# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The proof that client traffic is served through the router in prefill/decode mode: router_traffic's work (the
module file, plugins/modules/router_traffic.py, holds the documentation, the argument spec and main(), as
community.docker's plugins/modules/docker_container.py hands its module to
plugins/module_utils/_module_container/module.py). An I/O edge on the router host: it sends the requests and reads
every engine's counters over HTTP (_common/http.py, _router/client.py); the request matrix, the evidence and the
verdict are _router/traffic.py's (pure)."""

from __future__ import annotations

import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call
from ansible_collections.narwhal.deploy.plugins.module_utils._router import traffic
from ansible_collections.narwhal.deploy.plugins.module_utils._router.client import check_ca, metrics, read_key, stream
from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers

__metaclass__ = type

# The reads around each request go to every engine of the fleet (its counters before and after, each decode engine's
# own answer): at once, so that a request costs about one engine's answer in wall time, not one per engine.
PARALLEL_READS = 16


def _each(fn, items):
    """[fn(item) for item in items], PARALLEL_READS at a time, in the items' order."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(PARALLEL_READS, len(items))) as pool:
        return list(pool.map(fn, items))


def _readings(engines, timeout, cafile=None):
    texts = _each(lambda w: metrics(w["url"], timeout, cafile), engines)
    return traffic.counters(dict((w["engine"], texts[i]) for i, w in enumerate(engines)))


def one_request(p, key, workers, endpoint, streamed, kind, before):
    """One request through the router between two readings of every engine's counters: `before` (the previous
    request's `after`: nothing else is sent to the engines between two requests, the comparison with each decode
    engine's own answer comes after all of them, in compare()) -> (entry, after, the prompt sent)."""
    everyone = workers["prefill"] + workers["decode"]
    unique = "narwhal-%s" % uuid.uuid4().hex[:8]
    text = traffic.prompt(unique, kind, p["block_size"])
    body = traffic.request_body(endpoint, p["model"], text, p["max_tokens"], streamed)
    url = p["url"].rstrip("/") + traffic.ENDPOINTS[endpoint]
    entry = {"endpoint": endpoint, "stream": streamed, "prompt": kind, "ttft_s": None}
    started = time.time()
    if streamed:
        status, events, first, tail = stream(url, key, body, p["timeout"], p["ca_file"])
        got, usage, finish, got_ids = traffic.stream_text(endpoint, events)
        entry["ttft_s"] = round(first, 4) if first is not None else None
        broken = tail or None
        if not got:
            entry["events_tail"] = events[-4:]  # what the stream carried, to read why it had no text
    else:
        status, answer = call(url, key, body, timeout=p["timeout"], cafile=p["ca_file"])
        got = traffic.answer_text(endpoint, answer)
        got_ids = traffic.answer_tokens(answer)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        choices = answer.get("choices") if isinstance(answer, dict) else None
        finish = choices[0].get("finish_reason") if choices and isinstance(choices[0], dict) else None
        broken = None if status == 200 else str(answer)[:300]
    entry["latency_s"] = round(time.time() - started, 4)
    after = _readings(everyone, p["timeout"], p["ca_file"])
    decode = [w["engine"] for w in workers["decode"]]
    prompt_tokens, cached = traffic.usage_tokens(usage)
    evidence, grew, kv_problem = traffic.kv_evidence(
        cached, dict((e, before[e]) for e in decode), dict((e, after[e]) for e in decode))
    entry.update(status=status, text=got, token_ids=got_ids, finish_reason=finish, prompt_tokens=prompt_tokens,
                 cached_tokens=cached, kv=evidence, decode_engines=grew, served_by=traffic.served(before, after))
    problems = []
    if status != 200 or broken:
        problems.append("the router answered HTTP %s%s" % (status, ": %s" % broken if broken else ""))
    if not got and not got_ids:
        problems.append("no text and no token in the answer")
    if finish == "error":
        problems.append("finish_reason error (a failed KV load)")
    if kv_problem:
        problems.append(kv_problem)
    entry["problems"] = problems
    return entry, after, text


def compare(p, key, workers, entry, text):
    """The request's answer against each decode engine's own greedy answer to the same prompt `text` (sent to every
    decode engine at once); adds direct, direct_token_ids, equal, compared_as and the verdict (ok) to `entry`."""
    endpoint = entry["endpoint"]

    def own(worker):
        ref = traffic.request_body(endpoint, p["model"], text, p["max_tokens"], False, salt=uuid.uuid4().hex)
        code, answer = call(worker["url"] + traffic.ENDPOINTS[endpoint], key, ref, timeout=p["timeout"],
                            cafile=p["ca_file"])
        return ((traffic.answer_text(endpoint, answer), traffic.answer_tokens(answer))
                if code == 200 else ("HTTP %s" % code, None))

    answers = _each(own, workers["decode"])
    direct = dict((w["engine"], answers[i]) for i, w in enumerate(workers["decode"]))
    got, got_ids = entry["text"], entry["token_ids"]
    entry["direct"] = dict((engine, answer[0]) for engine, answer in direct.items())
    entry["direct_token_ids"] = dict((engine, answer[1]) for engine, answer in direct.items())
    entry["equal"], entry["compared_as"] = traffic.same_answer(got, got_ids, direct)
    if (got or got_ids) and not entry["equal"]:
        entry["problems"].append("the router's answer %r (tokens %s) differs from the decode engines' own %s"
                                 % (got, got_ids, direct))
    entry["ok"] = not entry["problems"]
    return entry


def run_module(module):
    """router_traffic: the key checks, the rounds of requests, each compared with the decode engines' own answers,
    and every engine's share -> exit_json, or fail_json naming every request and engine that did not pass."""
    p = module.params
    try:
        workers = fleet_workers(p["engines"])
        key = read_key(p["api_key_file"])
        ca = check_ca(p["ca_file"])
    except PlanError as exc:
        module.fail_json(msg=str(exc), input=exc.key)
    models = p["url"].rstrip("/") + "/v1/models"
    auth = {"none": call(models, None, timeout=p["timeout"], cafile=ca)[0],
            "wrong": call(models, "narwhal-wrong-%s" % uuid.uuid4().hex, timeout=p["timeout"], cafile=ca)[0],
            "key": call(models, key, timeout=p["timeout"], cafile=ca)[0]}
    problems = []
    if auth["none"] != 401 or auth["wrong"] != 401:
        problems.append("the router does not refuse clients without the key (HTTP %s without a key, %s with a wrong "
                        "one): it is an open proxy in front of the keyed engines" % (auth["none"], auth["wrong"]))
    if auth["key"] != 200:
        problems.append("the router refuses the engines' own key on /v1/models (HTTP %s)" % auth["key"])
    rounds = max(1, int(math.ceil(max(len(workers["prefill"]), len(workers["decode"])) / float(len(traffic.matrix())))))
    sent = []
    reading = _readings(workers["prefill"] + workers["decode"], p["timeout"], ca)
    for _round in range(rounds):
        for endpoint, streamed, kind in traffic.matrix():
            entry, reading, text = one_request(p, key, workers, endpoint, streamed, kind, reading)
            sent.append((entry, text))
    requests = [compare(p, key, workers, entry, text) for entry, text in sent]
    served = dict((w["engine"], 0) for w in workers["prefill"] + workers["decode"])
    for entry in requests:
        for engine in entry["served_by"]:
            if engine in served:
                served[engine] += 1
    for entry in requests:
        if not entry["ok"]:
            problems.append("%s%s %s prompt: %s" % (entry["endpoint"], " (stream)" if entry["stream"] else "",
                                                    entry["prompt"], "; ".join(entry["problems"])))
    problems += traffic.coverage_problems(workers, served)
    result = dict(changed=False, requests=requests, served=served, auth=auth)
    if problems:
        module.fail_json(msg="traffic through the router at %s: %s" % (p["url"], " | ".join(problems)), **result)
    module.exit_json(**result)
