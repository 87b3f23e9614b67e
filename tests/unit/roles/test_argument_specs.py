# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Each default written once: every role's defaults/main.yml holds exactly the options of its meta/argument_specs.yml
(prometheus-community/ansible's .github/scripts/lint_arguments_spec.sh compares the keys of the two; here also the
values), every variable a playbook or a role reads is declared in a role's spec unless Ansible or the collection sets
it, and each role README's option table is the one scripts/gen-role-docs.py generates from the two files.

A role with several entry points (launch: main, peers, restart; router: main, status, stop, traffic): ansible-core
reads defaults/main.yml for every entry point (import_role/include_role tasks_from keep defaults_from: main), so
the file holds the options of all of them; an option several entry points declare is declared the same in each
(one YAML anchor). A required option has no default (a default would satisfy `required`); ansible-core never uses
the spec's own `default:` (it documents), so where the spec keeps one it must equal the file's."""
import functools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jinja2
import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from jinja2 import nodes
from test_support.paths import REPO, load_file

gen = load_file("gen_role_docs", REPO / "scripts" / "gen-role-docs.py")
ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())

# What Ansible itself gives a task (magic variables, connection variables ansible_*, Jinja globals).
ANSIBLE = {"inventory_hostname", "inventory_hostname_short", "inventory_dir", "inventory_file", "groups", "group_names",
           "hostvars", "omit", "playbook_dir", "role_path", "role_name", "play_hosts", "item", "lookup", "query", "q",
           "now", "dict", "range", "lipsum", "undef", "true", "false", "none", "True", "False", "None"}
# Jinja expressions that YAML holds without braces
CONDITIONALS = {"when", "changed_when", "failed_when", "until", "that"}


def _spec_entries(role_dir):
    doc = yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text()) or {}
    return dict((e, (spec or {}).get("options") or {}) for e, spec in (doc.get("argument_specs") or {}).items())


def _defaults(role_dir):
    path = role_dir / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) if path.is_file() else None) or {}


def _same(a, b):
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # true is not 1, "5" is not 5


def default_problems(role_dir):
    """What keeps the role's defaults/main.yml from being exactly the options of its meta/argument_specs.yml."""
    name, problems = role_dir.name, []
    entries = _spec_entries(role_dir)
    if "main" not in entries:
        problems.append("roles/%s: meta/argument_specs.yml has no entry point main" % name)
    options = {}
    for entry, found in entries.items():
        for option, spec in found.items():
            if option in options and options[option][1] != spec:
                problems.append("roles/%s: option %s is declared differently in entry points %s and %s of "
                                "meta/argument_specs.yml; declare it once (a YAML anchor) and alias it"
                                % (name, option, options[option][0], entry))
            options.setdefault(option, (entry, spec))
    defaults = _defaults(role_dir)
    for option, (entry, spec) in options.items():
        if option.startswith("__"):
            problems.append("roles/%s: option %s (entry point %s) is private; private variables live in vars/ "
                            "and are not options" % (name, option, entry))
        if spec.get("required"):
            if option in defaults:
                problems.append("roles/%s: required option %s has a default in defaults/main.yml, which makes "
                                "`required` pass without it; remove one of the two" % (name, option))
            continue
        if option not in defaults:
            problems.append("roles/%s: option %s (entry point %s of meta/argument_specs.yml) has no default in "
                            "defaults/main.yml; add it there (null for none)" % (name, option, entry))
        elif "default" in spec and not _same(spec["default"], defaults[option]):
            problems.append("roles/%s: option %s has default %r in meta/argument_specs.yml but %r in "
                            "defaults/main.yml; make them equal (or drop the spec's)"
                            % (name, option, spec["default"], defaults[option]))
    for key in defaults:
        if key not in options:
            problems.append("roles/%s: defaults/main.yml sets %s, which no entry point of meta/argument_specs.yml "
                            "declares; declare it there, or make it private (vars/main.yml, __%s_*)"
                            % (name, key, name))
    found = yaml.safe_load((role_dir / "vars" / "main.yml").read_text()) if (role_dir / "vars" / "main.yml").is_file() \
        else None
    for key in found or {}:
        if not key.startswith("__%s_" % name):
            problems.append("roles/%s: vars/main.yml sets %s; vars/ holds the private __%s_* variables, an input is "
                            "an option (meta/argument_specs.yml and defaults/main.yml)" % (name, key, name))
    return problems


