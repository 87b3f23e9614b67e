# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The shapes of docs/shapes.md (docs/examples/shapes/<shape>/): planned by scripts/gen-shapes.py from the shape's
site.env and hosts.yml with discovery's and prepare's own code, compared with the checked-in launch config and
commands, and held to the properties each shape exists to show."""

import json
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml
from test_support.paths import REPO, load_file

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.rdma_reader import read_sysfs_hcas
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import check_record, launch_config_errors
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.container import docker_run_argv
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.checks import derive, shared_hosts
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.gate import check_pairs

SCRIPT = REPO / "scripts" / "gen-shapes.py"
SHAPES = REPO / "docs" / "examples" / "shapes"
PROFILE_SYS = REPO / "tests" / "harness" / "profiles" / "nvidia-8gpu-rdma" / "sys"


gen = load_file("gen_shapes", SCRIPT)
PLANNED = ["1p1d-tp8", "dp8-ep-dsv3", "wide-ep-dsv3", "xpyd-unequal-tp"]


@pytest.fixture(scope="module")
def planned():
    return dict((shape, gen.plan(SHAPES / shape)) for shape in PLANNED)


def _records(shape):
    return json.loads((SHAPES / shape / gen.LAUNCH_CONFIG).read_text())["engines"]


def _variant(tmp_path, shape, *lines):
    """A copy of the shape's inputs with lines appended to its site.env (a later key wins in .env)."""
    directory = tmp_path / shape
    directory.mkdir(parents=True)
    for name in ("site.env", "hosts.yml"):
        shutil.copyfile(str(SHAPES / shape / name), str(directory / name))
    with open(str(directory / "site.env"), "a") as fh:
        fh.write("".join(line + "\n" for line in lines))
    return directory


def _active_ib_ports():
    return ["%s:%d" % (h["name"], p["port"]) for h in read_sysfs_hcas(str(PROFILE_SYS))
            for p in h["ports"] if p["active"] and p["link_layer"] == "InfiniBand"]


@pytest.mark.parametrize("shape", PLANNED)
def test_the_checked_in_shape_is_a_fresh_generation(shape):
    files = gen.generate(SHAPES / shape)
    assert sorted(files) == [gen.COMMANDS, gen.LAUNCH_CONFIG]
    for name, text in files.items():
        assert (SHAPES / shape / name).read_text() == text, (
            "docs/examples/shapes/%s/%s is not what the shape plans to now: run scripts/gen-shapes.py" % (shape, name))
    assert gen.generate(SHAPES / shape) == files  # nothing of the machine or the time reaches the files


def test_every_shape_is_planned():
    shapes = [p.name for p in gen.shape_dirs()]
    assert shapes == PLANNED
    assert [s for s in shapes if gen.pending(SHAPES / s) is None] == PLANNED


def test_wide_ep_each_engine_spans_two_hosts(planned):
    shape = planned["wide-ep-dsv3"]
    records = shape["document"]["engines"]
    assert sorted(records) == ["engine-1", "engine-2"]  # one record per engine, not per host
    for engine, first in (("engine-1", "10.40.2.1"), ("engine-2", "10.40.2.11")):
        record = records[engine]
        assert (record["data_parallel_size"], record["data_parallel_size_local"], record["tensor_parallel_size"]) == \
            (16, 8, 1)
        assert record["enable_expert_parallel"] is True and record["data_parallel_rpc_port"] == 29550
        assert record["node"]["address"] == first and record["node"]["side_channel_ports"] == [5600, 5607]
        [member] = record["members"]
        assert member["data_parallel_start_rank"] == 8 and member["node"]["side_channel_ports"] == [5608, 5615]
        assert len(member["gpu_ids"]) == 8 and len(member["transfer"]["net_devices"]) == 8
        assert member["node"]["host_id"] != record["node"]["host_id"]
        head = shape["derived"][engine]["vllm_args"]
        other = shape["derived"][engine]["members"]["1"]["vllm_args"]
        assert "--headless" not in head and head[head.index("--data-parallel-address") + 1] == first
        assert other[other.index("--data-parallel-start-rank") + 1] == "8" and "--headless" in other
        assert other[other.index("--data-parallel-address") + 1] == first
    assert member["host"] == "gpu-f02.dc1.example"
    text = gen.commands("wide-ep-dsv3", shape)
    assert "## engine-1 (prefill) on gpu-e02.dc1.example (machine gpu-e02.dc1.example): its host of narwhal_rank 1, " \
           "DP ranks 8-15, headless" in text
    assert "engine-1 (narwhal_rank 1, headless): GPUs 0,1,2,3,4,5,6,7, no HTTP (the head serves it), side channel " \
           "5608-5615" in text


