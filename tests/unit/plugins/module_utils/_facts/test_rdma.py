# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""RDMA facts (plugins/module_utils/_facts/rdma.py parsers, host.py sysfs reader, plugins/modules/rdma_facts.py):
the real sysfs dump, the simulated host's tree, ibstat / ibv_devinfo / ibstatus captures, the module."""

from __future__ import annotations

import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest
from test_support.paths import PROFILES, REAL, REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import host as _host
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import rdma as _rdma
from ansible_collections.narwhal.deploy.plugins.modules import rdma_facts

NET = REAL / "net"
REAL_TREE = NET / "gpud__sys-class-infiniband-h100.0"
SIM_SYS = PROFILES / "nvidia-8gpu-rdma" / "sys"
SIM_DEVICES = PROFILES / "nvidia-8gpu-rdma" / "devices"

H100_HCAS = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"]


def _summary(hcas):
    return [
        (
            h["name"],
            h["hca_type"],
            h["fw_ver"],
            h["board_id"],
            [(p["port"], p["state"], p["phys_state"], p["link_layer"], p["rate"], p["active"]) for p in h["ports"]],
        )
        for h in hcas
    ]


CX7_SYSFS = (
    "MT4129",
    "28.41.1000",
    "MT_0000000838",
    [(1, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec (4X NDR)", True)],
)
BF3_SYSFS = (
    "MT41692",
    "32.38.3056",
    "MT_0000000884",
    [(1, "ACTIVE", "LinkUp", "Ethernet", "200 Gb/sec (2X NDR)", True)],
)
SYSFS_EXPECTED = [(name, *CX7_SYSFS) for name in H100_HCAS[:-1]] + [("mlx5_bond_0", *BF3_SYSFS)]


@pytest.fixture
def real_sysfs(tmp_path):
    """The real dump of /sys/class/infiniband placed at <root>/class/infiniband."""
    (tmp_path / "class").mkdir()
    os.symlink(REAL_TREE, tmp_path / "class" / "infiniband")
    return tmp_path


def test_real_sysfs_dump(real_sysfs):
    hcas = _host.read_sysfs_hcas(str(real_sysfs))
    assert _summary(hcas) == SYSFS_EXPECTED
    # a plain dump: no device links, no infiniband_verbs, no ndevs
    for hca in hcas:
        assert (hca["numa_node"], hca["pci_bus_id"], hca["pci_path"], hca["uverbs"]) == (None, None, None, None)
        assert hca["ports"][0]["netdev"] is None


def test_no_infiniband_class(tmp_path):
    assert _host.read_sysfs_hcas(str(tmp_path)) is None


SIM_PLACEMENT = [
    ("mlx5_0", 0, "0000:00:15.0", "/dev/infiniband/uverbs0"),
    ("mlx5_1", 0, "0000:00:16.0", "/dev/infiniband/uverbs1"),
    ("mlx5_4", 0, "0000:00:17.0", "/dev/infiniband/uverbs2"),
    ("mlx5_5", 0, "0000:00:18.0", "/dev/infiniband/uverbs3"),
    ("mlx5_6", 1, "0000:00:19.0", "/dev/infiniband/uverbs4"),
    ("mlx5_7", 1, "0000:00:1a.0", "/dev/infiniband/uverbs5"),
    ("mlx5_8", 1, "0000:00:1b.0", "/dev/infiniband/uverbs6"),
    ("mlx5_9", 1, "0000:00:1c.0", "/dev/infiniband/uverbs7"),
    ("mlx5_bond_0", 0, "0000:00:1d.0", "/dev/infiniband/uverbs8"),
]


def test_simulated_host_tree():
    hcas = _host.read_sysfs_hcas(str(SIM_SYS))
    assert _summary(hcas) == SYSFS_EXPECTED
    assert [(h["name"], h["numa_node"], h["pci_bus_id"], h["uverbs"]) for h in hcas] == SIM_PLACEMENT


def _sim_hca_path(rail):
    """nvidia-8gpu-rdma (tests/harness/profiles/nvidia-8gpu-rdma/sys/README.md): rail i shares the second-level
    PCIe switch of GPU i."""
    k, j = divmod(rail, 2)
    base, sub = 0x10 * (k + 1), 0x10 * (k + 1) + 2 + 4 * j
    return ["pci0000:00", "0000:00:%02x.0" % (k + 1), "0000:%02x:00.0" % base, "0000:%02x:%02x.0" % (base + 1, j),
            "0000:%02x:00.0" % sub, "0000:%02x:01.0" % (sub + 1)]


def test_simulated_host_pci_paths():
    hcas = _host.read_sysfs_hcas(str(SIM_SYS))
    assert [h["pci_path"] for h in hcas] == [_sim_hca_path(i) for i in range(8)] + [["pci0000:00", "0000:00:05.0"]]


def test_amd_profile_pci_paths():
    """amd-4gpu-rdma: mlx5_6..9 share a PCIe switch with the MI100s (bus 83, a3, c3, e3), the rest stand alone."""
    hcas = _host.read_sysfs_hcas(str(SIM_SYS.parent.parent / "amd-4gpu-rdma" / "sys"))
    assert [(h["name"], h["numa_node"], h["pci_bus_id"], h["uverbs"]) for h in hcas] == [
        (name, numa, bdf, uverbs) for (name, numa, _bdf, uverbs), bdf in zip(SIM_PLACEMENT, (
            "0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0",
            "0000:84:00.0", "0000:a4:00.0", "0000:c4:00.0", "0000:e4:00.0", "0000:02:00.0"), strict=True)]
    paths = {h["name"]: h["pci_path"] for h in hcas}
    assert paths["mlx5_6"] == ["pci0000:80", "0000:80:01.1", "0000:81:00.0", "0000:82:01.0"]
    assert paths["mlx5_9"] == ["pci0000:e0", "0000:e0:01.1", "0000:e1:00.0", "0000:e2:01.0"]
    assert paths["mlx5_1"] == ["pci0000:20", "0000:20:01.1"]
    assert paths["mlx5_bond_0"] == ["pci0000:00", "0000:00:03.1"]


def test_simulated_pci_trees_are_what_the_generator_writes():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-sim-pci.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_simulated_tree_is_a_faithful_copy_of_the_real_dump():
    for dirpath, _dirs, files in os.walk(REAL_TREE):
        rel = os.path.relpath(dirpath, REAL_TREE)
        for name in files:
            real = pathlib.Path(dirpath, name).read_bytes()
            assert (SIM_SYS / "class" / "infiniband" / rel / name).read_bytes() == real


def test_simulated_uverbs_match_the_profile_devices():
    listed = sorted(
        line.split()[-1] for line in SIM_DEVICES.read_text().splitlines() if "/dev/infiniband/uverbs" in line
    )
    assert sorted(p[3] for p in SIM_PLACEMENT) == listed


def test_dereferenced_links_fall_back_to_uevent(tmp_path):
    root = tmp_path / "sys"
    shutil.copytree(SIM_SYS / "bus", root / "bus")
    shutil.copytree(
        SIM_SYS / "class" / "infiniband" / "mlx5_6", root / "class" / "infiniband" / "mlx5_6", symlinks=False
    )
    hca = _host.read_sysfs_hcas(str(root))[0]
    assert (hca["numa_node"], hca["pci_bus_id"], hca["uverbs"]) == (1, "0000:00:19.0", None)
    assert hca["pci_path"] is None  # no devices/ tree to place it in


def test_ndevs_netdev_and_natural_order(tmp_path):
    for name, state in (("mlx5_10", "1: DOWN"), ("mlx5_2", "4: ACTIVE")):
        port = tmp_path / "class" / "infiniband" / name / "ports" / "1"
        (port / "gid_attrs" / "ndevs").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "link_layer").write_text("Ethernet\n")
        (port / "gid_attrs" / "ndevs" / "0").write_text(f"ens{name[-1]}\n")
    hcas = _host.read_sysfs_hcas(str(tmp_path))
    assert [h["name"] for h in hcas] == ["mlx5_2", "mlx5_10"]
    assert [(h["ports"][0]["netdev"], h["ports"][0]["active"]) for h in hcas] == [("ens2", True), ("ens0", False)]


# ------------------------------------------------------------------------------------------------
# text parsers over every capture

CX7_IBSTAT = ("MT4129", "28.41.1000", None, [(1, "ACTIVE", "LinkUp", "InfiniBand", "400 Gb/sec", True)])


def _eth(name, hca_type, fw, rate, state="ACTIVE", phys="LinkUp"):
    return (name, hca_type, fw, None, [(1, state, phys, "Ethernet", rate, state == "ACTIVE")])


IBSTAT_EXPECTED = {
    "gpud__ibstat.47.0.h100.all.active.2.txt": [(name, *CX7_IBSTAT) for name in H100_HCAS[:-1]]
    + [("mlx5_bond_0", "MT41692", "32.38.3056", None, [(1, "ACTIVE", "LinkUp", "Ethernet", "200 Gb/sec", True)])],
    "gpud__ibstat.47.0.h100.some.down.with.polling.1.txt": [
        _eth("mlx5_0", "MT4129", "28.39.1002", "400 Gb/sec"),
        _eth("mlx5_1", "MT4125", "22.39.1002", "100 Gb/sec"),
        _eth("mlx5_10", "MT4129", "28.39.1002", "400 Gb/sec"),
        _eth("mlx5_11", "MT4129", "28.39.1002", "40 Gb/sec", "DOWN", "Polling"),
        _eth("mlx5_2", "MT4125", "22.39.1002", "100 Gb/sec"),
        _eth("mlx5_3", "MT4129", "28.39.1002", "400 Gb/sec"),
        _eth("mlx5_4", "MT4129", "28.39.1002", "400 Gb/sec"),
        _eth("mlx5_5", "MT4129", "28.39.1002", "40 Gb/sec", "DOWN", "Disabled"),
        _eth("mlx5_6", "MT4129", "28.39.1002", "400 Gb/sec"),
        _eth("mlx5_7", "MT4125", "22.39.1002", "100 Gb/sec"),
        _eth("mlx5_8", "MT4125", "22.39.1002", "100 Gb/sec"),
        _eth("mlx5_9", "MT4129", "28.39.1002", "400 Gb/sec"),
    ],
}

MLX4_PORTS = [(1, "ACTIVE", None, "InfiniBand", None, True), (2, "DOWN", None, "InfiniBand", None, False)]
IBV_DEVINFO_EXPECTED = {
    "heioy__ibv_devinfo.2xmlx4.txt": [
        ("mlx4_1", "MT4099", "2.42.5000", "MT_1090120019", MLX4_PORTS),
        ("mlx4_0", "MT4099", "2.42.5000", "MT_1090120019", MLX4_PORTS),
    ],
}

HDR = [(1, "ACTIVE", "LinkUp", "InfiniBand", "200 Gb/sec (4X HDR)", True)]
IBSTATUS_EXPECTED = {
    "gpud__ibstatus.39.0.a100.all.active.0.txt": [(f"mlx5_{i}", None, None, None, HDR) for i in range(8)]
    + [("mlx5_8", None, None, None, [(1, "ACTIVE", "LinkUp", "Ethernet", "40 Gb/sec (4X QDR)", True)])],
}


def test_every_text_capture_has_expectations():
    names = sorted(p.name for p in NET.glob("*.txt"))
    assert names == sorted(list(IBSTAT_EXPECTED) + list(IBV_DEVINFO_EXPECTED) + list(IBSTATUS_EXPECTED))


@pytest.mark.parametrize("name", sorted(IBSTAT_EXPECTED))
def test_parse_ibstat(name):
    assert _summary(_rdma.parse_ibstat((NET / name).read_text())) == IBSTAT_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(IBV_DEVINFO_EXPECTED))
