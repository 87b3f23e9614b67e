"""engine_host_facts (discover.yml's one round trip per host) returns exactly the facts, and fails with exactly
the messages, of interface_facts, gpu_facts, rdma_facts, image_facts and model_facts run one by one."""
from __future__ import annotations

import json

import pytest
from test_gpu_facts import NVIDIA, NVIDIA_SYS, _replay
from test_image_facts import STANDIN_ATTRS, STANDIN_VERSIONS, FakeClient
from test_model_facts import checkpoint

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
    (bindir / "nvidia-smi").write_text("#!/bin/sh\n" + _replay(NVIDIA / "datakit__gtx-8card.xml", "-q -x"))
    for tool in bindir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):
        (dev / name).write_text("")
    model = checkpoint(tmp_path, "aiconf__meta-llama--Meta-Llama-3.1-8B")
    client = FakeClient(STANDIN_ATTRS, STANDIN_VERSIONS)
    monkeypatch.setattr(image_facts, "make_client", lambda docker_host, timeout: client)
    monkeypatch.setattr(engine_host_facts, "make_client", lambda docker_host, timeout: client)
    return {"sysfs_root": str(NVIDIA_SYS), "dev_root": str(dev), "model": str(model),
            "cache_dir": str(tmp_path / "cache"), "client": client}


def _singles(module_runner, host, interface="eth1"):
    hw = {"sysfs_root": host["sysfs_root"], "dev_root": host["dev_root"]}
    image = {"image": "narwhal-sim/engine-standin:latest", "cache_dir": host["cache_dir"]}
    facts = {}
    for main, args in ((interface_facts.main, {"name": interface, "family": "ipv4"}), (gpu_facts.main, hw),
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
    singles["ansible_facts"]["narwhal_image"]["cached"] = False
    assert combined == singles
    how, again = _combined(module_runner, host)                # warm: cached by image ID, no container started
    assert how == "exit" and again["ansible_facts"]["narwhal_image"]["cached"] is True
    assert len(host["client"].created) == 1


def test_same_failure_as_the_single_module(module_runner, host):
    assert _combined(module_runner, host, "eth9") == _singles(module_runner, host, "eth9")
    how, result = _combined(module_runner, host, "eth9")
    assert how == "fail" and "interface eth9 does not exist on this host" in result["msg"]