def validation_problems(role_dir):
    """The defaults against their own spec, with the validator the role's start runs (validate_argument_spec)."""
    problems = []
    defaults = _defaults(role_dir)
    for entry, found in _spec_entries(role_dir).items():
        mine = dict((k, v) for k, v in defaults.items() if k in found)
        optional = dict((k, dict(spec, required=False)) for k, spec in found.items())  # the caller gives those
        result = ArgumentSpecValidator(optional).validate(mine, validate_role_argument_spec=True)
        problems += ["roles/%s (entry point %s): %s" % (role_dir.name, entry, m) for m in result.error_messages]
    return problems


@pytest.mark.parametrize("role", ROLES)
def test_defaults_are_the_options_of_the_argument_specs(role):
    assert default_problems(REPO / "roles" / role) == []
    assert validation_problems(REPO / "roles" / role) == []


def _role(tmp_path, spec, defaults=None, name="demo"):
    role_dir = tmp_path / name
    (role_dir / "meta").mkdir(parents=True)
    (role_dir / "tasks").mkdir()
    (role_dir / "meta" / "argument_specs.yml").write_text(yaml.safe_dump({"argument_specs": spec}))
    if defaults is not None:
        (role_dir / "defaults").mkdir()
        (role_dir / "defaults" / "main.yml").write_text(defaults)
    return role_dir


def test_a_difference_is_named_by_role_and_key(tmp_path):
    spec = {"main": {"options": {
        "demo_a": {"type": "int", "default": 5},
        "demo_b": {"type": "str"},
        "demo_c": {"type": "dict", "required": True},
        "demo_d": {"type": "bool", "default": True}}},
        "other": {"options": {"demo_a": {"type": "str", "default": 5}, "demo_e": {"type": "bool"}}}}
    problems = default_problems(_role(tmp_path, spec, "demo_a: '5'\ndemo_c: {}\ndemo_d: 1\ndemo_x: 1\n"))
    assert problems == [
        "roles/demo: option demo_a is declared differently in entry points main and other of "
        "meta/argument_specs.yml; declare it once (a YAML anchor) and alias it",
        "roles/demo: option demo_a has default 5 in meta/argument_specs.yml but '5' in defaults/main.yml; make them "
        "equal (or drop the spec's)",
        "roles/demo: option demo_b (entry point main of meta/argument_specs.yml) has no default in defaults/main.yml; "
        "add it there (null for none)",
        "roles/demo: required option demo_c has a default in defaults/main.yml, which makes `required` pass without "
        "it; remove one of the two",
        "roles/demo: option demo_d has default True in meta/argument_specs.yml but 1 in defaults/main.yml; make them "
        "equal (or drop the spec's)",
        "roles/demo: option demo_e (entry point other of meta/argument_specs.yml) has no default in "
        "defaults/main.yml; add it there (null for none)",
        "roles/demo: defaults/main.yml sets demo_x, which no entry point of meta/argument_specs.yml declares; declare "
        "it there, or make it private (vars/main.yml, __demo_*)"]
    # a role without options needs no defaults; a private variable is not an option, a public one not in vars/
    assert default_problems(_role(tmp_path, {"main": {"options": {}}}, name="bare")) == []
    role_dir = _role(tmp_path, {"main": {"options": {"__demo_p": {"type": "str", "default": ""}}}}, "__demo_p: ''\n",
                     name="priv")
    (role_dir / "vars").mkdir()
    (role_dir / "vars" / "main.yml").write_text("__priv_ok: 1\npriv_input: 2\n")
    assert default_problems(role_dir) == [
        "roles/priv: option __demo_p (entry point main) is private; private variables live in vars/ and are not "
        "options",
        "roles/priv: vars/main.yml sets priv_input; vars/ holds the private __priv_* variables, an input is an option "
        "(meta/argument_specs.yml and defaults/main.yml)"]


