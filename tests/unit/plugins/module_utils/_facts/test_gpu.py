# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU facts: the parsers of plugins/module_utils/_facts/gpu.py over every real capture and the module itself
(plugins/modules/gpu_facts.py); the sysfs mapping of the reader is in test_gpu_reader.py."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from test_support.gpu import AMD_SYS, MI100, NVIDIA, NVIDIA_SYS, replay, without_render
from test_support.paths import REAL

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.modules import gpu_facts

AMD = REAL / "amd"

# ------------------------------------------------------------------------------------------------
# nvidia-smi -q -x: every capture, expected values written out
# (file, driver, [(uuid, name, pci_bus_id, minor, memory_mib)], {gpu index: number of MIG devices})

MASKED_2 = "GPU-12345678-aaaa-bbbb-cccc-0123456789ab"
V100S = "Tesla V100S-PCIE-32GB"
XML_EXPECTED = {
    "datakit__gtx-8card.xml": (
        "460.73.01",
        [
            ("GPU-76098dc1-d3bc-9a1b-7ea6-f7b48837829e", V100S, "0000:00:0d.0", 0, 32510),
            ("GPU-bbf7a241-bf9a-eb90-b2fb-d213294faf48", V100S, "0000:00:0e.0", 1, 32510),
            ("GPU-8f75e71c-23dd-a060-d997-4caf592954db", V100S, "0000:00:0f.0", 2, 32510),
            ("GPU-3181eb56-505c-8214-ba05-c132f68f89b8", V100S, "0000:00:10.0", 3, 32510),
            ("GPU-2aa87d54-d4ff-2900-812b-1a4b7e119583", V100S, "0000:00:11.0", 4, 32510),
            ("GPU-39c3a168-9034-0b5a-223a-1042f30a9242", V100S, "0000:00:12.0", 5, 32510),
            ("GPU-d2446f91-171e-1b54-515d-9d9b03484ddf", V100S, "0000:00:13.0", 6, 32510),
            ("GPU-1d955959-c95b-4f40-2cac-100d3006ffe2", V100S, "0000:00:14.0", 7, 32510),
        ],
        {},
    ),
    "netdata__a100-sxm4-mig.xml": (
        "510.47.03",
        [("GPU-27b94a00-ed54-5c24-b1fd-1054085de32a", "NVIDIA A100-SXM4-40GB", "0000:00:04.0", 0, 40960)],
        {0: 2},
    ),
    "netdata__rtx-4090-driver-535.xml": (
        "535.86.05",
        [("GPU-71d1acc2-662d-2166-bf9f-65272d2fc437", "NVIDIA GeForce RTX 4090", "0000:84:00.0", 0, 24564)],
        {},
    ),
    "telegraf__a100-sxm4-v12.xml": (
        "535.54.03",
        [("GPU-513536b6-7d19-9063-b049-1e69664bb298", "NVIDIA A100-SXM4-80GB", "0000:01:00.0", 1, 81920)],
        {0: 4},
    ),
    "telegraf__a10g.xml": (
        "515.105.01",
        [("GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94", "NVIDIA A10G", "0000:00:1e.0", 0, 23028)],
        {},
    ),
    "telegraf__dual_2080-v13.xml": (
        "590.44.01",
        [
            (MASKED_2, "NVIDIA GeForce RTX 2080", "0000:01:00.0", 0, 8192),
            (MASKED_2, "NVIDIA GeForce RTX 2080", "0000:02:00.0", 1, 8192),
        ],
        {},
    ),
    "telegraf__dual_a5000-v13.xml": (
        "590.44.01",
        [
            (MASKED_2, "NVIDIA RTX A5000", "0000:81:00.0", 1, 24564),
            ("GPU-12345678-aaaa-bbbb-cccc-0123456789cd", "NVIDIA RTX A5000", "0000:c1:00.0", 0, 24564),
        ],
        {},
    ),
    "telegraf__gtx-1660-ti.xml": (
        "418.43",
        [("GPU-304a277d-3545-63b8-3a36-dfde3c992989", "Graphics Device", "0000:43:00.0", 0, 5912)],
        {},
    ),
    "telegraf__pro-6000-maxq-blackwell-v13.xml": (
        "590.44.01",
        [(MASKED_2, "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition", "0000:61:00.0", 0, 97887)],
        {},
    ),
    "telegraf__rtx-4000-sff-ada-v13.xml": (
        "595.84",
        [("GPU-37037c3f-65c8-ec4d-24a9-420204ad8026", "NVIDIA RTX 4000 SFF Ada Generation", "0000:06:00.0", 0, 20475)],
        {},
    ),
    "telegraf__tesla-t4.xml": (
        "515.105.01",
        [("GPU-d37e67a5-91dd-3774-a5cb-99096249601a", "Tesla T4", "0000:00:1e.0", 0, 15360)],
        {},
    ),
}


def test_every_xml_capture_has_expectations():
    assert sorted(p.name for p in NVIDIA.glob("*.xml")) == sorted(XML_EXPECTED)


@pytest.mark.parametrize("name", sorted(XML_EXPECTED))
def test_parse_nvidia_smi_xml(name):
    driver, gpus, migs = XML_EXPECTED[name]
    parsed = _gpu.parse_nvidia_smi_xml((NVIDIA / name).read_text())
    assert parsed["driver_version"] == driver
    assert len(parsed["gpus"]) == len(gpus)
    for position, (gpu, (uuid, product, bdf, minor, memory)) in enumerate(zip(parsed["gpus"], gpus, strict=False)):
        assert gpu["index"] == position
        assert (gpu["uuid"], gpu["name"], gpu["pci_bus_id"], gpu["minor_number"], gpu["memory_mib"]) == (
            uuid,
            product,
            bdf,
            minor,
            memory,
        )
        if position in migs:
            assert len(gpu["mig_devices"]) == migs[position]
        else:
            assert "mig_devices" not in gpu