def test_parse_ibv_devinfo(name):
    assert _summary(_rdma.parse_ibv_devinfo((NET / name).read_text())) == IBV_DEVINFO_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(IBSTATUS_EXPECTED))
def test_parse_ibstatus(name):
    assert _summary(_rdma.parse_ibstatus((NET / name).read_text())) == IBSTATUS_EXPECTED[name]


def _rates(hcas):
    return sorted(set((p["rate"], p["rate_bits_s"]) for h in hcas for p in h["ports"]), key=str)


# every port rate the real captures and the real sysfs dump hold, in bits per second (the transfer probe's nominal
# rate of an RDMA rail); ibv_devinfo without -v prints no rate
RATES_EXPECTED = {
    "sysfs": [("200 Gb/sec (2X NDR)", 200000000000), ("400 Gb/sec (4X NDR)", 400000000000)],
    "gpud__ibstat.47.0.h100.all.active.2.txt": [("200 Gb/sec", 200000000000), ("400 Gb/sec", 400000000000)],
    "gpud__ibstat.47.0.h100.some.down.with.polling.1.txt": [
        ("100 Gb/sec", 100000000000), ("40 Gb/sec", 40000000000), ("400 Gb/sec", 400000000000)],
    "heioy__ibv_devinfo.2xmlx4.txt": [(None, None)],
    "gpud__ibstatus.39.0.a100.all.active.0.txt": [("200 Gb/sec (4X HDR)", 200000000000),
                                                  ("40 Gb/sec (4X QDR)", 40000000000)],
}


