#!/usr/bin/env python3
"""Generate .env.example and docs/inputs.md from the one input description
(plugins/module_utils/_inputs/catalogue.py). `--check` exits 1 when either file is out of date (a unit test runs it)."""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.narwhal.deploy.plugins.module_utils._discover.policy import KV_POLICY_KEYS, POLICY_KEYS
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import INPUTS, NODE_INPUTS

TUNING = """
## Per-engine tuning

Prefill and decode engines are usually tuned differently. `NARWHAL_EXTRA_ARGS`, `NARWHAL_ENGINE_ARGS` and
`NARWHAL_ENGINE_ENV` apply to every engine; `NARWHAL_NODE_<n>_EXTRA_ARGS` and `NARWHAL_NODE_<n>_ENGINE_ENV` to
engine-<n> only. Discovery records them in engine-<n>'s launch record ([launch records](launch-record.md)):

- `runtime.extra_args` = the derived flags (`--trust-remote-code` for a checkpoint with an `auto_map`), then
  `NARWHAL_EXTRA_ARGS`, then `NARWHAL_ENGINE_ARGS`, then `NARWHAL_NODE_<n>_EXTRA_ARGS`
  (`_discover/engine_args.py::engine_args`). A flag given twice (site `--max-num-seqs 64`, node `--max-num-seqs 8`)
  takes the later value: vLLM's argument parser keeps the last occurrence.
  `sources.extra_args` names each input with its words and the flags the node overrides.
- `runtime.environment` = the image's environment, then `NARWHAL_ENGINE_ENV`, then `NARWHAL_NODE_<n>_ENGINE_ENV`;
  the node's value wins. `sources.environment` names each input with its variables.

Both are checked like the site-level inputs: launcher-managed flags and variables and secret-looking names are
refused, the error naming the per-node key (`NARWHAL_NODE_2_EXTRA_ARGS: --port is set by the launcher ...`).
Prepare copies the record into the run (`runs/<run-id>/<engine>/`) and the manifest records both:
the arguments in `engines.<engine>.vllm_args`, the record with its environment by `record_sha256`.
The role environment that prepare writes carries no `NARWHAL_ENGINE_ARGS` or `NARWHAL_ENGINE_ENV`, and the
launcher refuses a role environment edited by hand to add them (it reads only the keys prepare writes,
`_plan/role_env.py::ROLE_ENV_KEYS`). Tune engines through `.env`, where discovery records the tuning and prepare
checks it (below).

## Overrides from the shell

`NARWHAL_*` inputs exported in the controller's environment override `.env`. Sourcing the generated
`config/deployment.env` exports `NARWHAL_NODE_<n>_IP`, `_URL`, `_ATTESTATION_URL`, `_ENGINE_PORT`, `_ATTEST_PORT`,
`_ROLE` and `_FABRIC_INTERFACE`; read as overrides, they would pin those nodes to the last discovery's values, and a
later `NARWHAL_ENGINE_PORT` change would be ignored for them. So the inputs step (`_inputs/site.py`) looks
for nodes whose every generated name the environment holds (what sourcing the file leaves behind), and compares
each of those with the current `deployment.env`:

- the same value: it is generated, not an override. It is ignored (with a warning naming it), and `.env` and
  discovery decide the value as if the shell did not hold it;
- another value (an older `deployment.env` sourced before discovery rewrote it), and not the value `.env` sets:
  refused, naming the variable, both values and where each comes from. Unset it or open a new shell; to override
  a node's value on purpose, set it in `.env` or export only the names you mean.

A node the environment names only in part (`NARWHAL_NODE_2_IP=... ansible-playbook ...`, the seed's explicit
address) is an override on purpose, as before.

Names `deployment.env` does not generate (`NARWHAL_NODE_<n>_GPU_IDS`, ...) and every name before the first
discovery are overrides, as before. A blank value (`NARWHAL_NODE_1_URL=`) is unset wherever it is read.
"""