def test_mig_devices_detail():
    gpu = _gpu.parse_nvidia_smi_xml((NVIDIA / "netdata__a100-sxm4-mig.xml").read_text())["gpus"][0]
    assert gpu["mig_mode"] == "Enabled"
    assert gpu["mig_devices"] == [
        {"index": 0, "gpu_instance_id": 1, "compute_instance_id": 0, "uuid": None, "memory_mib": 19968},
        {"index": 1, "gpu_instance_id": 2, "compute_instance_id": 0, "uuid": None, "memory_mib": 19968},
    ]
    gpu = _gpu.parse_nvidia_smi_xml((NVIDIA / "telegraf__a100-sxm4-v12.xml").read_text())["gpus"][0]
    assert [m["gpu_instance_id"] for m in gpu["mig_devices"]] == [3, 4, 5, 6]


def test_same_uuid_is_never_merged():
    gpus = _gpu.parse_nvidia_smi_xml((NVIDIA / "telegraf__dual_2080-v13.xml").read_text())["gpus"]
    assert [g["index"] for g in gpus] == [0, 1]
    assert gpus[0]["uuid"] == gpus[1]["uuid"]


def test_truncated_capture_lists_fewer_gpus_than_attached():
    # telegraf's A100 capture says 4 attached but keeps one <gpu>; the index is its position, the node its minor
    parsed = _gpu.parse_nvidia_smi_xml((NVIDIA / "telegraf__a100-sxm4-v12.xml").read_text())
    assert parsed["attached_gpus"] == 4
    assert [(g["index"], g["minor_number"]) for g in parsed["gpus"]] == [(0, 1)]


def test_parse_nvidia_smi_xml_skips_a_leading_warning_line():
    text = "WARNING: infoROM is corrupted at gpu 0000:00:1E.0\n" + (NVIDIA / "telegraf__tesla-t4.xml").read_text()
    assert _gpu.parse_nvidia_smi_xml(text)["gpus"][0]["name"] == "Tesla T4"


@pytest.mark.parametrize(
    "text",
    ["", "not xml at all", "<html><body>error</body></html>", "<nvidia_smi_log><gpu>"],
)
def test_parse_nvidia_smi_xml_rejects_garbage(text):
    with pytest.raises(_gpu.GpuParseError):
        _gpu.parse_nvidia_smi_xml(text)


# ------------------------------------------------------------------------------------------------
# nvidia-smi -q / -a text (fallback parser), incl. the -q section of the nvgpuexp capture files

H100 = "NVIDIA H100 80GB HBM3"
ZERO = "GPU-00000000-0000-0000-0000-000000000000"
TEXT_EXPECTED = {
    "gpud__nvidia-smi-q.535.161.08.8xH100.txt": (
        "535.161.08",
        [
            "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa",
            "GPU-47daa2ad-a218-6286-252b-af45f0dfaf00",
            "GPU-167d8376-ee13-fca4-938a-a05167c43cdc",
            "GPU-afe9f2ed-9dd0-572c-3cd8-b42b58b3bc99",
            "GPU-2b6f61f9-8b00-3b57-d912-b62792120662",
            "GPU-980ea11b-91dc-db7b-72ac-0685abc43658",
            "GPU-4ef109e9-e925-4834-2b85-0771b4ef696c",
            "GPU-b0fe4996-1f7c-91f6-0ccd-08ae3b7e23c5",
        ],
        H100,
        ["0000:19:00.0", "0000:3b:00.0", "0000:4c:00.0", "0000:5d:00.0"]
        + ["0000:9b:00.0", "0000:bb:00.0", "0000:cb:00.0", "0000:db:00.0"],
        [0, 1, 2, 3, 4, 5, 6, 7],
        81559,
        None,
    ),
    "gpud__nvidia-smi-q.535.154.05.8xRTX4090.txt": (
        "535.154.05",
        [
            "GPU-313bbff0-b0a0-fd26-4820-0578bdef3a12",
            "GPU-1a287db8-89a4-4cd7-5933-ae53d0c4d4ad",
            "GPU-a4f36154-6f3f-303f-e098-dec1632fd43f",
            "GPU-025f6884-1162-3032-9aab-14e0d5622783",
            "GPU-751d1667-9d35-b4ef-90cf-a7bdff6aa964",
            "GPU-63cdf48e-0e17-dc82-873d-e0af7f380d0b",
            "GPU-52688fe6-e746-6dec-48ea-96cd464a0db1",
            "GPU-94f6cd0f-cb66-91a9-a3b0-7253e9f9a0ba",
        ],
        "NVIDIA GeForce RTX 4090",
        ["0000:01:00.0", "0000:23:00.0", "0000:41:00.0", "0000:61:00.0"]
        + ["0000:81:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"],
        [3, 2, 1, 0, 7, 6, 5, 4],  # minor numbers do not follow the index
        24564,
        None,
    ),
    "thamada__H100SXMx8__nvidia-smi-a.txt": (
        "565.57.01",
        [
            "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1",
            "GPU-7c3cadbd-17e5-0913-f69b-c618122ea0cd",
            "GPU-2d50cdf6-dd67-9f2e-855e-0d4d6d395a2f",
            "GPU-d1838e76-90e6-4408-711d-aeeaa2e1fd14",
            "GPU-72be6e5d-3c1b-0d37-98ac-d3ef159f2589",
            "GPU-52378fbc-3124-3895-13b6-1dd179563e0f",
            "GPU-83a5aebb-b71c-c570-aa83-185e1233fe97",
            "GPU-33135771-a848-ece1-b61e-489e221d663c",
        ],
        H100,
        ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0"]
        + ["0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"],
        [0, 1, 2, 3, 4, 5, 6, 7],
        81559,
        None,
    ),
    "thamada__A100SXMx4__nvidia-smi-a.txt": (
        "555.42.02",
        [
            "GPU-31515c3d-1414-7c2c-004a-f86a898946ac",
            "GPU-72d87681-01db-370e-567d-41afcf20fad0",
            "GPU-62989189-9e1e-ac75-4676-114f14998542",
            "GPU-011b2cfe-2b8e-1cb0-19e1-1b764e854dfc",
        ],
        "NVIDIA A100-SXM4-80GB",
        ["0000:68:00.0", "0000:9e:00.0", "0000:c2:00.0", "0000:d4:00.0"],
        [3, 4, 5, 6],
        81920,
        None,
    ),
    "nvgpuexp__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.capture.txt": (
        "590.48.01",
        [ZERO],
        H100,
        ["0000:00:09.0"],
        [0],
        81559,
        None,
    ),
    "nvgpuexp__linux-x86_64__nvidia-h100-mig__590.48.01.capture.txt": (
        "590.48.01",
        [ZERO],
        H100,
        ["0000:00:09.0"],
        [0],
        81559,
        [(2, 0, 40448), (3, 0, 20096), (9, 0, 9984), (10, 0, 9984)],
    ),
    "nvgpuexp__linux-x86_64__nvidia-h200-mig__590.48.01.capture.txt": (
        "590.48.01",
        [ZERO],
        "NVIDIA H200",
        ["0000:83:00.0"],
        [0],
        143771,
        [(2, 0, 71424), (2, 1, 71424), (3, 0, 33280), (9, 0, 16384), (10, 0, 16384)],
    ),
    "nvgpuexp__linux-x86_64__nvidia-h200__590.48.01.capture.txt": (
        "590.48.01",
        [ZERO],
        "NVIDIA H200",
        ["0000:83:00.0"],
        [0],
        143771,
        None,
    ),
    "nvgpuexp__linux-x86_64__nvidia-l40s__595.80.capture.txt": (
        "595.80",
        [ZERO],
        "NVIDIA L40S",
        ["0000:01:00.0"],
        [0],
        46068,
        None,
    ),
}


