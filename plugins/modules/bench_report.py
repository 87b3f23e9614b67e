#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/bench_report.py does the work in the
# controller's process, with the step plugins/module_utils/_bench/results.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_report
short_description: Write one fleet benchmark run's figures on the controller
version_added: 0.2.0
description:
  - Writes C(<runs_dir>/bench-<stamp>/) with C(bench.json) (the plan, every step's figures, the rows, the router's
    overhead and the problems), C(table.txt) (the one-screen table) and C(latency.png) (latency against request rate
    for each target; matplotlib, pinned in requirements.txt), each mode C(0600).
  - With the prefix workload or policies (the plan's C(workload)), the targets side by side as well - TTFT p50/p99,
    throughput, the prefill and decode engines' prefix-cache hit rates from their own counters, the KV bytes NIXL
    moved - in C(table.txt) and C(bench.json)'s C(comparison); with policies also C(policies.png), TTFT p50 and p99
    by policy and load.
  - All or nothing - the files are written to a hidden directory beside it, renamed into place at the end; an
    interrupted run leaves no C(bench-<stamp>/). A directory of that stamp that already exists is refused.
  - The figures are written even when steps failed; the result's C(problems) name them (the role then fails).
options:
  runs_dir:
    description: The controller's runs directory (NARWHAL_RUNS_DIR).
    type: path
    required: true
  plan:
    description: The benchmark plan (the C(narwhal.deploy.bench_plan) filter).
    type: dict
    required: true
  results:
    description: Each step's figures by step ID (M(narwhal.deploy.bench_serve)'s C(result)).
    type: dict
    required: true
  failures:
    description: The refusal of each step that gave no result, by step ID (M(narwhal.deploy.bench_serve)'s C(msg)).
    type: dict
    default: {}
  context:
    description: What the run was measured against (the router's version and image, the engines' image), kept in
      C(bench.json).
    type: dict
    default: {}
  engines:
    description: The fleet's engines (the resolved fleet's entries; their C(engine), C(role) and C(url) are kept), so
      that the counters each step read from the engines (M(narwhal.deploy.bench_serve)'s C(counters), by engine URL)
      are summed by role.
    type: list
    elements: dict
    default: []
attributes:
  check_mode:
    description: Checks that the directory can be written (and matplotlib imported) and writes nothing.
    support: full
  diff_mode:
    description: Returns no diff; a new directory is written whole.
    support: none
  idempotent:
    description: Each run writes a new stamped directory (a benchmark is a measurement, not a state).
    support: none
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Keep the benchmark's figures
  narwhal.deploy.bench_report:
    runs_dir: runs
    plan: "{{ __bench_plan }}"
    results: "{{ __bench_results }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
dest:
  description: The run's directory.
  returned: always
  type: str
  sample: runs/bench-20261202T201500Z
table:
  description: The one-screen table.
  returned: always
  type: str
rows:
  description: One entry per step - target, load, completed, failed, throughput, goodput and p50/p90/p99 of ttft,
    tpot, itl and e2el (ms).
  returned: always
  type: list
  elements: dict
comparison:
  description: With the prefix workload or policies, one entry per target and load - C(target), C(load),
    C(completed), C(failed), C(request_throughput), C(output_throughput), C(p50_ttft_ms), C(p99_ttft_ms),
    C(vs_first) (TTFT p50 over the first target's at that load), C(prefill_prefix_hit_rate),
    C(decode_prefix_hit_rate), C(kv_mib).
  returned: when the plan has a workload
  type: list
  elements: dict
overhead:
  description: The router's overhead at each load (router minus direct, p50 and p99 TTFT and end-to-end, ms).
  returned: always
  type: list
  elements: dict
problems:
  description: Steps without a result or with failed requests.
  returned: always
  type: list
  elements: str
files:
  description: The files written.
  returned: always
  type: list
  elements: str
"""