CHANGES = """
## Changing an input

Discovery records the launch policy the records come from in `engine-launch.policy.json` (in
`NARWHAL_CONFIG_DIR`, its sha256 in `engine-launch.sources.json`): %s, and every `NARWHAL_NODE_<n>_*` input of
each engine. Prepare verifies the extract against the index and compares it with the current inputs; records
older than their inputs are refused before anything is created, naming every changed input with both values:

    prepare refused, no run was created: NARWHAL_KV_CACHE_DTYPE changed since discovery (records: auto,
    .env now: fp8); the records (config/engine-launch.local.json, sha256 ...) were discovered from the old
    values; rerun discovery (ansible-playbook narwhal.deploy.discover), then prepare a new run

So after changing any of them: rerun discovery, then prepare a new run; the manifest then records the corrected
state. The other inputs (paths, engine checkout, API key file, ready timeout) are read by prepare, install and
launch themselves and take effect without rediscovery.
"""

RULES = """
## Rules every value follows

Refused when the inputs are read (site_inputs), each naming the key, the value and the fix, before anything is
written; these would otherwise pass silently or end up in generated files:

- **One line of printable text.** A value with a newline, carriage return, NUL, tab or other control character
  (also U+2028/U+2029) is refused: values are written into line-based files (`deployment.env`, the engines'
  role environments) and paths, where it could add a line such as `NARWHAL_RUN_DIR=/tmp/evil`.
- **Known keys, once.** An unknown `NARWHAL_*` key in `.env` is refused with the closest input (`did you mean
  NARWHAL_TRANSPORT?`), a key set twice (python-dotenv keeps the last silently), a line python-dotenv cannot
  parse (it skips it silently) and a `NARWHAL_*` key without `=`. Unknown `NARWHAL_*` variables of the controller
  environment are ignored, with a warning when they resemble an input. `NARWHAL_NODE_<n>_*` settings for an
  `engine-<n>` the inventory does not have are refused by discovery.
- **Numbers** are written with the ASCII digits 0-9 (`8_000`, `+8000` and full-width digits are refused);
  counts are at least 1, ports 1-65535; `NARWHAL_NODE_<n>_GPU_IDS` are distinct and non-negative. An engine's GPU
  count is TP x DP (`NARWHAL_TP_SIZE` x its data-parallel size): with `NARWHAL_TP_SIZE` set, its GPU ids, or
  `NARWHAL_GPUS_PER_ENGINE`, times its hosts (`NARWHAL_NODE_<n>_HOSTS`) must come to that; unset, TP is the GPU
  count divided by DP, which must divide it.
- **Addresses.** `NARWHAL_NODE_<n>_IP` is an address of `NARWHAL_BIND_FAMILY`, never loopback, unspecified,
  link-local, multicast or IPv4-mapped (`::ffff:10.0.0.11`: write the IPv4 address). URL hosts are a dotted-quad
  IPv4 address, a bracketed IPv6 address or a DNS name: other numeric spellings (`127.1`, `0x7f.0.0.1`), loopback
  and localhost names (`localhost.`) are refused. `NARWHAL_NODE_<n>_URL` is `scheme://host:port` only;
  `NARWHAL_NODE_<n>_ATTESTATION_URL` may add a path; neither may carry user information, a query or a fragment.
  Discovery refuses a fabric interface whose link is down.
- **Names and paths.** `NARWHAL_SERVED_MODEL_NAME` (and, when it is unset, the last component of
  `NARWHAL_MODEL_PATH`) takes letters, digits and `. _ - + : @ /`, starts with a letter or digit and has no empty,
  `.` or `..` component: the engines mount the checkpoint at `/models/<name with / as _>`. Engine-host paths
  (`NARWHAL_MODEL_PATH`, `NARWHAL_ENGINE_CHECKOUT`) are absolute, below `/`, without `,` (docker `--mount`
  separates options by commas) or `.`/`..` components. Controller paths have no `..` component and no `~`.
  Image references and package names take their usual characters only.
- **Outputs of their own, out of git.** The fleet, the launch records, the files discovery writes into
  `NARWHAL_CONFIG_DIR` (`deployment.env`, `engine-launch.policy.json`, `engine-launch.sources.json`,
  `engine-launch.<engine>.inspection.json`) and the run directory each need a path of their own (compared after
  resolving symbolic links), none may be the `.env` file or the API key file, and one inside the project directory
  must be git-ignored (asked with `git check-ignore`; without git or a repository, the site paths of the shipped
  `.gitignore`: `config/fleet.json`, `config/fleet.*.json`, `config/engine-launch.*.json`, `config/deployment.env`,
  `config/<dir>/`, `config/*.key`, `runs/`). `NARWHAL_CONFIG_DIR=docs` is refused: the records would land in a
  tracked folder.
"""


