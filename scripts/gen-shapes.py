#!/usr/bin/env python3
"""Plan the shapes operators deploy (docs/shapes.md): for each directory docs/examples/shapes/<shape>/, the launch
config discovery writes and the containers prepare derives, from the shape's inputs, with the collection's own code.

A shape directory holds the operator's inputs:
- site.env: the .env of the shape;
- hosts.yml: the inventory: group engines, each host under the operator's own name with narwhal_node: <n> (two
  engines on one machine are two inventory hosts with the same ansible_host), and the variables only this generator
  reads (sim_*, which the collection ignores): per host the proving-ground hardware profile (sim_profile:
  tests/harness/profiles/<profile>) and fabric address (sim_fabric_ipv4), for the group the fabric subnet
  (sim_fabric_subnet4) and the model config (sim_model_config: a file of tests/fixtures/real/models, placed as the
  checkpoint's config.json in a temporary directory for read_checkpoint).
Each machine (ansible_host) is read as engine_host_facts reads a simulated host of its profile (the readers of
scripts/proving_ground.py, shared with scripts/gen-example-record.py: GPUs, RDMA, the stand-in image); its
node.host_id is the value host_id() returns on a machine named ansible_host without a machine-id, so inventory hosts
of one machine share it.

Next to the inputs it writes:
- engine-launch.json: discovery's launch config (build_fleet, collect_records, launch_config_errors), dumped as
  discovery dumps it;
- commands.txt: for each engine the container the launcher starts, as `docker run` reads it (prepare's derive():
  the role environment and the one planner, container_spec, then docker_run_argv; the API key redacted), the
  `vllm serve` command inside it, then the verdicts of prepare's P/D handshake gate (_prepare/gate.py::check_pairs)
  with the factors it compared, and of its shared-host check (_prepare/checks.py::shared_hosts).

A shape directory with a file PENDING is not planned (the file says what it waits for). `--check` exits 1 when a
generated file is out of date; `--shapes DIR` plans the shapes below DIR instead. A unit test regenerates every shape
and compares (tests/unit/scripts/test_gen_shapes.py).
"""

import hashlib
import os
import pathlib
import shlex
import shutil
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # proving_ground, also when loaded by a test

