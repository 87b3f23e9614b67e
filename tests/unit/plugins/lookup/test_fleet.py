"""The fleet lookup (plugins/lookup/fleet.py) without a path: the site's fleet, resolved once per run and kept as the
fact narwhal_fleet while its three files are the files it was resolved from."""
import json
import os
import subprocess
import sys

import pytest
from ansible.errors import AnsibleLookupError
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.lookup.fleet import LookupModule

FLEET = [{"engine": "engine-1", "role": "prefill", "url": "${NARWHAL_NODE_1_URL}"},
         {"engine": "engine-2", "role": "decode", "url": "${NARWHAL_NODE_2_URL}"}]


@pytest.fixture
def site(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("NARWHAL_")]:
        monkeypatch.delenv(key)
    (tmp_path / ".env").write_text("NARWHAL_FABRIC_INTERFACE=eth1\n")
    (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=http://10.0.0.11:8000\n"
                                             "NARWHAL_NODE_2_URL=http://10.0.0.12:8000\n")
    (tmp_path / "fleet.json").write_text(json.dumps(FLEET))
    return {"env_file": str(tmp_path / ".env"),
            "paths": {"fleet": str(tmp_path / "fleet.json"), "deployment_env": str(tmp_path / "deployment.env")}}


def lookup(variables, *terms, **options):
    plugin = LookupModule()
    given = dict({"stamped": False, "env_file": None, "deployment_env": None}, **options)
    # the options as the plugin loader would set them from the call's keywords (no loader in a unit test)
    plugin.set_options = lambda var_options=None, direct=None: None
    plugin.get_option = given.get
    return plugin.run(list(terms), variables=variables)[0]


def test_without_a_path_the_sites_fleet_is_resolved(site):
    assert [f["url"] for f in lookup({"narwhal_site": site})] == ["http://10.0.0.11:8000", "http://10.0.0.12:8000"]


def test_the_kept_fleet_is_returned_while_its_files_are_the_same_and_resolved_again_after(site, tmp_path):
    kept = lookup({"narwhal_site": site}, stamped=True)
    assert [s[0] for s in kept["stamp"]] == [site["paths"]["fleet"], site["env_file"], site["paths"]["deployment_env"]]
    marked = dict(kept, fleet=[{"engine": "engine-1", "url": "kept"}])  # tells the kept fleet from a new resolution
    assert lookup({"narwhal_site": site, "narwhal_fleet": marked}) == marked["fleet"]
    # discovery replaces deployment.env by rename: a new file, so the fleet is resolved again
    new = tmp_path / "deployment.env.new"
    new.write_text("NARWHAL_NODE_1_URL=http://10.0.0.21:8000\nNARWHAL_NODE_2_URL=http://10.0.0.22:8000\n")
    os.replace(new, tmp_path / "deployment.env")
    assert lookup({"narwhal_site": site, "narwhal_fleet": marked})[0]["url"] == "http://10.0.0.21:8000"


def test_a_fleet_that_does_not_resolve_is_named_by_the_stage_that_reads_it(site, tmp_path):
    (tmp_path / "fleet.json").write_text("{not json")
    with pytest.raises(AnsibleLookupError, match="cannot read the fleet .*fleet.json.*; run discovery first"):
        lookup({"narwhal_site": site, "narwhal_fleet": None})


def test_without_site_inputs_or_a_path_the_lookup_says_what_it_needs():
    with pytest.raises(AnsibleLookupError, match="no site inputs to take the fleet from"):
        lookup({})
    with pytest.raises(AnsibleLookupError, match="a fleet path needs env_file and deployment_env"):
        lookup({}, "config/fleet.json")


# ------------------------------------------------------------- a URL with credentials: refused by name, never shown

SECRET = "Zq7yK3pW9mXv2LtR"  # shaped like no token redact_text knows


@pytest.mark.parametrize("where", ["process", "dotenv", "deployment", "fleet"])
def test_a_resolved_url_with_credentials_is_refused_naming_the_entry_and_field(site, tmp_path, monkeypatch, where):
    url = "https://narwhal:%s@10.0.0.12:8000" % SECRET
    if where == "process":  # the controller's environment overrides .env for one run
        monkeypatch.setenv("NARWHAL_NODE_2_URL", url)
    elif where == "dotenv":
        (tmp_path / ".env").write_text("NARWHAL_NODE_2_URL=%s\n" % url)
    elif where == "deployment":
        (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=https://10.0.0.11:8000\n"
                                                 "NARWHAL_NODE_2_URL=%s\n" % url)
    else:
        (tmp_path / "fleet.json").write_text(json.dumps([FLEET[0], dict(FLEET[1], url=url)]))
    for stamped in (False, True):
        with pytest.raises(AnsibleLookupError) as err:
            lookup({"narwhal_site": site}, stamped=stamped)
        text = str(err.value)
        assert text.startswith("%s: engine-2, field url: the URL https://<redacted>@10.0.0.12:8000 carries user "
                               "information" % site["paths"]["fleet"]), text
        assert SECRET not in text and "narwhal:" not in text
    # with a path, too
    with pytest.raises(AnsibleLookupError, match="engine-2, field url") as err:
        lookup({}, site["paths"]["fleet"], env_file=site["env_file"], deployment_env=site["paths"]["deployment_env"])
    assert SECRET not in str(err.value)


def test_the_fleet_script_refuses_a_url_with_credentials_and_prints_nothing(tmp_path):
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps([dict(FLEET[0], attestation_url="${NARWHAL_NODE_1_ATTESTATION_URL}"), FLEET[1]]))
    (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=https://10.0.0.11:8000\n"
                                             "NARWHAL_NODE_1_ATTESTATION_URL=http://%s@10.0.0.11:8010\n"
                                             "NARWHAL_NODE_2_URL=https://10.0.0.12:8000\n" % SECRET)
    cmd = [sys.executable, str(REPO / "scripts" / "narwhal-fleet"), "--fleet", str(fleet),
           "--env-file", str(tmp_path / "none.env"), "--deployment-env", str(tmp_path / "deployment.env")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 1 and out.stdout == ""
    assert "%s: engine-1, field attestation_url: the URL http://<redacted>@10.0.0.11:8010" % fleet in out.stderr
    assert SECRET not in out.stderr
    (tmp_path / "deployment.env").write_text("NARWHAL_NODE_1_URL=https://10.0.0.11:8000\n"
                                             "NARWHAL_NODE_1_ATTESTATION_URL=http://10.0.0.11:8010\n"
                                             "NARWHAL_NODE_2_URL=https://10.0.0.12:8000\n")
    good = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    assert [e["url"] for e in json.loads(good.stdout)] == ["https://10.0.0.11:8000", "https://10.0.0.12:8000"]