@pytest.mark.parametrize("name", sorted(RATES_EXPECTED))
def test_port_rates_in_bits_from_the_real_captures(name, real_sysfs):
    if name == "sysfs":
        hcas = _host.read_sysfs_hcas(str(real_sysfs))
    else:
        parser = {"ibstat": _rdma.parse_ibstat, "ibv_devinfo": _rdma.parse_ibv_devinfo,
                  "ibstatus": _rdma.parse_ibstatus}[name.split("__")[1].split(".")[0]]
        hcas = parser((NET / name).read_text())
    assert _rates(hcas) == sorted(RATES_EXPECTED[name], key=str)


@pytest.mark.parametrize("rate, bits", [
    ("2.5 Gb/sec (1X SDR)", 2500000000),  # the kernel's half-Gb/s form (rate_show: "%d.5")
    ("14 Gb/sec (1X FDR)", 14000000000),
    ("800 Gb/sec (4X XDR)", 800000000000),
    ("400 Gb/sec", 400000000000),  # ibstat's number, as _ibstat_rate writes it
    ("25.0 Gbps (32)", None),  # ibv_devinfo -v's active_speed: one lane's speed, not the port's rate
    ("", None), (None, None), ("fast", None)])
def test_ib_rate_bits(rate, bits):
    assert _rdma.ib_rate_bits(rate) == bits