def _query_section(text):
    """The ``idle :: query (-q)`` section of an nvgpuexp capture file (split on its banners)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# idle :: query (-q)"))
    end = next(i for i in range(start + 3, len(lines)) if lines[i].startswith("####"))
    return "\n".join(lines[start + 3 : end])


def test_every_text_query_capture_has_expectations():
    names = sorted(p.name for p in NVIDIA.glob("*.txt") if p.name != "thamada__H100SXMx8__nvidia-smi.txt")
    assert names == sorted(TEXT_EXPECTED)


@pytest.mark.parametrize("name", sorted(TEXT_EXPECTED))
def test_parse_nvidia_smi_text(name):
    driver, uuids, product, bdfs, minors, memory, migs = TEXT_EXPECTED[name]
    text = (NVIDIA / name).read_text()
    if name.startswith("nvgpuexp"):
        text = _query_section(text)
    parsed = _gpu.parse_nvidia_smi_text(text)
    assert parsed["driver_version"] == driver
    assert [g["index"] for g in parsed["gpus"]] == list(range(len(uuids)))
    assert [g["uuid"] for g in parsed["gpus"]] == uuids
    assert {g["name"] for g in parsed["gpus"]} == {product}
    assert [g["pci_bus_id"] for g in parsed["gpus"]] == bdfs
    assert [g["minor_number"] for g in parsed["gpus"]] == minors
    assert {g["memory_mib"] for g in parsed["gpus"]} == {memory}
    if migs is None:
        assert "mig_devices" not in parsed["gpus"][0]
    else:
        got = [
            (m["gpu_instance_id"], m["compute_instance_id"], m["memory_mib"]) for m in parsed["gpus"][0]["mig_devices"]
        ]
        assert got == migs


def test_text_parser_reads_whole_capture_file_and_stops_at_banner():
    name = "nvgpuexp__linux-x86_64__nvidia-h200-mig__590.48.01.capture.txt"
    parsed = _gpu.parse_nvidia_smi_text((NVIDIA / name).read_text())
    assert len(parsed["gpus"]) == 1
    assert len(parsed["gpus"][0]["mig_devices"]) == 5


def test_text_parser_rejects_the_default_table():
    with pytest.raises(_gpu.GpuParseError):
        _gpu.parse_nvidia_smi_text((NVIDIA / "thamada__H100SXMx8__nvidia-smi.txt").read_text())


# ------------------------------------------------------------------------------------------------
# rocm-smi --json: every capture
# (file, driver, [(index, uuid, name, pci_bus_id, memory_mib, numa_node)])

NAVI22 = "Navi 22 [Radeon RX 6700/6700 XT / 6800M]"
ROCM_EXPECTED = {
    "gpustack__amd-gpu-6.2.4-rocm-smi.json": (
        None,
        [(0, "0x5c88007d760374f3", "Navi 32 [Radeon RX 7700 XT / 7800 XT]", None, 16368, None)],
    ),
    "gpustack__hygon-gpu-24.04.3-rocm-smi.json": (None, [(0, "7100fa8866904061", "DCU xxxx", None, 65520, None)]),
    "telegraf__mi100_rocm571.json": (
        "6.2.4",
        [
            (0, None, MI100, "0000:1e:00.0", 32752, 0),
            (1, None, MI100, "0000:22:00.0", 32752, 0),
            (2, None, MI100, "0000:3f:00.0", 32752, 0),
            (3, None, MI100, "0000:43:00.0", 32752, 0),
            (4, None, MI100, "0000:46:00.0", 32752, 0),
            (5, None, MI100, "0000:49:00.0", 32752, 0),
        ],
    ),
    "telegraf__mi100_rocm602.json": (
        "6.3.6",
        [
            (0, "0x79ccd55167a2124a", MI100, "0000:83:00.0", 32752, 1),
            (1, "0x4edfb117a17a07d", MI100, "0000:a3:00.0", 32752, 1),
            (2, "0xd4a9ec48d03d261d", MI100, "0000:c3:00.0", 32752, 1),
            (3, "0x1b9dd972253c3736", MI100, "0000:e3:00.0", 32752, 1),
        ],
    ),
    # ROCm 4.3 printed the vendor id where the name belongs
    "telegraf__rx6700xt_rocm430.json": ("6.3.6", [(0, None, "0x1002", "0000:07:00.0", 12272, 0)]),
    "telegraf__rx6700xt_rocm571.json": ("6.3.6", [(0, None, NAVI22, "0000:07:00.0", 12272, 0)]),
    "telegraf__rx6700xt_rocm602.json": ("6.3.6", [(0, None, NAVI22, "0000:07:00.0", 12272, 0)]),
    "telegraf__rx6700xt_rocm612.json": ("6.3.6", [(0, None, NAVI22, "0000:07:00.0", 12272, 0)]),
    # no "Card series" at all: the model id is what rocm-smi prints
    "telegraf__vega-10-XT.json": ("5.9.25", [(0, "0x2150e7d042a1124", "0xc1e", "0000:04:00.0", 16368, 0)]),
    "telegraf__vega-20-WKS-GL-XE.json": (
        "5.9.17",
        [(0, "0x2f048617326b1ea", "Radeon Instinct MI50 32GB", "0000:63:00.0", 32752, 0)],
    ),
}


def test_every_rocm_json_capture_has_expectations():
    assert sorted(p.name for p in AMD.glob("*.json")) == sorted(ROCM_EXPECTED)


@pytest.mark.parametrize("name", sorted(ROCM_EXPECTED))
def test_parse_rocm_smi_json(name):
    driver, gpus = ROCM_EXPECTED[name]
    parsed = _gpu.parse_rocm_smi_json((AMD / name).read_text())
    assert parsed["driver_version"] == driver
    got = [(g["index"], g["uuid"], g["name"], g["pci_bus_id"], g["memory_mib"], g["numa_node"]) for g in parsed["gpus"]]
    assert got == gpus


def test_rocm_smi_kfd_node_id_and_gfx_version():
    parsed = _gpu.parse_rocm_smi_json((AMD / "telegraf__rx6700xt_rocm612.json").read_text())
    assert (parsed["gpus"][0]["kfd_node_id"], parsed["gpus"][0]["gfx_version"]) == (1, "gfx1031")


@pytest.mark.parametrize("text", ["", "{", "[]", '{"system": {"Driver version": "6.3.6"}}'])
def test_parse_rocm_smi_json_rejects_garbage(text):
    with pytest.raises(_gpu.GpuParseError):
        _gpu.parse_rocm_smi_json(text)


# ------------------------------------------------------------------------------------------------
# amd-smi static --json (no real capture exists: two small documents in AMD's documented layout)

AMD_SMI_GPU = {
    "gpu": 0,
    "asic": {
        "market_name": "AMD Instinct MI300X",
        "asic_serial": "0x9BD5DD6F6ED5D8BB",
        "target_graphics_version": "gfx942",
    },
    "bus": {"bdf": "0000:0c:00.0", "max_pcie_width": 16},
    "board": {"product_name": "AMD Instinct MI300X OAM"},
    "driver": {"name": "amdgpu", "version": "6.7.0"},
    "numa": {"node": 0, "affinity": 0},
    "vram": {"type": "HBM", "size": {"value": 196592, "unit": "MB"}},
}


@pytest.mark.parametrize("wrap", [lambda gpus: gpus, lambda gpus: {"gpu_data": gpus}])
def test_parse_amd_smi_static_json(wrap):
    second = json.loads(json.dumps(AMD_SMI_GPU))
    second.update(gpu=1, bus={"bdf": "0000:22:00.0"}, numa={"node": 1})
    parsed = _gpu.parse_amd_smi_static_json(json.dumps(wrap([AMD_SMI_GPU, second])))
    assert parsed["driver_version"] == "6.7.0"
    got = [(g["index"], g["uuid"], g["name"], g["pci_bus_id"], g["memory_mib"], g["numa_node"]) for g in parsed["gpus"]]
    assert got == [
        (0, "0x9BD5DD6F6ED5D8BB", "AMD Instinct MI300X", "0000:0c:00.0", 196592, 0),
        (1, "0x9BD5DD6F6ED5D8BB", "AMD Instinct MI300X", "0000:22:00.0", 196592, 1),
    ]


def test_parse_amd_smi_static_json_tolerates_na_fields():
    parsed = _gpu.parse_amd_smi_static_json('[{"gpu": 0, "asic": {"market_name": "N/A"}, "bus": "N/A"}]')
    assert parsed["gpus"][0]["name"] is None and parsed["gpus"][0]["pci_bus_id"] is None


# ------------------------------------------------------------------------------------------------
# helpers and sysfs


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("00000000:00:0D.0", "0000:00:0d.0"),
        ("0000:83:00.0", "0000:83:00.0"),
        ("00000000:C1:00.0", "0000:c1:00.0"),
        ("00010000:E1:00.1", "10000:e1:00.1"),
        ("83:00.0", "0000:83:00.0"),
        ("N/A", None),
        (None, None),
        ("garbage", None),
    ],
)
def test_normalize_pci_bus_id(raw, expected):
    assert _gpu.normalize_pci_bus_id(raw) == expected


@pytest.mark.parametrize(
    "raw, unit, expected",
    [("81920 MiB", "MiB", 81920), ("34342961152", "B", 32752), ("N/A", "MiB", None), ("1.5 GiB", "MiB", 1536)],
)
def test_memory_to_mib(raw, unit, expected):
    assert _gpu.memory_to_mib(raw, unit) == expected


# ------------------------------------------------------------------------------------------------
# the module


@pytest.fixture
def module_runner(module_runner, monkeypatch, tmp_path):
    """conftest's runner for gpu_facts.main, with PATH reduced to a directory of stub tools."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    run_main = module_runner

    def run(args, stubs=None):
        for tool, body in (stubs or {}).items():
            path = bindir / tool
            path.write_text("#!/bin/sh\n" + body)
            path.chmod(0o755)
        return run_main(gpu_facts.main, args)

    return run


