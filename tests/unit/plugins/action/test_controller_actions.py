"""The controller steps as action plugins (plugins/action, plugins/plugin_utils/_action.py, _hostvars.py): run by a
real ansible-playbook against local engine hosts, each compared with its step run directly on the same inputs
(plugins/plugin_utils/_action.py::run_step); the modules' documentation states each step's argument spec.

Every host's Python is a wrapper that logs each module file it is asked to run, so a test can tell whether a step
ran in the controller's process (no AnsiballZ_<step>.py) or as a module on the task's host.
"""
import copy
import importlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import types

import pytest
import yaml
from test_support.paths import REPO
from test_support.prepare import API_KEY, HAND_LAUNCH, compatible, inspection, make_checkout, prep_args
from test_support.records import module_args, nv_pair, snapshot

from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.transfer import module_spec as probe_spec
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.transfer import transfer_probe
from ansible_collections.narwhal.deploy.plugins.plugin_utils import _hostvars as __hostvars
from ansible_collections.narwhal.deploy.plugins.plugin_utils._action import StepAction, run_step

ENGINES = ("engine-1", "engine-2")


@pytest.fixture
def no_narwhal_env(monkeypatch):
    """site_inputs reads NARWHAL_* of the process environment: none here, none in the playbooks."""
    for name in list(os.environ):
        if name.startswith("NARWHAL_"):
            monkeypatch.delenv(name)


class Play:
    """ansible-playbook in `where` over group engines (engine-1, engine-2) and localhost, all connection local;
    host_vars from `hostvars`; every module run logged to `modules` by the hosts' Python wrapper."""

    def __init__(self, where, hostvars=None):
        self.where = where
        self.modules = where / "modules.log"
        python = where / "python"
        python.write_text('#!/bin/sh\necho "$@" >> "%s"\nexec "%s" "$@"\n' % (self.modules, sys.executable))
        python.chmod(0o755)
        local = {"ansible_connection": "local", "ansible_python_interpreter": str(python)}
        inventory = {"all": {"hosts": {"localhost": dict(local)},
                             "children": {"engines": {"hosts": dict((e, dict(local)) for e in ENGINES)}}}}
        (where / "inventory").mkdir()
        (where / "inventory" / "hosts.yml").write_text(yaml.safe_dump(inventory))
        (where / "inventory" / "host_vars").mkdir()
        for host, values in (hostvars or {}).items():
            (where / "inventory" / "host_vars" / ("%s.yml" % host)).write_text(json.dumps(values))

    def run(self, tasks, *args, env=None):
        """(rc, output, the registered result `r` of the tasks); `env` adds to the controller's environment."""
        copy_result = {"dest": str(self.where / "r.json"), "content": "{{ r | to_json }}", "mode": "0600"}
        keep = {"name": "Keep the result", "ansible.builtin.copy": copy_result, "delegate_to": "localhost",
                "run_once": True, "check_mode": False, "diff": False}
        book = [{"name": "Steps", "hosts": "engines", "gather_facts": False, "tasks": tasks + [keep]}]
        (self.where / "play.yml").write_text(yaml.safe_dump(book, sort_keys=False))
        env = dict(((k, v) for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_"))),
                   **(env or {}))
        env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_PIPELINING="False",
                   ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_NOCOLOR="1")
        (self.where / "r.json").unlink(missing_ok=True)
        out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
                              str(self.where / "inventory"), str(self.where / "play.yml")] + list(args),
                             capture_output=True, text=True, env=env, cwd=self.where, timeout=300, check=False)
        result = json.loads((self.where / "r.json").read_text()) if (self.where / "r.json").exists() else None
        return out.returncode, out.stdout + out.stderr, result

    def ran_module(self, step):
        return self.modules.exists() and "AnsiballZ_%s.py" % step in self.modules.read_text()


def step_task(step, args, **keywords):
    task = {"name": "The step", "narwhal.deploy.%s" % step: args, "delegate_to": "localhost", "run_once": True,
            "register": "r"}
    task.update(keywords)
    return task


