"""The collection used from an operator's own project: the project directory rule, the prefill/decode groups
from .env (the fleet_groups inventory plugin, through a real ansible-inventory run), the tables' rows, and every
role documented by meta/argument_specs.yml."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.filter.narwhal import (
    status_problems,
    status_row,
    summary_entry,
    summary_row,
)
from ansible_collections.narwhal.deploy.plugins.inventory.fleet_groups import fleet_roles
from ansible_collections.narwhal.deploy.plugins.lookup.project_dir import project_dir

STAGES = ("inputs", "discover", "prepare", "install", "launch", "probe", "monitoring", "status", "stop", "summary")


def test_project_dir_explicit_is_made_absolute():
    assert project_dir("site-a", "", "/home/op", exists=lambda p: False) == "/home/op/site-a"
    assert project_dir("/srv/site", "/x", "/home/op", exists=lambda p: True) == "/srv/site"


def test_project_dir_first_candidate_with_a_dotenv():
    have = {"/work/site/.env"}
    # the current directory first, then the inventory's directory and the two above it
    assert project_dir("", "/work/site/inventories/prod", "/tmp", exists=have.__contains__) == "/work/site"
    assert project_dir("", "inventory", "/work/site", exists=have.__contains__) == "/work/site"
    assert project_dir("", "/elsewhere/inv", "/tmp", exists=have.__contains__) == "/tmp"
    have.add("/tmp/.env")
    assert project_dir("", "/work/site/inventory", "/tmp", exists=have.__contains__) == "/tmp"


def test_fleet_roles_from_dotenv_values():
    roles, problems = fleet_roles(
        {"engine-1": "engine-1", "engine-2": "engine-2", "engine-3": "engine-3", "gpu-a.dc1": "engine-4",
         "engine-10": "engine-10"},
        {"NARWHAL_NODE_1_ROLE": "prefill", "NARWHAL_NODE_2_ROLE": "decode", "NARWHAL_NODE_3_ROLE": "router",
         "NARWHAL_NODE_4_ROLE": "prefill", "NARWHAL_NODE_10_ROLE": " decode "})
    assert roles == {"engine-1": "prefill", "engine-2": "decode", "engine-10": "decode", "gpu-a.dc1": "prefill"}
    assert problems == [("engine-3", "NARWHAL_NODE_3_ROLE is 'router'; set NARWHAL_NODE_3_ROLE=prefill or decode "
                                     "in .env")]


def _inventory(tmp_path, env_text, extra_env=None, hosts=None, groups=None, host_vars=None, check=True):
    """ansible-inventory --list over hosts.yml and the fleet_groups plugin (a failing source fails the run)."""
    inventory = tmp_path / "inventory"
    (inventory / "host_vars").mkdir(parents=True)
    (tmp_path / ".env").write_text(env_text)
    doc = {"engines": {"hosts": hosts or {"engine-1": {}, "engine-2": {}, "engine-3": {}}}}
    doc.update(groups or {})
    (inventory / "hosts.yml").write_text(yaml.safe_dump(doc))
    for host, found in (host_vars or {}).items():
        (inventory / "host_vars" / ("%s.yml" % host)).write_text(yaml.safe_dump(found))
    (inventory / "narwhal.yml").write_text("plugin: narwhal.deploy.fleet_groups\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_INVENTORY_ANY_UNPARSED_IS_FAILED="true",
               **(extra_env or {}))
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-inventory"), "-i", str(inventory),
                          "--list"], capture_output=True, text=True, env=env, cwd=tmp_path, check=False)
    if not check:
        return out
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


ROLES_ENV = "NARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\nNARWHAL_NODE_3_ROLE=decode\n"


def test_inventory_plugin_groups_hosts_of_any_name_by_narwhal_node(tmp_path):
    """Operators keep their host names: narwhal_node ties a host to node <n> of .env, in hosts.yml or host_vars/;
    engine-<n> names keep working without it."""
    doc = _inventory(tmp_path, ROLES_ENV, hosts={"gpu-a17.dc1.example": {"narwhal_node": 1},
                                                 "gpu-b03.dc1.example": {}, "engine-3": {}},
                     host_vars={"gpu-b03.dc1.example": {"narwhal_node": 2}})
    assert doc["prefill"]["hosts"] == ["gpu-a17.dc1.example"]
    assert sorted(doc["decode"]["hosts"]) == ["engine-3", "gpu-b03.dc1.example"]


def test_inventory_plugin_puts_every_host_of_an_engine_across_hosts_in_its_role(tmp_path):
    """narwhal_rank (hosts.yml or host_vars/) gives each host of an engine across hosts its place; all are in the
    engine's role group, so -l prefill selects them all."""
    doc = _inventory(tmp_path, ROLES_ENV, hosts={"gpu-a17": {"narwhal_node": 1, "narwhal_rank": 0},
                                                 "gpu-a18": {"narwhal_node": 1}, "gpu-b03": {"narwhal_node": 2}},
                     host_vars={"gpu-a18": {"narwhal_rank": 1}})
    assert sorted(doc["prefill"]["hosts"]) == ["gpu-a17", "gpu-a18"] and doc["decode"]["hosts"] == ["gpu-b03"]
    (tmp_path / "dup").mkdir()
    out = _inventory(tmp_path / "dup", ROLES_ENV, hosts={"gpu-a17": {"narwhal_node": 1, "narwhal_rank": 0},
                                                         "gpu-a18": {"narwhal_node": 1, "narwhal_rank": 0}},
                     check=False)
    assert out.returncode != 0
    assert "inventory hosts gpu-a17 and gpu-a18 of engine-1 both have narwhal_rank: 0" in " ".join(out.stderr.split())


