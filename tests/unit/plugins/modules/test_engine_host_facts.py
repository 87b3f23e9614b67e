"""engine_host_facts (discover.yml's one round trip per host) returns exactly the facts, and fails with exactly
the messages, of interface_facts, gpu_facts, rdma_facts, image_facts and model_facts run one by one."""
from __future__ import annotations

import json
import socket
import time

import pytest
from test_support.gpu import NVIDIA, NVIDIA_SYS, replay
from test_support.image import STANDIN_ATTRS, STANDIN_VERSIONS, FakeClient
from test_support.model import checkpoint

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import image as _image
from ansible_collections.narwhal.deploy.plugins.modules import (
    engine_host_facts,
    gpu_facts,
    image_facts,
    interface_facts,
    model_facts,
    rdma_facts,
)

IP_JSON = [
    {"ifindex": 1, "ifname": "lo", "operstate": "UNKNOWN", "mtu": 65536,
     "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8, "scope": "host"}]},
    {"ifindex": 7, "ifname": "eth1", "operstate": "UP", "mtu": 1500,
     "addr_info": [{"family": "inet", "local": "172.31.201.11", "prefixlen": 24, "scope": "global"},
                   {"family": "inet6", "local": "fd00:6e77:b1::11", "prefixlen": 64, "scope": "global"},
                   {"family": "inet6", "local": "fe80::1", "prefixlen": 64, "scope": "link"}]},
]


@pytest.fixture
def host(tmp_path, monkeypatch):
    """Stub tools on PATH (ip, nvidia-smi), a dev tree, a checkpoint, a fake Docker client for both modules."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "ip.json").write_text(json.dumps(IP_JSON))
    (bindir / "ip").write_text("#!/bin/sh\nexec /bin/cat %s\n" % (tmp_path / "ip.json"))
    (bindir / "nvidia-smi").write_text("#!/bin/sh\n" + replay(NVIDIA / "datakit__gtx-8card.xml", "-q -x"))
    for tool in bindir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).write_text("")
    model = checkpoint(tmp_path, "aiconf__meta-llama--Meta-Llama-3.1-8B")
    # the interface's speed: a 25 GbE NIC as the kernel links it into devices/
    nic = tmp_path / "net-sys" / "devices" / "pci0000:00" / "0000:00:03.0" / "net" / "eth1"
    nic.mkdir(parents=True)
    (nic / "speed").write_text("25000\n")
    (tmp_path / "net-sys" / "class" / "net").mkdir(parents=True)
    (tmp_path / "net-sys" / "class" / "net" / "eth1").symlink_to(nic)
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS)
    monkeypatch.setattr(image_facts, "make_client", lambda docker_host, timeout: client)
    monkeypatch.setattr(engine_host_facts, "make_client", lambda docker_host, timeout: client)
    return {"sysfs_root": str(NVIDIA_SYS), "dev_root": str(dev), "model": str(model), "net": str(tmp_path / "net-sys"),
            "cache_dir": str(tmp_path / "cache"), "client": client}


def _singles(module_runner, host, interface="eth1"):
    hw = {"sysfs_root": host["sysfs_root"], "dev_root": host["dev_root"]}
    # the combined module reads what discovery records (its default), image_facts the same when asked for it
    image = {"image": "narwhal-sim/engine-standin:latest", "cache_dir": host["cache_dir"],
             "distributions": list(_image.DISCOVERY_DISTRIBUTIONS)}
    facts = {}
    for main, args in ((interface_facts.main, {"name": interface, "family": "ipv4", "sysfs_root": host["net"]}),
                       (gpu_facts.main, hw),
                       (rdma_facts.main, hw),
                       (image_facts.main, image),
                       (model_facts.main, {"path": host["model"]})):
        how, result = module_runner(main, args)
        if how == "fail":
            return how, result
        facts.update(result["ansible_facts"])
    return "exit", {"changed": False, "ansible_facts": facts}


def _combined(module_runner, host, interface="eth1"):
    return module_runner(engine_host_facts.main, {
        "interface": interface, "family": "ipv4", "sysfs_root": host["sysfs_root"], "dev_root": host["dev_root"],
        "net_sysfs_root": host["net"],
        "image": "narwhal-sim/engine-standin:latest", "cache_dir": host["cache_dir"], "model_path": host["model"]})


def test_same_facts_as_the_single_modules(module_runner, host):
    how, combined = _combined(module_runner, host)            # cold: one version container, cache written
    assert how == "exit", combined
    assert len(host["client"].created) == 1
    how, singles = _singles(module_runner, host)               # the cache is shared: no container either
    assert how == "exit", singles
    assert len(host["client"].created) == 1
    assert combined["changed"] is False
    assert sorted(combined["ansible_facts"]) == ["narwhal_gpus", "narwhal_image", "narwhal_interface",
                                                 "narwhal_model", "narwhal_rdma"]
    assert combined["ansible_facts"]["narwhal_image"]["cached"] is False
    # the interface's speed from net_sysfs_root, the GPUs and HCAs from the simulated sysfs_root
    assert combined["ansible_facts"]["narwhal_interface"]["speed"] == {"mbps": 25000, "virtual": False, "why": None}
    assert combined["ansible_facts"]["narwhal_rdma"]["hcas"][0]["ports"][0]["rate_bits_s"] == 400000000000
    singles["ansible_facts"]["narwhal_image"]["cached"] = False
    assert combined == singles
    how, again = _combined(module_runner, host)                # warm: cached by image ID, no container started
    assert how == "exit" and again["ansible_facts"]["narwhal_image"]["cached"] is True
    assert len(host["client"].created) == 1


def test_same_failure_as_the_single_module(module_runner, host):
    assert _combined(module_runner, host, "eth9") == _singles(module_runner, host, "eth9")
    how, result = _combined(module_runner, host, "eth9")
    assert how == "fail" and "interface eth9 does not exist on this host" in result["msg"]


# ------------------------------------------------------------------------------------------------
# tools that hang or lie (issue 13, class 6): the same named failure from the combined and the single modules


def _ip_prints(host_tmp, text):
    (host_tmp / "ip.json").write_text(text)


@pytest.mark.parametrize("text, cause", [
    ("", "no output (every host has at least the loopback interface)"),
    ("[]", "an empty list"),
    ("null", "entry 0 is a JSON NoneType, not an interface object"),
    ("[1, 2]", "entry 0 is a JSON int, not an interface object"),
    ('{"mtu": 1500}', "entry 0 has no ifname"),
    ('[{"ifname": "eth1", "addr_info": "172.31.201.11"}]', "interface eth1: addr_info is not a list of address"),
    ("Object \"addr\" is unknown, try \"ip help\".", "line 1 is not JSON"),
    ("[" * 100000, "nested too deeply to read"),
    # impossible listings (issue 24): one interface twice would hide the first one's state
    ('[{"ifname": "eth1", "operstate": "DOWN"}, {"ifname": "eth1", "operstate": "UP"}]',
     "interface eth1 is listed twice"),
    ('[{"ifname": "eth1", "flags": "UP,LOWER_UP"}]', "interface eth1: flags is not a list of flag names"),
    ('[{"ifname": "eth1", "operstate": 6}]', "interface eth1: operstate is not a state name"),
], ids=["empty", "empty-list", "null", "ints", "no-ifname", "addr-info-string", "old-iproute2", "deep", "eth1-twice",
        "flags-string", "operstate-number"])
def test_odd_ip_output_is_named_not_a_missing_interface(module_runner, host, tmp_path, text, cause):
    _ip_prints(tmp_path, text)
    how, result = _combined(module_runner, host)
    assert (how, result) == _singles(module_runner, host)
    assert how == "fail"
    assert result["msg"].startswith("'ip -j addr show' output on host %s is not the JSON 'ip -j' writes (a list of "
                                    "interface objects) (" % socket.gethostname())
    assert cause in result["msg"] and "does not exist" not in result["msg"]


def test_ip_that_hangs_is_killed_and_named(module_runner, host, tmp_path):
    (tmp_path / "bin" / "ip").write_text("#!/bin/sh\n/bin/sleep 30\n")
    started = time.monotonic()
    how, result = module_runner(interface_facts.main, {"name": "eth1", "command_timeout": 1})
    assert time.monotonic() - started < 10
    assert how == "fail" and result["timed_out"] is True
    assert result["msg"].startswith("'ip -j addr show' on host %s did not answer within 1 s (timed out, killed); ip "
                                    "hangs when the kernel's netlink socket does not answer" % socket.gethostname())


# ------------------------------------------------------------------------------------------------
# a fabric interface that cannot carry KV (issue 24): refused on the host, naming the tool, the host and the fix


@pytest.mark.parametrize("operstate, flags, cause", [
    ("DOWN", ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP"],
     "it is administratively up but has no carrier (ip reports flag NO-CARRIER, operstate DOWN)"),
    ("LOWERLAYERDOWN", ["NO-CARRIER", "BROADCAST", "MULTICAST", "UP", "M-DOWN"],
     "it is administratively up but has no carrier (ip reports flag NO-CARRIER, operstate LOWERLAYERDOWN)"),
    ("DOWN", ["BROADCAST", "MULTICAST"], "it is administratively down (ip reports no UP flag, operstate DOWN)"),
], ids=["no-carrier", "lower-layer-down", "admin-down"])
def test_a_link_without_carrier_is_refused(module_runner, host, tmp_path, operstate, flags, cause):
    links = json.loads(json.dumps(IP_JSON))
    links[1].update(operstate=operstate, flags=flags)
    _ip_prints(tmp_path, json.dumps(links))
    how, result = _combined(module_runner, host)
    assert (how, result) == _singles(module_runner, host)
    assert how == "fail"
    assert result["msg"].startswith("'ip -j addr show' on host %s: interface eth1 cannot carry KV: %s, so its "
                                    "addresses must not go into the records; " % (socket.gethostname(), cause))
    assert "NARWHAL_FABRIC_INTERFACE" in result["msg"]


def test_an_unknown_operstate_without_no_carrier_is_usable(module_runner, host, tmp_path):
    links = json.loads(json.dumps(IP_JSON))
    links[1].update(operstate="UNKNOWN", flags=["POINTOPOINT", "NOARP", "UP", "LOWER_UP"])
    _ip_prints(tmp_path, json.dumps(links))
    how, result = module_runner(interface_facts.main, {"name": "eth1", "family": "ipv4"})
    assert how == "exit", result
    assert result["ansible_facts"]["narwhal_interface"]["global_addresses"] == ["172.31.201.11"]