# ------------------------------------------------------------------------------------------------
# site_inputs


@pytest.fixture
def project(tmp_path):
    project = tmp_path / "site"
    project.mkdir()
    shutil.copy(REPO / ".env.example", project / ".env")
    return project


def test_site_inputs_action_sets_the_fact_the_module_returns(tmp_path, project, step_runner, no_narwhal_env):
    play = Play(tmp_path)
    keep = {"name": "Keep the fact of every engine", "ansible.builtin.set_fact": {
        "r": "{{ dict(ansible_play_hosts_all | zip(ansible_play_hosts_all | map('extract', hostvars, "
             "'narwhal_site'))) }}"}, "run_once": True}
    rc, out, facts = play.run([{"name": "The inputs role", "ansible.builtin.include_role":
                                {"name": "narwhal.deploy.inputs"}}, keep], "-e", "narwhal_project_dir=%s" % project)
    assert rc == 0, out
    status, module = step_runner("site_inputs", {"env_file": str(project / ".env"), "root": str(project)})
    assert status == "exit", module
    assert facts == {"engine-1": module["ansible_facts"]["narwhal_site"],
                     "engine-2": module["ansible_facts"]["narwhal_site"]}
    assert facts["engine-1"]["paths"]["fleet"] == str(project / "config" / "fleet.json")
    assert not play.ran_module("site_inputs"), play.modules.read_text()


def test_site_inputs_action_refusal_names_the_input_like_the_module(tmp_path, project, step_runner,
                                                                    no_narwhal_env):
    env = project / ".env"
    env.write_text(env.read_text() + "NARWHAL_ENGINE_PORT=eighty\n")  # .env.example has it commented out
    args = {"env_file": str(env), "root": str(project)}
    play = Play(tmp_path)
    rc, out, result = play.run([step_task("site_inputs", args, ignore_errors=True)])
    assert rc == 0, out
    status, module = step_runner("site_inputs", args)
    assert status == "fail"
    assert result["failed"] is True and module["input"] == result["input"] == "NARWHAL_ENGINE_PORT"
    assert result["msg"] == module["msg"]
    assert "'eighty' is not a whole number" in result["msg"]
    assert not play.ran_module("site_inputs")


def test_site_inputs_action_warns_and_refuses_an_unknown_option_as_the_module(
        tmp_path, project, step_runner, monkeypatch, no_narwhal_env):
    play = Play(tmp_path)
    near_miss = {"NARWHAL_ENGNE_PORT": "9000"}  # not an input: ignored with a warning
    rc, out, result = play.run([step_task("site_inputs", {"env_file": str(project / ".env")})], env=near_miss)
    assert rc == 0, out
    monkeypatch.setenv("NARWHAL_ENGNE_PORT", "9000")
    status, module = step_runner("site_inputs", {"env_file": str(project / ".env")})
    assert status == "exit"
    assert result["warnings"] == module["warnings"] == [
        "NARWHAL_ENGNE_PORT in the controller environment is not a site input (did you mean NARWHAL_ENGINE_PORT?) "
        "and is ignored"]
    assert "[WARNING]: NARWHAL_ENGNE_PORT in the controller environment is not a site input" in out
    rc, out, result = play.run([step_task("site_inputs", {"env_file": str(project / ".env"), "bogus": 1},
                                          ignore_errors=True)])
    assert result["msg"] == ("Unsupported parameters for (narwhal.deploy.site_inputs) module: bogus. Supported "
                             "parameters include: env_file, root, use_process_env.")


# ------------------------------------------------------------------------------------------------
# discovery_outputs: the engines' facts from hostvars