@pytest.fixture
def no_host_tools():
    for tool in ("nvidia-smi", "amd-smi", "rocm-smi"):
        for directory in ("/sbin", "/usr/sbin", "/usr/local/sbin", "/opt/rocm/bin"):
            if os.path.exists(os.path.join(directory, tool)):
                pytest.skip(f"this machine has {tool} in {directory}")


def test_module_nvidia(module_runner, tmp_path, no_host_tools):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).write_text("")
    stub = replay(NVIDIA / "datakit__gtx-8card.xml", "-q -x")
    how, result = module_runner({"sysfs_root": str(NVIDIA_SYS), "dev_root": str(dev)}, {"nvidia-smi": stub})
    assert how == "exit", result
    assert result["changed"] is False
    facts = result["ansible_facts"]["narwhal_gpus"]
    assert facts["vendor"] == "nvidia"
    assert facts["source"] == "nvidia-smi -q -x"
    assert facts["driver_version"] == "460.73.01"
    assert facts["devices"] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert len(facts["gpus"]) == 8
    assert facts["gpus"][5] == {
        "index": 5,
        "uuid": "GPU-39c3a168-9034-0b5a-223a-1042f30a9242",
        "name": V100S,
        "pci_bus_id": "0000:00:12.0",
        "pci_path": ["pci0000:00", "0000:00:03.0", "0000:30:00.0", "0000:31:01.0", "0000:36:00.0", "0000:37:00.0"],
        "devices": ["/dev/nvidia5"],
        "numa_node": 1,
        "memory_mib": 32510,
        "minor_number": 5,
    }


