"""bench/prefix_routing.py (`make prefix-bench`): the pure parts, the site's .env (its inputs are real inputs and
valid as the collection reads them), the simulated site, the image cache's name and the refused arguments. The
benchmark itself needs a simulated site and docker and is not run by the suite (docs/fleet-benchmark.md)."""
from __future__ import annotations

import sys

import pytest
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.catalogue import INPUTS
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs

sys.path.insert(0, str(REPO / "bench"))

import day_two  # noqa: E402 - bench/day_two.py
import prefix_routing  # noqa: E402 - bench/prefix_routing.py


def test_the_env_is_a_prefix_workload_over_every_policy_on_engines_that_publish_events():
    values = prefix_routing.env_values(prefix_routing.parse([]))
    assert values["NARWHAL_BENCH_WORKLOAD"] == "prefix" and values["NARWHAL_KV_EVENTS"] == "on"
    assert values["NARWHAL_BENCH_POLICIES"] == "round_robin,cache_aware,kv_aware"
    assert values["NARWHAL_BENCH_IMAGE"] == "narwhal-sim/vllm-cpu:latest"
    assert values["NARWHAL_ENGINE_ENV"] == "NARWHAL_STANDIN_PREFILL_S_PER_TOK=0.002"
    assert values["NARWHAL_MODEL_PATH"] == "/srv/models/tiny-llama-real"
    assert values["NARWHAL_EXTRA_ARGS"] == "--max-model-len 512"
    assert [values["NARWHAL_NODE_%d_ROLE" % i] for i in range(1, 5)] == ["prefill", "decode", "prefill", "decode"]
    # every site input it sets is one the collection knows (a misspelt key would be refused by discovery)
    known = {spec["name"] for spec in INPUTS}
    assert not sorted(k for k in values if not k.startswith("NARWHAL_NODE_") and k not in known)
    # and valid as discovery reads them
    load_inputs(dict(values, NARWHAL_FABRIC_INTERFACE="eth1"))
    lines = prefix_routing.env_text(values).splitlines()
    assert "NARWHAL_EXTRA_ARGS='--max-model-len 512'" in lines
    assert "NARWHAL_BENCH_PREFIXES=8" in lines


def test_its_own_site_beside_the_other_benchmarks():
    site = prefix_routing.site_vars()
    assert site["sim_site"] == "narwhal-sim-prefix" and site["sim_models"] == [".cache/models/real/tiny-llama-real"]
    assert site["sim_engine_images"] == ["narwhal-sim/engine-standin:latest"]
    assert [h["name"] for h in site["sim_hosts"]] == ["engine-1", "engine-2", "engine-3", "engine-4", "router-1"]
    assert site["sim_hosts"][-1]["groups"] == ["routers"]
    others = {day_two.MGMT, day_two.FABRIC4, prefix_routing.bench.MGMT, prefix_routing.bench.FABRIC4}
    assert not {prefix_routing.MGMT, prefix_routing.FABRIC4} & others


def test_the_image_cache_is_the_harness_one():
    """tests/harness/tasks/up.yml keeps `docker save` as .cache/images/<name with / and : as _>.<id[:12]>.tar."""
    tar = prefix_routing.image_cache_tar("narwhal-sim/vllm-cpu:latest", "sha256:bb08672ed679" + "0" * 52)
    assert tar == str(REPO / ".cache" / "images" / "narwhal-sim_vllm-cpu_latest.bb08672ed679.tar")
    assert "tr '/:' '__'" in (REPO / "tests" / "harness" / "tasks" / "up.yml").read_text()


@pytest.mark.parametrize("argv, words", [(["--prefix-len", "500"], "more than --max-model-len 512"),
                                         (["--prompts", "20"], "--prompts 20 is not a multiple of --prefixes 8")])
def test_arguments_the_benchmark_would_refuse_are_refused_first(argv, words, capsys):
    with pytest.raises(SystemExit):
        prefix_routing.parse(argv)
    assert words in capsys.readouterr().err


def test_the_make_targets_run_it():
    makefile = (REPO / "Makefile").read_text()
    assert "prefix-bench: bootstrap" in makefile and "\tbench/prefix_routing.py $(PREFIX_BENCH_ARGS)" in makefile
    assert "\tbench/prefix_routing.py --down" in makefile
