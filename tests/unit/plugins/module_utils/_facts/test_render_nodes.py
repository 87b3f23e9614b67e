# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The device nodes of AMD GPUs (plugins/module_utils/_facts/render_nodes.py): a GPU matched to its KFD node by id
when the tool prints no bus id, and the refusal of a GPU without a render node (issue 24: ROCr would not see it in
the container, so it must not be counted in TP) or of two GPUs on one, naming the tool, the host, the GPU and the
fix."""

from __future__ import annotations

import shutil

from test_support.gpu import AMD, AMD_SYS, MI100, amd_profile_facts, without_render

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.render_nodes import (
    amd_gpu_devices,
    render_node_refusal,
)


def test_amd_facts_by_kfd_node_id_when_no_bus_id():
    parsed = _gpu.parse_rocm_smi_json((AMD / "gpustack__amd-gpu-6.2.4-rocm-smi.json").read_text())
    nodes = [{"node": 1, "gpu_id": 1, "drm_render_minor": 128, "pci_bus_id": "0000:03:00.0", "unique_id": None}]
    devices, how, bdf = amd_gpu_devices(parsed["gpus"][0], nodes, {})
    assert (devices, how, bdf) == (["/dev/dri/renderD128"], ["kfd-topology"], "0000:03:00.0")


def test_render_node_refusal_names_every_gpu_without_one(tmp_path):
    root = without_render(tmp_path, "0000:c3:00.0", "0000:e3:00.0")
    facts = amd_profile_facts(root)
    assert [g["devices"] for g in facts["gpus"]][2:] == [["/dev/dri/card2"], ["/dev/dri/card3"]]
    message = render_node_refusal(facts, str(root), "host engine-1")
    assert message.startswith(f"'rocm-smi' on host engine-1 lists AMD GPUs 2 (0000:c3:00.0, {MI100}), 3 "
                              f"(0000:e3:00.0, {MI100}) without a render node: neither the KFD topology ")
    assert "so a container given it would see fewer GPUs than the engine's tensor parallel size" in message
    assert render_node_refusal(amd_profile_facts(AMD_SYS), str(AMD_SYS), "host engine-1") is None
    nothing = render_node_refusal(amd_profile_facts(tmp_path / "none"), str(tmp_path / "none"), "host x")
    assert "lists AMD GPUs 0 (0000:83:00.0" in nothing and "3 (0000:e3:00.0" in nothing


def test_render_node_refusal_of_two_gpus_on_one_node(tmp_path):
    """A KFD topology that gives two of the tool's GPUs one render node: the tool and sysfs disagree, refused."""
    root = tmp_path / "sys"
    shutil.copytree(AMD_SYS, root, symlinks=True)
    properties = root / "class" / "kfd" / "kfd" / "topology" / "nodes" / "3" / "properties"
    properties.write_text(properties.read_text().replace("drm_render_minor 129", "drm_render_minor 128"))
    facts = amd_profile_facts(root)
    message = render_node_refusal(facts, str(root), "host engine-1")
    assert message.startswith("'rocm-smi' on host engine-1 lists AMD GPUs 0 and 1, and sysfs below ")
    assert "maps both to /dev/dri/renderD128; one device node cannot be two GPUs" in message