@pytest.mark.parametrize("parser", [_rdma.parse_ibstat, _rdma.parse_ibv_devinfo, _rdma.parse_ibstatus])
def test_text_parsers_empty_and_garbage(parser):
    assert parser("") == []
    with pytest.raises(_rdma.RdmaParseError):
        parser("something else entirely\n")


# ------------------------------------------------------------------------------------------------
# the module


@pytest.fixture
def module_runner(module_runner, monkeypatch, tmp_path):
    """conftest's runner for rdma_facts.main, with PATH reduced to a directory of stub tools."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))
    run_main = module_runner

    def run(args, stubs=None):
        for tool, body in (stubs or {}).items():
            path = bindir / tool
            path.write_text("#!/bin/sh\n" + body)
            path.chmod(0o755)
        return run_main(rdma_facts.main, args)

    return run


@pytest.fixture
def sim_dev(tmp_path):
    """A dev_root holding the RDMA nodes the profile's devices file lists."""
    dev = tmp_path / "dev"
    for line in SIM_DEVICES.read_text().splitlines():
        if line.startswith("c ") and "/dev/infiniband/" in line:
            node = dev / line.split()[-1][len("/dev/") :]
            node.parent.mkdir(parents=True, exist_ok=True)
            node.write_text("")
    return dev


@pytest.fixture
def no_host_tools():
    for tool in ("ibstat", "ibv_devinfo"):
        for directory in ("/sbin", "/usr/sbin", "/usr/local/sbin"):
            if os.path.exists(os.path.join(directory, tool)):
                pytest.skip(f"this machine has {tool} in {directory}")


def test_module_simulated_host(module_runner, sim_dev):
    how, result = module_runner({"sysfs_root": str(SIM_SYS), "dev_root": str(sim_dev)})
    assert how == "exit", result
    assert result["changed"] is False
    facts = result["ansible_facts"]["narwhal_rdma"]
    assert facts["rdma_cm"] == "/dev/infiniband/rdma_cm"
    assert facts["devices"] == [f"/dev/infiniband/uverbs{i}" for i in range(9)] + ["/dev/infiniband/rdma_cm"]
    assert facts["source"] == os.path.join(str(SIM_SYS), "class", "infiniband")
    assert [(h["name"], h["numa_node"], h["pci_bus_id"], h["uverbs"]) for h in facts["hcas"]] == SIM_PLACEMENT
    assert facts["hcas"][0]["pci_path"] == _sim_hca_path(0)
    assert facts["hcas"][0]["ports"] == [
        {
            "port": 1,
            "state": "ACTIVE",
            "phys_state": "LinkUp",
            "link_layer": "InfiniBand",
            "rate": "400 Gb/sec (4X NDR)",
            "rate_bits_s": 400000000000,
            "netdev": None,
            "active": True,
        }
    ]