def test_inventory_plugin_refuses_by_name(tmp_path):
    cases = [
        ({"gpu-a17": {}}, None, "inventory host gpu-a17 is in group engines but has no host variable narwhal_node"),
        ({"gpu-a17": {"narwhal_node": 1}, "gpu-b03": {"narwhal_node": "1"}}, None,
         "inventory hosts gpu-a17 and gpu-b03 are both engine-1"),
        ({"gpu-a17": {"narwhal_node": 0}}, None, "gpu-a17 has narwhal_node: 0, which is not a node number"),
        ({"engine-3": {"narwhal_node": 2}}, None, "a host named engine-<n> is node <n>: set narwhal_node: 3"),
        ({"gpu-a17": {"narwhal_node": 1}, "gpu-b03": {"narwhal_node": 2}},
         {"decode": {"hosts": {"gpu-a17": {}}}},
         "NARWHAL_NODE_1_ROLE: inventory host gpu-a17 (engine-1) is in the inventory's group decode, but .env has "
         "NARWHAL_NODE_1_ROLE=prefill"),
    ]
    for n, (hosts, groups, message) in enumerate(cases):
        here = tmp_path / str(n)
        here.mkdir()
        out = _inventory(here, ROLES_ENV, hosts=hosts, groups=groups, check=False)
        assert out.returncode != 0, (hosts, out.stdout)
        assert message in " ".join(out.stderr.split()), (message, out.stderr)
    # the operator's own groups agreeing with .env are fine
    (tmp_path / "ok").mkdir()
    doc = _inventory(tmp_path / "ok", ROLES_ENV, hosts={"gpu-a17": {"narwhal_node": 1}, "gpu-b03": {"narwhal_node": 2}},
                     groups={"decode": {"hosts": {"gpu-b03": {}}}})
    assert doc["decode"]["hosts"] == ["gpu-b03"] and doc["prefill"]["hosts"] == ["gpu-a17"]


def test_inventory_plugin_groups_the_engines_by_role(tmp_path):
    doc = _inventory(tmp_path, "NARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\n"
                               "NARWHAL_NODE_3_ROLE=decode\n")
    assert doc["prefill"]["hosts"] == ["engine-1"]
    assert sorted(doc["decode"]["hosts"]) == ["engine-2", "engine-3"]


def test_inventory_plugin_process_environment_overrides_the_file(tmp_path):
    doc = _inventory(tmp_path, "NARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\n",
                     {"NARWHAL_NODE_2_ROLE": "prefill"})
    assert sorted(doc["prefill"]["hosts"]) == ["engine-1", "engine-2"]
    assert "hosts" not in doc.get("decode", {})


