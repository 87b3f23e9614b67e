#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: transfer_probe
short_description: Prove that KV moves between prefill and decode engines (runtime transfer probe)
version_added: 0.1.0
description:
  - For each ordered pair (producer, consumer) sends a request with C(kv_transfer_params.do_remote_decode) to the
    producer, hands the returned C(kv_transfer_params) to the consumer with the same C(X-Request-Id), and reads the
    consumer's C(/metrics) before and after. The prompt begins with a fresh ID, so no engine can serve any of its
    blocks from its prefix cache.
  - A pair passes only when both answered 200, the consumer did not finish with reason C(error), its
    C(vllm:nixl_bytes_transferred) grew and C(vllm:nixl_num_failed_transfers) did not (proof that KV moved, not a
    silent recompute). With C(kv_both) every engine is probed once as producer and once as consumer.
  - How KV was proven is returned per pair as C(evidence). C(request) when the consumer's own answer counts the
    prompt as loaded (C(usage.prompt_tokens_details.cached_tokens), which vLLM returns when the engine runs with
    C(--enable-prompt-tokens-details); the probe forwards the producer's parameters without
    C(remote_prefill_cached_tokens), a field vLLM 0.32 and later read only to report the producer's cache hits in
    its place). A consumer answer that counts 0 cached tokens fails the pair. C(counters) when only the metrics
    prove it. Counters move for every client; when they moved more than one request explains (more than one
    finished request, more loaded prompt tokens than the prompt has) the pair says C(concurrent traffic seen) in
    its notes instead of failing.
  - A pure HTTP client that reads nothing of the controller's, so it can run where the fabric is, e.g. delegated
    to the consumer's engine host when the management workstation cannot reach the engines. The API key comes
    from O(api_key), O(api_key_file), or the engine installed on the host that runs the probe (O(engine_checkout)
    and O(installed_engine), whose role environment names C(NARWHAL_API_KEY_FILE)). The key file must be mode 0600
    or 0400 and hold one line, the launcher's rule. The key never appears in the results.
  - Read-only for the fleet; never reports a change. Fails when any pair fails, naming it and the reason.
options:
  engines:
    description: Engines by name, each with C(url) (the resolved engine URL) and C(role).
    type: dict
    required: true
  pairs:
    description: Ordered C([producer, consumer]) engine names.
    type: list
    elements: list
    required: true
  model:
    description: Served model name.
    type: str
    required: true
  api_key:
    description:
      - The engine API key (sent as C(Authorization Bearer)). Exactly one of O(api_key), O(api_key_file) and
        O(engine_checkout) is required.
    type: str
  api_key_file:
    description: File with the engine API key, on the host that runs the probe (mode 0600 or 0400, one line).
    type: path
  engine_checkout:
    description:
      - The engine checkout (C(NARWHAL_ENGINE_CHECKOUT)) on the host that runs the probe. With
        O(installed_engine), the key file is the one the installed role environment
        C(<engine_checkout>/config/<installed_engine>.env) names in C(NARWHAL_API_KEY_FILE).
    type: path
  installed_engine:
    description: An engine installed on the host that runs the probe (required with O(engine_checkout)).
    type: str
  prompt:
    description: Prompt of the probe requests; each pair prefixes it with its own request ID so that no engine can
      serve it from its prefix cache.
    type: str
    default: narwhal transfer probe - the quick brown fox jumps over the lazy dog
  timeout:
    description: Seconds per HTTP request.
    type: int
    default: 120
  recompute:
    description:
      - Also send the same greedy request to the consumer with a fresh C(cache_salt) (so it cannot reuse the
        transferred blocks) and compare its output with the output decoded over the transferred KV.
      - C(require) fails the pair when they differ, C(report) only records the comparison (GPU kernels may
        legitimately differ in the last bits between a chunked prefill and a transferred one), C(off) skips it.
    type: str
    choices: [require, report, "off"]
    default: report
attributes:
  check_mode:
    description: Probes in check mode too (nothing changes).
  idempotent:
    description: Never changes the fleet.
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.read_only
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Probe both directions of the pair
  narwhal.deploy.transfer_probe:
    engines:
      engine-1: {url: "http://10.0.0.11:8000", role: prefill}
      engine-2: {url: "http://10.0.0.12:8000", role: decode}
    pairs: [[engine-1, engine-2], [engine-2, engine-1]]
    model: llama-3.1-8b
    api_key_file: /srv/narwhal/config/engine-api.key
  delegate_to: localhost
  run_once: true

