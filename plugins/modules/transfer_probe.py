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
    consumer's C(/metrics) before and after.
  - A pair passes only when both answered 200, the consumer did not finish with reason C(error), and its
    C(vllm:nixl_bytes_transferred) grew while C(vllm:nixl_num_failed_transfers) did not (proof that KV moved, not a
    silent recompute). With C(kv_both) every engine is probed once as producer and once as consumer.
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
  api_key_file:
    description: File with the engine API key (sent as C(Authorization Bearer)).
    type: path
    required: true
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
"""

RETURN = r"""
results:
  description: One entry per pair with producer, consumer, ok, reasons, the consumer's counters before and after,
    bytes moved, latency (producer request to consumer answer; prefill_s and decode_s split it), the consumer's output and whether it equals the
    local recomputation (null when not compared).
  returned: always
  type: list
  elements: dict
  sample: [{"producer": "engine-1", "consumer": "engine-2", "ok": true, "reasons": [], "bytes": 3584.0}]
"""

import json
import time
import uuid

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url

from ansible_collections.narwhal.deploy.plugins.module_utils._probe import (
    completion_text,
    consumer_request,
    nixl_counters,
    producer_request,
    recompute_reasons,
    reference_request,
    verdict,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._tools import read_regular


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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engines=dict(type="dict", required=True),
            pairs=dict(type="list", elements="list", required=True),
            model=dict(type="str", required=True),
            api_key_file=dict(type="path", required=True, no_log=False),
            prompt=dict(type="str", default="narwhal transfer probe - the quick brown fox jumps over the lazy dog"),
            timeout=dict(type="int", default=120),
            recompute=dict(type="str", choices=["require", "report", "off"], default="report"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        key = read_regular(p["api_key_file"], 65536).decode("utf-8", "replace").strip()
    except OSError as exc:
        module.fail_json(msg="cannot read the engine API key file %s (%s); NARWHAL_API_KEY_FILE" % (p["api_key_file"], exc))
    module.no_log_values.add(key)
    results = []
    for pair in p["pairs"]:
        producer, consumer = pair[0], pair[1]
        purl, curl = p["engines"][producer]["url"].rstrip("/"), p["engines"][consumer]["url"].rstrip("/")
        rid = "narwhal-probe-%s" % uuid.uuid4().hex[:12]
        # a prompt no engine has seen: neither side can serve any of its blocks from its own prefix cache
        prompt = "%s: %s" % (rid, p["prompt"])
        before = nixl_counters(call(curl + "/metrics", None, timeout=p["timeout"])[1])
        started = time.time()
        prod = call(purl + "/v1/completions", key, producer_request(p["model"], prompt), rid, p["timeout"])
        prefilled = time.time()
        params = prod[1].get("kv_transfer_params") if isinstance(prod[1], dict) else None
        cons = (0, None)
        if prod[0] == 200 and params:
            cons = call(curl + "/v1/completions", key, consumer_request(p["model"], prompt, params), rid,
                        p["timeout"])
        latency = time.time() - started
        after = nixl_counters(call(curl + "/metrics", None, timeout=p["timeout"])[1])
        ok, reasons = verdict(prod, cons, before, after)
        output, matches = completion_text(cons[1]), None
        if ok and p["recompute"] != "off":
            reference = call(curl + "/v1/completions", key,
                             reference_request(p["model"], prompt, "narwhal-probe-%s" % uuid.uuid4().hex), None,
                             p["timeout"])
            mismatch = recompute_reasons(output, reference)
            matches = not mismatch
            if mismatch and p["recompute"] == "require":
                ok, reasons = False, reasons + mismatch
            elif mismatch:
                module.warn("%s -> %s: %s" % (producer, consumer, mismatch[0]))
        moved = None
        if after.get("bytes_transferred") is not None and before.get("bytes_transferred") is not None:
            moved = after["bytes_transferred"] - before["bytes_transferred"]
        results.append({"producer": producer, "consumer": consumer, "request_id": rid, "ok": ok, "reasons": reasons,
                        "before": before, "after": after, "bytes": moved, "latency_s": round(latency, 3),
                        "prefill_s": round(prefilled - started, 3), "decode_s": round(started + latency - prefilled, 3),
                        "output": output, "matches_recompute": matches,
                        "remote_host": (params or {}).get("remote_host"),
                        "remote_port": (params or {}).get("remote_port")})
    failed = [r for r in results if not r["ok"]]
    if failed:
        module.fail_json(msg="transfer probe failed: %s" % "; ".join(
            "%s -> %s: %s" % (r["producer"], r["consumer"], ", ".join(r["reasons"])) for r in failed), results=results)
    module.exit_json(changed=False, results=results)


if __name__ == "__main__":
    main()