def test_wide_ep_an_inconsistent_engine_across_hosts_is_refused(tmp_path):
    with pytest.raises(InputError) as exc:
        gen.plan(_variant(tmp_path, "wide-ep-dsv3", "NARWHAL_NODE_1_HOSTS=4", "NARWHAL_DATA_PARALLEL_SIZE=16"))
    assert exc.value.key == "NARWHAL_NODE_1_HOSTS"
    assert "engine-1 spans 4 host(s) by .env (NARWHAL_NODE_1_HOSTS=4) but the inventory has 2 host(s) of it in " \
           "group engines (gpu-e01.dc1.example, gpu-e02.dc1.example)" in str(exc.value)
    with pytest.raises(InputError) as exc:
        gen.plan(_variant(tmp_path / "odd", "wide-ep-dsv3", "NARWHAL_DATA_PARALLEL_SIZE=15"))
    assert exc.value.key == "NARWHAL_NODE_1_HOSTS"
    assert "the DP size must be a multiple of the host count" in str(exc.value)


def test_the_command_line_skips_pending_shapes_and_checks_the_rest(tmp_path):
    root = tmp_path / "shapes"
    root.mkdir()
    _variant(root, "1p1d-tp8")
    (root / "1p1d-tp8" / "PENDING").write_text("waits for something\n")
    run = [sys.executable, str(SCRIPT), "--shapes", str(root)]
    out = subprocess.run(run + ["--check"], capture_output=True, text=True, check=False)
    assert (out.returncode, out.stderr) == (0, "1p1d-tp8: not planned (PENDING: waits for something)\n")
    (root / "1p1d-tp8" / "PENDING").unlink()
    out = subprocess.run(run + ["--check"], capture_output=True, text=True, check=False)
    assert out.returncode == 1 and "out of date: " in out.stdout and "run scripts/gen-shapes.py" in out.stdout
    assert subprocess.run(run, check=False).returncode == 0
    for name in (gen.COMMANDS, gen.LAUNCH_CONFIG):
        assert (root / "1p1d-tp8" / name).read_text() == (SHAPES / "1p1d-tp8" / name).read_text()
    assert subprocess.run(run + ["--check"], check=False).returncode == 0


@pytest.mark.parametrize("shape", PLANNED)
def test_the_records_pass_the_record_check_and_prepare(shape):
    records = _records(shape)
    assert launch_config_errors({"version": 1, "engines": records}) == []
    for engine, record in records.items():
        check_record(record, engine)
    assert check_pairs(records) is None
    assert shared_hosts(records) is None


@pytest.mark.parametrize("shape", PLANNED)
def test_the_commands_are_the_planners_for_the_checked_in_records(shape):
    """commands.txt holds, for each engine, docker_run_argv of what prepare derives from that engine's record (with
    the shape's bind input, the key guard and, NARWHAL_TLS being on by default, a certificate)."""
    text = (SHAPES / shape / gen.COMMANDS).read_text()
    site = gen.plan(SHAPES / shape)["inputs"]["site"]
    for engine, record in _records(shape).items():
        argv = docker_run_argv(derive(record, site["NARWHAL_ENGINE_CHECKOUT"], gen.RUN_ID,
                                      gen.access(site, engine))["container"])
        assert "--middleware" in argv and ("--ssl-certfile" in argv) == (site["NARWHAL_TLS"] != "off")
        block = text.split("## %s (" % engine, 1)[1].split("\n", 1)[1].split("\n# inside the container:", 1)[0]
        assert shlex.split(block.replace("\\\n", " ")) == argv
        assert "VLLM_API_KEY=" in argv and "NARWHAL_GUARD_KEY_FILE=/narwhal/secrets/engine-api.key" in argv


