# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The docs' example launch config (docs/examples/engine-launch.example.json) is what discovery writes for the
proving ground's default site (scripts/gen-example-record.py): regenerated here and compared byte for byte, checked
by the one record check and the P/D gate, and traced back to the site's recorded inputs."""

import hashlib
import json
import subprocess
import sys

import pytest
import yaml
from test_support.paths import REAL, REPO, load_file

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import read_dotenv
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import check_record, launch_config_errors
from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.gate import check_pairs

SCRIPT = REPO / "scripts" / "gen-example-record.py"
EXAMPLE = REPO / "docs" / "examples" / "engine-launch.example.json"
SCENARIO = REPO / "extensions" / "molecule" / "default"
# every key of `sources` discovery writes (records.py::build_record, _discover/outputs.py::collect_records)
# every source discovery writes for this site (kv_lease only where NARWHAL_KV_LEASE_SECONDS is set; shutdown on
# vLLM >= 0.18, which the stand-in image is)
SOURCES = {"allocation", "transfer", "ucx_tls", "extra_args", "environment", "visibility", "host", "image", "model",
           "policy", "shutdown"}


gen = load_file("gen_example_record", SCRIPT)


@pytest.fixture(scope="module")
def generated():
    return gen.generate()


@pytest.fixture
def example():
    return json.loads(EXAMPLE.read_text())


def test_the_example_is_a_fresh_generation(generated):
    assert EXAMPLE.read_text() == generated, (
        "docs/examples/engine-launch.example.json is not what discovery writes for the default site now: run "
        "scripts/gen-example-record.py to regenerate it")


def test_generation_is_stable(generated):
    """Nothing of the machine that generates it (temporary paths, the time) reaches the example."""
    assert gen.generate() == generated


def test_the_example_passes_the_record_check_and_the_pd_gate(example):
    assert launch_config_errors(example) == []
    for engine, record in example["engines"].items():
        check_record(record, engine)
    assert check_pairs(example["engines"]) is None
    assert sorted(r["role"] for r in example["engines"].values()) == ["decode", "prefill"]


def test_the_example_carries_every_source_discovery_writes(example):
    for record in example["engines"].values():
        assert set(record["sources"]) == SOURCES


def test_the_example_is_the_default_sites_discovery(example):
    """Each value traces back to the site: molecule.yml's engine hosts, site.env, the profile's recorded capture."""
    platforms = [p for p in yaml.safe_load((SCENARIO / "molecule.yml").read_text())["platforms"]
                 if "engines" in p.get("groups", [])]
    site = read_dotenv(str(SCENARIO / "site.env"))
    uuids = [g["uuid"] for g in _gpu.parse_nvidia_smi_xml((REAL / "nvidia" / "datakit__gtx-8card.xml").read_text())
             ["gpus"]]
    assert sorted(example["engines"]) == [p["name"] for p in platforms]
    for platform in platforms:
        record = example["engines"][platform["name"]]
        assert platform["profile"] == "nvidia-8gpu-rdma"
        assert record["node"]["address"] == platform["fabric_ipv4"]
        assert record["role"] == site["NARWHAL_NODE_%s_ROLE" % platform["name"].rsplit("-", 1)[1]]
        assert record["gpu_ids"] == uuids and record["accelerator"]["product"] == "Tesla V100S-PCIE-32GB"
        assert record["transfer"]["transport"] == "ucx_tcp"
        assert record["runtime"]["image"] == site["NARWHAL_IMAGE"]
        assert record["runtime"]["model_path"] == site["NARWHAL_MODEL_PATH"]
        assert record["runtime"]["served_model_name"] == site["NARWHAL_SERVED_MODEL_NAME"]
        # the stand-in image's ENV (launcher-managed NVIDIA_VISIBLE_DEVICES dropped) and make_dists.py's versions
        assert record["runtime"]["environment"]["CUDA_VERSION"] == "12.9.1"
        assert "NVIDIA_VISIBLE_DEVICES" not in record["runtime"]["environment"]
        assert record["runtime"]["expected_packages"] == {"vllm": "0.33.0", "nixl": "1.5.1"}


def test_the_machine_specific_values_are_the_documented_stand_ins(example):
    doc = (REPO / "docs" / "launch-record.md").read_text()
    for engine, record in example["engines"].items():
        image = record["runtime"]["image"]
        assert record["runtime"]["image_id"] == "sha256:" + hashlib.sha256(image.encode()).hexdigest()
        assert record["node"]["host_id"] == hashlib.sha256(("/" + engine).encode()).hexdigest()[:16]
    assert "scripts/gen-example-record.py" in doc and "`image_id`" in doc and "`host_id`" in doc


def test_check_names_the_command_that_regenerates(tmp_path, generated):
    stale = tmp_path / "example.json"
    stale.write_text(generated.replace('"tiny-llama"', '"renamed"'))
    run = [sys.executable, str(SCRIPT), "--check", "--output", str(stale)]
    out = subprocess.run(run, capture_output=True, text=True, check=False)
    assert out.returncode == 1
    assert out.stdout == "%s is out of date: run scripts/gen-example-record.py to regenerate it\n" % stale
    assert subprocess.run([sys.executable, str(SCRIPT), "--output", str(stale)], check=False).returncode == 0
    assert stale.read_text() == generated
    out = subprocess.run(run, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