def test_discovery_outputs_action_reads_the_engines_facts_from_hostvars(tmp_path, step_runner):
    (tmp_path / "dev").mkdir()
    for name in ("nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / name).write_text("")
    root = tmp_path / "checkout"
    root.mkdir()
    args = module_args(root, nv_pair(tmp_path))
    status, module = step_runner("discovery_outputs", copy.deepcopy(args))
    assert status == "exit" and module["changed"] is True, module
    by_module = snapshot(root)
    shutil.rmtree(root / "config")

    # the facts as engine_host_facts leaves them on each engine; the task passes neither interfaces nor hosts
    facts = dict((e, dict(narwhal_interface=args["interfaces"][e], **dict(
        (fact, args["hosts"][e][key]) for key, fact in __hostvars.INSPECTION_FACTS))) for e in ENGINES)
    (tmp_path / "play").mkdir()
    play = Play(tmp_path / "play", facts)
    task_args = dict((k, args[k]) for k in ("site", "engines", "root"))
    rc, out, result = play.run([step_task("discovery_outputs", task_args)])
    assert rc == 0, out
    assert result["changed"] is True and result["table"] == module["table"] and result["files"] == module["files"]
    assert dict((k, v[0]) for k, v in snapshot(root).items()) == dict((k, v[0]) for k, v in by_module.items())
    assert not play.ran_module("discovery_outputs")

    # an engine whose facts were not gathered is refused by name, as before
    (tmp_path / "play" / "inventory" / "host_vars" / "engine-2.yml").unlink()
    rc, out, result = play.run([step_task("discovery_outputs", task_args, ignore_errors=True)])
    assert result["failed"] is True and result["msg"].startswith("discovery refused its inputs, nothing was written")
    assert "engine-2" in result["msg"]
    # ... unless its host is lost in this run (narwhal_lost.hosts): its last record is kept, the set as it was
    rc, out, result = play.run([step_task("discovery_outputs", dict(task_args, lost=["engine-2", "router-1"]))])
    assert rc == 0, out
    assert result["kept"] == ["engine-2"] and result["changed"] is False
    assert dict((k, v[0]) for k, v in snapshot(root).items()) == dict((k, v[0]) for k, v in by_module.items())


# ------------------------------------------------------------------------------------------------
# prepare_run: the current inspection from hostvars


@pytest.fixture
def checkout(tmp_path):
    return make_checkout(tmp_path / "checkout", compatible(copy.deepcopy(HAND_LAUNCH)))


def current_facts(image_id=None):
    """What the prepare role leaves on each engine: narwhal_gpus, narwhal_interface and prepare_prereqs."""
    facts = {}
    for engine, record in compatible(copy.deepcopy(HAND_LAUNCH))["engines"].items():
        now = inspection(record)
        facts[engine] = {"narwhal_gpus": now["gpus"], "narwhal_interface": now["interface"],
                         "prepare_prereqs": {"changed": False, "image_id": image_id or now["image_id"]}}
    return facts


def test_prepare_run_action_check_mode_writes_nothing_then_writes_the_modules_run(tmp_path, checkout, step_runner):
    good = dict((e, inspection(r)) for e, r in compatible(copy.deepcopy(HAND_LAUNCH))["engines"].items())
    status, module = step_runner("prepare_run", prep_args(checkout, "write", good, check=True))
    assert status == "exit" and module["changed"] is True, module
    assert not (checkout / "runs").exists()
    task_args = dict((k, v) for k, v in prep_args(checkout, "write").items() if k != "hosts")
    (tmp_path / "play").mkdir()
    play = Play(tmp_path / "play", current_facts())

    rc, out, result = play.run([step_task("prepare_run", task_args)], "--check", "--diff")
    assert rc == 0, out
    assert result["changed"] is True and result["run_id"] == module["run_id"]
    assert result["manifest"] == module["manifest"]
    assert not (checkout / "runs").exists()
    assert result["run_id"] in out  # the diff lists the files of the new run

    rc, out, result = play.run([step_task("prepare_run", task_args)])
    assert rc == 0, out
    assert result["changed"] is True and result["run_id"] == module["run_id"]
    assert (checkout / "runs" / module["run_id"] / "manifest.json").is_file()
    assert API_KEY not in (checkout / "runs" / module["run_id"] / "manifest.json").read_text()
    assert not play.ran_module("prepare_run")


def test_prepare_run_action_refuses_a_stale_host_from_hostvars_like_the_module(tmp_path, checkout, step_runner):
    stale_id = "sha256:" + "cd" * 32
    (tmp_path / "play").mkdir()
    play = Play(tmp_path / "play", current_facts(stale_id))
    task_args = dict((k, v) for k, v in prep_args(checkout, "write").items() if k != "hosts")
    rc, out, result = play.run([step_task("prepare_run", task_args, ignore_errors=True)])
    assert result["failed"] is True, out
    hosts = dict((e, dict(inspection(r), image_id=stale_id))
                 for e, r in compatible(copy.deepcopy(HAND_LAUNCH))["engines"].items())
    status, module = step_runner("prepare_run", prep_args(checkout, "write", hosts))
    assert status == "fail"
    assert result["msg"] == module["msg"] and result["input"] == module["input"] == "engine-1"
    image = HAND_LAUNCH["engines"]["engine-1"]["runtime"]["image"]
    assert "image %s is %s on the host" % (image, stale_id) in result["msg"]
    assert not (checkout / "runs").exists()


# ------------------------------------------------------------------------------------------------
# transfer_probe: in-process on the controller, the module on an engine host


def test_transfer_probe_runs_here_on_the_controller_and_as_a_module_with_become(tmp_path):
    args = {"engines": {"engine-1": {"url": "http://127.0.0.1:9", "role": "prefill"},
                        "engine-2": {"url": "http://127.0.0.1:9", "role": "decode"}},
            "pairs": [["engine-1", "engine-2"]], "model": "m", "api_key": "sk-probe-secret-000000", "timeout": 5}
    play = Play(tmp_path)
    rc, out, here = play.run([step_task("transfer_probe", args, ignore_errors=True)])
    assert here["failed"] is True and here["msg"].startswith("transfer probe failed: engine-1 -> engine-2: "), out
    assert not play.ran_module("transfer_probe")
    # the consumer-side probe: on the engine's host with become (here: su to root on the local connection)
    remote = dict(step_task("transfer_probe", args, ignore_errors=True), become=True, become_method="su")
    remote.pop("delegate_to")
    rc, out, there = play.run([remote])
    assert play.ran_module("transfer_probe"), out
    assert there["msg"] == here["msg"]
    assert "sk-probe-secret-000000" not in json.dumps(here) + json.dumps(there)


# ------------------------------------------------------------------------------------------------
# run_step and the local/remote decision, in this process


def test_a_step_fails_like_the_module_on_bad_arguments():
    result = run_step(transfer_probe, probe_spec(), {"engines": {}, "pairs": [], "model": "m"},
                      "narwhal.deploy.transfer_probe")
    assert result["failed"] is True
    assert result["msg"] == "one of the following is required: api_key, api_key_file, engine_checkout"
    result = run_step(transfer_probe, probe_spec(), {"engines": {}, "pairs": [], "model": "m",
                                                     "api_key": "sk-0000-0000", "api_key_file": "/k"}, "x")
    assert result["msg"] == "parameters are mutually exclusive: api_key|api_key_file|engine_checkout"
    result = run_step(transfer_probe, probe_spec(), {"engines": {}, "pairs": [], "model": "m", "api_key": "k",
                                                     "bogus": 1}, "narwhal.deploy.transfer_probe")
    assert result["msg"].startswith("Unsupported parameters for (narwhal.deploy.transfer_probe) module: bogus.")


def test_a_step_result_hides_no_log_values_and_the_steps_secrets():
    def step(task):
        task.secrets.add("read-from-a-file-0042")
        task.warnings.append("careful")
        return {"changed": False, "echo": [task.params["api_key"], 1], "said": "key=" + task.params["api_key"],
                "file": "read-from-a-file-0042"}

    result = run_step(step, probe_spec(), {"engines": {}, "pairs": [], "model": "m", "api_key": "sk-hidden-123456"},
                      "x")
    assert result["echo"] == ["VALUE_SPECIFIED_IN_NO_LOG_PARAMETER", 1] and result["said"] == "key=********"
    assert result["file"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"
    assert result["changed"] is False and result["warnings"] == ["careful"] and "invocation" not in result


def test_a_step_error_is_a_failed_result_with_its_keys():
    def step(task):
        raise StepError("refused, fix it", input="NARWHAL_X")

    result = run_step(step, {"argument_spec": {}}, {}, "x")
    assert result == {"failed": True, "msg": "refused, fix it", "input": "NARWHAL_X"}


@pytest.mark.parametrize("transport, become, here", [("local", False, True), ("ssh", False, False),
                                                     ("local", True, False)])
def test_a_remote_step_runs_here_only_on_a_local_connection_without_become(transport, become, here):
    action = StepAction.__new__(StepAction)
    action._connection = types.SimpleNamespace(transport=transport)
    action._play_context = types.SimpleNamespace(become=become)
    assert action.runs_here() is here


def test_a_controller_step_runs_in_this_process_even_with_become(tmp_path):
    """Only transfer_probe has a module that runs elsewhere; the others are documentation, their action does the
    work (as ansible-core's set_fact), with become too."""
    play = Play(tmp_path)
    dest = tmp_path / "report.json"
    rc, out, result = play.run([step_task("private_file", {"dest": str(dest), "content": "{}\n"}, become=True,
                                          become_method="su")])
    assert rc == 0, out
    assert result["changed"] is True and dest.read_text() == "{}\n" and oct(dest.stat().st_mode & 0o777) == "0o600"
    assert not play.ran_module("private_file")


DOC_ONLY = ("site_inputs", "discovery_outputs", "prepare_run", "private_file", "bench_report", "tls_material",
            "model_manifest", "image_sources")


@pytest.mark.parametrize("name", DOC_ONLY + ("transfer_probe",))
def test_the_modules_documentation_states_the_steps_argument_spec(name):
    """A documentation-only module is not checked against an AnsibleModule call by ansible-test's validate-modules:
    this test is that check (type, required, default, choices, elements, no_log of every option)."""
    module = importlib.import_module("ansible_collections.narwhal.deploy.plugins.modules.%s" % name)
    action = importlib.import_module("ansible_collections.narwhal.deploy.plugins.action.%s" % name).ActionModule
    documented = yaml.safe_load(module.DOCUMENTATION)["options"]
    spec = action.module_spec()["argument_spec"]
    assert sorted(documented) == sorted(spec)
    for option, rule in spec.items():
        doc = documented[option]
        for key in ("type", "required", "default", "choices", "elements"):
            assert doc.get(key) == rule.get(key) or (key == "required" and not doc.get(key) and not rule.get(key)) \
                or (key == "type" and rule.get(key, "str") == doc.get(key, "str")), (option, key, doc, rule)
    if name in DOC_ONLY:
        assert not hasattr(module, "main"), "%s is documentation only" % name


def test_hostvars_fill_only_what_the_task_does_not_give():
    hostvars = {"engine-1": {"narwhal_interface": {"name": "eth1"}, "narwhal_gpus": {"vendor": "nvidia"},
                             "prepare_prereqs": {"image_id": "sha256:x", "model_manifest": "sha256:m"}}}
    args = __hostvars.discovery_facts({"engines": ["engine-1", "engine-9"]}, hostvars)
    assert args["interfaces"] == {"engine-1": {"name": "eth1"}, "engine-9": None}
    assert args["hosts"]["engine-1"] == {"gpus": {"vendor": "nvidia"}, "rdma": None, "image": None, "model": None}
    given = {"engines": ["engine-1"], "interfaces": {}, "hosts": None}
    assert __hostvars.discovery_facts(given, hostvars) == given
    assert __hostvars.prepare_facts({"engines": ["engine-1"], "stage": "write"}, hostvars)["hosts"] == {
        "engine-1": {"gpus": {"vendor": "nvidia"}, "interface": {"name": "eth1"}, "image_id": "sha256:x",
                     "model_manifest": "sha256:m"}}
    assert "hosts" not in __hostvars.prepare_facts({"engines": ["engine-1"], "stage": "validate"}, hostvars)


def test_lost_hosts_are_mapped_to_their_engines():
    """discovery_outputs' lost_engines from `lost` (narwhal_lost.hosts): through narwhal_engines and narwhal_members
    (any host of an engine across hosts), an engine-<n> host without a mapping is its own; a host of no engine of
    the task (a router) is not discovery's; a task's own lost_engines wins."""
    hosts = {"gpu-a17": "engine-1", "gpu-a18": "engine-1", "engine-2": "engine-2", "gpu-c3": "engine-3"}
    members = {"engine-1": ["gpu-a17", "gpu-a18"]}
    args = {"engines": ["engine-1", "engine-2", "engine-3", "engine-4"], "lost": ["gpu-a18", "router-1", "engine-4"]}
    assert __hostvars.discovery_facts(args, {}, hosts, members)["lost_engines"] == {
        "engine-1": ["gpu-a18"], "engine-4": ["engine-4"]}
    args["lost"] = ["gpu-c3", "gpu-a17", "gpu-a18"]
    assert __hostvars.discovery_facts(args, {}, hosts, members)["lost_engines"] == {
        "engine-1": ["gpu-a17", "gpu-a18"], "engine-3": ["gpu-c3"]}
    assert __hostvars.discovery_facts(dict(args, lost_engines={}), {}, hosts, members)["lost_engines"] == {}
    assert "lost_engines" not in __hostvars.discovery_facts({"engines": ["engine-1"]}, {}, hosts, members)


def test_hostvars_of_an_engine_are_its_inventory_hosts():
    """Engine hosts of the operator's own names: narwhal_engines ({inventory host: engine-<n>}, the opening play's
    fact) says whose variables are an engine's; an engine-<n> host without a mapping is its own."""
    hostvars = {"gpu-a17.dc1.example": {"narwhal_interface": {"name": "ib0"}, "narwhal_gpus": {"vendor": "amd"},
                                        "prepare_prereqs": {"image_id": "sha256:a"}},
                "engine-1": {"narwhal_interface": {"name": "wrong"}},
                "engine-2": {"narwhal_interface": {"name": "eth1"}}}
    hosts = {"gpu-a17.dc1.example": "engine-1", "engine-2": "engine-2"}
    args = __hostvars.discovery_facts({"engines": ["engine-1", "engine-2"]}, hostvars, hosts)
    assert args["interfaces"] == {"engine-1": {"name": "ib0"}, "engine-2": {"name": "eth1"}}
    assert args["hosts"]["engine-1"]["gpus"] == {"vendor": "amd"}
    assert __hostvars.prepare_facts({"engines": ["engine-1"], "stage": "write"}, hostvars, hosts)["hosts"] == {
        "engine-1": {"gpus": {"vendor": "amd"}, "interface": {"name": "ib0"}, "image_id": "sha256:a",
                     "model_manifest": None}}
    # with tls, which inventory host's certificate each engine serves (the head of an engine across hosts)
    given = {"engines": ["engine-1", "engine-2", "engine-3"], "stage": "validate", "tls": {"mode": "site"}}
    members = {"engine-3": ["head-3", "worker-3"]}
    assert __hostvars.prepare_facts(given, hostvars, hosts, members)["engine_hosts"] == {
        "engine-1": "gpu-a17.dc1.example", "engine-2": "engine-2", "engine-3": "head-3"}
    assert "engine_hosts" not in __hostvars.prepare_facts(dict(given, tls=None), hostvars, hosts, members)
    assert __hostvars.prepare_facts(dict(given, engine_hosts={}), hostvars, hosts)["engine_hosts"] == {}