INVENTORY = """## The inventory

Every engine is one host of the inventory's group `engines`, and node `<n>` of `.env` (`NARWHAL_NODE_<n>_*`) is
the engine `engine-<n>`: its name in `.env`, the records, the fleet, the runs and the container
(`narwhal-engine-<n>`). The inventory host keeps the operator's own name; the host variable `narwhal_node: <n>` (a
positive integer, in the inventory file or `host_vars/`) ties it to node `<n>`. A host named `engine-<n>` is node
`<n>` without it.

```yaml
engines:
  hosts:
    gpu-a17.dc1.example: {narwhal_node: 1}
    gpu-b03.dc1.example: {narwhal_node: 2}
    engine-3: {}                        # node 3 by its name
```

`-l gpu-a17.dc1.example`, `-l prefill` and `-l decode` select engines; every table shows the engine next to its
inventory host. `.env` stays the one source of the roles: the `narwhal.deploy.fleet_groups` inventory plugin and
every playbook's opening add each engine to `prefill` or `decode` from `NARWHAL_NODE_<n>_ROLE`, and an inventory
group `prefill`/`decode` of the operator's own that holds an engine of the other role (or none) is refused naming
the host, its engine and the key. Refused as well, naming the host: an engine host with neither `narwhal_node` nor
an `engine-<n>` name, a `narwhal_node` that is not a positive integer, a host named `engine-<n>` whose
`narwhal_node` is another number, and two hosts with one node. Two engines on one machine stay possible: two
inventory hosts with the same `ansible_host`, each with its node, ports and GPUs.

### An engine across hosts

An engine whose data-parallel ranks do not fit one host spans several (`NARWHAL_NODE_<n>_HOSTS`, e.g. DeepSeek-V3
with DP 16 over two 8-GPU hosts). Each of its hosts is an inventory host of group `engines` with the engine's
`narwhal_node` and its own `narwhal_rank`: `0` for the head (it serves the engine's HTTP API, its fabric address is
the engine's URL and vLLM's `--data-parallel-address`), `1` .. for the others (`vllm serve --headless
--data-parallel-start-rank`). Every host runs DP / hosts ranks on `NARWHAL_GPUS_PER_ENGINE` (or
`NARWHAL_NODE_<n>_GPU_IDS`) of its GPUs, from the same image and checkpoint; the engine is still one engine:
one record (the head's, with `members` for the others), one URL, one row of discovery's table; status and the
closing tables show a row per host (`<engine>#<k>` in the status report).

```yaml
engines:
  hosts:
    gpu-a17.dc1.example: {narwhal_node: 1, narwhal_rank: 0}   # engine-1's head
    gpu-a18.dc1.example: {narwhal_node: 1, narwhal_rank: 1}   # engine-1's second host
    gpu-b03.dc1.example: {narwhal_node: 2}
```

Refused, naming the hosts: two hosts of one node without ranks, a repeated or missing rank, a rank that is not 0 ..
99, an engine with another number of hosts than `NARWHAL_NODE_<n>_HOSTS`, a DP size the hosts cannot share equally,
two hosts of the engine on one machine, and hosts of one engine whose image, GPUs (product and count) or
checkpoint differ.

"""


def _shown(value):
    """A default as .env spells it (a bool as true/false)."""
    return str(value).lower() if isinstance(value, bool) else value


def _commented(spec):
    """The value a commented-out line shows: the default, else the example, else nothing."""
    if spec.get("default") not in (None, ""):
        return _shown(spec["default"])
    return "" if spec.get("example") is None else spec["example"]