- name: Probe from the consumer's host, where the fabric is, with the key installed there
  narwhal.deploy.transfer_probe:
    engines:
      engine-1: {url: "http://10.0.0.11:8000", role: prefill}
      engine-2: {url: "http://10.0.0.12:8000", role: decode}
    pairs: [[engine-1, engine-2]]
    model: llama-3.1-8b
    engine_checkout: /srv/narwhal
    installed_engine: engine-2
  delegate_to: engine-2
  become: true
  run_once: true
"""

RETURN = r"""
results:
  description:
    - One entry per pair with producer, consumer, request_id, ok, reasons, the consumer's counters before and
      after, bytes moved, latency (producer request to consumer answer; prefill_s and decode_s split it), the
      consumer's output and whether it equals the local recomputation (null when not compared), remote_host and
      remote_port (the producer's side channel).
    - C(evidence) is how KV was proven for this pair's request, C(request), C(counters) or null (failed);
      C(cached_tokens) and C(prompt_tokens) are the consumer's usage for the request (C(cached_tokens) null without
      C(--enable-prompt-tokens-details)); C(concurrent_traffic) is true when the counters moved more than one
      request explains; C(notes) say what was seen without failing the pair.
  returned: always
  type: list
  elements: dict
  sample: [{"producer": "engine-1", "consumer": "engine-2", "ok": true, "reasons": [], "bytes": 3584.0,
            "evidence": "request", "cached_tokens": 14, "prompt_tokens": 14, "concurrent_traffic": false,
            "notes": []}]
"""

import json
import os
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.narwhal.deploy.plugins.module_utils import _plan
from ansible_collections.narwhal.deploy.plugins.module_utils._probe import (
    completion_text,
    consumer_request,
    forward_params,
    nixl_counters,
    probe_prompt,
    producer_request,
    recompute_reasons,
    reference_request,
    verdict,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._tools import host_name, read_regular


def call(url, key, body=None, request_id=None, timeout=120):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer %s" % key
    if request_id:
        headers["X-Request-Id"] = request_id
    try:
        resp = open_url(url, method="POST" if body is not None else "GET", headers=headers, timeout=timeout,
                        data=json.dumps(body) if body is not None else None, validate_certs=True)
        text = resp.read().decode("utf-8", "replace")
        status = resp.getcode()
    except Exception as exc:  # noqa: BLE001 - HTTP errors carry a status; anything else is a failed probe
        status = getattr(exc, "code", None) or 0
        try:
            text = exc.read().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001
            text = str(exc)
    try:
        return status, json.loads(text)
    except (ValueError, RecursionError):
        return status, text


def read_key_file(path):
    """The key in `path` by the launcher's rule (_plan.api_key_from); raises _plan.PlanError naming the file."""
    try:
        st = os.stat(path)
        raw = read_regular(path, _plan.API_KEY_MAX_BYTES)  # a FIFO is refused by name, never waited on
    except OSError as exc:
        raise _plan.PlanError("cannot read the engine API key file %s on host %s (%s); install the engine there "
                              "(playbooks/prepare.yml) or pass api_key_file / api_key"
                              % (path, host_name(), exc.strerror or exc), "NARWHAL_API_KEY_FILE")
    return _plan.api_key_from(raw, st.st_mode, path)


def installed_key_file(checkout, engine):
    """The key file that the installed role environment of `engine` names (NARWHAL_API_KEY_FILE)."""
    where = _plan.install_paths(checkout, engine, "")["role_env"]
    try:
        text = read_regular(where, 65536).decode("utf-8", "replace")
    except OSError as exc:
        raise _plan.PlanError("cannot read the role environment %s of %s on host %s (%s); is %s installed on this "
                              "host (engine_checkout / installed_engine, NARWHAL_ENGINE_CHECKOUT)?"
                              % (where, engine, host_name(), exc.strerror or exc, engine), "installed_engine")
    path = _plan.parse_role_env(text, where).get("NARWHAL_API_KEY_FILE")
    if not path:
        raise _plan.PlanError("the role environment %s names no NARWHAL_API_KEY_FILE; prepare a new run and install "
                              "it" % where, "installed_engine")
    return path


def api_key(params):
    if params["api_key"] is not None:
        key = params["api_key"].strip()
        if not key or "\n" in key:
            raise _plan.PlanError("api_key must be one non-empty line", "api_key")
        return key
    if params["api_key_file"]:
        return read_key_file(params["api_key_file"])
    return read_key_file(installed_key_file(params["engine_checkout"], params["installed_engine"]))


