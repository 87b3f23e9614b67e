"""The filter install_plan (plugins/filter/narwhal.py over _plan/role_env.py::install_plan): what install writes and
held_files' list of what the host should hold, the one list install reads and prepare's host checks read for it."""

import hashlib
import json

import pytest
from ansible.errors import AnsibleFilterError
from ansible.plugins.filter.core import to_nice_json
from test_support.paths import HAND_LAUNCH_CONFIG

from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters

PATHS = filters.install_paths_filter("/opt/narwhal", "engine-2")
PATHS["run_dir"] = "/opt/narwhal/runs/run-0123456789ab"
ROLE_ENV = "# Role environment of engine-2\nNARWHAL_ENGINE=engine-2\nNARWHAL_RUN_ID=run-0123456789ab\n"


def record():
    return json.loads(HAND_LAUNCH_CONFIG.read_text())["engines"]["engine-2"]


def test_the_record_is_written_as_ansibles_to_nice_json_writes_it():
    """Byte for byte the text install wrote before the filter (the copy's content `to_nice_json(indent=2)` and a
    newline): an installed host holds the same record, and its digest is the one held_files compares."""
    rec = dict(record(), note="ünïcode \u2013 and a \"quote\"")
    plan = filters.install_plan_filter(PATHS, rec, ROLE_ENV, "ab" * 32, "/srv/key")
    assert plan["record_text"] == to_nice_json(rec, indent=2) + "\n"


def test_the_wanted_list_names_every_directory_and_file_with_its_mode_owner_and_digest():
    rec = record()
    plan = filters.install_plan_filter(PATHS, rec, ROLE_ENV, "ab" * 32, "/srv/key", "narwhal")
    text_sha = hashlib.sha256(plan["record_text"].encode()).hexdigest()
    assert plan["wanted"] == [
        {"path": "/opt/narwhal/config", "state": "directory", "mode": "0700", "owner": "narwhal"},
        {"path": "/opt/narwhal/bin", "state": "directory", "mode": "0755", "owner": "narwhal"},
        {"path": "/opt/narwhal/runs", "state": "directory", "mode": "0700", "owner": "narwhal"},
        {"path": PATHS["record"], "sha256": text_sha, "mode": "0600", "owner": "narwhal"},
        {"path": PATHS["role_env"], "sha256": hashlib.sha256(ROLE_ENV.encode()).hexdigest(), "mode": "0600",
         "owner": "narwhal"},
        {"path": PATHS["launcher"], "sha256": "ab" * 32, "mode": "0755", "owner": "narwhal"},
        {"path": "/opt/narwhal/secrets", "state": "directory", "mode": "0700", "owner": "narwhal"},
        {"path": "/opt/narwhal/secrets/engine-api.key", "src": "/srv/key", "mode": "0600", "owner": "narwhal"}]
    assert PATHS["api_key"] == "/opt/narwhal/secrets/engine-api.key"  # its own directory, which the engines mount
    assert PATHS["former_api_key"] == "/opt/narwhal/config/engine-api.key"  # where it was: install removes it
    # the same inputs give the same list (install takes prepare's read only then); any other role env does not
    again = filters.install_plan_filter(PATHS, record(), ROLE_ENV, "ab" * 32, "/srv/key", "narwhal")
    assert again["wanted"] == plan["wanted"]
    other = filters.install_plan_filter(PATHS, record(), ROLE_ENV + "NARWHAL_X=1\n", "ab" * 32, "/srv/key", "narwhal")
    assert other["wanted"] != plan["wanted"]
    assert filters.install_plan_filter(PATHS, rec, ROLE_ENV, "ab" * 32, "/srv/key")["wanted"][0]["owner"] == "root"


def test_the_guard_and_the_tls_files_join_the_list_when_prepare_names_them():
    """The key guard always (its digest: install copies the role's own file), the engine's TLS directory and files
    only with TLS, the key 0600 in a 0700 directory (src: the tls_material step's controller files)."""
    tls = {"cert": "/p/config/tls/hosts/engine-2.crt", "key": "/p/config/tls/hosts/engine-2.key",
           "ca": "/p/config/tls/ca.crt"}
    base = filters.install_plan_filter(PATHS, record(), ROLE_ENV, "ab" * 32, "/srv/key")["wanted"]
    plan = filters.install_plan_filter(PATHS, record(), ROLE_ENV, "ab" * 32, "/srv/key", "root",
                                       {"guard_sha256": "cd" * 32, "tls": tls})
    assert plan["wanted"][:len(base)] == base
    assert plan["wanted"][len(base):] == [
        {"path": "/opt/narwhal/guard", "state": "directory", "mode": "0755", "owner": "root"},
        {"path": "/opt/narwhal/guard/narwhal_guard.py", "sha256": "cd" * 32, "mode": "0644", "owner": "root"},
        {"path": "/opt/narwhal/tls", "state": "directory", "mode": "0700", "owner": "root"},
        {"path": "/opt/narwhal/tls/engine-2", "state": "directory", "mode": "0700", "owner": "root"},
        {"path": "/opt/narwhal/tls/engine-2/server.crt", "src": tls["cert"], "mode": "0644", "owner": "root"},
        {"path": "/opt/narwhal/tls/engine-2/server.key", "src": tls["key"], "mode": "0600", "owner": "root"},
        {"path": "/opt/narwhal/tls/engine-2/ca.crt", "src": tls["ca"], "mode": "0644", "owner": "root"}]
    off = filters.install_plan_filter(PATHS, record(), ROLE_ENV, "ab" * 32, "/srv/key", "root",
                                      {"guard_sha256": "cd" * 32, "tls": None})
    assert off["wanted"] == plan["wanted"][:len(base) + 2]
    with pytest.raises(AnsibleFilterError, match="sources must be prepare_run's install_sources"):
        filters.install_plan_filter(PATHS, record(), ROLE_ENV, "ab" * 32, "/srv/key", "root", "tls")


@pytest.mark.parametrize("args", [(None, {}, ""), (PATHS, None, ""), (PATHS, {}, None)])
def test_what_is_not_a_plan_input_is_refused(args):
    with pytest.raises(AnsibleFilterError, match="install_plan takes the install paths"):
        filters.install_plan_filter(*args, "ab" * 32, "/srv/key")