def test_status_rows_and_problems():
    healthy = {"engine": "engine-1", "role": "prefill", "serving": True, "as_recorded": True, "problems": [],
               "container": {"id": "0123456789abcdef", "state": "running", "restart_count": 1},
               "plan_hash_running": "sha256:feedfacecafe0000", "health": {"ok": True},
               "version": {"served": "0.33.0"}, "nixl": {"bytes_transferred": 4096}}
    row = status_row(healthy)
    assert row.split()[:7] == ["engine-1", "engine-1", "prefill", "running/1r", "0123456789ab", "feedfacecafe", "ok"]
    assert row.endswith("serving as recorded")
    assert row.split()[8] == "-"  # the served certificate's days left: no TLS
    assert status_row(dict(healthy, tls={"days_left": 364, "not_after": "x"})).split()[8] == "364d"
    assert status_row(dict(healthy, tls={"url": "https://x", "error": "certificate verify failed"})).split()[8] == \
        "FAIL"
    down = {"engine": "engine-2", "problems": ["container narwhal-engine-2 is exited (code 137)"]}
    assert status_row(down).split()[:5] == ["engine-2", "engine-2", "-", "absent", "-"]
    assert status_problems(down) == "engine-2: container narwhal-engine-2 is exited (code 137)"
    # an inventory host of the operator's own name is shown next to the engine
    named = dict(down, inventory_host="gpu-b03.dc1.example")
    assert status_row(named).split()[:3] == ["engine-2", "gpu-b03.dc1.example", "-"]
    assert status_problems(named) == ("engine-2 (gpu-b03.dc1.example): container narwhal-engine-2 is exited "
                                      "(code 137)")


@pytest.mark.parametrize("tls, cert", [(None, "-"), ({"days_left": 364, "not_after": "2027-12-05T10:00:00Z"}, "364d"),
                                       ({"days_left": 1}, "1d"), ({"days_left": 0}, "expired"),
                                       ({"days_left": -3}, "expired"), ({"days_left": None}, "-"), ({}, "-")])
def test_the_status_row_shows_the_days_left_of_the_engines_certificate(tls, cert):
    status = {"engine": "engine-1", "role": "prefill", "problems": [], "health": {"ok": True},
              "container": {"id": "0123456789abcdef", "state": "running"}, "plan_hash_running": "sha256:feedface",
              "version": {"served": "0.33.0"}, "nixl": {"bytes_transferred": 4096}}
    if tls is not None:
        status["tls"] = tls
    assert status_row(status).split()[7:10] == ["0.33.0", cert, "4096"]
    assert status_row(status).endswith("serving as recorded")


def test_summary_entry_and_row():
    hostvars = {"inventory_hostname": "engine-2", "ansible_host": "10.0.0.2",
                "narwhal_site": {"nodes": {"2": {"ROLE": "decode"}}},
                "launch_summary": {"run_id": "run-0123456789ab", "container_id": "abcdef0123456789",
                                   "action": "replaced", "vllm_version": "0.33.0"},
                "probe_summary": {"probe": "PASS (2/2 pairs)"}}
    entry = summary_entry(hostvars, {"engine-2": "http://10.1.0.2:8000"})
    assert entry == {"engine": "engine-2", "inventory_host": "engine-2", "host": "10.0.0.2", "role": "decode",
                     "url": "http://10.1.0.2:8000", "run_id": "run-0123456789ab", "container_id": "abcdef0123456789",
                     "action": "replaced", "vllm_version": "0.33.0", "probe": "PASS (2/2 pairs)"}
    assert summary_row(entry).split()[:7] == ["engine-2", "engine-2", "decode", "http://10.1.0.2:8000",
                                              "abcdef012345", "replaced", "0.33.0"]
    # a host of the operator's own name: narwhal_engine (set by the opening play) is its engine
    named = summary_entry(dict(hostvars, inventory_hostname="gpu-b03.dc1.example", narwhal_engine="engine-2"),
                          {"engine-2": "http://10.1.0.2:8000"})
    assert (named["engine"], named["inventory_host"], named["role"], named["url"]) == (
        "engine-2", "gpu-b03.dc1.example", "decode", "http://10.1.0.2:8000")


def test_every_stage_role_is_documented_and_every_playbook_opens_with_the_boilerplate():
    for role in STAGES:
        spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
        assert spec["argument_specs"]["main"]["short_description"], role
        assert (REPO / "roles" / role / "README.md").read_text().startswith("# narwhal.deploy.%s" % role)
    for book in ("discover", "prepare", "launch", "probe", "monitoring", "status", "stop"):
        plays = yaml.safe_load((REPO / "playbooks" / ("%s.yml" % book)).read_text())
        assert plays[0]["ansible.builtin.import_playbook"] == "boilerplate.yml", book
        roles = [r["role"] for p in plays[1:] for r in p.get("roles", [])]
        assert "narwhal.deploy.%s" % book in roles, book