def test_module_falls_back_to_ibstat(module_runner, tmp_path, no_host_tools):
    stub = 'if [ "$#" -eq 0 ]; then exec /bin/cat "%s"; fi\nexit 2\n' % (
        NET / "gpud__ibstat.47.0.h100.all.active.2.txt"
    )
    how, result = module_runner({"sysfs_root": str(tmp_path), "dev_root": str(tmp_path)}, {"ibstat": stub})
    assert how == "exit", result
    facts = result["ansible_facts"]["narwhal_rdma"]
    assert facts["source"] == "ibstat"
    assert [h["name"] for h in facts["hcas"]] == H100_HCAS
    assert (facts["rdma_cm"], facts["devices"]) == (None, [])


def test_module_falls_back_to_ibv_devinfo(module_runner, tmp_path, no_host_tools):
    stub = 'exec /bin/cat "%s"\n' % (NET / "heioy__ibv_devinfo.2xmlx4.txt")
    how, result = module_runner({"sysfs_root": str(tmp_path), "dev_root": str(tmp_path)}, {"ibv_devinfo": stub})
    assert how == "exit", result
    assert [h["name"] for h in result["ansible_facts"]["narwhal_rdma"]["hcas"]] == ["mlx4_1", "mlx4_0"]


def test_module_host_without_rdma(module_runner, tmp_path, no_host_tools):
    how, result = module_runner({"sysfs_root": str(tmp_path), "dev_root": str(tmp_path)})
    assert how == "exit", result
    assert result["ansible_facts"]["narwhal_rdma"] == {"hcas": [], "rdma_cm": None, "devices": [], "source": None}


def test_module_tool_fails(module_runner, tmp_path, no_host_tools):
    stub = "echo 'ibpanic: [1234] main: stat of IB device mlx5_0 failed' >&2\nexit 1\n"
    how, result = module_runner({"sysfs_root": str(tmp_path)}, {"ibstat": stub})
    assert how == "fail"
    assert "'ibstat' failed on host %s (rc=1): ibpanic" % socket.gethostname() in result["msg"]
    assert "mlx5_ib" in result["msg"]


def test_module_tool_prints_garbage(module_runner, tmp_path, no_host_tools):
    how, result = module_runner({"sysfs_root": str(tmp_path)}, {"ibstat": "echo 'usage: ibstat [-d]'\n"})
    assert how == "fail"
    assert "'ibstat' output on host %s is not the text ibstat writes ('usage: ibstat [-d]')" % socket.gethostname() \
        in result["msg"]


# ------------------------------------------------------------------------------------------------
# tools that hang or lie (issue 13, class 6)


@pytest.mark.parametrize("tool", ["ibstat", "ibv_devinfo"])
def test_module_tool_that_hangs_is_killed_and_named(module_runner, tmp_path, no_host_tools, tool):
    started = time.monotonic()
    how, result = module_runner({"sysfs_root": str(tmp_path), "command_timeout": 1}, {tool: "/bin/sleep 30\n"})
    assert time.monotonic() - started < 10
    assert how == "fail" and result["timed_out"] is True
    assert result["msg"].startswith(f"'{tool}' on host {socket.gethostname()} did not answer within 1 s (timed out, "
                                    f"killed); {tool} hangs when an HCA's driver or firmware is stuck")


@pytest.mark.parametrize("tool, output, cause", [
    ("ibv_devinfo", "hca_id:\tmlx5_0\n\tport:\t\tone\n", "'port: one' is not a port number"),
    ("ibv_devinfo", "transport: InfiniBand (0)\n", "no 'hca_id:' lines"),
    ("ibstat", "Port 1:\n\tState: Active\n", "no \"CA '<name>'\" lines"),
], ids=["devinfo-port-word", "devinfo-no-hca", "ibstat-no-ca"])
def test_module_odd_tool_output_is_named(module_runner, tmp_path, no_host_tools, tool, output, cause):
    captured = tmp_path / "out.txt"
    captured.write_text(output)
    how, result = module_runner({"sysfs_root": str(tmp_path)}, {tool: f"exec /bin/cat {captured}\n"})
    assert how == "fail", result
    assert f"'{tool}' output on host {socket.gethostname()} is not the text {tool} writes" in result["msg"]
    assert cause in result["msg"]