def test_1p1d_tp8_is_two_whole_hosts_on_every_rail(planned):
    shape = planned["1p1d-tp8"]
    records = shape["document"]["engines"]
    rails = _active_ib_ports()
    assert len(rails) == 8
    assert sorted((r["role"], shape["machines"][e]) for e, r in records.items()) == [
        ("decode", "gpu-b03.dc1.example"), ("prefill", "gpu-a17.dc1.example")]
    assert len(set(r["node"]["host_id"] for r in records.values())) == 2
    for engine, record in records.items():
        assert record["tensor_parallel_size"] == 8
        assert record["gpu_host_indices"] == list(range(8))
        assert len(set(record["gpu_ids"])) == 8 and all(g.startswith("GPU-") for g in record["gpu_ids"])
        assert record["transfer"]["transport"] == "ucx_rdma"
        assert record["transfer"]["net_devices"] == rails  # every InfiniBand rail, one per GPU
        assert record["transfer"]["devices"] == ["/dev/infiniband/uverbs%d" % i for i in range(8)] + [
            "/dev/infiniband/rdma_cm"]
        command = shape["derived"][engine]["container"]
        assert command["command"][command["command"].index("--tensor-parallel-size") + 1] == "8"
        assert command["environment"]["UCX_NET_DEVICES"] == ",".join(rails)
        assert command["environment"]["CUDA_VISIBLE_DEVICES"] == ",".join(record["gpu_ids"])
        assert command["device_requests"][0]["device_ids"] == [str(i) for i in range(8)]
    assert "Verdict: passes (check_pairs" in gen.commands("1p1d-tp8", shape)


def test_dp8_ep_dsv3_is_eight_ranks_with_experts_and_a_side_channel_each(planned):
    shape = planned["dp8-ep-dsv3"]
    records = shape["document"]["engines"]
    rails = _active_ib_ports()
    for engine, record in records.items():
        assert (record["tensor_parallel_size"], record["data_parallel_size"], record["enable_expert_parallel"]) == (
            1, 8, True)
        assert len(set(record["gpu_ids"])) == 8 and record["transfer"]["net_devices"] == rails
        assert record["node"]["side_channel_ports"] == [5600, 5607]
        assert "NARWHAL_ENABLE_EXPERT_PARALLEL=true" in record["sources"]["parallelism"]
        assert record["runtime"]["cache_plan"]["block_size"] == 64
        command = shape["derived"][engine]["container"]["command"]
        at = command.index("--tensor-parallel-size")
        assert command[at:at + 5] == ["--tensor-parallel-size", "1", "--data-parallel-size", "8",
                                      "--enable-expert-parallel"]
    assert "Verdict: passes (check_pairs" in gen.commands("dp8-ep-dsv3", shape)


def test_expert_parallelism_on_a_dense_model_is_refused_by_its_key(tmp_path):
    shape = tmp_path / "ep-dense"
    shutil.copytree(SHAPES / "1p1d-tp8", shape)
    with open(shape / "site.env", "a") as env:
        env.write("NARWHAL_ENABLE_EXPERT_PARALLEL=true\n")
    with pytest.raises(InputError) as err:
        gen.plan(shape)
    assert err.value.key == "NARWHAL_ENABLE_EXPERT_PARALLEL"
    assert "a dense model (its config.json has no n_routed_experts" in str(err.value)
    assert "set NARWHAL_ENABLE_EXPERT_PARALLEL=false" in str(err.value)


