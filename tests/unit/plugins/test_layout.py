"""The layout's rules (docs/architecture.md): pure planning folders do no I/O, each host module ships only the
module_utils it imports, and the launcher zipapp carries exactly the planner files its parts import."""
import ast

import pytest
from test_support.paths import REPO

from ansible_collections.narwhal.deploy.plugins.module_utils._prepare.launcher import LAUNCHER_DIR, PLANNER_FILES

MU = REPO / "plugins" / "module_utils"
PREFIX = "ansible_collections.narwhal.deploy.plugins.module_utils."
# Discover's host readers: the tool runner, the sysfs reads and the readers of GPUs, RDMA and the fabric interface.
HOST_READERS = ("_facts/tool_runner.py", "_facts/sysfs.py", "_facts/gpu_reader.py", "_facts/rdma_reader.py",
                "_facts/interface_reader.py")
# The files that may read the disk, run tools or talk to a daemon: the edges. Everything else is pure.
EDGES = {"_common/tools.py", *HOST_READERS, "_facts/checkpoint.py", "_facts/daemon.py", "_docker/engine_api.py",
         "_inputs/dotenv.py", "_inputs/paths.py", "_outputs/writer.py", "_prepare/launcher.py",
         "_router/client.py", "_common/http.py",
         # the host modules' work (community.docker's _module_container): each its module's run_module
         "_facts/prereqs.py", "_router/proof.py", "_router/container.py", "_router/members.py", "_bench/serve.py",
         "_deliver/model_host.py", "_deliver/image_host.py",
         # the steps, each the work of one task (_common/step.py): they read and write what their stage names
         "_inputs/site.py", "_discover/outputs.py", "_prepare/run.py", "_probe/transfer.py", "_bench/results.py",
         "_outputs/private_file.py", "_tls/material.py", "_deliver/model_source.py", "_deliver/image_sources.py"}
# The container planner (what turns a record into a container), which a host module that only reads the role
# environment (_plan/role_env.py) does not ship.
CONTAINER_PLANNER = ("_plan/container.py", "_plan/fields.py", "_plan/labels.py", "_plan/lifecycle.py",
                     "_plan/parallel.py", "_plan/transfer.py")
IO_MODULES = {"subprocess", "socket", "glob", "shutil", "http", "urllib", "fcntl", "tempfile", "pathlib", "io"}


def _module_utils_files():
    return sorted(p.relative_to(MU).as_posix() for p in MU.glob("_*/*.py") if p.name != "__init__.py")