def probe_pair(module, key, producer, consumer):
    p = module.params
    purl, curl = p["engines"][producer]["url"].rstrip("/"), p["engines"][consumer]["url"].rstrip("/")
    unique = uuid.uuid4().hex[:12]
    rid = "narwhal-probe-%s" % unique
    # the fresh ID first: no block of the prompt can be in either engine's prefix cache
    prompt = probe_prompt(unique, p["prompt"])
    before = nixl_counters(call(curl + "/metrics", None, timeout=p["timeout"])[1])
    started = time.time()
    prod = call(purl + "/v1/completions", key, producer_request(p["model"], prompt), rid, p["timeout"])
    prefilled = time.time()
    params = prod[1].get("kv_transfer_params") if isinstance(prod[1], dict) else None
    cons = (0, None)
    if prod[0] == 200 and isinstance(params, dict) and params:
        cons = call(curl + "/v1/completions", key, consumer_request(p["model"], prompt, forward_params(params)),
                    rid, p["timeout"])
    latency = time.time() - started
    after = nixl_counters(call(curl + "/metrics", None, timeout=p["timeout"])[1])
    judged = verdict(prod, cons, before, after)
    ok, reasons = judged["ok"], judged["reasons"]
    output, matches = completion_text(cons[1]), None
    if ok and p["recompute"] != "off":
        reference = call(curl + "/v1/completions", key,
                         reference_request(p["model"], prompt, "narwhal-probe-%s" % uuid.uuid4().hex), None,
                         p["timeout"])
        mismatch = recompute_reasons(output, reference)
        matches = not mismatch
        if mismatch and p["recompute"] == "require":
            ok, reasons = False, reasons + mismatch
            judged["evidence"] = None
        elif mismatch:
            module.warn("%s -> %s: %s" % (producer, consumer, mismatch[0]))
    for note in judged["notes"]:
        module.warn("%s -> %s: %s" % (producer, consumer, note))
    moved = None
    if after.get("bytes_transferred") is not None and before.get("bytes_transferred") is not None:
        moved = after["bytes_transferred"] - before["bytes_transferred"]
    params = params if isinstance(params, dict) else {}
    return {"producer": producer, "consumer": consumer, "request_id": rid, "ok": ok, "reasons": reasons,
            "evidence": judged["evidence"], "notes": judged["notes"],
            "concurrent_traffic": judged["concurrent_traffic"], "cached_tokens": judged["cached_tokens"],
            "prompt_tokens": judged["prompt_tokens"],
            "before": before, "after": after, "bytes": moved, "latency_s": round(latency, 3),
            "prefill_s": round(prefilled - started, 3), "decode_s": round(started + latency - prefilled, 3),
            "output": output, "matches_recompute": matches,
            "remote_host": params.get("remote_host"), "remote_port": params.get("remote_port")}


def main():
    module = AnsibleModule(
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
        ),
        mutually_exclusive=[("api_key", "api_key_file", "engine_checkout")],
        required_one_of=[("api_key", "api_key_file", "engine_checkout")],
        required_together=[("engine_checkout", "installed_engine")],
        supports_check_mode=True,
    )
    p = module.params
    unknown = sorted(set(e for pair in p["pairs"] for e in pair[:2]) - set(p["engines"]))
    bad = [pair for pair in p["pairs"] if len(pair) != 2]
    if unknown or bad:
        module.fail_json(msg="transfer probe: %s; pairs are [producer, consumer] names of engines"
                             % ("pairs name engines that engines does not have: %s" % ", ".join(map(str, unknown))
                                if unknown else "pairs must have two engines each: %s" % bad))
    try:
        key = api_key(p)
    except _plan.PlanError as exc:
        module.fail_json(msg="transfer probe: %s" % exc, input=exc.key)
    module.no_log_values.add(key)
    results = [probe_pair(module, key, pair[0], pair[1]) for pair in p["pairs"]]
    failed = [r for r in results if not r["ok"]]
    if failed:
        module.fail_json(msg="transfer probe failed: %s" % "; ".join(
            "%s -> %s: %s" % (r["producer"], r["consumer"], ", ".join(r["reasons"])) for r in failed), results=results)
    module.exit_json(changed=False, results=results)


if __name__ == "__main__":
    main()
