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
  - The producer's C(/metrics) is read before and after as well. Its KV lease counters
    C(vllm:nixl_num_kv_expired_reqs) and C(vllm:nixl_num_notifications_after_expiry) must not grow, because a read of
    blocks whose lease expired still answers HTTP 200 on the consumer (vLLM issues 25562 and 52234); so a pair whose
    producer counted an expiry fails, naming the counter. A producer without these counters is a note.
  - A pure HTTP client that reads nothing of the controller's, so it can run where the fabric is, e.g. delegated
    to the consumer's engine host when the management workstation cannot reach the engines (its action plugin runs
    the probe in the controller's process when the task's connection is local and without become, and this module on
    the task's host otherwise). The API key comes
    from O(api_key), O(api_key_file), or the engine installed on the host that runs the probe (O(engine_checkout)
    and O(installed_engine), whose role environment names C(NARWHAL_API_KEY_FILE)). The key file must be mode 0600
    or 0400 and hold one line, the launcher's rule. The key never appears in the results.
  - Pairs run in rounds of at most O(parallel) probes at a time, one thread each; no engine is in two probes of a
    round, in either role (a matching over all engines; for prefill/decode pairs, as few rounds as König's theorem
    allows, max(P, D) per direction for a whole fleet). So each probe's counters, the consumer's and the
    producer's, move for its own request only, and every pair keeps the evidence and verdict of a serial run.
  - Each pair reports the KV bytes its request moved, the time NIXL took (C(transfer_s)) and the rate, against its
    link's nominal rate (O(links), read on the hosts at discovery - the fabric interface's speed for C(ucx_tcp),
    each HCA port's rate for C(ucx_rdma)); the module names the slowest pair and the slowest rail. With O(prompt_tokens)
    the prompt is that long, so that the transfer rather than the request's overhead makes the figure. The figures
    never fail a pair.
  - An C(https) engine URL is verified against O(ca_file), the site CA, and the engine's certificate must name the
    URL's host; an engine whose certificate does not verify (another CA, expired, another name) fails each of its
    pairs, naming the engine, its URL and the TLS reason (C(certificate verify failed) and OpenSSL's why), and
    nothing is sent to the pair.
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
  parallel:
    description:
      - The most probes at a time. C(1) probes one pair at a time, in the order of O(pairs). More never puts an
        engine in two probes at once.
    type: int
    default: 8
  data_parallel:
    description:
      - The data-parallel size of each engine (engine name to DP size; an engine not named is DP 1). A pair with a
        DP engine is probed once per rank pair, so that every rank of both engines produces and consumes once
        (max of the two sizes), each request naming its rank with the C(X-data-parallel-rank) header; the consumer's
        counters are read for its rank alone (label C(engine="<rank>")) and the producer's answer must come from the
        rank asked for (C(remote_engine_id) C(<id>_dp<rank>)).
    type: dict
    default: {}
  prompt_tokens:
    description:
      - Pad each pair's prompt with one-token filler words to this many words, so that its KV, not the request's
        overhead, makes the transfer figures (the consumer's C(usage.prompt_tokens) in each result says how many
        tokens the engine counted). C(0), the default, sends the short O(prompt) as it is.
      - Every engine of O(pairs) must hold it, with the 8 tokens the consumer answers, within its O(max_model_len);
        otherwise the module refuses before probing, naming the engine and its limit.
    type: int
    default: 0
  max_model_len:
    description:
      - The longest sequence each engine serves (engine name to tokens), which O(prompt_tokens) must fit. The probe role
        reads it with the lookup P(narwhal.deploy.probe_engines#lookup) (the record's C(--max-model-len), else the
        checkpoint's config as discovery read it). Used only with O(prompt_tokens).
    type: dict
    default: {}
  links:
    description:
      - The link of each engine (engine name to C(transport), C(rails) - each C(rail), C(nominal_bits_s), C(rate),
        C(virtual), C(why) - C(nominal_bits_s), the sum over its rails, and C(why) when that is unknown), as the
        lookup P(narwhal.deploy.probe_engines#lookup) builds it from the launch records and discovery's inspection
        extracts. An engine not named has an unknown link; its pairs then have no C(utilisation).
    type: dict
    default: {}
  ca_file:
    description:
      - The CA certificate (PEM) the engines' certificates must be signed by, on the host that runs the probe -
        trusted alone, the system's CAs are not. The probe role passes the controller's C(<NARWHAL_TLS_DIR>/ca.crt)
        and, from a consumer's host, the engine checkout's C(<NARWHAL_ENGINE_CHECKOUT>/tls/<engine>/ca.crt) that install
        writes; none with C(NARWHAL_TLS=off) (the URLs are C(http)).
      - Without it an C(https) URL is verified against the system's CAs. A file that cannot be read as certificates
        fails the module before any probe, naming it.
    type: path
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

- name: Probe engines that serve TLS, verified against the site CA
  narwhal.deploy.transfer_probe:
    engines:
      engine-1: {url: "https://10.0.0.11:8000", role: prefill}
      engine-2: {url: "https://10.0.0.12:8000", role: decode}
    pairs: [[engine-1, engine-2]]
    model: llama-3.1-8b
    api_key_file: /srv/narwhal/config/engine-api.key
    ca_file: /srv/narwhal/config/tls/ca.crt
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
      after, the producer's lease counters (C(producer_before), C(producer_after)), bytes moved, latency
      (producer request to consumer answer; prefill_s and decode_s split it), the consumer's output and whether
      it equals the local recomputation (null when not compared), remote_host and remote_port (the producer's side
      channel).
    - C(evidence) is how KV was proven for this pair's request, C(request), C(counters) or null (failed);
      C(cached_tokens) and C(prompt_tokens) are the consumer's usage for the request (C(cached_tokens) null without
      C(--enable-prompt-tokens-details)); C(concurrent_traffic) is true when the counters moved more than one
      request explains; C(notes) say what was seen without failing the pair.
    - C(round) is the round (from 1) in which the pair was probed, together with the other pairs of that round.
    - For a pair with a data-parallel engine (O(data_parallel)), the fields are those of its first rank pair, C(ok)
      and C(reasons) (each prefixed C(rank <p> -> <c>)) cover every rank pair, and C(ranks) lists each (C(producer_rank),
      C(consumer_rank), C(request_id), C(ok), C(reasons), C(evidence), C(cached_tokens), C(prompt_tokens), C(bytes),
      C(remote_host), C(remote_port), C(remote_engine_id)).
    - C(transfer_s) is the growth of the consumer's C(vllm:nixl_xfer_time_seconds) sum (the time NIXL spent moving
      this pair's KV; null where the engine has no such metric) and C(rate_bytes_s) is C(bytes) / C(transfer_s),
      rounded to a byte per second (null without both). With the probe's short prompt the transfer is a few KV
      blocks, so the rate says more about per-transfer overhead than about the link; O(prompt_tokens) lengthens it.
    - C(link) has the C(producer)'s and the C(consumer)'s link (O(links)), C(nominal_bits_s), the lower of their
      nominal rates (the pair's bound; null with C(why) when either is unknown) and C(bound) (which side sets it,
      or C(both)). C(utilisation) is C(rate_bytes_s) * 8 / C(link.nominal_bits_s), rounded to 4 decimals (null
      without both).
    - In the order of O(pairs).
  returned: always
  type: list
  elements: dict
  sample: [{"producer": "engine-1", "consumer": "engine-2", "ok": true, "reasons": [], "bytes": 3584.0,
            "evidence": "request", "cached_tokens": 14, "prompt_tokens": 14, "concurrent_traffic": false,
            "notes": [], "round": 1}]
slowest:
  description: The pair with the lowest C(rate_bytes_s) (C(producer), C(consumer), C(rate_bytes_s), C(bytes),
    C(transfer_s), C(nominal_bits_s) of its link and its C(utilisation)), or null when no pair has a rate.
  returned: success
  type: dict
  sample: {"producer": "engine-2", "consumer": "engine-1", "rate_bytes_s": 51200000, "bytes": 32768.0,
           "transfer_s": 0.00064, "nominal_bits_s": 10000000000, "utilisation": 0.041}
slowest_rail:
  description:
    - The rail that moved KV slowest, or null when no pair has a rate. The probe measures pairs, not rails - each
      engine gets the median rate of the pairs it took part in, and the engine with the lowest median is named with
      its rail (C(ucx_tcp) the fabric interface, C(ucx_rdma) the C(<hca>:<port>); with several rails the one with the
      lowest nominal rate, all of them in C(rails)).
    - C(engine), C(rail), C(rails), C(rate_bytes_s) (the median), C(pairs) (how many it is over), C(nominal_bits_s)
      (the rail's), C(engine_nominal_bits_s) (all its rails'), C(utilisation) (the median against the engine's
      nominal rate), C(virtual) (the rail is a virtual interface, such as a veth, whose nominal rate is its driver's
      figure) and C(tied) (engines with the same median, as both engines of a single pair have).
  returned: success
  type: dict
  sample: {"engine": "engine-2", "rail": "eth1", "rails": ["eth1"], "rate_bytes_s": 51200000, "pairs": 2,
           "nominal_bits_s": 10000000000, "engine_nominal_bits_s": 10000000000, "utilisation": 0.041,
           "virtual": true, "tied": ["engine-1"]}
rounds:
  description: How many rounds the pairs took.
  returned: success
  type: int
  sample: 2
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError, StepRun
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.transfer import module_spec, transfer_probe


def main():
    # the step is module_utils/_probe/transfer.py; the action plugin of the same name runs it in the controller's
    # process, this main() where the task runs on an engine host (narwhal_probe_from=consumer)
    module = AnsibleModule(**module_spec())
    task = StepRun(module.params, module.check_mode, module._diff)
    failure = None
    try:
        result = transfer_probe(task)
    except StepError as exc:
        failure = exc.result
    module.no_log_values.update(task.secrets)
    for warning in task.warnings:
        module.warn(warning)
    if failure is not None:
        module.fail_json(**failure)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