import proving_ground as pg  # noqa: E402  pylint: disable=wrong-import-position
from proving_ground import REAL, ROOT, SiteError  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import (  # noqa: E402
    NODE_VAR,
    RANK_VAR,
    engine_hosts,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.outputs import dump  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import read_checkpoint  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import read_dotenv  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import (  # noqa: E402
    check_engine_hosts,
    engine_settings,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import docker_run_argv  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.parallel import member_view  # noqa: E402
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.checks import (  # noqa: E402
    derive,
    shared_hosts,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.gate import (  # noqa: E402
    EQUAL,
    check_pairs,
    factors,
    pair_problem,
)

SHAPES = ROOT / "docs" / "examples" / "shapes"
MODELS = REAL / "models"
PENDING = "PENDING"
LAUNCH_CONFIG = "engine-launch.json"
COMMANDS = "commands.txt"
# prepare's run ID is a hash of the prepared run (records, derived containers, launcher); the container does not
# depend on it (it names the run directory of the role environment only)
RUN_ID = "run-000000000000"
GUARD = ROOT / "roles" / "install" / "files" / "guard" / "narwhal_guard.py"


def access(site, engine):
    """What prepare_run gives derive() for who gets in: NARWHAL_ENGINE_BIND, the key guard's sha256 and, with
    NARWHAL_TLS on, the engine's certificate, whose sha256 here is a placeholder (the site CA issues the certificate
    at prepare, tls_material: its sha256 differs per site)."""
    tls = None if site.get("NARWHAL_TLS", "off") == "off" else {
        "sha256": hashlib.sha256(("the certificate of %s (a placeholder)" % engine).encode()).hexdigest()}
    return {"bind": site.get("NARWHAL_ENGINE_BIND") or "", "tls": tls,
            "guard_sha256": hashlib.sha256(GUARD.read_bytes()).hexdigest()}


def shape_dirs(root=SHAPES):
    """The shape directories below root (those with a site.env), by name."""
    return sorted(p for p in pathlib.Path(root).iterdir() if (p / "site.env").is_file())


def pending(directory):
    """Why the shape is not planned yet (its PENDING file), or None."""
    path = pathlib.Path(directory) / PENDING
    return path.read_text().strip() if path.exists() else None


def inventory(directory):
    """-> (group vars, [(inventory host, its variables)]) of the group engines of the shape's hosts.yml."""
    data = yaml.safe_load((pathlib.Path(directory) / "hosts.yml").read_text()) or {}
    group = data.get("engines") or {}
    hosts = group.get("hosts") or {}
    if not hosts:
        raise SiteError("%s/hosts.yml has no hosts in group engines" % directory)
    return dict(group.get("vars") or {}), [(name, dict(hvars or {})) for name, hvars in hosts.items()]


def _need(where, variables, key):
    if variables.get(key) in (None, ""):
        raise SiteError("%s has no %s" % (where, key))
    return variables[key]


def checkpoint(tmp, model_path, config_name):
    """narwhal_model of a checkpoint holding the real model config `config_name` (tests/fixtures/real/models) as its
    config.json, and the model's tokenizer config next to it where the fixtures have one."""
    source = MODELS / config_name
    if not source.is_file():
        raise SiteError("sim_model_config %s is not a file of %s" % (config_name, MODELS))
    directory = pathlib.Path(tmp) / "models" / os.path.basename(model_path.rstrip("/"))
    directory.mkdir(parents=True)
    shutil.copyfile(str(source), str(directory / "config.json"))
    tokenizer = MODELS / config_name.replace("__config.json", "__tokenizer_config.json")
    if config_name.endswith("__config.json") and tokenizer.is_file():
        shutil.copyfile(str(tokenizer), str(directory / "tokenizer_config.json"))
    return read_checkpoint(str(directory))


def plan(directory):
    """The shape planned: {"inputs", "engines": {inventory host: engine}, "machines": {engine: ansible_host},
    "document": the launch config, "derived": {engine: derive()}}."""
    directory = pathlib.Path(directory)
    inputs = load_inputs(read_dotenv(str(directory / "site.env")))
    site = inputs["site"]
    group_vars, hosts = inventory(directory)
    members = engine_hosts([(name, hvars.get(NODE_VAR), hvars.get(RANK_VAR)) for name, hvars in hosts])
    check_engine_hosts(members, inputs)
    names = dict((host, engine) for engine, names in members.items() for host in names[:1])
    requested = pg.requested_packages(site)
    facts, interfaces, machines, spread = {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        model = checkpoint(tmp, site["NARWHAL_MODEL_PATH"], _need("hosts.yml engines vars", group_vars,
                                                                  "sim_model_config"))
        for name, hvars in hosts:
            engine = [e for e, hs in members.items() if name in hs][0]
            rank = members[engine].index(name)
            where = "hosts.yml host %s" % name
            machine = _need(where, hvars, "ansible_host")
            settings = engine_settings(inputs, engine)
            address = ("inet", _need(where, hvars, "sim_fabric_ipv4"),
                       _need("hosts.yml engines vars", group_vars, "sim_fabric_subnet4"))
            interface = pg.interface(settings["fabric_interface"], [address], machine)
            found = pg.host_facts(_need(where, hvars, "sim_profile"), pathlib.Path(tmp) / "dev" / machine,
                                  settings["image"], requested, model)
            if rank:  # another host of an engine across hosts, as discovery gathers it (_plugin_utils/_hostvars.py)
                spread.setdefault(engine, []).append({"host": name, "interface": interface, "inspection": found})
                machines["%s/%d" % (engine, rank)] = machine
                continue
            interfaces[engine], facts[engine], machines[engine] = interface, found, machine
    for engine in spread:
        spread[engine].sort(key=lambda m, e=engine: members[e].index(m["host"]))
    document, _fleet = pg.launch_config(inputs, sorted(names.values(), key=_node), interfaces, facts, spread)
    derived = dict((engine, derive(record, site["NARWHAL_ENGINE_CHECKOUT"], RUN_ID, access(site, engine)))
                   for engine, record in document["engines"].items())
    return {"inputs": inputs, "engines": names, "machines": machines, "document": document, "derived": derived}


def _node(engine):
    return int(engine.rsplit("-", 1)[1])


def shell_lines(argv, indent="    "):
    """A command as shell lines joined by backslash-newline: a new line at each option (a word starting with -)
    except docker's -d, so each option stands on its line with its value."""
    lines = [[]]
    for word in argv:
        if word.startswith("-") and word != "-d" and lines[-1]:
            lines.append([])
        lines[-1].append(shlex.quote(word))
    return (" \\\n" + indent).join(" ".join(line) for line in lines)


def gate_verdict(records):
    """The P/D gate over the fleet, as lines: each prefill/decode pair with what vLLM's handshake compares, then the
    verdict of check_pairs (passes, or its refusal)."""
    lines = []
    facts = dict((engine, factors(record)) for engine, record in records.items())
    prefill = sorted((e for e, r in records.items() if r["role"] == "prefill"), key=_node)
    decode = sorted((e for e, r in records.items() if r["role"] == "decode"), key=_node)
    first = facts[prefill[0]]
    lines.append("Compared for equality on every prefill/decode pair (vLLM's NIXL compatibility hash and handshake):")
    for name in EQUAL:
        values = sorted(set(_show(facts[e][name]["value"]) for e in prefill + decode))
        shown = values[0] if len(values) == 1 else "differs: " + " / ".join(values)
        lines.append("  %-40s %s" % (first[name]["label"] + ":", shown))
    for p in prefill:
        for d in decode:
            tp_p, tp_d = records[p]["tensor_parallel_size"], records[d]["tensor_parallel_size"]
            problem = pair_problem(records[p], records[d], facts[p], facts[d])
            lines.append("%s (prefill, TP %d) x %s (decode, TP %d): %s" % (
                p, tp_p, d, tp_d, "handshake predicted to succeed" if problem is None else
                "refused by %s: %s" % problem))
            if problem is None and tp_p != tp_d:
                lines += ["  " + line for line in tp_mapping(records[p], records[d], facts[p])]
    lines.append(verdict(check_pairs, records,
                         "check_pairs: every prefill/decode pair would complete vLLM's NIXL handshake"))
    return lines


def verdict(check, records, passes):
    """The verdict line of one of prepare's checks over the records: passes (what it proves) or its refusal."""
    try:
        check(records)
    except InputError as exc:
        return "Verdict: refused: %s" % exc
    return "Verdict: passes (%s)" % passes


def _show(value):
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def tp_mapping(producer, consumer, facts):
    """How vLLM maps an unequal TP pair that the gate accepted, in its own terms (TransferTopology), as lines."""
    tp_p, tp_c = producer["tensor_parallel_size"], consumer["tensor_parallel_size"]
    heads = facts["num_kv_heads"]["value"]
    small, large = min(tp_p, tp_c), max(tp_p, tp_c)
    lines = ["unequal TP: %d divides %d (tp_ratio %d)" % (small, large, large // small)]
    if facts["use_mla"]["value"]:
        lines.append("MLA: the latent KV is replicated on every rank, each rank reads it from one remote rank")
        return lines
    per_rank = (heads // small, small, heads // large, large, small, large // small)
    lines += ["the larger TP %d is at most the %d KV heads: no rank holds a replicated head" % (large, heads),
              "KV heads per rank: %d on the TP-%d engine, %d on the TP-%d engine; each rank of the TP-%d engine "
              "holds the heads of %d ranks of the other" % per_rank,
              "KV cache layout %s (head-contiguous), so a rank's heads are one contiguous slice of the remote block"
              % facts["kv_cache_layout"]["value"],
              "block size %s on both (the consumer's must be a multiple of the producer's, both ways under kv_both)"
              % facts["block_size"]["value"]]
    return lines


def shared_host_verdict(records, machines):
    """Prepare's shared-host check over the fleet, with each machine's engines, as lines."""
    lines = []
    by_machine = {}
    views = {}
    for engine in sorted(records, key=_node):
        views[engine] = records[engine]
        for member in records[engine].get("members") or []:
            views["%s/%d" % (engine, member["member"])] = member_view(records[engine], member["member"])
    for key in views:
        by_machine.setdefault(machines[key], []).append(key)
    for machine, engines in sorted(by_machine.items()):
        lines.append("%s (host_id %s):" % (machine, views[engines[0]]["node"]["host_id"]))
        for key in engines:
            view, node = views[key], views[key]["node"]
            low, high = node["side_channel_ports"]
            what = key if "/" not in key else "%s (narwhal_rank %s, headless)" % tuple(key.split("/"))
            lines.append("  %s: GPUs %s, %s, side channel %s" % (
                what, ",".join(str(i) for i in view["gpu_host_indices"]),
                "HTTP %d, attestation %d" % (node["engine_port"], node["attest_port"]) if "/" not in key else
                "no HTTP (the head serves it)", str(low) if low == high else "%d-%d" % (low, high)))
    lines.append(verdict(shared_hosts, records, "shared_hosts: no two engines of one machine share a GPU or a port"))
    return lines


def commands(shape, planned):
    """commands.txt of a planned shape."""
    records = planned["document"]["engines"]
    hosts = dict((engine, host) for host, engine in planned["engines"].items())
    out = ["# The containers of the shape %s, generated by scripts/gen-shapes.py from site.env and hosts.yml" % shape,
           "# (do not edit): what prepare derives for each engine (_prepare/checks.py::derive: the role environment",
           "# and the one planner, _plan/container.py::container_spec) as `docker run` reads it (docker_run_argv);",
           "# the launcher starts exactly that. The API key is redacted; the run ID is a placeholder (%s)," % RUN_ID,
           "# and so is the sha256 of each engine's TLS certificate (org.narwhal.tls-cert-sha256), which the site CA",
           "# issues at prepare.",
           ""]
    for engine in sorted(records, key=_node):
        record, derived = records[engine], planned["derived"][engine]
        across = " (the head of its %d hosts, narwhal_rank 0)" % (1 + len(record["members"])) \
            if record.get("members") else ""
        out.append("## %s (%s) on %s (machine %s)%s" % (engine, record["role"], hosts[engine],
                                                        planned["machines"][engine], across))
        out += _container_lines(derived)
        for member in record.get("members") or []:
            machine = planned["machines"]["%s/%d" % (engine, member["member"])]
            first = member["data_parallel_start_rank"]
            out.append("## %s (%s) on %s (machine %s): its host of narwhal_rank %d, DP ranks %d-%d, headless"
                       % (engine, record["role"], member["host"], machine, member["member"], first,
                          first + record["data_parallel_size_local"] - 1))
            out += _container_lines(derived["members"][str(member["member"])])
    out.append("## The P/D handshake gate (prepare: _prepare/gate.py::check_pairs)")
    out += gate_verdict(records)
    out.append("")
    out.append("## Shared hosts (prepare: _prepare/checks.py::shared_hosts)")
    out += shared_host_verdict(records, planned["machines"])
    return "\n".join(out) + "\n"


def _container_lines(derived):
    """One host's container: `docker run` and the command inside, then a blank line."""
    return [shell_lines(docker_run_argv(derived["container"])), "# inside the container:",
            " ".join(shlex.quote(w) for w in derived["container"]["entrypoint"] + derived["container"]["command"]),
            ""]


def generate(directory):
    """{file name: text} of the generated files of one shape."""
    directory = pathlib.Path(directory)
    planned = plan(directory)
    return {LAUNCH_CONFIG: dump(planned["document"]), COMMANDS: commands(directory.name, planned)}


def main():
    argv = sys.argv[1:]
    root = pathlib.Path(argv[argv.index("--shapes") + 1]) if "--shapes" in argv else SHAPES
    stale = []
    for directory in shape_dirs(root):
        why = pending(directory)
        if why is not None:
            print("%s: not planned (%s: %s)" % (directory.name, PENDING, why.splitlines()[0] if why else "pending"),
                  file=sys.stderr)
            continue
        try:
            files = generate(directory)
        except (SiteError, InputError) as exc:
            print("cannot plan the shape %s: %s" % (directory, exc), file=sys.stderr)
            return 2
        for name, text in sorted(files.items()):
            path = directory / name
            if "--check" in argv:
                if not path.exists() or path.read_text() != text:
                    stale.append(path)
            else:
                path.write_text(text)
    if stale:
        print("out of date: %s; run scripts/gen-shapes.py to regenerate" % ", ".join(str(p) for p in stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
