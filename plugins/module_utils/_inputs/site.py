# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The site_inputs step: read and validate the site .env (see plugins/modules/site_inputs.py for its contract).

site_inputs(task) reads a StepRun (_common/step.py) and returns the task's result; a refusal raises StepError. Its
action plugin (plugins/action/site_inputs.py) runs it in the controller's process.
"""

from __future__ import annotations

import hashlib
import io
import os
import re

from ansible.module_utils.basic import missing_required_lib

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text, secret_values
from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import (
    DOTENV_IMPORT_ERROR,
    DotenvError,
    decode_dotenv,
    literal_expansions,
    parse_dotenv,
    read_dotenv,
    read_dotenv_bytes,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.nodes import resolve_engines
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.paths import (
    DEPLOYMENT_ENV,
    check_paths,
    git_ignore_checker,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import (
    check_env_file,
    is_input_name,
    load_inputs,
    unknown_name_warning,
)

__metaclass__ = type

try:
    from dotenv.parser import parse_stream
except ImportError:
    parse_stream = None


def module_spec():
    """The argument spec of site_inputs (its action plugin validates with it; the module documents it)."""
    return dict(
        argument_spec=dict(
            env_file=dict(type="path", required=True),
            use_process_env=dict(type="bool", default=True),
            root=dict(type="path"),
        ),
        supports_check_mode=True,
    )


def generated_echoes(process, dotenv, generated, generated_path):
    """Values of the controller's environment that discovery itself generated (docs/inputs.md, "Overrides from
    the shell"). A shell that sourced config/deployment.env holds every NARWHAL_NODE_<n>_IP/_URL/_ENGINE_PORT/...
    that file holds for a node; read as overrides, they would pin those nodes to the last discovery's values.
    A node counts as sourced when the environment holds every name deployment.env generates for it: then a value
    equal to deployment.env's is generated (dropped: .env's own value, if any, applies), and one that differs
    from it and from .env is refused, naming where it came from. A node the environment names only in part is
    overridden on purpose (the seed's "Set NARWHAL_NODE_<n>_IP explicitly ..."): its values stay overrides, as
    before. -> names to drop (pure)."""
    by_node = {}
    for key in generated:
        match = re.match(r"^NARWHAL_NODE_(\d+)_", key)
        if match:
            by_node.setdefault(match.group(1), set()).add(key)
    sourced = set()
    for keys in by_node.values():
        if all(process.get(key, "").strip() for key in keys):
            sourced |= keys
    echoes = []
    for key in sorted(sourced):
        value = process[key]
        if value == generated[key]:
            echoes.append(key)
            continue
        if value == dotenv.get(key):
            continue  # the shell repeats .env: nothing comes from the shell
        raise InputError(key, "%s=%s comes from the controller's environment (exported, or a sourced file), not from "
                              ".env, and %s, which the last discovery generated, holds %s=%s: a sourced deployment.env "
                              "feeds old generated values back as overrides, which would pin this node. Unset it "
                              "(unset %s, or open a new shell) and rerun; to override it on purpose, set it in .env"
                         % (key, value, generated_path, key, generated[key], key))
    return echoes


def site_inputs(task):
    if DOTENV_IMPORT_ERROR:
        raise StepError(missing_required_lib("python-dotenv"), exception=DOTENV_IMPORT_ERROR)
    path = task.params["env_file"]
    try:
        raw = read_dotenv_bytes(path)
    except DotenvError as exc:
        raise StepError("site inputs: %s; copy .env.example to .env and fill it in, or point "
                        "NARWHAL_ENV_FILE at the site's file" % exc)
    try:
        text = decode_dotenv(path, raw)
        parsed = parse_dotenv(text)
    except DotenvError as exc:
        raise StepError("site inputs: %s; save it as UTF-8" % exc, input="NARWHAL_ENV_FILE")
    # values of secret-looking names of .env and of the controller's environment: hidden wherever they are pasted
    secrets = secret_values(parsed, os.environ if task.params["use_process_env"] else {})
    values = {k: v for k, v in parsed.items() if k.startswith("NARWHAL_")}
    process = {}
    if task.params["use_process_env"]:
        for key, value in os.environ.items():
            if not key.startswith("NARWHAL_"):
                continue
            if is_input_name(key):
                values[key] = process[key] = value
            else:  # the project's tool variables and others: not inputs (a near miss of an input is warned about)
                warning = unknown_name_warning(key)
                if warning:
                    task.warnings.append(warning)
    for key in literal_expansions(values):
        task.warnings.append("%s holds '${...}', which stays literal: .env values are not expanded from the "
                             "environment; write the value itself" % key)
    try:
        # what python-dotenv passes silently: unparseable lines, repeated keys (the last wins)
        check_env_file([(b.key, b.value, b.original.line, b.error) for b in parse_stream(io.StringIO(text))], path)
        inputs = load_inputs(values)
        root = task.params["root"]
        if root:
            paths = check_paths(root, inputs["site"], env_file=path,
                                ignored=git_ignore_checker(root), resolve=os.path.realpath)
            generated_path = os.path.join(paths["config_dir"], DEPLOYMENT_ENV)
            try:
                generated = read_dotenv(generated_path) if process and os.path.isfile(generated_path) else {}
            except DotenvError:
                generated = {}  # discovery rewrites it; nothing generated to recognise
            echoes = generated_echoes(process, parsed, generated, generated_path)
            if echoes:
                task.warnings.append("%s in the controller's environment equal%s what the last discovery generated "
                                     "in %s (a sourced deployment.env): read as generated values, not as overrides, "
                                     "so they follow .env (unset them to silence this)"
                                     % (", ".join(echoes), "s" if len(echoes) == 1 else "", generated_path))
                for key in echoes:
                    if parsed.get(key) is None:
                        values.pop(key)
                    else:
                        values[key] = parsed[key]
                inputs = load_inputs(values)
    except InputError as exc:
        raise StepError(redact_text("invalid site input in %s: %s" % (path, exc), secrets), input=exc.key)
    # every engine's per-node overrides applied once (the roles read them with the filter node_settings)
    inputs["engines"] = resolve_engines(inputs)
    inputs["nodes"] = {str(n): v for n, v in inputs["nodes"].items()}
    inputs["env_file"] = path
    inputs["env_sha256"] = hashlib.sha256(raw).hexdigest()
    if root:
        paths["deployment_env"] = os.path.join(paths["config_dir"], DEPLOYMENT_ENV)
        inputs["paths"] = paths
        inputs["project_dir"] = os.path.normpath(root)
    return dict(changed=False, ansible_facts={"narwhal_site": inputs})
