# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU tool captures (tests/fixtures/real/nvidia), the simulated NVIDIA host's sysfs tree and a stub
tool that replays a capture: shared by the gpu_facts and engine_host_facts tests."""

from __future__ import annotations

from test_support.paths import PROFILES, REAL

NVIDIA = REAL / "nvidia"
NVIDIA_SYS = PROFILES / "nvidia-8gpu-rdma" / "sys"


def replay(fixture, accepted):
    """A stub like the harness' replay: prints the capture only for the accepted argument string."""
    return (
        f'if [ "$*" = "{accepted}" ]; then exec /bin/cat "{fixture}"; fi\n'
        "echo \"stub: no recorded output for '$*'\" >&2\n"
        "exit 2\n"
    )