def _imports(path):
    """The module_utils files (relative paths) that a Python file imports by FQCN."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            parts = node.module[len(PREFIX):].split(".")
            if len(parts) == 2:
                found.add("%s/%s.py" % tuple(parts))
            else:  # from ...module_utils._pkg import module
                found.update("%s/%s.py" % (parts[0], alias.name) for alias in node.names)
    return found


def _closure(paths):
    seen, todo = set(), list(paths)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_imports(MU / name))
    return seen


def test_every_module_utils_file_sits_in_a_stage_folder():
    assert not list(MU.glob("_*.py")), "module_utils files outside a stage folder"
    for folder in MU.glob("_*"):
        assert (folder / "__init__.py").read_text() == "", "%s/__init__.py must stay empty (it ships)" % folder


@pytest.mark.parametrize("name", [f for f in _module_utils_files() if f not in EDGES])
def test_pure_files_do_no_io(name):
    tree = ast.parse((MU / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & IO_MODULES, (name, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.module.split(".")[0] not in IO_MODULES, (name, node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "open", (name, node.lineno)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
            assert node.attr == "path", "%s:%d uses os.%s" % (name, node.lineno, node.attr)
    for imported in _imports(MU / name):
        assert imported not in EDGES, "pure %s imports the I/O edge %s" % (name, imported)


@pytest.mark.parametrize("module, forbidden", [
    ("engine_prereqs", ("_discover/", "_inputs/", "_plan/", "_prepare/", "_outputs/")),
    ("held_files", ("_discover/", "_inputs/", "_plan/", "_prepare/", "_outputs/", "_facts/", "_docker/")),
    ("engine_host_facts", ("_discover/", "_inputs/", "_plan/", "_prepare/", "_outputs/")),
    ("gpu_facts", ("_discover/", "_inputs/", "_plan/", "_docker/", "_common/secrets.py")),
    ("image_facts", ("_discover/", "_inputs/", "_plan/", *HOST_READERS)),
    ("transfer_probe", ("_discover/", "_inputs/", *CONTAINER_PLANNER, "_facts/")),
    ("router_workers", ("_discover/", "_inputs/", *CONTAINER_PLANNER, "_facts/", "_prepare/", "_docker/")),
    ("router_traffic", ("_discover/", "_inputs/", *CONTAINER_PLANNER, "_facts/", "_prepare/", "_docker/")),
    ("router_container", ("_discover/", "_inputs/", "_plan/", "_facts/", "_prepare/", "_router/client.py",
                          "_router/traffic.py", "_outputs/")),
    ("model_delivery", ("_discover/", "_inputs/", "_plan/", "_prepare/", "_outputs/", "_facts/", "_docker/",
                        "_deliver/model_source.py")),
    ("image_delivery", ("_discover/", "_inputs/", "_plan/", "_facts/", "_prepare/", "_outputs/", "_router/",
                        "_deliver/image_sources.py", "_deliver/manifest.py")),
    ("router_members", ("_discover/", "_inputs/", "_plan/", "_facts/", "_prepare/", "_router/traffic.py",
                        "_router/proof.py", "_router/container.py", "_outputs/")),
])
def test_host_modules_ship_only_what_they_need(module, forbidden):
    shipped = _closure(_imports(REPO / "plugins" / "modules" / ("%s.py" % module)))
    assert shipped
    assert not [f for f in shipped if f.startswith(forbidden)], sorted(shipped)


@pytest.mark.parametrize("module", ["engine_host_facts", "model_facts", "engine_prereqs"])
def test_the_checkpoint_readers_ship_the_manifest_only_of_the_deliver_stage(module):
    """Discovery's and prepare's host readers read the STAMP the deliver stage writes (_facts/checkpoint.py): they
    ship _deliver/manifest.py (pure, standard library) for its shape and digest, and nothing else of _deliver/."""
    shipped = _closure(_imports(REPO / "plugins" / "modules" / ("%s.py" % module)))
    assert sorted(f for f in shipped if f.startswith("_deliver/")) == ["_deliver/manifest.py"]


def test_urls_are_opened_by_the_http_edges_only():
    """One HTTP client: _common/http.py (the JSON request, the attestation GET) and _router/client.py (streams and
    Prometheus text over its TLS context); no module and no other module_utils file opens a URL of its own."""
    files = list((REPO / "plugins" / "modules").glob("*.py")) + [MU / f for f in _module_utils_files()]
    openers = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.ImportFrom) and node.module == "ansible.module_utils.urls"
                    or isinstance(node, ast.Import) and "ansible.module_utils.urls" in [a.name for a in node.names]):
                openers.add(path.relative_to(REPO / "plugins").as_posix())
    assert openers == {"module_utils/_common/http.py", "module_utils/_router/client.py"}


def test_the_launcher_carries_exactly_the_planner_files_it_imports():
    parts = (REPO / LAUNCHER_DIR).rglob("*.py")
    needed = _closure(set().union(*(_imports(p) for p in parts)))
    assert needed == set(PLANNER_FILES)


def _folder_table():
    """The folders docs/architecture.md's folder table names (first column, a path in backticks ending in /)."""
    import re

    text = (REPO / "docs" / "architecture.md").read_text()
    return {m.group(1).rstrip("/") for m in re.finditer(r"^\| `([^`]+/)`", text, re.M)}


def test_the_architecture_pages_folder_table_is_the_tree():
    """Every folder of plugins/, every stage folder of plugins/module_utils/ and the launcher's parts are in the
    table, and every folder the table names exists (docs/architecture.md, "The folders")."""
    table = _folder_table()
    plugins = REPO / "plugins"
    tree = {p.relative_to(REPO).as_posix() for p in plugins.iterdir() if p.is_dir() and p.name != "__pycache__"}
    tree |= {p.relative_to(REPO).as_posix() for p in MU.glob("_*") if p.is_dir()}
    tree.add(LAUNCHER_DIR)
    assert sorted(tree - table) == [], "folders missing from docs/architecture.md's table"
    assert sorted(f for f in table if not (REPO / f).is_dir()) == [], "the table names folders that do not exist"


MAX_FUNCTION_LINES = 80  # issue 34, item 5: a longer function is split into named helpers, one job each


def _long_functions(paths, root=REPO, limit=MAX_FUNCTION_LINES):
    """path::name (lines) of each function or method in `paths` longer than `limit` lines, a function's lines counted
    from its def to its last line (ast's end_lineno - lineno + 1); paths relative to `root`."""
    found = []
    for path in sorted(paths):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append("%s::%s (%d)" % (path.relative_to(root).as_posix(), node.name, lines))
    return found


def test_no_function_is_longer_than_80_lines():
    """Every function and method of the collection's plugins and of the launcher fits in 80 lines."""
    paths = list((REPO / "plugins").rglob("*.py")) + list((REPO / LAUNCHER_DIR).rglob("*.py"))
    assert len(paths) > 50
    offenders = _long_functions(paths)
    assert offenders == [], "functions over %d lines (split them into named helpers): %s" % (
        MAX_FUNCTION_LINES, ", ".join(offenders))


def test_the_length_rule_counts_functions_and_methods(tmp_path):
    """The rule sees a function and a method just over the limit (decorators not counted), and passes 80 lines."""
    source = tmp_path / "pkg" / "long.py"
    source.parent.mkdir()
    source.write_text(
        "def fits():\n" + "    x = 1\n" * 79 + "\n\n"
        "@staticmethod\ndef over():\n" + "    x = 1\n" * 80 + "\n\n"
        "class C:\n    async def method(self):\n" + "        y = 2\n" * 81)
    assert _long_functions([source], root=tmp_path) == ["pkg/long.py::over (81)", "pkg/long.py::method (82)"]