def test_xpyd_co_hosted_prefills_take_distinct_gpus_ports_and_side_channels(planned):
    shape = planned["xpyd-unequal-tp"]
    records = shape["document"]["engines"]
    prefill = sorted(e for e, r in records.items() if r["role"] == "prefill")
    assert prefill == ["engine-1", "engine-2", "engine-3", "engine-4"]
    assert set(shape["machines"][e] for e in prefill) == {"gpu-c01.dc1.example"}
    assert len(set(records[e]["node"]["host_id"] for e in prefill)) == 1  # one machine: shared-host checks apply
    gpus = [set(records[e]["gpu_host_indices"]) for e in prefill]
    assert sorted(i for g in gpus for i in g) == list(range(8))  # distinct GPU sets covering the host
    ranges = sorted(tuple(records[e]["node"]["side_channel_ports"]) for e in prefill)
    assert all(a[1] < b[0] for a, b in zip(ranges[:-1], ranges[1:], strict=True))
    assert [shape["derived"][e]["container"]["environment"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for e in prefill] == \
        ["5600", "5601", "5602", "5603"]
    assert len(set(records[e]["node"]["engine_port"] for e in prefill)) == 4
    rails = [records[e]["transfer"]["net_devices"] for e in prefill]
    assert sorted(r for pair in rails for r in pair) == _active_ib_ports()  # each prefill its own two rails
    assert records["engine-5"]["tensor_parallel_size"] == 8
    assert [records[e]["tensor_parallel_size"] for e in prefill] == [2, 2, 2, 2]


def test_xpyd_the_gate_maps_unequal_tp(planned):
    shape = planned["xpyd-unequal-tp"]
    records = shape["document"]["engines"]
    assert check_pairs(records) is None
    text = gen.commands("xpyd-unequal-tp", shape)
    assert text.count("(prefill, TP 2) x engine-5 (decode, TP 8): handshake predicted to succeed") == 4
    assert "KV heads per rank: 4 on the TP-2 engine, 1 on the TP-8 engine" in text
    assert "KV cache layout HND (head-contiguous)" in text


def test_xpyd_the_gate_refuses_a_decode_of_another_block_size(tmp_path, planned):
    """A decode discovered with another NARWHAL_BLOCK_SIZE: vLLM's handshake would refuse the pair."""
    records = dict(planned["xpyd-unequal-tp"]["document"]["engines"])
    other = gen.plan(_variant(tmp_path, "xpyd-unequal-tp", "NARWHAL_BLOCK_SIZE=32"))["document"]["engines"]
    records["engine-5"] = other["engine-5"]
    with pytest.raises(InputError) as exc:
        check_pairs(records)
    assert exc.value.key == "NARWHAL_BLOCK_SIZE"
    assert "engine-1 (prefill) and engine-5 (decode) would fail vLLM's NIXL handshake: effective KV block size " \
           "differs (16 on engine-1 (cache plan) vs 32 on engine-5 (cache plan))" in str(exc.value)
    text = gen.gate_verdict(records)
    assert text[-1].startswith("Verdict: refused: NARWHAL_BLOCK_SIZE: engine-1 (prefill) and engine-5 (decode)")


def test_xpyd_the_gate_refuses_unequal_tp_on_a_layout_that_is_not_head_contiguous(tmp_path):
    planned = gen.plan(_variant(tmp_path, "xpyd-unequal-tp", "NARWHAL_ENGINE_ENV=VLLM_KV_CACHE_LAYOUT=NHD"))
    with pytest.raises(InputError) as exc:
        check_pairs(planned["document"]["engines"])
    assert exc.value.key == "NARWHAL_TP_SIZE"
    assert "TP 2 on engine-1 vs 8 on engine-5 with the NHD KV layout: heterogeneous TP splits KV heads and needs " \
           "the head-contiguous HND (LBHNC) layout" in str(exc.value)
    verdict = "Verdict: refused: NARWHAL_TP_SIZE: engine-1 (prefill) and engine-5 (decode)"
    assert verdict in gen.commands("xpyd-unequal-tp", planned)


def test_discovery_refuses_co_hosted_engines_on_one_port(tmp_path):
    with pytest.raises(InputError) as exc:
        gen.plan(_variant(tmp_path, "xpyd-unequal-tp", "NARWHAL_NODE_2_ENGINE_PORT=8000"))
    assert exc.value.key == "NARWHAL_NODE_2_ENGINE_PORT"
    assert "engine-1 and engine-2 share a host and both use port 8000" in str(exc.value)


def test_the_inventories_use_the_operators_names(planned):
    for shape in PLANNED + ["wide-ep-dsv3"]:
        hosts = yaml.safe_load((SHAPES / shape / "hosts.yml").read_text())["engines"]["hosts"]
        assert not any(name.startswith("engine-") for name in hosts)
        assert all(isinstance(v["narwhal_node"], int) for v in hosts.values())
    assert planned["xpyd-unequal-tp"]["engines"]["gpu-c01-p3"] == "engine-3"


def test_docs_present_each_shape_with_its_commands():
    doc = (REPO / "docs" / "shapes.md").read_text()
    for shape in PLANNED:
        assert "examples/shapes/%s/" % shape in doc
        text = (SHAPES / shape / gen.COMMANDS).read_text()
        serve = [line for line in text.splitlines() if line.startswith("vllm serve ")]
        assert serve and serve[0] in doc, "docs/shapes.md does not quote the first vllm serve command of %s" % shape
    for page in ("README.md", "docs/architecture.md"):
        assert "shapes.md" in (REPO / page).read_text()
