"""The lookup probe_engines (plugins/lookup/probe_engines.py) over what discovery_outputs really writes: each
engine's link with the nominal rates read on its host (the real H100 sysfs dump's NDR ports; an interface speed) and
its longest sequence; unreadable or older extracts say why; and the plugin as ansible-playbook loads it."""
import json
import os
import pathlib
import subprocess
import sys

from test_support.paths import REPO
from test_support.records import module_args, nv_pair, rdma_pair

from ansible_collections.narwhal.deploy.plugins.lookup.probe_engines import probe_engines

NIC = {"mbps": 100000, "virtual": False, "why": None}


def discover(step_runner, tmp_path, hosts, extra=None, speed=None):
    speed = speed or NIC
    root = tmp_path / "checkout"
    root.mkdir()
    args = module_args(root, hosts, extra)
    for facts in args["interfaces"].values():
        facts["speed"] = speed
    status, result = step_runner("discovery_outputs", args)
    assert status == "exit", result
    config = root / "config"
    return json.loads((config / "engine-launch.local.json").read_text()), config


def test_rdma_engines_have_their_rails_at_the_ports_rates(step_runner, tmp_path, dev):
    launch, config = discover(step_runner, tmp_path, rdma_pair(tmp_path), {"NARWHAL_TRANSPORT": "ucx_rdma"})
    found = probe_engines(launch, str(config))
    for engine in ("engine-1", "engine-2"):
        rails = launch["engines"][engine]["transfer"]["net_devices"]
        link = found["links"][engine]
        assert len(rails) == 4 and [r["rail"] for r in link["rails"]] == rails
        assert [r["rate"] for r in link["rails"]] == ["400 Gb/sec (4X NDR)"] * 4
        assert link["nominal_bits_s"] == 4 * 400 * 10 ** 9 and link["transport"] == "ucx_rdma"
    # no --max-model-len in the records: the checkpoint's (Llama 3.1 8B, max_position_embeddings 131072)
    assert found["max_model_len"] == {"engine-1": 131072, "engine-2": 131072}
    assert found["max_model_len_from"]["engine-1"] == "the checkpoint's config (no --max-model-len in the record)"


def test_tcp_engines_have_the_interface_speed_and_the_record_bound(step_runner, tmp_path, dev):
    launch, config = discover(step_runner, tmp_path, nv_pair(tmp_path),
                              {"NARWHAL_NODE_2_EXTRA_ARGS": "--max-model-len 512"})
    found = probe_engines(launch, str(config))
    assert found["links"]["engine-1"]["rails"] == [{"rail": "eth1", "nominal_bits_s": 10 ** 11, "rate": "100000 Mb/s",
                                                    "virtual": False, "why": None}]
    assert found["max_model_len"] == {"engine-1": 131072, "engine-2": 512}
    assert found["max_model_len_from"]["engine-2"] == "--max-model-len in the record"


def test_missing_and_older_extracts_give_unknown_rates_with_the_reason(step_runner, tmp_path, dev):
    launch, config = discover(step_runner, tmp_path, nv_pair(tmp_path))
    (config / "engine-launch.engine-1.inspection.json").unlink()
    older = json.loads((config / "engine-launch.engine-2.inspection.json").read_text())
    del older["host"]["interface_speed"]
    (config / "engine-launch.engine-2.inspection.json").write_text(json.dumps(older))
    found = probe_engines(launch, str(config))
    one, two = found["links"]["engine-1"], found["links"]["engine-2"]
    assert one["nominal_bits_s"] is None and "cannot read %s" % (config / "engine-launch.engine-1.inspection.json") \
        in one["why"] and "rerun discovery" in one["why"]
    assert two["nominal_bits_s"] is None and "earlier release" in two["why"]
    assert found["max_model_len"]["engine-1"] is None and found["max_model_len"]["engine-2"] == 131072


def test_the_lookup_as_ansible_loads_it(step_runner, tmp_path, dev):
    launch, config = discover(step_runner, tmp_path, nv_pair(tmp_path))
    env = dict((k, v) for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "NARWHAL_")))
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_NOCOLOR="1", ANSIBLE_STDOUT_CALLBACK="json")
    term = "{{ lookup('narwhal.deploy.probe_engines', '%s') }}" % (config / "engine-launch.local.json")
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible"), "localhost", "-m",
                          "ansible.builtin.debug", "-a", "msg=%s" % term, "-c", "local"],
                         capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert '"nominal_bits_s": 100000000000' in out.stdout and '"max_model_len_from"' in out.stdout
    missing = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible"), "localhost", "-m",
                              "ansible.builtin.debug", "-a", "msg={{ lookup('narwhal.deploy.probe_engines', "
                              "'%s') }}" % (tmp_path / "none.json"), "-c", "local"],
                             capture_output=True, text=True, env=env, timeout=120, check=False, cwd=tmp_path)
    assert missing.returncode != 0 and "cannot read the launch config" in missing.stdout + missing.stderr