def test_a_default_the_spec_refuses_is_named(tmp_path):
    spec = {"main": {"options": {"demo_engines": {"type": "str", "choices": ["all", "changing"]},
                                 "demo_poll": {"type": "int"}}}}
    problems = validation_problems(_role(tmp_path, spec, "demo_engines: some\ndemo_poll: often\n"))
    assert len(problems) == 2, problems
    assert "roles/demo (entry point main): value of demo_engines must be one of: all, changing, got: some" in problems
    assert [p for p in problems if "demo_poll" in p and "to int" in p], problems


# --- every variable read is declared ---------------------------------------------------------------------------------

def _strings(doc, key=None):
    """(the key it sits under, string) of every string of a parsed YAML document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _strings(v, k)
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v, key)
    elif isinstance(doc, str):
        yield key, doc


def _names(text, key):
    """The variables a template (or a conditional) reads, less those it binds itself ({% for %}, {% set %})."""
    if key in CONDITIONALS and "{{" not in text and "{%" not in text:
        text = "{{ %s }}" % text
    if "{{" not in text and "{%" not in text:
        return set()
    ast = jinja2.Environment().parse(text)
    bound = {n.name for n in ast.find_all(nodes.Name) if n.ctx in ("store", "param")}
    return {n.name for n in ast.find_all(nodes.Name) if n.ctx == "load"} - bound


def _tasks(doc):
    """Every task of a parsed playbook or tasks file (plays' tasks, blocks, rescue, always)."""
    for item in doc if isinstance(doc, list) else []:
        if not isinstance(item, dict):
            continue
        yield item
        for section in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from _tasks(item.get(section))


@functools.cache
def _module_facts():
    """The facts the collection's modules set (ansible_facts of their RETURN documentation)."""
    facts = set()
    for path in sorted((REPO / "plugins" / "modules").glob("*.py")):
        found = re.search(r'^RETURN = r?"""(.*?)"""', path.read_text(), re.S | re.M)
        doc = yaml.safe_load(found.group(1)) if found else None
        facts |= set(((doc or {}).get("ansible_facts") or {}).get("contains") or {})
    return facts


def _read_and_set(files):
    """({variable: [files that read it]}, {variables the files set: set_fact, register, add_host, loop_var})."""
    return _read_and_set_once(tuple(files))


@functools.cache
def _read_and_set_once(files):
    read, own = {}, set()
    for path in files:
        doc = yaml.safe_load(path.read_text())
        for key, text in _strings(doc):
            for name in _names(text, key):
                read.setdefault(name, []).append(str(path.relative_to(REPO)))
        for task in _tasks(doc):
            for action in ("ansible.builtin.set_fact", "set_fact"):
                own |= set(task.get(action) or {}) - {"cacheable"}
            for action in ("ansible.builtin.add_host", "add_host"):
                own |= set(task.get(action) or {}) - {"name", "hostname", "host", "groups", "group", "groupname"}
            if task.get("register"):
                own.add(task["register"])
            if (task.get("loop_control") or {}).get("loop_var"):
                own.add(task["loop_control"]["loop_var"])
    return read, own


def undeclared(files, declared):
    """'<variable> (<files>)' for each variable the files read that neither Ansible, the collection (a fact it
    sets, a private __* variable) nor a role's meta/argument_specs.yml (declared) gives."""
    everything = sorted(REPO.glob("playbooks/*.yml")) + sorted(REPO.glob("roles/*/tasks/*.yml"))
    own = _read_and_set(everything)[1] | _module_facts()
    read, _own = _read_and_set(files)
    return ["%s (%s)" % (name, ", ".join(sorted(set(where)))) for name, where in sorted(read.items())
            if not name.startswith(("__", "ansible_")) and name not in ANSIBLE | own | declared]


def _declared():
    return {o for role in ROLES for found in _spec_entries(REPO / "roles" / role).values() for o in found}


def test_every_narwhal_variable_of_the_playbooks_is_declared_in_a_spec():
    """narwhal_launch_serial and every other narwhal_* input a playbook reads (-e, inventory) is an option of a
    role's meta/argument_specs.yml; the narwhal_* facts the collection sets (narwhal_site, narwhal_engine, ...) are
    not inputs."""
    books = sorted(REPO.glob("playbooks/*.yml"))
    read, _own = _read_and_set(books)
    assert {"narwhal_launch_serial", "narwhal_stage_summary", "narwhal_run_id"} <= set(read)  # the test sees them
    assert [u for u in undeclared(books, _declared()) if u.startswith("narwhal_")] == []
    assert undeclared(books, _declared()) == []


def test_every_variable_the_roles_read_is_declared_in_a_spec():
    files = sorted(REPO.glob("roles/*/tasks/*.yml")) + sorted(REPO.glob("roles/*/vars/*.yml")) \
        + sorted(REPO.glob("roles/*/defaults/*.yml"))
    assert undeclared(files, _declared()) == []


def test_an_undeclared_input_is_named_with_its_file():
    book = REPO / "playbooks" / "launch.yml"
    assert undeclared([book], _declared() - {"narwhal_launch_serial"}) == [
        "narwhal_launch_serial (playbooks/launch.yml)"]
    # a fact the collection sets (set_fact, add_host, a module's ansible_facts) is not an input
    assert {"narwhal_engines", "narwhal_engine", "narwhal_site", "launch_peers"} <= _read_and_set(
        sorted(REPO.glob("roles/*/tasks/*.yml")))[1] | _module_facts()
    assert _names("narwhal_x | default(y) and __z", "when") == {"narwhal_x", "y", "__z"}
    assert _names("{% for e in narwhal_list %}{{ e }}{% endfor %}", "msg") == {"narwhal_list"}


# --- the README tables ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
def test_the_readme_option_table_is_generated_from_the_spec_and_the_defaults(role):
    role_dir = REPO / "roles" / role
    assert (role_dir / "README.md").read_text() == gen.readme(role_dir), (
        "roles/%s/README.md: the option table is stale; run make docs (scripts/gen-role-docs.py)" % role)


def test_a_stale_readme_table_is_found(tmp_path):
    role_dir = tmp_path / "launch"
    shutil.copytree(REPO / "roles" / "launch", role_dir, ignore=shutil.ignore_patterns("files", "tasks"))
    (role_dir / "tasks").mkdir()
    readme = (role_dir / "README.md").read_text()
    assert gen.readme(role_dir) == readme
    (role_dir / "defaults" / "main.yml").write_text(
        (role_dir / "defaults" / "main.yml").read_text().replace("narwhal_launch_poll: 5", "narwhal_launch_poll: 7"))
    assert gen.readme(role_dir) != readme
    assert "| `narwhal_launch_poll` | `main`, `restart` | int | `7` |" in gen.readme(role_dir)
    (role_dir / "defaults" / "main.yml").write_text("---\n")
    with pytest.raises(gen.DocsError, match="launch: option narwhal_launch_restart has no default in defaults/main"):
        gen.readme(role_dir)
    (role_dir / "README.md").write_text(readme.replace(gen.END, ""))
    with pytest.raises(gen.DocsError, match="README.md: needs the marker lines"):
        gen.readme(role_dir)


def test_make_docs_finds_no_stale_table():
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "gen-role-docs.py"), "--check"], capture_output=True,
                         text=True, check=False)
    assert (out.returncode, out.stdout) == (0, "")