def test_the_getting_started_text_is_true():
    """README step 2 installs ansible-core (only requirements/controller.txt names it), and the inventory init
    writes does not ask to be copied where it already is."""
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "pip install -r requirements/controller.txt" in readme
    assert "ansible-core" in (REPO / "requirements" / "controller.txt").read_text()
    assert "ansible-core" not in "".join(line for line in (REPO / "requirements.txt").read_text().splitlines(True)
                                         if not line.startswith("#"))
    init = yaml.safe_load((REPO / "playbooks" / "init.yml").read_text())
    copies = [item for play in init for task in play.get("tasks", []) for item in task.get("loop", [])
              if isinstance(item, dict) and item.get("dest") == "inventory/hosts.yml"]
    assert copies and copies[0]["src"].endswith("/inventories/example/hosts.yml")
    comment = " ".join(line for line in (REPO / "inventories" / "example" / "hosts.yml").read_text().splitlines()
                       if line.startswith("#"))
    assert "In a project made by narwhal.deploy.init this file is already in place" in comment
    assert not comment.startswith("# A real site's inventory: copy to")


OPENING_ENV = ("NARWHAL_FABRIC_INTERFACE=eth1\nNARWHAL_IMAGE=vllm/vllm-openai:v0.33.0\n"
               "NARWHAL_MODEL_PATH=/srv/models/tiny\nNARWHAL_NODE_1_ROLE=prefill\nNARWHAL_NODE_2_ROLE=decode\n")


def _open_twice(tmp_path, between):
    """A playbook that opens like site.yml does (the boilerplate before each stage) with `between` (tasks) in the
    middle, run by a real ansible-playbook over two local engine hosts -> (rc, output)."""
    (tmp_path / ".env").write_text(OPENING_ENV)
    # the opening reaches each host with a module (ansible.builtin.ping): this Python runs it
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"engines": {"hosts": {"engine-1": local,
                                                                              "engine-2": local}}}))
    book = [{"ansible.builtin.import_playbook": "narwhal.deploy.boilerplate"},
            {"name": "A stage", "hosts": "engines", "gather_facts": False, "tasks": between},
            {"ansible.builtin.import_playbook": "narwhal.deploy.boilerplate"},
            {"name": "The next stage", "hosts": "engines", "gather_facts": False, "tasks": [
                {"name": "Opened", "ansible.builtin.debug": {"msg": OPENED}}]}]
    (tmp_path / "site.yml").write_text(yaml.safe_dump(book, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_NOCOLOR="1")
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(tmp_path / "hosts.yml"), str(tmp_path / "site.yml")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300, check=False)
    return out.returncode, out.stdout + out.stderr


OPENED = "{{ narwhal_engine }} {{ groups['prefill'] | join(',') }} {{ narwhal_site.site.NARWHAL_IMAGE }}"
READ = "TASK [narwhal.deploy.inputs : Read and validate the site inputs on the controller]"


def test_a_site_run_reads_the_inputs_once_while_they_stay_the_same(tmp_path):
    """The later openings of one run keep what the first read (the stage after them still has narwhal_site,
    narwhal_engine and the groups); a new ansible-playbook reads again."""
    for _run in (1, 2):
        rc, out = _open_twice(tmp_path, [{"name": "Nothing", "ansible.builtin.debug": {"msg": "stage"}}])
        assert rc == 0, out
        assert out.count(READ) == 1, out
        assert "engine-2 engine-1 vllm/vllm-openai:v0.33.0" in out


def test_a_site_run_reads_the_inputs_again_when_deployment_env_changed(tmp_path):
    """Discovery rewrites config/deployment.env, which the inputs read compares with the shell's values: the next
    opening of the same run reads again."""
    write = {"name": "Rewrite deployment.env", "ansible.builtin.copy": {
        "dest": str(tmp_path / "config" / "deployment.env"), "content": "NARWHAL_NODE_1_IP=10.0.0.1\n",
        "mode": "0600"}, "delegate_to": "localhost", "run_once": True}
    (tmp_path / "config").mkdir()
    rc, out = _open_twice(tmp_path, [write])
    assert rc == 0, out
    assert out.count(READ) == 2, out
