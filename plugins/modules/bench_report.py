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
