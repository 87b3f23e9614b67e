# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""RDMA facts (plugins/module_utils/_facts/rdma.py parsers, plugins/modules/rdma_facts.py): ibstat / ibv_devinfo /
ibstatus captures, the simulated host's tree against the real dump and its generator, the module. The sysfs reader
(_facts/rdma_reader.py) is tested in test_rdma_reader.py."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from test_support.paths import REAL, REPO
from test_support.rdma import (
    H100_HCAS,
    REAL_TREE,
    SIM_DEVICES,
    SIM_PLACEMENT,
    SIM_SYS,
    real_sysfs_root,
    sim_hca_path,
    summary,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import rdma as _rdma
from ansible_collections.narwhal.deploy.plugins.module_utils._facts import rdma_reader as _rdma_reader
from ansible_collections.narwhal.deploy.plugins.modules import rdma_facts

NET = REAL / "net"


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
    assert summary(_rdma.parse_ibstat((NET / name).read_text())) == IBSTAT_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(IBV_DEVINFO_EXPECTED))
def test_parse_ibv_devinfo(name):
    assert summary(_rdma.parse_ibv_devinfo((NET / name).read_text())) == IBV_DEVINFO_EXPECTED[name]


@pytest.mark.parametrize("name", sorted(IBSTATUS_EXPECTED))
def test_parse_ibstatus(name):
    assert summary(_rdma.parse_ibstatus((NET / name).read_text())) == IBSTATUS_EXPECTED[name]


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


@pytest.fixture
def real_sysfs(tmp_path):
    """The real dump of /sys/class/infiniband placed at <root>/class/infiniband."""
    return real_sysfs_root(tmp_path)


@pytest.mark.parametrize("name", sorted(RATES_EXPECTED))
def test_port_rates_in_bits_from_the_real_captures(name, real_sysfs):
    if name == "sysfs":
        hcas = _rdma_reader.read_sysfs_hcas(str(real_sysfs))
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
    assert facts["hcas"][0]["pci_path"] == sim_hca_path(0)
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