def test_ibv_devinfo_without_devices_is_no_hca():
    assert _rdma.parse_ibv_devinfo("No IB devices found\n") == []


# ------------------------------------------------------------------------------------------------
# impossible listings (issue 24): an HCA twice, a port twice or numbered 0, fewer ports than the HCA says, an HCA
# without ports -- an error, never fewer HCAs or ports

DEVINFO = (NET / "heioy__ibv_devinfo.2xmlx4.txt").read_text()
IBSTAT = (NET / "gpud__ibstat.47.0.h100.all.active.2.txt").read_text()
IBSTATUS = (NET / "gpud__ibstatus.39.0.a100.all.active.0.txt").read_text()
FIRST_CA = IBSTAT[: IBSTAT.index("CA 'mlx5_1'")]
FIRST_HCA = DEVINFO[: DEVINFO.index("hca_id:\tmlx4_0")]


@pytest.mark.parametrize("parser, text, cause", [
    (_rdma.parse_ibv_devinfo, DEVINFO + FIRST_HCA, "HCA mlx4_1 is listed twice; ibv_devinfo lists each HCA once"),
    (_rdma.parse_ibv_devinfo, FIRST_HCA.replace("port:\t2", "port:\t1"), "HCA mlx4_1: port 1 is listed twice"),
    (_rdma.parse_ibv_devinfo, FIRST_HCA.replace("port:\t1", "port:\t0"), "HCA mlx4_1: port 0 is not an HCA port"),
    (_rdma.parse_ibv_devinfo, FIRST_HCA[: FIRST_HCA.index("\t\tport:\t2")],
     "HCA mlx4_1 says it has 2 port(s) but 1 are listed"),
    (_rdma.parse_ibv_devinfo, FIRST_HCA.replace("phys_port_cnt:\t\t\t2", "phys_port_cnt:\t\t\ttwo"),
     "HCA mlx4_1: 'phys_port_cnt: two' is not a number of ports"),
    (_rdma.parse_ibv_devinfo, "hca_id:\tmlx5_0\n\x00\x17 garbage: yes\n",
     "HCA mlx5_0 has no port entries; ibv_devinfo lists every port of an HCA"),
    (_rdma.parse_ibstat, IBSTAT + FIRST_CA, "HCA mlx5_0 is listed twice; ibstat lists each HCA once"),
    (_rdma.parse_ibstat, FIRST_CA.replace("Number of ports: 1", "Number of ports: 2"),
     "HCA mlx5_0 says it has 2 port(s) but 1 are listed"),
    (_rdma.parse_ibstat, FIRST_CA + FIRST_CA[FIRST_CA.index("Port 1:"):], "HCA mlx5_0: port 1 is listed twice"),
    (_rdma.parse_ibstat, "CA 'mlx5_0'\n\tCA type: MT4129\n%%garbage%%\n", "HCA mlx5_0 has no port entries"),
    (_rdma.parse_ibstatus, IBSTATUS + IBSTATUS[: IBSTATUS.index("\n\n") + 2],
     "port 1 is listed twice"),
], ids=["devinfo-hca-twice", "devinfo-port-twice", "devinfo-port-0", "devinfo-cut", "devinfo-count-word",
        "devinfo-no-ports", "ibstat-ca-twice", "ibstat-cut", "ibstat-port-twice", "ibstat-no-ports",
        "ibstatus-port-twice"])
def test_impossible_hca_listings_are_refused(parser, text, cause):
    with pytest.raises(_rdma.RdmaParseError) as err:
        parser(text)
    assert cause in str(err.value)


def test_module_refuses_a_cut_ibv_devinfo_naming_tool_and_host(module_runner, tmp_path, no_host_tools):
    captured = tmp_path / "out.txt"
    captured.write_text(FIRST_HCA[: FIRST_HCA.index("\t\tport:\t2")])
    how, result = module_runner({"sysfs_root": str(tmp_path)}, {"ibv_devinfo": f"exec /bin/cat {captured}\n"})
    assert how == "fail", result
    assert result["msg"].startswith(f"'ibv_devinfo' output on host {socket.gethostname()} is not the text "
                                    "ibv_devinfo writes (")
    assert "HCA mlx4_1 says it has 2 port(s) but 1 are listed; the output is cut short or garbled" in result["msg"]
