# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU tool captures (tests/fixtures/real/nvidia, amd), the simulated NVIDIA and AMD hosts' sysfs trees (and the AMD
one with GPUs unbound), and a stub tool that replays a capture: shared by the GPU reader, render node, gpu_facts and
engine_host_facts tests."""

from __future__ import annotations

import shutil

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu_reader as _gpu_reader
from test_support.paths import PROFILES, REAL

NVIDIA = REAL / "nvidia"
NVIDIA_SYS = PROFILES / "nvidia-8gpu-rdma" / "sys"
AMD = REAL / "amd"
AMD_SYS = PROFILES / "amd-4gpu-rdma" / "sys"
MI100 = "Arcturus GL-XL [Instinct MI100]"  # the AMD profile's GPUs as rocm-smi names them


def amd_profile_facts(sysfs_root):
    """The AMD profile's rocm-smi capture mapped through the sysfs tree at `sysfs_root` (amd_facts)."""
    parsed = _gpu.parse_rocm_smi_json((AMD / "telegraf__mi100_rocm602.json").read_text())
    return _gpu_reader.amd_facts(parsed, str(sysfs_root), "rocm-smi")


def without_render(tmp_path, *bdfs):
    """The AMD profile's sysfs with the KFD nodes and DRM entries of the GPUs at `bdfs` removed."""
    root = tmp_path / "sys"
    shutil.copytree(AMD_SYS, root, symlinks=True)
    nodes = {n["pci_bus_id"]: n["node"] for n in _gpu_reader.read_kfd_topology(str(AMD_SYS))}
    drm = _gpu_reader.read_drm_nodes(str(AMD_SYS))
    for bdf in bdfs:
        shutil.rmtree(root / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(nodes[bdf]))
        for minor in drm[bdf]["render"]:
            shutil.rmtree(root / "class" / "drm" / f"renderD{minor}")
    return root


def replay(fixture, accepted):
    """A stub like the harness' replay: prints the capture only for the accepted argument string."""
    return (
        f'if [ "$*" = "{accepted}" ]; then exec /bin/cat "{fixture}"; fi\n'
        "echo \"stub: no recorded output for '$*'\" >&2\n"
        "exit 2\n"
    )