def test_module_nvidia_mig(module_runner, tmp_path, no_host_tools):
    stub = replay(NVIDIA / "netdata__a100-sxm4-mig.xml", "-q -x")
    how, result = module_runner({"sysfs_root": str(tmp_path), "dev_root": str(tmp_path)}, {"nvidia-smi": stub})
    assert how == "exit", result
    gpu = result["ansible_facts"]["narwhal_gpus"]["gpus"][0]
    assert (gpu["index"], gpu["uuid"]) == (0, "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a")
    assert len(gpu["mig_devices"]) == 2
    assert result["ansible_facts"]["narwhal_gpus"]["devices"] == []


def test_module_amd_rocm_smi_fallback(module_runner, no_host_tools):
    stub = replay(AMD / "telegraf__mi100_rocm602.json", "--showproductname --showbus --showuniqueid --json")
    how, result = module_runner({"sysfs_root": str(AMD_SYS)}, {"rocm-smi": stub})
    assert how == "exit", result
    facts = result["ansible_facts"]["narwhal_gpus"]
    assert facts["vendor"] == "amd"
    assert facts["source"] == "rocm-smi --showproductname --showbus --showuniqueid --json"
    assert facts["devices"] == ["/dev/kfd"]
    assert [(g["index"], g["uuid"], g["pci_bus_id"], g["devices"]) for g in facts["gpus"]] == [
        (0, "0x79ccd55167a2124a", "0000:83:00.0", ["/dev/dri/renderD128", "/dev/dri/card0"]),
        (1, "0x4edfb117a17a07d", "0000:a3:00.0", ["/dev/dri/renderD129", "/dev/dri/card1"]),
        (2, "0xd4a9ec48d03d261d", "0000:c3:00.0", ["/dev/dri/renderD130", "/dev/dri/card2"]),
        (3, "0x1b9dd972253c3736", "0000:e3:00.0", ["/dev/dri/renderD131", "/dev/dri/card3"]),
    ]
    assert not result.get("warnings")


def test_module_amd_smi_preferred(module_runner, tmp_path, no_host_tools):
    doc = tmp_path / "static.json"
    doc.write_text(json.dumps({"gpu_data": [dict(AMD_SMI_GPU, bus={"bdf": "0000:83:00.0"})]}))
    stubs = {"amd-smi": replay(doc, "static --json"), "rocm-smi": "exit 99\n"}
    how, result = module_runner({"sysfs_root": str(AMD_SYS)}, stubs)
    assert how == "exit", result
    facts = result["ansible_facts"]["narwhal_gpus"]
    assert facts["source"] == "amd-smi static --json"
    assert facts["gpus"][0]["name"] == "AMD Instinct MI300X"
    assert facts["gpus"][0]["devices"] == ["/dev/dri/renderD128", "/dev/dri/card0"]


# an AMD GPU without a render node (issue 24): ROCr would not see it in the container, so it must not be counted in
# TP; refused naming the tool, the host, the GPU and the fix