# --- the defaults reach the playbooks' play keywords -----------------------------------------------------------------

def test_role_defaults_reach_the_plays_hosts_and_serial(tmp_path):
    """playbooks/launch.yml's serial plays read narwhal_launch_serial and the Summary plays of prepare.yml and
    launch.yml narwhal_stage_summary without a default() of their own: a play's keywords are templated with the
    defaults of the roles it runs (ansible-core's VariableManager.get_vars(play=...)). --list-hosts templates every
    play's hosts and serial and fails on an undefined variable."""
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"engines": {"hosts": {"engine-1": {}, "engine-2": {}}}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NARWHAL_", "ANSIBLE_"))}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_NOCOLOR="1")
    books = [str(p) for p in sorted(REPO.glob("playbooks/*.yml")) if p.name != "boilerplate.yml"]
    out = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i",
                          str(tmp_path / "hosts.yml"), "--list-hosts"] + books, capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    plays = re.findall(r"play #\d+ \(([^)]*)\): (.+?)\t", out.stdout)
    summaries = [hosts for hosts, name in plays if name == "Summary"]
    # launch.yml, probe.yml, prepare.yml, stop.yml on their own; site.yml leaves out prepare's and launch's
    assert summaries.count("engines") == 4 + 1 and summaries.count("engines:!engines") == 2, plays
