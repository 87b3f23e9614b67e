# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The fleet and deployment.env (plugins/module_utils/_discover/fleet.py:
build_fleet, render_env): URLs per bind family, overrides, ports, what only discovery can see."""


import pytest
from test_support.inputs import BASE

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet, render_env
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    interface_addresses,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs


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


TWO = {"engine-1": facts(("10.0.0.11", "ipv4"), ("fd00::11", "ipv6")),
       "engine-2": facts(("10.0.0.12", "ipv4"), ("fd00::12", "ipv6"))}


def plan(extra=None, interfaces=None, engines=("engine-1", "engine-2")):
    values = dict(BASE, **(extra or {}))
    return build_fleet(load_inputs(values), list(engines), interfaces or TWO)


def test_ipv4_plan_urls_and_fleet_references():
    result = plan()
    env = dict(result["deployment_env"])
    assert env["NARWHAL_NODE_1_IP"] == "10.0.0.11"
    assert env["NARWHAL_NODE_1_URL"] == "https://10.0.0.11:8000"  # NARWHAL_TLS=site, the default
    assert env["NARWHAL_NODE_2_ATTESTATION_URL"] == "http://10.0.0.12:8010/v1/attestation"  # the sidecar's own
    assert result["fleet"][0] == {"iid": "n1", "engine": "engine-1", "url": "${NARWHAL_NODE_1_URL}",
                                  "attestation_url": "${NARWHAL_NODE_1_ATTESTATION_URL}", "role": "prefill"}
    assert [r["role"] for r in result["fleet"]] == ["prefill", "decode"]


def test_ipv6_plan_brackets_hosts():
    env = dict(plan({"NARWHAL_BIND_FAMILY": "ipv6", "NARWHAL_ENGINE_PORT": "9000"})["deployment_env"])
    assert env["NARWHAL_NODE_2_IP"] == "fd00::12"
    assert env["NARWHAL_NODE_2_URL"] == "https://[fd00::12]:9000"
    assert env["NARWHAL_NODE_2_ATTESTATION_URL"] == "http://[fd00::12]:8010/v1/attestation"


def test_explicit_ip_wins_over_several_addresses():
    many = dict(TWO, **{"engine-2": facts(("fd00::12", "ipv6"), ("fd00::99", "ipv6"))})
    with pytest.raises(InputError) as err:
        plan({"NARWHAL_BIND_FAMILY": "ipv6"}, many)
    assert err.value.key == "NARWHAL_NODE_2_IP" and "fd00::12, fd00::99" in str(err.value)
    env = dict(plan({"NARWHAL_BIND_FAMILY": "ipv6", "NARWHAL_NODE_2_IP": "fd00::99"}, many)["deployment_env"])
    assert env["NARWHAL_NODE_2_URL"] == "https://[fd00::99]:8000"


def test_temporary_and_deprecated_do_not_count_as_several():
    host = facts(("fd00::12", "ipv6"), ("fd00::77", "ipv6", "temporary"), ("fd00::78", "ipv6", "deprecated"))
    env = dict(plan({"NARWHAL_BIND_FAMILY": "ipv6"}, dict(TWO, **{"engine-2": host}))["deployment_env"])
    assert env["NARWHAL_NODE_2_IP"] == "fd00::12"


@pytest.mark.parametrize("tls, scheme", [("site", "https"), ("operator", "https"), ("off", "http")])
def test_the_engines_urls_take_the_scheme_of_narwhal_tls(tls, scheme):
    result = plan({"NARWHAL_TLS": tls})
    env = dict(result["deployment_env"])
    assert env["NARWHAL_NODE_1_URL"] == "%s://10.0.0.11:8000" % scheme
    assert env["NARWHAL_NODE_2_URL"] == "%s://10.0.0.12:8000" % scheme
    assert [row["url"] for row in result["table"]] == ["%s://10.0.0.1%d:8000" % (scheme, n) for n in (1, 2)]
    # the attestation sidecar is not the engine: its URL keeps its own scheme
    assert env["NARWHAL_NODE_1_ATTESTATION_URL"] == "http://10.0.0.11:8010/v1/attestation"
    assert "NARWHAL_NODE_1_URL=%s://10.0.0.11:8000\n" % scheme in render_env(result["deployment_env"], [])


@pytest.mark.parametrize("tls, url, wrote", [
    ("site", "http://engine-a.example:8000", "https"), ("operator", "http://engine-a.example:8000", "https"),
    ("off", "https://engine-a.example:8000", "http")])
def test_a_url_override_in_another_scheme_than_narwhal_tls_is_refused_by_name(tls, url, wrote):
    with pytest.raises(InputError) as err:
        plan({"NARWHAL_TLS": tls, "NARWHAL_NODE_1_URL": url})
    assert err.value.key == "NARWHAL_NODE_1_URL"
    assert "NARWHAL_TLS is %s" % tls in str(err.value) and "write the URL with %s://" % wrote in str(err.value)
    assert ("NARWHAL_TLS=off" if wrote == "https" else "NARWHAL_TLS to site or operator") in str(err.value)
    # the attestation URL is the sidecar's: any scheme
    att = "https://10.0.0.11:8010/v1/attestation"
    env = dict(plan({"NARWHAL_TLS": tls, "NARWHAL_NODE_1_ATTESTATION_URL": att})["deployment_env"])
    assert env["NARWHAL_NODE_1_ATTESTATION_URL"] == att


def test_url_overrides_honoured_and_port_checked():
    env = dict(plan({"NARWHAL_NODE_1_URL": "https://engine-a.example:8000"})["deployment_env"])
    assert env["NARWHAL_NODE_1_URL"] == "https://engine-a.example:8000"
    assert env["NARWHAL_NODE_1_IP"] == "10.0.0.11"
    with pytest.raises(InputError) as err:
        plan({"NARWHAL_NODE_1_URL": "https://engine-a.example:9000"})
    assert err.value.key == "NARWHAL_NODE_1_URL" and "NARWHAL_NODE_1_ENGINE_PORT=9000" in str(err.value)
    env = dict(plan({"NARWHAL_NODE_1_URL": "http://engine-a.example:9000", "NARWHAL_TLS": "off",
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
    assert env["NARWHAL_NODE_2_URL"] == "https://10.0.0.11:8001"


def test_render_env_has_no_volatile_content():
    text = render_env(plan()["deployment_env"], ["header"])
    assert text == render_env(plan()["deployment_env"], ["header"])
    assert text.startswith("# header\nNARWHAL_NODE_1_IP=10.0.0.11\n")


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


@pytest.mark.parametrize("extra,interfaces,key,words", [
    ({"NARWHAL_NODE_3_IP": "10.0.0.13"}, None, "NARWHAL_NODE_3_IP",
     "no host of the inventory's group engines is engine-3 (a host with narwhal_node: 3, or named engine-3; "
     "the group has engine-1, engine-2)"),
    ({"NARWHAL_NODE_5_GPU_IDS": "0", "NARWHAL_NODE_5_EXTRA_ARGS": "--max-num-seqs 8"}, None,
     "NARWHAL_NODE_5_EXTRA_ARGS", "NARWHAL_NODE_5_EXTRA_ARGS, NARWHAL_NODE_5_GPU_IDS would configure nothing"),
    ({}, dict(TWO, **{"engine-2": dict(TWO["engine-2"], operstate="DOWN")}), "NARWHAL_FABRIC_INTERFACE",
     "interface eth1 on host engine-2 is down (ip reports operstate DOWN)"),
    ({"NARWHAL_NODE_1_FABRIC_INTERFACE": "eth1"},
     dict(TWO, **{"engine-1": dict(TWO["engine-1"], operstate="LOWERLAYERDOWN")}),
     "NARWHAL_NODE_1_FABRIC_INTERFACE", "operstate LOWERLAYERDOWN"),
    # operstates.rst: DORMANT (e.g. 802.1X not yet authorised) carries no user data either (issue 24)
    ({}, dict(TWO, **{"engine-2": dict(TWO["engine-2"], operstate="DORMANT")}), "NARWHAL_FABRIC_INTERFACE",
     "interface eth1 on host engine-2 is down (ip reports operstate DORMANT)"),
])
def test_discovery_refuses_what_only_it_can_see(extra, interfaces, key, words):
    """Class 4 at discovery: settings for engines the inventory lacks, a fabric link that is down."""
    with pytest.raises(InputError) as err:
        plan(extra, interfaces)
    assert err.value.key == key and words in str(err.value), str(err.value)


def test_an_unknown_operstate_is_not_refused():
    plan({}, dict(TWO, **{"engine-1": dict(TWO["engine-1"], operstate="UNKNOWN")}))


@pytest.mark.parametrize("key, url", [("NARWHAL_NODE_1_URL", "https://narwhal:%s@10.0.0.11:8000"),
                                      ("NARWHAL_NODE_1_ATTESTATION_URL", "http://%s@10.0.0.11:8010/v1/attestation")])
def test_a_url_input_with_credentials_is_refused_without_showing_them(key, url):
    secret = "Zq7yK3pW9mXv2LtR"  # discovery writes nothing: deployment.env and the fleet never hold it
    with pytest.raises(InputError) as err:
        plan({key: url % secret})
    assert err.value.key == key and "user information" in str(err.value) and secret not in str(err.value)
