"""Discovery part 1, pure core: address choice over real `ip -j addr` captures, URLs, overrides,
input validation, the one-set writer and complete-value substitution."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common import errors as _errors
from ansible_collections.narwhal.deploy.plugins.module_utils._common import secrets as _secrets
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet, render_env
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    global_addresses,
    interface_addresses,
    parse_ip_json,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import (
    DotenvError,
    parse_dotenv,
    read_dotenv,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.paths import FALLBACK_IGNORED
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs import writer as _writer
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.schemas import (
    LAUNCH_CONFIG_SCHEMA,
    validation_errors,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import (
    SubstitutionError,
    layered_env,
    resolve_values,
)
from ansible_collections.narwhal.deploy.plugins.modules import site_inputs

REPO = pathlib.Path(__file__).resolve().parents[2]
NET = REPO / "tests" / "fixtures" / "real" / "net"


def iface(capture, name):
    link, addresses = interface_addresses(parse_ip_json((NET / capture).read_text()), name)
    assert link is not None
    return addresses


@pytest.mark.parametrize(
    "capture,name,family,expected",
    [
        # wlan0: 169.254/16 labelled scope global, a temporary, a mngtmpaddr (stable), a deprecated /128
        ("nix_stat__ip-j-addr.json", "wlan0", "ipv4", ["192.168.2.230"]),
        ("nix_stat__ip-j-addr.json", "wlan0", "ipv6", ["2003:df:174b:85e7:4e20:b8ff:fea8:105f"]),
        ("nix_stat__ip-j-addr.json", "tailscale0", "ipv6", ["fd7a:115c:a1e0::c436:fc3a"]),
        ("nix_stat__ip-j-addr.json", "lo", "any", []),
        # netplan: temporary + mngtmpaddr on wlan0, single-line JSON without trailing newline
        ("netplan__ip-d-j-addr.json", "wlan0", "ipv6", ["2001:9e8:a19f:1c00:f24f:f724:5dd1:d0ad"]),
        ("netplan__ip-d-j-addr.json", "enp0s31f6", "any", ["192.168.178.62", "2001:9e8:a19f:1c00:56e1:adff:fe5f:24b4"]),
        ("netplan__ip-d-j-addr.json", "wwan0", "any", []),
        # cloud-init: an fe80:: address labelled scope global is still link-local
        ("cloud-init__sample-ipaddrshow-json.json", "enp0s25", "ipv6", []),
        ("cloud-init__sample-ipaddrshow-json.json", "enp0s25", "ipv4", ["192.168.2.18"]),
        ("cloud-init__sample-ipaddrshow-json-down.json", "eth0", "any", []),
    ],
)
def test_global_addresses_from_real_captures(capture, name, family, expected):
    assert global_addresses(iface(capture, name), family) == expected


def test_rejection_reasons_are_named():
    reasons = {a["address"]: a["reason"] for a in iface("nix_stat__ip-j-addr.json", "wlan0")}
    assert reasons["169.254.11.146"] == "link-local"
    assert reasons["2003:df:174b:85e7:9132:9421:5943:ae00"] == "temporary"
    assert reasons["2003:df:174b:8579:4e20:b8ff:fea8:105f"] == "deprecated"
    assert reasons["fe80::4e20:b8ff:fea8:105f"] == "scope link"


def facts(*addrs):
    """narwhal_interface facts for a simulated eth1 with the given (address, family[, flag]) entries."""
    out = []
    for entry in addrs:
        address, family = entry[0], entry[1]
        info = {"family": "inet" if family == "ipv4" else "inet6", "local": address, "prefixlen": 24,
                "scope": "global", "preferred_life_time": 4294967295}
        if len(entry) > 2:
            info[entry[2]] = True
        out.append(info)
    _link, addresses = interface_addresses([{"ifname": "eth1", "addr_info": out}], "eth1")
    return {"addresses": addresses, "host_id": None}


BASE = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode",
        "NARWHAL_IMAGE": "vllm/vllm-openai:v0.33.0", "NARWHAL_MODEL_PATH": "/srv/models/tiny"}
TWO = {"engine-1": facts(("10.0.0.11", "ipv4"), ("fd00::11", "ipv6")),
       "engine-2": facts(("10.0.0.12", "ipv4"), ("fd00::12", "ipv6"))}


def plan(extra=None, interfaces=None, engines=("engine-1", "engine-2")):
    values = dict(BASE, **(extra or {}))
    return build_fleet(load_inputs(values), list(engines), interfaces or TWO)


def test_ipv4_plan_urls_and_fleet_references():
    result = plan()
    env = dict(result["deployment_env"])
    assert env["NARWHAL_NODE_1_IP"] == "10.0.0.11"
    assert env["NARWHAL_NODE_1_URL"] == "http://10.0.0.11:8000"
    assert env["NARWHAL_NODE_2_ATTESTATION_URL"] == "http://10.0.0.12:8010/v1/attestation"
    assert result["fleet"][0] == {"iid": "n1", "engine": "engine-1", "url": "${NARWHAL_NODE_1_URL}",
                                  "attestation_url": "${NARWHAL_NODE_1_ATTESTATION_URL}", "role": "prefill"}
    assert [r["role"] for r in result["fleet"]] == ["prefill", "decode"]


def test_ipv6_plan_brackets_hosts():
    env = dict(plan({"NARWHAL_BIND_FAMILY": "ipv6", "NARWHAL_ENGINE_PORT": "9000"})["deployment_env"])
    assert env["NARWHAL_NODE_2_IP"] == "fd00::12"
    assert env["NARWHAL_NODE_2_URL"] == "http://[fd00::12]:9000"
    assert env["NARWHAL_NODE_2_ATTESTATION_URL"] == "http://[fd00::12]:8010/v1/attestation"


def test_explicit_ip_wins_over_several_addresses():
    many = dict(TWO, **{"engine-2": facts(("fd00::12", "ipv6"), ("fd00::99", "ipv6"))})
    with pytest.raises(InputError) as err:
        plan({"NARWHAL_BIND_FAMILY": "ipv6"}, many)
    assert err.value.key == "NARWHAL_NODE_2_IP" and "fd00::12, fd00::99" in str(err.value)
    env = dict(plan({"NARWHAL_BIND_FAMILY": "ipv6", "NARWHAL_NODE_2_IP": "fd00::99"}, many)["deployment_env"])
    assert env["NARWHAL_NODE_2_URL"] == "http://[fd00::99]:8000"


def test_temporary_and_deprecated_do_not_count_as_several():
    host = facts(("fd00::12", "ipv6"), ("fd00::77", "ipv6", "temporary"), ("fd00::78", "ipv6", "deprecated"))
    env = dict(plan({"NARWHAL_BIND_FAMILY": "ipv6"}, dict(TWO, **{"engine-2": host}))["deployment_env"])
    assert env["NARWHAL_NODE_2_IP"] == "fd00::12"


def test_url_overrides_honoured_and_port_checked():
    env = dict(plan({"NARWHAL_NODE_1_URL": "http://engine-a.example:8000"})["deployment_env"])
    assert env["NARWHAL_NODE_1_URL"] == "http://engine-a.example:8000"
    assert env["NARWHAL_NODE_1_IP"] == "10.0.0.11"
    with pytest.raises(InputError) as err:
        plan({"NARWHAL_NODE_1_URL": "http://engine-a.example:9000"})
    assert err.value.key == "NARWHAL_NODE_1_URL" and "NARWHAL_NODE_1_ENGINE_PORT=9000" in str(err.value)
    env = dict(plan({"NARWHAL_NODE_1_URL": "http://engine-a.example:9000",
                     "NARWHAL_NODE_1_ENGINE_PORT": "9000"})["deployment_env"])
    assert env["NARWHAL_NODE_1_ENGINE_PORT"] == "9000"
    with pytest.raises(InputError) as err:
        plan({"NARWHAL_NODE_2_ATTESTATION_URL": "http://[fd00::12]/v1/attestation"})
    assert "NARWHAL_NODE_2_ATTEST_PORT=80" in str(err.value)


@pytest.mark.parametrize(
    "extra,interfaces,engines,key",
    [
        ({"NARWHAL_FABRIC_INTERFACE": ""}, None, None, "NARWHAL_FABRIC_INTERFACE"),
        ({"NARWHAL_ENGINE_PORT": "80000"}, None, None, "NARWHAL_ENGINE_PORT"),
        ({"NARWHAL_ATTEST_PORT": "http"}, None, None, "NARWHAL_ATTEST_PORT"),
        ({"NARWHAL_BIND_FAMILY": "ipv5"}, None, None, "NARWHAL_BIND_FAMILY"),
        ({"NARWHAL_NODE_1_IP": "10.0.0.300"}, None, None, "NARWHAL_NODE_1_IP"),
        ({"NARWHAL_NODE_1_IP": "10.0.0.99"}, None, None, "NARWHAL_NODE_1_IP"),
        ({"NARWHAL_NODE_1_URL": "10.0.0.11:8000"}, None, None, "NARWHAL_NODE_1_URL"),
        ({"NARWHAL_NODE_1_URL": "http://fd00::11:8000"}, None, None, "NARWHAL_NODE_1_URL"),
        ({"NARWHAL_NODE_2_ROLE": "router"}, None, None, "NARWHAL_NODE_2_ROLE"),
        ({"NARWHAL_NODE_2_ROLE": "prefill"}, None, None, "NARWHAL_NODE_<n>_ROLE"),
        ({"NARWHAL_NODE_1_PORT": "8000"}, None, None, "NARWHAL_NODE_1_PORT"),
        ({"NARWHAL_NODE_3_ROLE": "decode"}, None, None, "NARWHAL_NODE_3_ROLE"),
        ({"NARWHAL_NODE_2_ROLE": ""}, None, ("engine-1",), "engines"),
        ({}, None, ("engine-1", "gpu-7"), "gpu-7"),
        ({}, dict(TWO, **{"engine-2": facts(("fd00::12", "ipv6"))}), None, "NARWHAL_FABRIC_INTERFACE"),
        ({"NARWHAL_NODE_2_ENGINE_PORT": "8010"}, None, None, "NARWHAL_NODE_2_ATTEST_PORT"),
    ],
)
def test_bad_inputs_name_the_input(extra, interfaces, engines, key):
    with pytest.raises(InputError) as err:
        plan(extra, interfaces, engines or ("engine-1", "engine-2"))
    assert err.value.key == key
    assert "rerun" in str(err.value) or "set" in str(err.value) or "add" in str(err.value) \
        or "rename" in str(err.value) or "give" in str(err.value) or "assign" in str(err.value)


def test_two_engines_on_one_host_need_their_own_ports():
    shared = facts(("10.0.0.11", "ipv4"))
    shared["host_id"] = "box-a"
    with pytest.raises(InputError) as err:
        plan({}, {"engine-1": shared, "engine-2": shared})
    assert "engine-1 and engine-2 share a host" in str(err.value)
    env = dict(plan({"NARWHAL_NODE_2_ENGINE_PORT": "8001", "NARWHAL_NODE_2_ATTEST_PORT": "8011"},
                    {"engine-1": shared, "engine-2": shared})["deployment_env"])
    assert env["NARWHAL_NODE_2_URL"] == "http://10.0.0.11:8001"


def test_render_env_has_no_volatile_content():
    text = render_env(plan()["deployment_env"], ["header"])
    assert text == render_env(plan()["deployment_env"], ["header"])
    assert text.startswith("# header\nNARWHAL_NODE_1_IP=10.0.0.11\n")


def test_output_set_unchanged_is_untouched_and_failure_restores(tmp_path, monkeypatch):
    a, b = tmp_path / "deployment.env", tmp_path / "fleet.json"
    files = {str(a): ("A1\n", 0o600), str(b): ("B1\n", 0o600)}
    _writer.apply_set(_writer.set_changes(files))
    assert a.read_text() == "A1\n" and oct(a.stat().st_mode & 0o777) == "0o600"
    assert _writer.set_changes(files) == []
    new = {str(a): ("A2\n", 0o600), str(b): ("B2\n", 0o600)}
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(_writer.os, "replace", failing_replace)
    with pytest.raises(_writer.OutputError) as err:
        _writer.apply_set(_writer.set_changes(new))
    assert str(err.value).endswith("disk full; fix the cause and rerun — the previous set is intact")
    monkeypatch.setattr(_writer.os, "replace", real_replace)
    assert a.read_text() == "A1\n" and b.read_text() == "B1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deployment.env", "fleet.json"]


ENV = {"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000", "EMPTY": ""}


@pytest.mark.parametrize(
    "data,expected",
    [
        ({"url": "${NARWHAL_NODE_1_URL}"}, {"url": "http://10.0.0.11:8000"}),
        ([{"a": ["${EMPTY}", 3, None]}], [{"a": ["", 3, None]}]),
        ({"plain": "$HOME and {braces}"}, {"plain": "$HOME and {braces}"}),
    ],
)
def test_complete_values_resolve(data, expected):
    assert resolve_values(data, ENV) == expected


@pytest.mark.parametrize(
    "data,needle",
    [
        ({"url": "http://${HOST}:8000"}, "not a complete"),
        ({"url": "${NARWHAL_NODE_1_URL}/v1"}, "not a complete"),
        ({"url": "${ NARWHAL_NODE_1_URL }"}, "not a complete"),
        ({"url": "${UNSET_NAME}"}, "${UNSET_NAME} is not set"),
        ({"x": ["${1BAD}"]}, "$.x[0]"),
    ],
)
def test_substitution_errors_name_the_value(data, needle):
    with pytest.raises(SubstitutionError) as err:
        resolve_values(data, ENV)
    assert needle in str(err.value)


def test_substitution_is_not_recursive_and_layers():
    env = layered_env({"A": "process"}, {"A": "dotenv", "B": "${C}"}, {"A": "generated", "C": "x", "D": "gen"})
    assert env["A"] == "process" and env["D"] == "gen"
    assert resolve_values({"b": "${B}"}, env) == {"b": "${C}"}


def test_fleet_cli_prints_resolved_fleet_and_fails_on_unset(tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps([{"iid": "n1", "url": "${NARWHAL_NODE_1_URL}"}]))
    (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=http://[fd00::11]:8000\n")
    cmd = [sys.executable, str(REPO / "scripts" / "narwhal-fleet"), "--fleet", str(fleet),
           "--env-file", str(tmp_path / "none.env"), "--deployment-env", str(tmp_path / "deployment.env")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == [{"iid": "n1", "url": "http://[fd00::11]:8000"}]
    (tmp_path / "deployment.env").write_text("")
    bad = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 1 and "${NARWHAL_NODE_1_URL} is not set" in bad.stderr


def test_env_example_and_docs_are_generated_from_the_input_description():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-inputs.py"), "--check"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout


def test_example_record_validates_and_every_field_is_documented():

    example = json.loads((REPO / "docs" / "examples" / "engine-launch.example.json").read_text())
    assert validation_errors(example, LAUNCH_CONFIG_SCHEMA) == []
    transports = sorted(r["transfer"]["transport"] for r in example["engines"].values())
    vendors = sorted(r["accelerator"]["vendor"] for r in example["engines"].values())
    assert transports == ["ucx_rdma", "ucx_tcp"] and vendors == ["amd", "nvidia"]
    doc = (REPO / "docs" / "launch-record.md").read_text()
    record = example["engines"]["engine-1"]
    runtime = ["runtime." + k for k in record["runtime"] if k not in ("trust_remote_code", "ssm_conv_state")]
    undocumented = [f for f in list(record) + runtime if f not in ("engine", "iid", "role", "runtime")
                    and "`%s`" % f not in doc]
    assert undocumented == []


# ------------------------------------------------------------------------------------------------
# hostile and broken inputs, refused when the inputs are read (issue 13, classes 1 and 4)

MINIMAL = dict(BASE)


def refused_input(extra):
    with pytest.raises(InputError) as err:
        load_inputs(dict(MINIMAL, **extra))
    return err.value


@pytest.mark.parametrize("key,value,char", [
    ("NARWHAL_SERVED_MODEL_NAME", "x\nNARWHAL_RUN_DIR=/tmp/evil", "\n"),
    ("NARWHAL_IMAGE", "vllm/vllm-openai:v0.33.0\r\nNARWHAL_X=1", "\r"),
    ("NARWHAL_EXTRA_ARGS", "--max-model-len 8192\x00", "\x00"),
    ("NARWHAL_MODEL_PATH", "/srv/models/a\u2028NARWHAL_RUN_DIR=/tmp", "\u2028"),
    ("NARWHAL_NODE_1_ENGINE_ENV", "A=1\x0bNARWHAL_RUN_DIR=/tmp/evil", "\x0b"),
    ("NARWHAL_FABRIC_INTERFACE", "eth1\t", "\t"),
    ("NARWHAL_NODE_2_URL", "http://10.0.0.12:8000\n", "\n"),
    ("NARWHAL_CONFIG_DIR", "config/\x1b[2Jsite", "\x1b"),
])
def test_values_that_could_add_a_line_are_refused(key, value, char):
    """Class 1: a value with a line break or another control character never reaches a line-based file."""
    err = refused_input({key: value})
    assert err.key == key
    assert "contains the control character %r" % char in str(err) and "one line of printable text" in str(err)


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_SERVED_MODEL_NAME": ".."}, "NARWHAL_SERVED_MODEL_NAME", "no empty, '.' or '..' component"),
    ({"NARWHAL_SERVED_MODEL_NAME": "../../etc"}, "NARWHAL_SERVED_MODEL_NAME", "/models/<name with / as _>"),
    ({"NARWHAL_SERVED_MODEL_NAME": "org/../x"}, "NARWHAL_SERVED_MODEL_NAME", "'..' component"),
    ({"NARWHAL_SERVED_MODEL_NAME": "/abs/name"}, "NARWHAL_SERVED_MODEL_NAME", "starts with a letter or digit"),
    ({"NARWHAL_SERVED_MODEL_NAME": "x,source=/etc"}, "NARWHAL_SERVED_MODEL_NAME", "not a served model name"),
    ({"NARWHAL_SERVED_MODEL_NAME": "llama 3"}, "NARWHAL_SERVED_MODEL_NAME", "not a served model name"),
    ({"NARWHAL_MODEL_PATH": "/srv/models/llama 3"}, "NARWHAL_MODEL_PATH",
     "its last component 'llama 3', the default served model name"),
    ({"NARWHAL_MODEL_PATH": "/srv/models/a,b"}, "NARWHAL_MODEL_PATH", "docker --mount separates options by commas"),
    ({"NARWHAL_MODEL_PATH": "/srv/models/../../etc"}, "NARWHAL_MODEL_PATH", "'.'/'..' component"),
    ({"NARWHAL_MODEL_PATH": "/"}, "NARWHAL_MODEL_PATH", "below /"),
    ({"NARWHAL_ENGINE_CHECKOUT": "/opt/../etc"}, "NARWHAL_ENGINE_CHECKOUT", "'.'/'..' component"),
    ({"NARWHAL_CONFIG_DIR": "../elsewhere"}, "NARWHAL_CONFIG_DIR", "'..' component"),
    ({"NARWHAL_FLEET": "~/fleet.json"}, "NARWHAL_FLEET", "'~' (which nothing expands)"),
    ({"NARWHAL_IMAGE": "--privileged"}, "NARWHAL_IMAGE", "not an image reference"),
    ({"NARWHAL_NODE_2_IMAGE": "img name"}, "NARWHAL_NODE_2_IMAGE", "not an image reference"),
    ({"NARWHAL_EXPECTED_PACKAGES": "torch,x;rm -rf /"}, "NARWHAL_EXPECTED_PACKAGES", "not a distribution name"),
])
def test_values_that_would_escape_their_directory_or_argument_are_refused(extra, key, words):
    """Class 1: names and paths stay inside their directory (/models/<name>, mounts) and their argument."""
    err = refused_input(extra)
    assert err.key == key and words in str(err), str(err)


@pytest.mark.parametrize("extra", [
    {"NARWHAL_SERVED_MODEL_NAME": "meta-llama/Llama-3.1-8B-Instruct"},
    {"NARWHAL_SERVED_MODEL_NAME": "qwen2.5:7b@q4+x"},
    {"NARWHAL_MODEL_PATH": "/srv/models/Llama-3.1-8B/"},
    {"NARWHAL_IMAGE": "registry.example:5000/vllm/vllm-openai@sha256:" + "ab" * 32},
    {"NARWHAL_NODE_1_ATTESTATION_URL": "http://10.0.0.11:8010/v1/attestation"},
    {"NARWHAL_NODE_1_URL": "https://engine-1.example.:8000"},
    {"NARWHAL_CONFIG_DIR": "/srv/site-a/config", "NARWHAL_EXPECTED_PACKAGES": "torch, flashinfer-python"},
])
def test_plain_values_still_pass(extra):
    load_inputs(dict(MINIMAL, **extra))


@pytest.mark.parametrize("value", ["http://10.0.0.11:8000/x$(id)", "eth1\nNARWHAL_RUN_DIR=/tmp", "a b", "'q'", "a#b"])
def test_deployment_env_values_cannot_add_lines_or_be_expanded(value):
    with pytest.raises(InputError) as err:
        render_env([("NARWHAL_NODE_1_URL", "http://10.0.0.11:8000"), ("NARWHAL_NODE_1_FABRIC_INTERFACE", value)], [])
    assert err.value.key == "NARWHAL_NODE_1_FABRIC_INTERFACE" and "one plain KEY=VALUE line" in str(err.value)


def test_deployment_env_reads_back_as_written():
    """python-dotenv (scripts/narwhal-fleet, the fleet lookup) reads exactly the planned values back."""
    import io

    from dotenv import dotenv_values

    entries = plan({"NARWHAL_BIND_FAMILY": "ipv6", "NARWHAL_NODE_2_ATTESTATION_URL":
                    "http://[fd00::12]:8010/v1/attest,x=1+y@z~%41"})["deployment_env"]
    assert dotenv_values(stream=io.StringIO(render_env(entries, ["h"]))) == dict(entries)


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_TRANSPRT": "ucx_tcp"}, "NARWHAL_TRANSPRT", "did you mean NARWHAL_TRANSPORT?"),
    ({"NARWHAL_GPU_PER_ENGINE": "4"}, "NARWHAL_GPU_PER_ENGINE", "did you mean NARWHAL_GPUS_PER_ENGINE?"),
    ({"NARWHAL_WHATEVER": "1"}, "NARWHAL_WHATEVER", "is not a site input; a misspelt key"),
    ({"NARWHAL_RUN_DIR": "/tmp/evil"}, "NARWHAL_RUN_DIR", "role environment that prepare writes"),
    ({"NARWHAL_ENV_FILE": "/x/.env"}, "NARWHAL_ENV_FILE", "not from .env"),
    ({"NARWHAL_NODE_2_ENGINE_PROT": "8001"}, "NARWHAL_NODE_2_ENGINE_PROT", "did you mean NARWHAL_NODE_2_ENGINE_PORT?"),
    ({"NARWHAL_NODE_02_ROLE": "decode"}, "NARWHAL_NODE_02_ROLE", "no leading zero"),
    ({"NARWHAL_ENGINE_PORT": "8_000"}, "NARWHAL_ENGINE_PORT", "ASCII digits 0-9"),
    ({"NARWHAL_ENGINE_PORT": "\uff18\uff10\uff10\uff10"}, "NARWHAL_ENGINE_PORT", "ASCII digits 0-9"),
    ({"NARWHAL_NODE_1_ATTEST_PORT": "+8010"}, "NARWHAL_NODE_1_ATTEST_PORT", "ASCII digits 0-9"),
    ({"NARWHAL_BLOCK_SIZE": "-16"}, "NARWHAL_BLOCK_SIZE", "must be at least 1, got -16"),
    ({"NARWHAL_BLOCK_SIZE": "1_6"}, "NARWHAL_BLOCK_SIZE", "ASCII digits 0-9"),
    ({"NARWHAL_GPUS_PER_ENGINE": "\u0664"}, "NARWHAL_GPUS_PER_ENGINE", "ASCII digits 0-9"),
    ({"NARWHAL_NODE_1_GPU_IDS": "0,0"}, "NARWHAL_NODE_1_GPU_IDS", "negative or repeated"),
    ({"NARWHAL_NODE_1_GPU_IDS": "-1,0"}, "NARWHAL_NODE_1_GPU_IDS", "negative or repeated"),
    ({"NARWHAL_NODE_1_GPU_IDS": "0,\uff11"}, "NARWHAL_NODE_1_GPU_IDS", "ASCII digits 0-9"),
    ({"NARWHAL_NODE_1_GPU_IDS": "0,1,2", "NARWHAL_TP_SIZE": "2"}, "NARWHAL_NODE_1_GPU_IDS", "NARWHAL_TP_SIZE is 2"),
    ({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "2"}, "NARWHAL_TP_SIZE", "gives engine-1 4 GPU(s)"),
    ({"NARWHAL_NODE_1_IP": "127.1"}, "NARWHAL_NODE_1_IP", "not an IPv4 or IPv6 address"),
    ({"NARWHAL_NODE_1_IP": "::ffff:127.0.0.1"}, "NARWHAL_NODE_1_IP", "IPv4-mapped loopback"),
    ({"NARWHAL_NODE_1_IP": "0.0.0.0"}, "NARWHAL_NODE_1_IP", "the unspecified address"),
    ({"NARWHAL_NODE_1_IP": "169.254.1.1"}, "NARWHAL_NODE_1_IP", "a link-local address"),
    ({"NARWHAL_NODE_1_IP": "::ffff:10.0.0.11"}, "NARWHAL_NODE_1_IP", "write the IPv4 address 10.0.0.11"),
    ({"NARWHAL_NODE_1_IP": "fd00::11"}, "NARWHAL_NODE_1_IP", "NARWHAL_BIND_FAMILY is ipv4"),
    ({"NARWHAL_NODE_1_URL": "http://localhost.:8000"}, "NARWHAL_NODE_1_URL", "a localhost name"),
    ({"NARWHAL_NODE_1_URL": "http://127.1:8000"}, "NARWHAL_NODE_1_URL", "numeric form"),
    ({"NARWHAL_NODE_1_URL": "http://2130706433:8000"}, "NARWHAL_NODE_1_URL", "numeric form"),
    ({"NARWHAL_NODE_1_URL": "http://0x7f.0.0.1:8000"}, "NARWHAL_NODE_1_URL", "numeric form"),
    ({"NARWHAL_NODE_1_URL": "http://[::ffff:127.0.0.1]:8000"}, "NARWHAL_NODE_1_URL", "IPv4-mapped loopback"),
    ({"NARWHAL_NODE_1_URL": "http://0.0.0.0:8000"}, "NARWHAL_NODE_1_URL", "the unspecified address"),
    ({"NARWHAL_NODE_1_URL": "http://[::1]:8000"}, "NARWHAL_NODE_1_URL", "a loopback address"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000/v1"}, "NARWHAL_NODE_1_URL", "has a path (/v1)"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000/"}, "NARWHAL_NODE_1_URL", "has a path (/)"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000?x=1"}, "NARWHAL_NODE_1_URL", "query"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:\uff18\uff10\uff10\uff10"}, "NARWHAL_NODE_1_URL", "not an http(s) URL"),
    ({"NARWHAL_NODE_1_ATTESTATION_URL": "http://10.0.0.11:8010/v1/attestation#x"},
     "NARWHAL_NODE_1_ATTESTATION_URL", "fragment"),
    ({"NARWHAL_NODE_1_ATTESTATION_URL": "http://10.0.0.11:8010/v1/$(id)"},
     "NARWHAL_NODE_1_ATTESTATION_URL", "path with characters other than"),
    ({"NARWHAL_EXTRA_ARGS": "--chat-template '/a b.j2"}, "NARWHAL_EXTRA_ARGS", "not valid shell words"),
    ({"NARWHAL_NODE_1_ENGINE_ENV": "A='x"}, "NARWHAL_NODE_1_ENGINE_ENV", "not valid shell words"),
    ({"NARWHAL_FABRIC_INTERFACE": ".."}, "NARWHAL_FABRIC_INTERFACE", "not a network interface name"),
])
def test_values_that_passed_unchecked_are_refused_by_name(extra, key, words):
    """Class 4: typos, unusual digits, loopback spellings, URLs with more than a server, contradictions."""
    err = refused_input(extra)
    assert err.key == key and words in str(err), str(err)
    assert "rerun discovery" in str(err) or "remove it" in str(err) or ".env" in str(err)


def test_url_user_information_is_refused_without_repeating_it():
    err = refused_input({"NARWHAL_NODE_1_URL": "http://admin:hunter2@10.0.0.11:8000"})
    assert err.key == "NARWHAL_NODE_1_URL" and "user information" in str(err)
    assert "hunter2" not in str(err) and "admin" not in str(err)


@pytest.mark.parametrize("extra,interfaces,key,words", [
    ({"NARWHAL_NODE_3_IP": "10.0.0.13"}, None, "NARWHAL_NODE_3_IP",
     "the inventory has no engine-3 in group engines (it has engine-1, engine-2)"),
    ({"NARWHAL_NODE_5_GPU_IDS": "0", "NARWHAL_NODE_5_EXTRA_ARGS": "--max-num-seqs 8"}, None,
     "NARWHAL_NODE_5_EXTRA_ARGS", "NARWHAL_NODE_5_EXTRA_ARGS, NARWHAL_NODE_5_GPU_IDS would configure nothing"),
    ({}, dict(TWO, **{"engine-2": dict(TWO["engine-2"], operstate="DOWN")}), "NARWHAL_FABRIC_INTERFACE",
     "interface eth1 on host engine-2 is down (ip reports operstate DOWN)"),
    ({"NARWHAL_NODE_1_FABRIC_INTERFACE": "eth1"},
     dict(TWO, **{"engine-1": dict(TWO["engine-1"], operstate="LOWERLAYERDOWN")}),
     "NARWHAL_NODE_1_FABRIC_INTERFACE", "operstate LOWERLAYERDOWN"),
])
def test_discovery_refuses_what_only_it_can_see(extra, interfaces, key, words):
    """Class 4 at discovery: settings for engines the inventory lacks, a fabric link that is down."""
    with pytest.raises(InputError) as err:
        plan(extra, interfaces)
    assert err.value.key == key and words in str(err.value), str(err.value)


def test_an_unknown_operstate_is_not_refused():
    plan({}, dict(TWO, **{"engine-1": dict(TWO["engine-1"], operstate="UNKNOWN")}))


# ------------------------------------------------------------------------------------------------
# site_inputs: what python-dotenv passes silently, and the output paths (classes 3 and 4)

ENV_TEXT = ("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
            "NARWHAL_MODEL_PATH=/srv/models/tiny\nNARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\n")


def _without_narwhal_env(monkeypatch):
    """The controller environment without NARWHAL_* (site_inputs reads it by default)."""
    for key in [k for k in os.environ if k.startswith("NARWHAL_")]:
        monkeypatch.delenv(key)


@pytest.fixture
def site_module(module_runner, tmp_path, monkeypatch):
    from ansible_collections.narwhal.deploy.plugins.modules import site_inputs

    _without_narwhal_env(monkeypatch)

    def run(text, root=None, process_env=False):
        env_file = tmp_path / "site.env"
        env_file.write_text(text)
        args = {"env_file": str(env_file), "use_process_env": process_env}
        if root is not None:
            args["root"] = str(root)
        return module_runner(site_inputs.main, args)

    return run


# secrets and literal .env values (issue 13, class 5); hostile .env files (class 6)

TOKEN = "hf_controllerToken0123456789abcdef"
SITE_ENV = ("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
            "NARWHAL_MODEL_PATH=/srv/models/m\nNARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\n")


@pytest.fixture
def site(module_runner, monkeypatch, tmp_path):
    """site_inputs.main over a .env in tmp_path; the controller environment holds a token and no NARWHAL_*."""
    _without_narwhal_env(monkeypatch)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HOME", "/home/operator")

    def run(text, path=None):
        path = path or tmp_path / ".env"
        if text is not None:
            path.write_text(text)
        return module_runner(site_inputs.main, {"env_file": str(path)})

    return run


@pytest.mark.parametrize("text,key,words", [
    (ENV_TEXT + "NARWHAL_ENGINE_PORT=8000\nNARWHAL_ENGINE_PORT=9000\n", "NARWHAL_ENGINE_PORT",
     "is set twice in %s (lines 6 and 7); python-dotenv would keep the last value silently"),
    (ENV_TEXT + "NARWHAL_TRANSPRT=ucx_rdma\n", "NARWHAL_TRANSPRT", "did you mean NARWHAL_TRANSPORT?"),
    (ENV_TEXT + "NARWHAL_ENGINE_PORT 9000\n", "NARWHAL_ENV_FILE",
     "%s line 6 is not KEY=VALUE as python-dotenv reads it"),
    (ENV_TEXT + "NARWHAL_TP_SIZE\n", "NARWHAL_TP_SIZE", "line 6 names NARWHAL_TP_SIZE without '='"),
    (ENV_TEXT + 'NARWHAL_SERVED_MODEL_NAME="tiny\nNARWHAL_RUN_DIR=/tmp/evil"\n', "NARWHAL_SERVED_MODEL_NAME",
     "contains the control character '\\n'"),
])
def test_site_inputs_refuses_what_dotenv_passes_silently(site_module, tmp_path, text, key, words):
    status, result = site_module(text)
    assert status == "fail" and result["input"] == key, result
    assert (words % (tmp_path / "site.env") if "%s" in words else words) in result["msg"], result["msg"]


def test_site_inputs_ignores_tool_variables_and_warns_about_near_misses(site_module, monkeypatch):
    from ansible.module_utils import _internal
    from ansible.module_utils.common import warnings

    monkeypatch.setattr(warnings, "_global_warnings", {})
    # as a module process: once a controller plugin was imported (other tests), warnings would go to Display
    monkeypatch.setattr(_internal, "is_controller", False)
    monkeypatch.setenv("NARWHAL_IMAGES", "sim real")  # the Makefile's, not an input
    monkeypatch.setenv("NARWHAL_TRANSPRT", "ucx_rdma")
    monkeypatch.setenv("NARWHAL_ENGINE_PORT", "9000")
    status, result = site_module(ENV_TEXT, process_env=True)
    assert status == "exit", result
    assert result["ansible_facts"]["narwhal_site"]["site"]["NARWHAL_ENGINE_PORT"] == 9000
    assert warnings.get_warning_messages() == (
        "NARWHAL_TRANSPRT in the controller environment is not a site input (did you mean NARWHAL_TRANSPORT?) and "
        "is ignored",)


GIT = shutil.which("git")


def git_checkout(path):
    """A git repository with the project's .gitignore, as the checkout root."""
    path.mkdir()
    subprocess.run([GIT, "init", "-q", str(path)], check=True)
    shutil.copyfile(REPO / ".gitignore", path / ".gitignore")
    return path


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_site_inputs_asks_git_whether_the_outputs_are_ignored(site_module, tmp_path):
    root = git_checkout(tmp_path / "checkout")
    status, result = site_module(ENV_TEXT, root=root)
    assert status == "exit", result
    status, result = site_module(ENV_TEXT + "NARWHAL_CONFIG_DIR=docs\n", root=root)
    assert status == "fail" and result["input"] == "NARWHAL_CONFIG_DIR"
    assert "'docs': deployment.env would be docs/deployment.env inside the checkout, which git does not ignore" \
        in result["msg"]
    # git itself decides: once docs/ is ignored, the same input passes
    with open(root / ".gitignore", "a") as fh:
        fh.write("docs/\n")
    assert site_module(ENV_TEXT + "NARWHAL_CONFIG_DIR=docs\n", root=root)[0] == "exit"