@pytest.mark.parametrize("tool, stub_args, removed, expected", [
    ("rocm-smi", "--showproductname --showbus --showuniqueid --json", ["0000:a3:00.0"],
     f"lists AMD GPU 1 (0000:a3:00.0, {MI100}) without a render node"),
    ("amd-smi", "static --json", None, "lists AMD GPU 0 (0000:0c:00.0, AMD Instinct MI300X) without a render node"),
], ids=["rocm-smi-one-unbound", "amd-smi-no-sysfs"])
def test_module_refuses_an_amd_gpu_without_render_node(module_runner, tmp_path, no_host_tools, tool, stub_args,
                                                       removed, expected):
    if tool == "rocm-smi":
        source, root = AMD / "telegraf__mi100_rocm602.json", without_render(tmp_path, *removed)
    else:
        source, root = tmp_path / "static.json", tmp_path / "empty-sys"
        source.write_text(json.dumps([AMD_SMI_GPU]))
    how, result = module_runner({"sysfs_root": str(root)}, {tool: replay(source, stub_args)})
    assert how == "fail", result
    assert result["msg"].startswith(f"'{tool} {stub_args}' on host {socket.gethostname()} {expected}: ")
    assert result["msg"].endswith("and that sysfs_root is the host's /sys, then rerun discovery")


def test_module_no_vendor_tool(module_runner, tmp_path, no_host_tools):
    how, result = module_runner({"sysfs_root": str(tmp_path), "dev_root": str(tmp_path)})
    assert how == "exit", result
    assert result["ansible_facts"]["narwhal_gpus"] == {
        "vendor": "none",
        "gpus": [],
        "devices": [],
        "driver_version": None,
        "source": None,
    }


def test_module_tool_fails(module_runner, no_host_tools):
    stub = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    how, result = module_runner({}, {"nvidia-smi": stub})
    assert how == "fail"
    assert "'nvidia-smi -q -x' failed on host %s (rc=9)" % socket.gethostname() in result["msg"]
    assert "couldn't communicate with the NVIDIA driver" in result["msg"]
    assert "lsmod | grep nvidia" in result["msg"]


def test_module_tool_prints_garbage(module_runner, no_host_tools):
    how, result = module_runner({}, {"rocm-smi": "echo 'WARNING: unknown option'\nexit 0\n"})
    assert how == "fail"
    assert "rocm-smi --showproductname --showbus --showuniqueid --json" in result["msg"]
    assert "output on host %s is not the JSON rocm-smi writes ('WARNING: unknown option')" % socket.gethostname() \
        in result["msg"] and "not valid JSON" in result["msg"]


# ------------------------------------------------------------------------------------------------
# tools that hang or lie (issue 13, class 6): a deadline naming the tool and the host; unreadable output is an
# error naming them, never "zero GPUs"

HANG = "/bin/sleep 30\n"  # a child of the stub shell holds the pipes: the whole process group must go
DEEP_JSON = "[" * 100000


@pytest.mark.parametrize("tool, label, cause", [
    ("nvidia-smi", "nvidia-smi -q -x", "nvidia-smi hangs when the NVIDIA driver is wedged"),
    ("amd-smi", "amd-smi static --json", "amd-smi hangs when the amdgpu driver is stuck"),
    ("rocm-smi", "rocm-smi --showproductname --showbus --showuniqueid --json", "rocm-smi hangs when the amdgpu"),
])
def test_module_tool_that_hangs_is_killed_and_named(module_runner, no_host_tools, tool, label, cause):
    started = time.monotonic()
    how, result = module_runner({"command_timeout": 1}, {tool: HANG})
    assert time.monotonic() - started < 10
    assert how == "fail" and result["timed_out"] is True
    assert result["msg"].startswith(f"'{label}' on host {socket.gethostname()} did not answer within 1 s "
                                    "(timed out, killed); " + cause)
    assert "raise command_timeout" in result["msg"]


@pytest.mark.parametrize("tool, output, form, cause", [
    ("nvidia-smi", "garbage", "the XML nvidia-smi writes", "not well-formed XML"),
    ("nvidia-smi", "<nvidia_smi_log><attached_gpus>8</attached_gpus></nvidia_smi_log>", "the XML nvidia-smi writes",
     "lists no <gpu> (attached_gpus: 8)"),
    ("nvidia-smi", "<nvidia_smi_log></nvidia_smi_log>", "the XML nvidia-smi writes", "lists no <gpu>"),
    ("nvidia-smi", "<nvidia_smi_log><gpu/></nvidia_smi_log>", "the XML nvidia-smi writes",
     "GPU 0 has neither a PCI bus id nor a minor number"),
    ("rocm-smi", "{}", "the JSON rocm-smi writes", "no cardN entries"),
    ("rocm-smi", '{"card0": "x"}', "the JSON rocm-smi writes", "card0 is a JSON str, not the object of one GPU"),
    ("rocm-smi", DEEP_JSON, "the JSON rocm-smi writes", "nested too deeply"),
    ("amd-smi", "[]", "the JSON amd-smi writes", "no GPU objects"),
    ("amd-smi", '"ok"', "the JSON amd-smi writes", "expected a list of GPUs"),
    ("amd-smi", DEEP_JSON, "the JSON amd-smi writes", "nested too deeply"),
], ids=["nv-text", "nv-attached-no-gpu", "nv-empty-log", "nv-blank-gpu", "rocm-empty", "rocm-card-not-object",
        "rocm-deep", "amd-empty", "amd-string", "amd-deep"])
def test_module_garbage_output_is_an_error_not_zero_gpus(module_runner, tmp_path, no_host_tools, tool, output, form,
                                                         cause):
    captured = tmp_path / "out.txt"
    captured.write_text(output)
    how, result = module_runner({}, {tool: f"exec /bin/cat {captured}\n"})
    assert how == "fail", result
    assert f"output on host {socket.gethostname()} is not {form} (" in result["msg"]
    assert cause in result["msg"]
    assert repr(output[:80] + ("..." if len(output) > 80 else "")) in result["msg"]  # the first 80 characters


def test_parse_nvidia_smi_xml_refuses_an_empty_inventory():
    with pytest.raises(_gpu.GpuParseError, match="lists no <gpu>"):
        _gpu.parse_nvidia_smi_xml("<?xml version='1.0'?><nvidia_smi_log><driver_version>535</driver_version>"
                                  "</nvidia_smi_log>")


