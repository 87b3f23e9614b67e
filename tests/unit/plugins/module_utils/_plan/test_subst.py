# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Complete-value substitution (plugins/module_utils/_plan/subst.py) and
scripts/narwhal-fleet, which resolves the fleet with it."""

import json
import os
import subprocess
import sys

import pytest
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._discover.fleet import build_fleet, render_env
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import interface_addresses
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import (
    SubstitutionError,
    layered_env,
    resolve_values,
)

ENV = {"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000", "EMPTY": ""}


@pytest.mark.parametrize(
    "data,expected",
    [
        ({"url": "${NARWHAL_NODE_1_URL}"}, {"url": "http://10.0.0.11:8000"}),
        ([{"a": ["x", 3, None]}], [{"a": ["x", 3, None]}]),
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
        ({"url": "${EMPTY}"}, "${EMPTY} is not set (its value is blank, which counts as unset)"),
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


# ------------------------------------------------------------- a blank value is unset, for every resolver

DERIVED = "https://10.0.0.11:8000"  # discovery's URL with NARWHAL_TLS at its default (site)


@pytest.mark.parametrize("blank", ["", " ", "\t"])
def test_a_blank_value_hides_nothing_below_it(blank):
    """.env's NARWHAL_NODE_1_URL= is unset for discovery (it writes the derived URL to deployment.env), so it is
    unset for the resolver too: the derived URL is used, not an empty one."""
    env = layered_env({"NARWHAL_NODE_2_URL": blank}, {"NARWHAL_NODE_1_URL": blank},
                      {"NARWHAL_NODE_1_URL": DERIVED, "NARWHAL_NODE_2_URL": "http://10.0.0.12:8000"})
    assert resolve_values(["${NARWHAL_NODE_1_URL}", "${NARWHAL_NODE_2_URL}"], env) == [
        DERIVED, "http://10.0.0.12:8000"]
    with pytest.raises(SubstitutionError, match=r"\$\{NARWHAL_NODE_3_URL\} is not set"):
        resolve_values("${NARWHAL_NODE_3_URL}", layered_env({}, {"NARWHAL_NODE_3_URL": blank}, {}))


def _blank_url_site(tmp_path):
    """A site whose .env sets NARWHAL_NODE_1_URL= (blank), and the deployment.env and fleet discovery writes for it."""
    values = {"NARWHAL_FABRIC_INTERFACE": "eth1", "NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode",
              "NARWHAL_IMAGE": "vllm/vllm-openai:v0.33.0", "NARWHAL_MODEL_PATH": "/srv/models/m",
              "NARWHAL_NODE_1_URL": ""}
    (tmp_path / ".env").write_text("".join("%s=%s\n" % kv for kv in values.items()))

    def info(a):
        return {"addresses": interface_addresses([{"ifname": "eth1", "addr_info": [
            {"family": "inet", "local": a, "prefixlen": 24, "scope": "global", "preferred_life_time": 4294967295}]}],
            "eth1")[1], "host_id": None}
    plan = build_fleet(load_inputs(values), ["engine-1", "engine-2"],
                       {"engine-1": info("10.0.0.11"), "engine-2": info("10.0.0.12")})
    (tmp_path / "deployment.env").write_text(render_env(plan["deployment_env"], ["generated"]))
    (tmp_path / "fleet.json").write_text(json.dumps(plan["fleet"]))
    return dict(plan["deployment_env"])["NARWHAL_NODE_1_URL"]


def test_blank_url_in_dotenv_resolves_to_the_derived_url_in_narwhal_fleet(tmp_path):
    derived = _blank_url_site(tmp_path)
    assert derived == DERIVED  # discovery: blank is unset, the URL is derived
    cmd = [sys.executable, str(REPO / "scripts" / "narwhal-fleet"), "--fleet", str(tmp_path / "fleet.json"),
           "--env-file", str(tmp_path / ".env"), "--deployment-env", str(tmp_path / "deployment.env")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout)[0]["url"] == derived
    env["NARWHAL_NODE_1_URL"] = ""  # exported blank in the shell: unset as well
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert json.loads(out.stdout)[0]["url"] == derived


def test_blank_url_in_dotenv_resolves_to_the_derived_url_in_the_fleet_lookup(tmp_path, monkeypatch):
    derived = _blank_url_site(tmp_path)
    from ansible_collections.narwhal.deploy.plugins.lookup.fleet import LookupModule

    for key in [k for k in os.environ if k.startswith("NARWHAL_")]:
        monkeypatch.delenv(key)
    lookup = LookupModule()
    # the options as the plugin loader would set them from the call's keywords (no loader in a unit test)
    monkeypatch.setattr(lookup, "set_options", lambda var_options=None, direct=None: setattr(lookup, "_given", direct))
    monkeypatch.setattr(lookup, "get_option", lambda name: lookup._given[name])
    fleet = lookup.run([str(tmp_path / "fleet.json")], variables={}, env_file=str(tmp_path / ".env"),
                       deployment_env=str(tmp_path / "deployment.env"))[0]
    assert [f["url"] for f in fleet] == [derived, "https://10.0.0.12:8000"]
