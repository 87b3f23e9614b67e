# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launcher artefact: one zipapp (launch_engine.pyz) built from the launcher's parts
(roles/install/files/launcher: cli, common, start, stop, status, preview, image check, health wait, the in-image
observer), the collection's pure planner (plugins/module_utils/_plan/ and the _common/ files it imports), the NIXL
metrics parser (_common/nixl_metrics.py, for status) and the Docker Engine API client (_docker/engine_api.py,
standard library only), laid out under ansible_collections/... so the planner's own import lines work inside it.
The build is deterministic (sorted members, fixed timestamps and modes, no compression): the same sources give
the same bytes, so its sha256 is the launcher digest that runs, manifests and deployment records name.
"""

from __future__ import annotations

import io
import os
import zipfile

__metaclass__ = type

LAUNCHER_DIR = os.path.join("roles", "install", "files", "launcher")

# The engines' key guard (_plan/container.py runs it with vllm serve --middleware): install copies it from the install
# role's files, prepare puts its sha256 in every plan.
GUARD_SOURCE = os.path.join("roles", "install", "files", "guard", "narwhal_guard.py")

PLANNER_PACKAGE = "ansible_collections/narwhal/deploy/plugins/module_utils"


# Paths below plugins/module_utils: the planner and what it imports (a unit test checks that the launcher's import
# closure is exactly this), the record check (_outputs/schemas.py::check_record, the validator discovery and prepare
# use), the NIXL metrics parser (status), the probes' URLs (_common/endpoints.py, health.py) and the stdlib Docker
# Engine API client (no Docker SDK).
PLANNER_FILES = (
    "_common/api_key.py", "_common/endpoints.py", "_common/errors.py", "_common/kv_events.py", "_common/names.py",
    "_common/nixl_metrics.py", "_common/secrets.py", "_common/versions.py", "_common/words.py", "_docker/engine_api.py",
    "_outputs/schemas.py", "_plan/args.py", "_plan/container.py", "_plan/fields.py", "_plan/labels.py",
    "_plan/lifecycle.py", "_plan/parallel.py", "_plan/role_env.py", "_plan/subst.py", "_plan/transfer.py",
)

SHEBANG = b"#!/usr/bin/env python3\n"

EPOCH = (1980, 1, 1, 0, 0, 0)


def launcher_sources(collection_root):
    """{archive name: bytes} of every file the launcher needs, read from the collection."""
    members = {}
    base = os.path.join(collection_root, LAUNCHER_DIR)
    for folder, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                with open(path, "rb") as fh:
                    members[os.path.relpath(path, base).replace(os.sep, "/")] = fh.read()
    for name in PLANNER_FILES:
        with open(os.path.join(collection_root, "plugins", "module_utils", *name.split("/")), "rb") as fh:
            members["%s/%s" % (PLANNER_PACKAGE, name)] = fh.read()
    return members


def build_zipapp(members):
    """The zipapp's bytes for {archive name: bytes} (pure and deterministic)."""
    if "__main__.py" not in members:
        raise ValueError("the launcher sources have no __main__.py")
    members = dict(members)
    for name in list(members):
        parts = name.split("/")[:-1]
        if name.startswith(PLANNER_PACKAGE + "/"):
            for depth in range(1, len(parts) + 1):
                members.setdefault("/".join(parts[:depth]) + "/__init__.py", b"")
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, date_time=EPOCH)
            info.external_attr = 0o644 << 16
            info.create_system = 3
            archive.writestr(info, members[name])
    return buffer.getvalue()
