# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The role environment: the one file per engine that install writes and the launcher reads (its keys,
format and parser), the install paths it names (the record, the launcher, the API key file, the key guard and the
engine's TLS files), and what install writes there.
"""

from __future__ import annotations

import hashlib
import json
import posixpath

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENV_NAME
from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import control_character

__metaclass__ = type

ROLE_ENV_KEYS = ("NARWHAL_ENGINE", "NARWHAL_RECORD", "NARWHAL_MODEL_MOUNT", "NARWHAL_SERVED_MODEL_NAME",
                 "NARWHAL_BIND_FAMILY", "NARWHAL_HTTP_PORT", "NARWHAL_ADVERTISED_ADDRESS", "NARWHAL_SIDE_CHANNEL_PORT",
                 "NARWHAL_FABRIC_INTERFACE", "NARWHAL_API_KEY_FILE", "NARWHAL_RUN_ID", "NARWHAL_RUN_DIR",
                 "NARWHAL_APP_REVISION", "NARWHAL_COLLECTION", "NARWHAL_ENGINE_MEMBER", "NARWHAL_BIND_ADDRESS",
                 "NARWHAL_TLS_DIR", "NARWHAL_TLS_CERT_SHA256", "NARWHAL_GUARD_DIR", "NARWHAL_GUARD_SHA256")

# The engine's TLS files in its directory <checkout>/tls/<engine> (NARWHAL_TLS_DIR; one directory per engine: two
# engines on one host are two inventory hosts, each with its own certificate): the leaf certificate and key vLLM
# serves (--ssl-certfile, --ssl-keyfile) and the CA the launcher's probes verify against.
TLS_FILES = {"cert": "server.crt", "key": "server.key", "ca": "ca.crt"}
# The key guard (roles/install/files/guard/narwhal_guard.py) in <checkout>/guard (NARWHAL_GUARD_DIR)
GUARD_FILE = "narwhal_guard.py"
# The engines' API key file in <checkout>/secrets (NARWHAL_API_KEY_FILE), a directory of its own (0700) that the engine
# mounts read-only for its key guard (_plan/container.py key_file_mount); before issue 36 the key was
# <checkout>/config/engine-api.key (install_paths "former_api_key": install removes it)
SECRETS_DIR = "secrets"


# ----------------------------------------------------------------------------------------- role environment

def install_paths(checkout, engine, run_id):
    """Where install puts an engine's files in the engine checkout, and the launcher's run directory."""
    tls_dir = "%s/tls/%s" % (checkout, engine)
    return {
        "record": "%s/config/engine-launch.%s.json" % (checkout, engine),
        "role_env": "%s/config/%s.env" % (checkout, engine),
        "launcher": "%s/bin/launch_engine.pyz" % checkout,
        "secrets_dir": "%s/%s" % (checkout, SECRETS_DIR),
        "api_key": "%s/%s/engine-api.key" % (checkout, SECRETS_DIR),
        "former_api_key": "%s/config/engine-api.key" % checkout,
        "run_dir": "%s/runs/%s" % (checkout, run_id),
        "guard_dir": "%s/guard" % checkout,
        "guard": "%s/guard/%s" % (checkout, GUARD_FILE),
        "tls_dir": tls_dir,
        "tls_cert": "%s/%s" % (tls_dir, TLS_FILES["cert"]),
        "tls_key": "%s/%s" % (tls_dir, TLS_FILES["key"]),
        "tls_ca": "%s/%s" % (tls_dir, TLS_FILES["ca"]),
    }


def install_plan(paths, record, role_env_text, launcher_sha256, api_key_file, owner="root", sources=None):
    """What install writes on an engine host and what the host should then hold (roles/install; roles/prepare reads
    the same list with its host checks): `record_text` (the launch record as ansible's to_nice_json(indent=2) writes
    it, and a newline) and `wanted`, held_files' list - the checkout's directories, then the record, role environment,
    launcher (its prepared sha256), the key's directory and the API key (`src`, the controller file, digested by the
    action plugin; a new key is a new file there, which the engines' guard reads: no restart), then what
    `sources` (prepare_run's install_sources of this host: {guard_sha256, tls: {cert, key, ca} or None}) names: the
    key guard (its sha256: install copies the install role's own file) and, with TLS, the engine's TLS directory and
    its certificate, key (0600) and CA (`src`: the controller files of the tls_material step)."""
    record_text = json.dumps(record, indent=2, sort_keys=True, separators=(",", ": ")) + "\n"
    parent = dict((key, posixpath.dirname(paths[key])) for key in ("record", "launcher", "run_dir"))
    wanted = [
        {"path": parent["record"], "state": "directory", "mode": "0700", "owner": owner},
        {"path": parent["launcher"], "state": "directory", "mode": "0755", "owner": owner},
        {"path": parent["run_dir"], "state": "directory", "mode": "0700", "owner": owner},
        {"path": paths["record"], "sha256": hashlib.sha256(record_text.encode("utf-8")).hexdigest(), "mode": "0600",
         "owner": owner},
        {"path": paths["role_env"], "sha256": hashlib.sha256(role_env_text.encode("utf-8")).hexdigest(),
         "mode": "0600", "owner": owner},
        {"path": paths["launcher"], "sha256": launcher_sha256, "mode": "0755", "owner": owner},
        {"path": paths["secrets_dir"], "state": "directory", "mode": "0700", "owner": owner},
        {"path": paths["api_key"], "src": api_key_file, "mode": "0600", "owner": owner},
    ]
    return {"record_text": record_text, "wanted": wanted + _engine_files(paths, sources or {}, owner)}


def _engine_files(paths, sources, owner):
    """The key guard's and the TLS files' entries of install's wanted list (install_plan)."""
    wanted = []
    if sources.get("guard_sha256"):
        wanted += [{"path": paths["guard_dir"], "state": "directory", "mode": "0755", "owner": owner},
                   {"path": paths["guard"], "sha256": sources["guard_sha256"], "mode": "0644", "owner": owner}]
    tls = sources.get("tls") or {}
    if tls:
        wanted += [{"path": posixpath.dirname(paths["tls_dir"]), "state": "directory", "mode": "0700", "owner": owner},
                   {"path": paths["tls_dir"], "state": "directory", "mode": "0700", "owner": owner},
                   {"path": paths["tls_cert"], "src": tls["cert"], "mode": "0644", "owner": owner},
                   {"path": paths["tls_key"], "src": tls["key"], "mode": "0600", "owner": owner},
                   {"path": paths["tls_ca"], "src": tls["ca"], "mode": "0644", "owner": owner}]
    return wanted


def model_mount(record):
    """The container path of the checkpoint: /models/<served model name, / as _>."""
    served = record["runtime"]["served_model_name"]
    return "/models/%s" % served.replace("/", "_")


def role_environment(record, checkout, run_id, revision=None, member=0, bind="", tls=None, guard_sha256=""):
    """The role environment prepare writes and the launcher reads (-> {key: value}). `member`: which host of an
    engine across hosts it is for (0 the head; k > 0 the k-th host after it, NARWHAL_ENGINE_MEMBER=k, whose own
    address and interface it carries: members[k-1].node). `bind`: NARWHAL_ENGINE_BIND ("": the host's advertised
    address). `tls`: the engine's entry of the tls_material step's `hosts` ({cert, key, sha256, ...}; None: TLS off),
    for the head only (a host after the head serves no HTTP: vllm serve --headless). `guard_sha256`: the key guard's
    sha256 (prepare reads it; in the plan, so that a new guard replaces the engine)."""
    node = dict(record["node"])
    if member:
        entry = next(m for m in record.get("members") or [] if m.get("member") == member)
        node.update((k, entry["node"][k]) for k in ("address", "fabric_interface"))
    paths = install_paths(checkout, record["engine"], run_id)
    env = {
        "NARWHAL_ENGINE": record["engine"],
        "NARWHAL_RECORD": paths["record"],
        "NARWHAL_MODEL_MOUNT": model_mount(record),
        "NARWHAL_SERVED_MODEL_NAME": record["runtime"]["served_model_name"],
        "NARWHAL_BIND_FAMILY": node["bind_family"],
        "NARWHAL_HTTP_PORT": str(node["engine_port"]),
        "NARWHAL_ADVERTISED_ADDRESS": node["address"],
        "NARWHAL_SIDE_CHANNEL_PORT": str(node["side_channel_port"]),
        "NARWHAL_FABRIC_INTERFACE": node["fabric_interface"],
        "NARWHAL_API_KEY_FILE": paths["api_key"],
        "NARWHAL_RUN_ID": run_id,
        "NARWHAL_RUN_DIR": paths["run_dir"],
        "NARWHAL_BIND_ADDRESS": bind or node["address"],
        "NARWHAL_TLS_DIR": paths["tls_dir"] if tls and not member else "",
        "NARWHAL_TLS_CERT_SHA256": tls["sha256"] if tls and not member else "",
        "NARWHAL_GUARD_DIR": paths["guard_dir"],
        "NARWHAL_GUARD_SHA256": guard_sha256,
    }
    if revision is not None:
        env["NARWHAL_APP_REVISION"] = revision
    if member:
        env["NARWHAL_ENGINE_MEMBER"] = str(member)
    return env


def render_role_env(role_env):
    """KEY=VALUE lines; a value that could add a line or is not text is refused (no injection)."""
    lines = ["# Role environment of %s, written by narwhal.deploy prepare/install. Do not edit: prepare a new run."
             % role_env.get("NARWHAL_ENGINE", "?")]
    for key in sorted(role_env):
        value = role_env[key]
        if key not in ROLE_ENV_KEYS:
            raise PlanError("role env key %s is not one the launcher reads" % key, key)
        if not isinstance(value, str) or control_character(value) is not None:
            raise PlanError("role env %s=%r must be one line of text without control characters; correct the input "
                            "it comes from" % (key, value), key)
        lines.append("%s=%s" % (key, value))
    return "\n".join(lines) + "\n"


def parse_role_env(text, where):
    """The inverse of render_role_env: `#` comments and blank lines ignored, no expansion, no quote removal;
    unknown keys and repeated keys are refused."""
    result = {}
    # lines end at \n only (what render_role_env writes): str.splitlines() would also split at \r, \v, \f,
    # \x1c-\x1e, \x85, U+2028 and U+2029, so a value carrying one of them could smuggle in another key
    for number, line in enumerate(text.split("\n"), 1):
        bad = control_character(line)
        if bad is not None:
            raise PlanError("role environment %s line %d contains the control character %r; a role environment is "
                            "one KEY=VALUE per line of printable text: prepare a new run" % (where, number, bad))
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, sep, value = stripped.partition("=")
        key = key.strip()
        if not sep or not ENV_NAME.match(key):
            raise PlanError("role environment %s line %d: %r is not KEY=VALUE; fix the line"
                            % (where, number, stripped))
        if key not in ROLE_ENV_KEYS:
            known = ", ".join(ROLE_ENV_KEYS)
            raise PlanError("role environment %s line %d: %s is not a key the launcher reads (%s); the role "
                            "environment is written by prepare: prepare a new run" % (where, number, key, known), key)
        if key in result:
            raise PlanError("role environment %s line %d: %s is set twice; prepare a new run" % (where, number, key),
                            key)
        result[key] = value
    return result


# ---------------------------------------------------------------------------------------------- checks