def env_example():
    """The operator's first .env (narwhal.deploy.init copies it): set are only the inputs every site must decide
    (the required ones and the engines' roles); every other input is commented out with its default or example."""
    out = ["# narwhal.deploy site inputs. Copy to .env (git-ignored) and fill in.",
           "# Generated from plugins/module_utils/_inputs/catalogue.py by scripts/gen-inputs.py; docs/inputs.md",
           "# explains every variable. The process environment overrides this file. Values are literal: ${VAR} is",
           "# not expanded.",
           "# The lines that are set are what every site must decide. Every other input is commented out with its",
           "# default (or an example where it has none): remove the '# ' to set it.", ""]
    for spec in INPUTS:
        out.append("# %s" % spec["doc"])
        extra = ("required" if spec.get("required") else
                 "optional" if spec.get("default") is None else "default: %s" % _shown(spec.get("default")))
        if spec.get("choices"):
            extra += "; one of %s" % ", ".join(spec["choices"])
        out.append("# (%s)" % extra)
        if spec.get("required"):
            out.append("%s=%s" % (spec["name"], spec["example"]))
        else:
            out.append("# %s=%s" % (spec["name"], _commented(spec)))
        out.append("")
    out.append("# Per engine: node <n> is the inventory host with narwhal_node: <n> (or named engine-<n>). The "
               "two-engine minimum:")
    for spec in NODE_INPUTS:
        out.append("# NARWHAL_NODE_<n>_%s: %s" % (spec["name"], spec["doc"]))
        example = spec.get("example")
        if isinstance(example, list):
            for n, value in enumerate(example, 1):
                out.append("NARWHAL_NODE_%d_%s=%s" % (n, spec["name"], value))
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def docs():
    out = ["# Site inputs (`.env`)", "",
           "Generated from `plugins/module_utils/_inputs/catalogue.py` (`make docs`); validation reads the same",
           "description.",
           "The controller reads `.env` in the project directory (or `$NARWHAL_ENV_FILE`) with python-dotenv;",
           "`NARWHAL_*` variables of the process environment override it. Every bad value stops discovery with",
           "an error naming the variable, before anything is written.", "",
           "Values are literal: `${VAR}` in `.env` is not expanded from the controller's environment (python-dotenv",
           "runs with `interpolate=False`), so `NARWHAL_MODEL_PATH=${HOME}/m` stays the text `${HOME}/m`, which is",
           "refused as not absolute; a value holding `${...}` draws a warning. The one substitution is the",
           "fleet file's complete-value `${NAME}` (docs/substitution.md). Secret-looking values (of names with",
           "KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL, after `--api-key`/`--hf-token`-style flags, URL passwords,",
           "bearer tokens, the controller environment's own secrets) show as `<redacted>` in every error.", "",
           "| variable | kind | default | meaning |", "|---|---|---|---|"]
    for spec in INPUTS:
        kind = spec["kind"] + (" (%s)" % "/".join(spec["choices"]) if spec.get("choices") else "")
        default = ("required" if spec.get("required") else "(unset)" if spec.get("default") is None
                   else "`%s`" % _shown(spec.get("default")))
        out.append("| `%s` | %s | %s | %s |" % (spec["name"], kind, default, spec["doc"]))
    out += [""] + INVENTORY.splitlines()
    out += ["## Per node", "", "`<n>` is the node number: the inventory host with `narwhal_node: <n>`, or the host "
            "named `engine-<n>`.", "", "| variable | kind | meaning |", "|---|---|---|"]
    for spec in NODE_INPUTS:
        out.append("| `NARWHAL_NODE_<n>_%s` | %s | %s |" % (spec["name"], spec["kind"], spec["doc"]))
    out += RULES.splitlines()
    out += TUNING.splitlines()
    kv_keys = ", ".join("`%s`" % k for k in KV_POLICY_KEYS)
    kv_note = " (the prefill policy as it applies, from `NARWHAL_ROUTER_POLICY` when the role's own is unset)"
    out += (CHANGES % (", ".join("`%s`" % k for k in POLICY_KEYS) + "; while KV events are on, also " + kv_keys
                       + kv_note)).splitlines()
    return "\n".join(out) + "\n"


def main():
    targets = {ROOT / ".env.example": env_example(), ROOT / "docs" / "inputs.md": docs()}
    stale = [p for p, text in targets.items() if not p.exists() or p.read_text() != text]
    if "--check" in sys.argv:
        for p in stale:
            print("%s is out of date: run make docs" % p.relative_to(ROOT))
        return 1 if stale else 0
    for p in stale:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(targets[p])
        print("wrote %s" % p.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