# ------------------------------------------------------------------------------------------------
# impossible inventories (issue 24): an error naming what is wrong, never a smaller or different inventory

MI100_CARD = json.loads((AMD / "telegraf__mi100_rocm602.json").read_text())["card0"]


def _rocm(**cards):
    return json.dumps(dict(cards, system={"Driver version": "6.3.6"}))


def _card(**fields):
    return dict(MI100_CARD, **fields)


@pytest.mark.parametrize("text, cause", [
    (_rocm(card0=_card(), card00=_card(**{"PCI Bus": "0000:A3:00.0"})),
     "card0 and card00 have the same GPU index 0; one host cannot have two GPUs with one GPU index"),
    (_rocm(card0=_card(), card1=_card()), "card0 and card1 have the same PCI bus id 0000:83:00.0"),
    (_rocm(card0=_card(**{"Node ID": "2"}), card1=_card(**{"PCI Bus": "0000:A3:00.0", "Node ID": "2"})),
     "card0 and card1 have the same KFD node id 2"),
    (_rocm(card0=_card(**{"VRAM Total Memory (B)": "lots"})),
     "card0: 'VRAM Total Memory (B)' 'lots' is not a memory size"),
    (_rocm(card0=_card(**{"VRAM Total Memory (B)": "-34342961152"})),
     "card0: 'VRAM Total Memory (B)' '-34342961152' is not a memory size"),
    (_rocm(card0=_card(**{"PCI Bus": "slot 3"})), "card0: 'PCI Bus' 'slot 3' is not a PCI bus id"),
    (_rocm(card0=_card(**{"Node ID": "one"})), "card0: 'Node ID' 'one' is not a whole number"),
    (_rocm(card0=_card(**{"(Topology) Numa Node": "1.5"})),
     "card0: '(Topology) Numa Node' '1.5' is not a whole number"),
    (_rocm(card0=_card(), cardX=_card()), "key 'cardX' is not a card entry rocm-smi writes"),
    (_rocm(card0=_card(), card1=[]), "card1 is a JSON list, not the object of one GPU"),
    ('{"card0": %s, "card0": %s}' % (json.dumps(_card()), json.dumps(_card(**{"PCI Bus": "0000:A3:00.0"}))),
     "the key 'card0' appears twice in one object"),
], ids=["card0-card00", "same-bus", "same-kfd-node", "vram-text", "vram-negative", "bus-text", "node-text",
        "numa-fraction", "card-x", "card-list", "key-twice"])
def test_rocm_smi_impossible_inventories(text, cause):
    with pytest.raises(_gpu.GpuParseError) as err:
        _gpu.parse_rocm_smi_json(text)
    assert cause in str(err.value)


def test_rocm_smi_unknown_markers_stay_unknown():
    unknown = {"VRAM Total Memory (B)": "N/A", "PCI Bus": "N/A", "(Topology) Numa Node": "N/A"}
    gpu = _gpu.parse_rocm_smi_json(_rocm(card0=_card(**unknown)))["gpus"][0]
    assert (gpu["memory_mib"], gpu["pci_bus_id"], gpu["numa_node"]) == (None, None, None)


def _amd(*entries):
    gpus = [json.loads(json.dumps(AMD_SMI_GPU)) for _entry in entries]
    for gpu, entry in zip(gpus, entries, strict=True):
        gpu.update(entry)
    return json.dumps({"gpu_data": gpus})


@pytest.mark.parametrize("text, cause", [
    (_amd({"gpu": -1}), "gpu -1: GPU index -1 is negative; GPU indices count from 0"),
    (_amd({"gpu": "zero"}), "gpu \"zero\": index 'zero' is not a whole number"),
    (_amd({"gpu": True}), "gpu true: index true is not a whole number"),
    (_amd({"gpu": 1.5}), "gpu 1.5: index 1.5 is not a whole number"),
    (_amd({"gpu": 0}, {"gpu": 0, "bus": {"bdf": "0000:22:00.0"}}), "gpu 0 and gpu 0 have the same GPU index 0"),
    (_amd({"gpu": 0}, {"gpu": 1}), "gpu 0 and gpu 1 have the same PCI bus id 0000:0c:00.0"),
    (_amd({"vram": {"type": "HBM", "size": {"value": "lots", "unit": "MB"}}}),
     "gpu 0: vram.size 'lots MB' is not a memory size"),
    (_amd({"vram": {"type": "HBM", "size": "192 gigs"}}), "gpu 0: vram.size '192 gigs' is not a memory size"),
    (_amd({"vram": {"type": "HBM", "size": {"value": -196592, "unit": "MB"}}}),
     "gpu 0: vram.size -196592 is negative"),
    (_amd({"vram": {"type": "HBM", "size": {"value": 196592, "unit": 7}}}), "gpu 0: vram.size.unit 7 is not a unit"),
    (_amd({"bus": {"bdf": "nope"}}), "gpu 0: bus.bdf 'nope' is not a PCI bus id"),
    (_amd({"numa": {"node": "first"}}), "gpu 0: numa.node 'first' is not a whole number"),
    (json.dumps([AMD_SMI_GPU, 7]), "entry 1 is a JSON int, not the object of one GPU"),
    ((AMD / "telegraf__mi100_rocm602.json").read_text(),
     "the object has neither gpu_data nor a 'gpu' index (keys: card0, card1, card2, card3, system)"),
], ids=["negative", "text-index", "bool-index", "fraction-index", "same-index", "same-bus", "vram-text",
        "vram-string", "vram-negative", "vram-unit", "bus-text", "numa-text", "not-an-object", "rocm-smi-document"])