@pytest.mark.skipif(GIT is None, reason="needs git")
def test_the_fallback_patterns_agree_with_the_shipped_gitignore(tmp_path):
    import fnmatch


    root = git_checkout(tmp_path / "checkout")
    samples = ["config/fleet.json", "config/fleet.site-a.json", "config/engine-launch.local.json",
               "config/deployment.env", "config/site-a/deployment.env", "config/engine-api.key", "runs/run-0",
               "docs/deployment.env", "config/other.json", "fleet.json", "README.md", "config/engine-launch.md"]
    for rel in samples:
        by_git = subprocess.run([GIT, "-C", str(root), "check-ignore", "-q", "--", rel], check=False).returncode == 0
        assert by_git == any(fnmatch.fnmatchcase(rel, p) for p in FALLBACK_IGNORED), rel


def test_dotenv_values_are_literal(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    values = parse_dotenv('A=${HOME}/x\nB="${HF_TOKEN}"\nC=${HF_TOKEN:-fallback}\nD=$HOME\n')
    assert values == {"A": "${HOME}/x", "B": "${HF_TOKEN}", "C": "${HF_TOKEN:-fallback}", "D": "$HOME"}


@pytest.mark.parametrize("value", ["${HOME}/models/m", "${HF_TOKEN}"])
def test_site_input_with_an_expansion_stays_literal_in_the_error(site, value):
    how, result = site(SITE_ENV.replace("/srv/models/m", value))
    assert how == "fail" and result["input"] == "NARWHAL_MODEL_PATH"
    assert "%r is not an absolute path" % value in result["msg"]
    assert "/home/operator" not in result["msg"] and TOKEN not in result["msg"]


def test_site_input_expansion_is_kept_and_warned(site):
    how, result = site(SITE_ENV + "NARWHAL_EXTRA_ARGS=--served-model-name-suffix ${USER}-model\n")
    assert how == "exit", result
    assert result["ansible_facts"]["narwhal_site"]["site"]["NARWHAL_EXTRA_ARGS"] == \
        "--served-model-name-suffix ${USER}-model"
    from ansible.module_utils.common.warnings import get_warning_messages

    assert any("NARWHAL_EXTRA_ARGS holds '${...}', which stays literal" in w for w in get_warning_messages())


@pytest.mark.parametrize("extra, key, shown", [
    # the controller's token pasted into an input: redacted as a known secret of the environment
    ("NARWHAL_FABRIC_INTERFACE=%s\n" % TOKEN, "NARWHAL_FABRIC_INTERFACE", "'<redacted>' is not a network interface"),
    # a secret of the .env itself (not a NARWHAL_ input), pasted into another input
    ("MY_SECRET=Zq9-site-secret\nNARWHAL_ENGINE_PORT=Zq9-site-secret\n", "NARWHAL_ENGINE_PORT",
     "'<redacted>' is not a whole number"),
    ("NARWHAL_EXTRA_ARGS=--api-key=sk-site-0123456789\n", "NARWHAL_EXTRA_ARGS", "'--api-key=<redacted>' overrides"),
    ("NARWHAL_ENGINE_ENV='HF_TOKEN=hf_x-9876543210'\n", "NARWHAL_ENGINE_ENV",
     "sets HF_TOKEN, which looks like a secret"),
    ("NARWHAL_NODE_1_URL=http://admin:pa55-w0rd@10.0.0.11:8000\n", "NARWHAL_NODE_1_URL",
     "user information"),
], ids=["env-token", "dotenv-secret", "api-key-flag", "engine-env", "url-password"])
def test_secret_values_are_redacted_in_site_errors(site, extra, key, shown):
    base = SITE_ENV.replace("NARWHAL_FABRIC_INTERFACE=eth1\n", "") if extra.startswith("NARWHAL_FABRIC_INTERFACE=") \
        else SITE_ENV
    how, result = site(base + extra)
    assert how == "fail" and result["input"] == key, result
    assert shown in result["msg"]
    for secret in (TOKEN, "Zq9-site-secret", "sk-site-0123456789", "hf_x-9876543210", "pa55-w0rd"):
        assert secret not in result["msg"]


@pytest.mark.parametrize("make, needle", [
    (os.mkfifo, "is a FIFO, not a regular file"),
    (lambda p: os.symlink(p.name, p), "is a symlink loop"),
    (lambda p: p.write_bytes(b"NARWHAL_FABRIC_INTERFACE=eth\xff1\n"), "is not UTF-8 text"),
], ids=["fifo", "symlink-loop", "latin-1"])
def test_hostile_env_file_is_named_not_waited_on(site, tmp_path, make, needle):
    path = tmp_path / "site.env"
    make(path)
    how, result = site(None, path)
    assert how == "fail" and needle in result["msg"] and str(path) in result["msg"]


@pytest.mark.parametrize("text, expected", [
    ("HF_TOKEN=abc123 x", "HF_TOKEN=<redacted> x"),
    ("NARWHAL_API_KEY_FILE=config/engine-api.key", "NARWHAL_API_KEY_FILE=config/engine-api.key"),  # a path
    ("{'api_key': 'abcdefgh', 'model': 'm'}", "{'api_key': '<redacted>', 'model': 'm'}"),
    ('{"hf_token": ["hf-1"]}', '{"hf_token": ["<redacted>"]}'),
    ("vllm serve m --hf-token abcdef123 --port 8000", "vllm serve m --hf-token <redacted> --port 8000"),
    ("['--api-key', 'k-0123456']", "['--api-key', '<redacted>']"),
    ("--api-key is launcher-managed", "--api-key is launcher-managed"),  # prose stays
    ("is not KEY=VALUE", "is not KEY=VALUE"),
    ("Authorization: Bearer abcdef0123", "Authorization: Bearer <redacted>"),
    ("https://u:p4ss@h.example/x", "https://u:<redacted>@h.example/x"),
    ("token hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ here", "token <redacted> here"),
    ("--max-num-batched-tokens 8192 --ssl-keyfile /k.pem", "--max-num-batched-tokens 8192 --ssl-keyfile /k.pem"),
])
def test_redact_text(text, expected):
    assert _secrets.redact_text(text) == expected


def test_redact_text_known_secrets_and_registered_key():
    assert _secrets.redact_text("key: zebra-777", ["zebra-777"]) == "key: <redacted>"
    _secrets.register_secret("registered-key-0123")
    try:
        assert str(_errors.PlanError("docker said registered-key-0123 is bad")) == "docker said <redacted> is bad"
    finally:
        _secrets._SECRET_VALUES.discard("registered-key-0123")


def test_input_error_of_a_secret_looking_key_hides_its_value():
    err = InputError("NARWHAL_NODE_1_HF_TOKEN", "%r is not valid; fix it" % "plain")
    assert str(err) == "NARWHAL_NODE_1_HF_TOKEN: '<redacted>' is not valid; fix it"


def test_fleet_cli_keeps_dotenv_values_literal(tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps([{"iid": "n1", "url": "${NARWHAL_NODE_1_URL}", "model": "${MODEL_DIR}"}]))
    (tmp_path / "site.env").write_text("MODEL_DIR=${HOME}/models\n")
    (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=http://10.0.0.11:8000\n")
    cmd = [sys.executable, str(REPO / "scripts" / "narwhal-fleet"), "--fleet", str(fleet),
           "--env-file", str(tmp_path / "site.env"), "--deployment-env", str(tmp_path / "deployment.env")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    env.update(HOME="/home/operator")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout) == [{"iid": "n1", "url": "http://10.0.0.11:8000", "model": "${HOME}/models"}]
    with pytest.raises(DotenvError, match="is a FIFO"):
        os.mkfifo(tmp_path / "fifo.env")
        read_dotenv(str(tmp_path / "fifo.env"))


def test_env_example_loads_unchanged_through_site_inputs(site_module, tmp_path):
    """The first documented step: the shipped .env.example, copied as it is into a project, is valid input and
    holds no Python None."""
    project = tmp_path / "project"
    project.mkdir()
    text = (REPO / ".env.example").read_text()
    assert "None" not in text
    status, result = site_module(text, root=project)
    assert status == "exit", result
    site = result["ansible_facts"]["narwhal_site"]
    assert site["project_dir"] == str(project)
    assert site["paths"]["fleet"] == str(project / "config" / "fleet.json")
    assert site["paths"]["runs_dir"] == str(project / "runs")
    assert sorted(site["nodes"]) == ["1", "2"] and {n["ROLE"] for n in site["nodes"].values()} == {"prefill", "decode"}
