# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The transfer_probe step: probe the KV transfer of prefill/decode pairs (see plugins/modules/transfer_probe.py).

transfer_probe(task) reads a StepRun (_common/step.py) and returns the task's result; a failed pair raises StepError.
Its action plugin runs it in the controller's process, the module's main() (plugins/modules/transfer_probe.py) on an
engine host.
Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

import ssl
import threading
import time
import uuid

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call, tls_context, tls_failure
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import read_key_file as _read_key_file
from ansible_collections.narwhal.deploy.plugins.module_utils._common.nixl_metrics import (
    consumer_reading,
    engine_samples,
    producer_counters,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import host_name, read_regular
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import natural_key
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.role_env import (
    install_paths,
    parse_role_env,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.fabric import (
    long_prompt,
    prompt_refusals,
    slowest,
    slowest_rail,
    with_link,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.schedule import probe_rounds
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.verdict import (
    completion_text,
    consumer_request,
    forward_params,
    probe_prompt,
    producer_rank_reasons,
    producer_request,
    rank_headers,
    rank_pairs,
    recompute_reasons,
    reference_request,
    verdict,
)

__metaclass__ = type


def read_key_file(path):
    """The key in `path` (_common/http.py::read_key_file, the launcher's rule)."""
    return _read_key_file(path, "install the engine there (playbooks/prepare.yml) or pass api_key_file / api_key")


def installed_key_file(checkout, engine):
    """The key file that the installed role environment of `engine` names (NARWHAL_API_KEY_FILE)."""
    where = install_paths(checkout, engine, "")["role_env"]
    try:
        text = read_regular(where, 65536).decode("utf-8", "replace")
    except OSError as exc:
        raise PlanError("cannot read the role environment %s of %s on host %s (%s); is %s installed on this "
                        "host (engine_checkout / installed_engine, NARWHAL_ENGINE_CHECKOUT)?"
                        % (where, engine, host_name(), exc.strerror or exc, engine), "installed_engine")
    path = parse_role_env(text, where).get("NARWHAL_API_KEY_FILE")
    if not path:
        raise PlanError("the role environment %s names no NARWHAL_API_KEY_FILE; prepare a new run and install "
                        "it" % where, "installed_engine")
    return path


def tls_refusals(p, answers):
    """The reasons a pair fails when an engine's certificate did not verify against the probe's CA (`ca_file`):
    `answers` are (engine, URL, the call() answer of its first request); one reason per engine that failed in TLS,
    naming it, its URL and the TLS reason ("certificate verify failed: ...")."""
    reasons = []
    for engine, url, answer in answers:
        why = tls_failure(answer)
        if why:
            reasons.append("%s (%s): TLS refused, %s; its certificate must be valid, name the URL's host and be signed "
                           "by the CA %s (rerun prepare and launch: NARWHAL_TLS=site reissues it; with operator "
                           "certificates, correct the host's certificate in NARWHAL_TLS_DIR)"
                           % (engine, url, why, p.get("ca_file") or "of the system (no ca_file given)"))
    return reasons


def api_key(params):
    if params["api_key"] is not None:
        key = params["api_key"].strip()
        if not key or "\n" in key:
            raise PlanError("api_key must be one non-empty line", "api_key")
        return key
    if params["api_key_file"]:
        return read_key_file(params["api_key_file"])
    return read_key_file(installed_key_file(params["engine_checkout"], params["installed_engine"]))


def probe_pair(task, key, producer, consumer, warn=None):
    """One pair's probe -> its result; what it notes without failing goes to `warn` (default the task's warnings).

    Data-parallel engines (`data_parallel`: {engine: DP size} > 1) serve their ranks behind one HTTP port; each
    request names its rank with X-data-parallel-rank (vLLM 0.32.0 entrypoints/generate/base/serving.py:220-232,
    v1/engine/core_client.py:1648), and the pair is probed once per entry of rank_pairs, so every rank of both
    engines produces and consumes once. A rank's proof is its own: the producer's answer must come from the rank
    asked for (remote_engine_id <id>_dp<rank>), and the consumer's counters are read for its rank alone (label
    engine="<rank>", _common/nixl_metrics.py::engine_samples). The pair's result is the first rank pair's, with
    `ok` and `reasons` over all of them and `ranks` listing each; DP 1 pairs are probed as before (no `ranks`)."""
    sizes = task.params.get("data_parallel") or {}
    plan = rank_pairs(sizes.get(producer), sizes.get(consumer))
    if plan == [(None, None)]:
        return probe_ranks(task, key, producer, consumer, warn)
    results = [probe_ranks(task, key, producer, consumer, warn, ranks) for ranks in plan]
    first = dict(results[0])
    first["ok"] = all(r["ok"] for r in results)
    first["reasons"] = ["rank %s -> %s: %s" % (r["producer_rank"], r["consumer_rank"], reason)
                        for r in results for reason in r["reasons"]]
    first["ranks"] = [dict((k, r[k]) for k in RANK_FIELDS) for r in results]
    return first


# What each rank pair of a data-parallel pair reports in its result's `ranks`
RANK_FIELDS = ("producer_rank", "consumer_rank", "request_id", "ok", "reasons", "evidence", "cached_tokens",
               "prompt_tokens", "bytes", "remote_host", "remote_port", "remote_engine_id")


def probe_ranks(task, key, producer, consumer, warn=None, ranks=(None, None)):
    """The probe of one request pair: the producer's DP rank ranks[0] (None: vLLM's balancer picks, DP 1) and the
    consumer's ranks[1]."""
    p = task.params
    warn = warn or task.warnings.append
    prank, crank = ranks
    purl, curl = p["engines"][producer]["url"].rstrip("/"), p["engines"][consumer]["url"].rstrip("/")
    unique = uuid.uuid4().hex[:12]
    rid = "narwhal-probe-%s" % unique
    # the fresh ID first: no block of the prompt can be in either engine's prefix cache
    prompt = long_prompt(probe_prompt(unique, p["prompt"]), p["prompt_tokens"])
    metrics, ca = curl + "/metrics", p.get("ca_file")
    c_first = call(metrics, None, timeout=p["timeout"], cafile=ca)
    p_first = call(purl + "/metrics", None, timeout=p["timeout"], cafile=ca)
    # an engine whose certificate does not verify fails the pair by name; nothing is asked of the pair then
    refused = tls_refusals(p, ((consumer, curl, c_first), (producer, purl, p_first)))
    before, xfer_before = consumer_reading(engine_samples(c_first[1], crank))
    # the producer's lease counters: an expired lease answers HTTP 200 on the consumer (_probe/verdict.py)
    p_before = producer_counters(engine_samples(p_first[1], prank))
    started = time.time()
    prod = (0, None) if refused else call(purl + "/v1/completions", key, producer_request(p["model"], prompt), rid,
                                          p["timeout"], rank_headers(prank), cafile=ca)
    prefilled = time.time()
    params = prod[1].get("kv_transfer_params") if isinstance(prod[1], dict) else None
    cons = (0, None)
    if prod[0] == 200 and isinstance(params, dict) and params:
        cons = call(curl + "/v1/completions", key, consumer_request(p["model"], prompt, forward_params(params)),
                    rid, p["timeout"], rank_headers(crank), cafile=ca)
    latency = time.time() - started
    after, xfer_after = consumer_reading(engine_samples(call(metrics, None, timeout=p["timeout"], cafile=ca)[1], crank))
    p_after = producer_counters(engine_samples(call(purl + "/metrics", None, timeout=p["timeout"], cafile=ca)[1],
                                               prank))
    judged = verdict(prod, cons, before, after, p_before, p_after)
    ok, reasons = (False, refused) if refused else (judged["ok"], judged["reasons"])
    if prod[0] == 200:
        wrong_rank = producer_rank_reasons(params, prank, None)
        ok, reasons = ok and not wrong_rank, reasons + wrong_rank
    output, matches = completion_text(cons[1]), None
    if ok and p["recompute"] != "off":
        reference = call(curl + "/v1/completions", key,
                         reference_request(p["model"], prompt, "narwhal-probe-%s" % uuid.uuid4().hex), None,
                         p["timeout"], rank_headers(crank), cafile=ca)
        mismatch = recompute_reasons(output, reference)
        matches = not mismatch
        if mismatch and p["recompute"] == "require":
            ok, reasons = False, reasons + mismatch
            judged["evidence"] = None
        elif mismatch:
            warn("%s -> %s: %s" % (_ranked(producer, prank), _ranked(consumer, crank), mismatch[0]))
    for note in judged["notes"]:
        warn("%s -> %s: %s" % (_ranked(producer, prank), _ranked(consumer, crank), note))
    moved = None
    if after.get("bytes_transferred") is not None and before.get("bytes_transferred") is not None:
        moved = after["bytes_transferred"] - before["bytes_transferred"]
    transfer_s = rate = None
    if xfer_before is not None and xfer_after is not None:
        transfer_s = xfer_after - xfer_before
        rate = round(moved / transfer_s) if moved and transfer_s > 0 else None
        transfer_s = round(transfer_s, 6)
    params = params if isinstance(params, dict) else {}
    result = {"producer": producer, "consumer": consumer, "request_id": rid, "ok": ok, "reasons": reasons,
              "evidence": judged["evidence"], "notes": judged["notes"],
              "concurrent_traffic": judged["concurrent_traffic"], "cached_tokens": judged["cached_tokens"],
              "prompt_tokens": judged["prompt_tokens"],
              "before": before, "after": after, "producer_before": p_before, "producer_after": p_after,
              "bytes": moved, "transfer_s": transfer_s, "rate_bytes_s": rate, "latency_s": round(latency, 3),
              "prefill_s": round(prefilled - started, 3), "decode_s": round(started + latency - prefilled, 3),
              "output": output, "matches_recompute": matches,
              "remote_host": params.get("remote_host"), "remote_port": params.get("remote_port")}
    if prank is not None or crank is not None:
        result.update(producer_rank=prank, consumer_rank=crank, remote_engine_id=params.get("remote_engine_id"))
    return result


def _ranked(engine, rank):
    return engine if rank is None else "%s (DP rank %d)" % (engine, rank)


def run_round(task, key, members, results):
    """Probe the pairs `members` (indices into the task's pairs) at the same time, one thread each, and wait for
    all of them; results[index] gets each pair's verdict. A round shares no engine between its pairs
    (_probe/schedule.py::probe_rounds), so each probe's counters move for its own request only."""
    pairs = task.params["pairs"]
    if len(members) == 1:
        index = members[0]
        results[index] = probe_pair(task, key, pairs[index][0], pairs[index][1])
        return
    errors, warnings = [], dict((index, []) for index in members)

    def one(index):
        try:
            results[index] = probe_pair(task, key, pairs[index][0], pairs[index][1], warnings[index].append)
        except Exception as exc:  # noqa: BLE001 - raised again in the calling thread, where the step fails
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(index,), name="narwhal-probe-%d" % index) for index in members]
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    for index in members:  # in the pairs' order, as a serial run warns
        for warning in warnings[index]:
            task.warnings.append(warning)


def module_spec():
    """The argument spec of transfer_probe (its action plugin and its module validate with it)."""
    return dict(
        argument_spec=dict(
            engines=dict(type="dict", required=True),
            pairs=dict(type="list", elements="list", required=True),
            model=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            api_key_file=dict(type="path", no_log=False),
            engine_checkout=dict(type="path"),
            installed_engine=dict(type="str"),
            prompt=dict(type="str", default="narwhal transfer probe - the quick brown fox jumps over the lazy dog"),
            timeout=dict(type="int", default=120),
            recompute=dict(type="str", choices=["require", "report", "off"], default="report"),
            parallel=dict(type="int", default=8),
            data_parallel=dict(type="dict", default={}),
            prompt_tokens=dict(type="int", default=0, no_log=False),
            max_model_len=dict(type="dict", default={}),
            links=dict(type="dict", default={}),
            ca_file=dict(type="path"),
        ),
        mutually_exclusive=[("api_key", "api_key_file", "engine_checkout")],
        required_one_of=[("api_key", "api_key_file", "engine_checkout")],
        required_together=[("engine_checkout", "installed_engine")],
        supports_check_mode=True,
    )


def transfer_probe(task):
    p = task.params
    unknown = sorted(set(e for pair in p["pairs"] for e in pair[:2]) - set(p["engines"]))
    bad = [pair for pair in p["pairs"] if len(pair) != 2]
    if unknown or bad:
        raise StepError("transfer probe: %s; pairs are [producer, consumer] names of engines"
                        % ("pairs name engines that engines does not have: %s" % ", ".join(map(str, unknown))
                           if unknown else "pairs must have two engines each: %s" % bad))
    try:
        key = api_key(p)
    except PlanError as exc:
        raise StepError("transfer probe: %s" % exc, input=exc.key)
    task.secrets.add(key)
    if p["ca_file"]:
        try:  # read once, before any probe: every request of every pair verifies against it (_common/http.py)
            tls_context(p["ca_file"])
        except (OSError, ssl.SSLError) as exc:
            raise StepError("transfer probe: cannot read the CA certificate %s on host %s (%s); it is the site CA that "
                            "the engines' certificates are checked against: on the controller <NARWHAL_TLS_DIR>/ca.crt "
                            "(prepare makes it with NARWHAL_TLS=site), on an engine host "
                            "<checkout>/tls/<engine>/ca.crt (install puts it there): rerun prepare and install, or "
                            "pass the CA's path as ca_file"
                            % (p["ca_file"], host_name(), getattr(exc, "strerror", None) or exc), input="ca_file")
    if p["parallel"] < 1:
        raise StepError("transfer probe: parallel must be 1 (one probe at a time) or more, got %d"
                        % p["parallel"], input="parallel")
    if p["prompt_tokens"] < 0:
        raise StepError("transfer probe: prompt_tokens must be 0 (the short prompt) or more, got %d"
                        % p["prompt_tokens"], input="prompt_tokens")
    if p["prompt_tokens"]:
        engines = sorted(set(e for pair in p["pairs"] for e in pair), key=natural_key)
        refused = prompt_refusals(p["prompt_tokens"], engines, p["max_model_len"])
        if refused:
            raise StepError("transfer probe: prompt_tokens (narwhal_probe_prompt_tokens) %d does not fit: %s; "
                            "lower it, or raise --max-model-len and relaunch, nothing was probed"
                            % (p["prompt_tokens"], "; ".join(refused)), input="prompt_tokens")
    rounds = probe_rounds(p["pairs"], p["parallel"])
    results = [None] * len(p["pairs"])
    for number, members in enumerate(rounds, 1):
        run_round(task, key, members, results)
        for index in members:
            results[index]["round"] = number
    # each pair's rate against its link's nominal rate (_probe/fabric.py)
    results = [with_link(r, p["links"]) for r in results]
    failed = [r for r in results if not r["ok"]]
    if failed:
        raise StepError("transfer probe failed: %s" % "; ".join(
            "%s -> %s: %s" % (r["producer"], r["consumer"], ", ".join(r["reasons"])) for r in failed), results=results)
    return dict(changed=False, results=results, rounds=len(rounds), slowest=slowest(results),
                slowest_rail=slowest_rail(results))