def test_amd_smi_impossible_inventories(text, cause):
    with pytest.raises(_gpu.GpuParseError) as err:
        _gpu.parse_amd_smi_static_json(text)
    assert cause in str(err.value)


def _nv_gpu(bus, minor, memory="32510 MiB"):
    return ("<gpu id=\"%s\"><pci><pci_bus_id>%s</pci_bus_id></pci><minor_number>%s</minor_number>"
            "<fb_memory_usage><total>%s</total></fb_memory_usage></gpu>" % (bus, bus, minor, memory))


def _nv_log(*gpus, attached=None):
    return "<nvidia_smi_log><attached_gpus>%d</attached_gpus>%s</nvidia_smi_log>" % (
        len(gpus) if attached is None else attached, "".join(gpus))


@pytest.mark.parametrize("text, cause", [
    (_nv_log(_nv_gpu("00000000:00:0D.0", 0), _nv_gpu("00000000:00:0D.0", 1)),
     "GPU 0 and GPU 1 have the same PCI bus id 0000:00:0d.0"),
    (_nv_log(_nv_gpu("00000000:00:0D.0", 3), _nv_gpu("00000000:00:0E.0", 3)),
     "GPU 0 and GPU 1 have the same minor number (/dev/nvidia<N>) 3"),
    (_nv_log(_nv_gpu("00000000:00:0D.0", "three")), "GPU 0: minor number 'three' is not a whole number"),
    (_nv_log(_nv_gpu("00000000:00:0D.0", -1)), "GPU 0: minor number -1 is negative"),
    (_nv_log(_nv_gpu("00000000:00:0D.0", 0, "lots")), "GPU 0: fb_memory_usage total 'lots' is not a memory size"),
    (_nv_log(_nv_gpu("bus three", 0)), "GPU 0: pci_bus_id 'bus three' is not a PCI bus id"),
    (_nv_log(_nv_gpu("00000000:00:0D.0", 0), _nv_gpu("00000000:00:0E.0", 1), attached=1),
     "2 <gpu> entries but attached_gpus is 1"),
    ("<nvidia_smi_log><attached_gpus>eight</attached_gpus>%s</nvidia_smi_log>" % _nv_gpu("00000000:00:0D.0", 0),
     "attached_gpus 'eight' is not a whole number"),
], ids=["same-bus", "same-minor", "minor-text", "minor-negative", "memory-text", "bus-text", "more-than-attached",
        "attached-text"])
def test_nvidia_smi_xml_impossible_inventories(text, cause):
    with pytest.raises(_gpu.GpuParseError) as err:
        _gpu.parse_nvidia_smi_xml(text)
    assert cause in str(err.value)


NVSMI_HEAD = "==============NVSMI LOG==============\n\nTimestamp : Mon Dec  1 10:00:00 2026\n"


@pytest.mark.parametrize("text, cause", [
    (NVSMI_HEAD + "\x00\x17garbage \ufffd\ufffd\nmore garbage\n",
     "the NVSMI LOG lists no 'GPU <bus id>' section (Attached GPUs: None)"),
    (NVSMI_HEAD + "Driver Version : 535.161.08\nAttached GPUs : 8\n%%$#@!\n",
     "the NVSMI LOG lists no 'GPU <bus id>' section (Attached GPUs: 8)"),
    (NVSMI_HEAD + "Attached GPUs : 1\nGPU is on fire\n", "GPU 0 has neither a PCI bus id nor a minor number"),
    (NVSMI_HEAD + "Attached GPUs : 1\nGPU 00000000:19:00.0\n    Minor Number : x\n",
     "GPU 0 (GPU 00000000:19:00.0): minor number 'x' is not a whole number"),
    (NVSMI_HEAD + "Attached GPUs : 1\nGPU 00000000:19:00.0\n    Minor Number : 0\n"
     "GPU 00000000:3B:00.0\n    Minor Number : 1\n", "2 'GPU <bus id>' entries but attached_gpus is 1"),
    (NVSMI_HEAD + "Attached GPUs : many\n", "Attached GPUs 'many' is not a whole number"),
], ids=["garbage-body", "attached-garbage", "gpu-garbage", "minor-text", "more-than-attached", "attached-text"])
def test_nvidia_smi_text_impossible_inventories(text, cause):
    with pytest.raises(_gpu.GpuParseError) as err:
        _gpu.parse_nvidia_smi_text(text)
    assert cause in str(err.value)


@pytest.mark.parametrize("tool, output, cause", [
    ("rocm-smi", _rocm(card0=_card(), card00=_card(**{"PCI Bus": "0000:A3:00.0"})),
     "card0 and card00 have the same GPU index 0"),
    ("amd-smi", _amd({"gpu": -1}), "GPU index -1 is negative"),
    ("amd-smi", _amd({"vram": {"type": "HBM", "size": {"value": "lots", "unit": "MB"}}}),
     "vram.size 'lots MB' is not a memory size"),
    ("nvidia-smi", _nv_log(_nv_gpu("00000000:00:0D.0", 3), _nv_gpu("00000000:00:0E.0", 3)),
     "GPU 0 and GPU 1 have the same minor number (/dev/nvidia<N>) 3"),
], ids=["rocm-card00", "amd-negative", "amd-vram", "nvidia-same-minor"])
def test_module_refuses_an_impossible_inventory_naming_tool_and_host(module_runner, tmp_path, no_host_tools, tool,
                                                                     output, cause):
    captured = tmp_path / "out.txt"
    captured.write_text(output)
    how, result = module_runner({"sysfs_root": str(AMD_SYS)}, {tool: f"exec /bin/cat {captured}\n"})
    assert how == "fail", result
    assert result["msg"].startswith(f"'{tool} ")
    assert f"output on host {socket.gethostname()} is not " in result["msg"]
    assert cause in result["msg"]
