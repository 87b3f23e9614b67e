# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of record -> container (seed §15-16, ARCHITECTURE.md §7): pure, standard library only.

`container_spec(record, role_env)` turns a launch record and an engine's role environment into the complete
container the engine runs (image, entrypoint, command, environment, devices, device requests, groups,
capabilities, ulimits, mounts, labels, restart policy). Discovery calls it on every record it writes (so it
refuses at once what the launcher would refuse, in the launcher's words), prepare records its environment,
command and hash in the manifest, and the launcher snapshot (a zipapp that carries this file) starts exactly
that. The rules it applies have no other copy: the launcher-managed flags and variables, the UCX transport
table, the role environment's keys and format, the ${NAME} resolution of record values (via _subst).

Every refusal raises PlanError(message, key): `key` names the input or record field to correct.
"""

from __future__ import annotations

import copy
import hashlib
import ipaddress
import json
import re
import shlex

from ansible_collections.narwhal.deploy.plugins.module_utils._subst import SubstitutionError, resolve_values

__metaclass__ = type

PLAN_HASH_LABEL = "org.narwhal.plan-hash"
ENGINE_LABEL = "org.narwhal.engine"
# The run that created the container: set at create time next to the plan hash, never part of the plan (so the
# hash stays run-independent and an unchanged engine survives a new run); `status` reads it to say which run serves.
RUN_ID_LABEL = "org.narwhal.run-id"
REDACTED = "<redacted>"
API_KEY_ENV = "VLLM_API_KEY"
# Engines come back after a daemon restart or host reboot, not after a stop. The launch record carries no restart
# policy (no input sets it), so the plan's is this constant.
RESTART_POLICY = "unless-stopped"
RERUN = "rerun discovery"

# Flags whose value the launcher owns (normalised: `--x_y` -> `--x-y`). `--config` (a YAML file of arguments)
# could set any of them, `--uds` replaces the HTTP host/port, `--kv-events-config` binds its own endpoints.
MANAGED_LONG_FLAGS = (
    "--port", "--host", "--tensor-parallel-size", "--kv-transfer-config", "--api-key", "--served-model-name",
    "--model", "--dtype", "--kv-cache-dtype", "--block-size", "--data-parallel-size", "--pipeline-parallel-size",
    "--config", "--uds", "--kv-events-config", "--trust-remote-code",
)
MANAGED_SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size",
                       "-pp": "--pipeline-parallel-size"}
# Derived by discovery from the checkpoint (auto_map): in a record's runtime.extra_args only when
# runtime.trust_remote_code says so, never from an operator's extra arguments.
DERIVED_FLAGS = ("--trust-remote-code",)

VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
VISIBILITY_BY_VENDOR = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}
SSM_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"
MANAGED_ENV = VISIBILITY_ENV + (
    "UCX_NET_DEVICES", "UCX_TLS", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", API_KEY_ENV,
    SSM_LAYOUT_ENV, "VLLM_HOST_IP", "VLLM_PORT", "PATH",
)
DERIVED_ENV = (SSM_LAYOUT_ENV,)  # managed (no extra may set it) but carried in runtime.derived_environment
SECRETISH = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
SECRET_FLAGS = ("--api-key", "--hf-token")  # vLLM serve's flags that take a credential (see is_secret_flag)

# UCX transports (UCX_TLS) per (transfer.transport, runtime.platform, runtime.kv_buffer_device).
# - With the KV cache in GPU memory UCX needs its GPU memory transport to register it: without `cuda_copy`
#   (ROCm: `rocm_copy`) UCX classifies VRAM as host memory and NIXL's registerMem fails with
#   NIXL_ERR_BACKEND "VRAM memory is detected as host by UCX" (ai-dynamo/nixl issues 334 and 1628, PRs 1385,
#   1393; PR 1617 fails on a UCX_TLS without GPU support). Issue 1628's working list:
#   cuda_copy,cuda_ipc,sm,tcp,self. `cuda_ipc`/`rocm_ipc` and `sm` act only within one host (co-hosted
#   engines), `self` is the loopback; between hosts only the network transport moves bytes, and it is bound
#   to the recorded fabric by UCX_NET_DEVICES.
# - Host-memory KV (kv_buffer_device cpu: the CPU build) needs no GPU transport: tcp (resp. rc,ud) alone.
# - RDMA: rc (reliable connection, the bulk transport) and ud (connection setup), as UCX's own docs list them.
UCX_TLS_TABLE = {
    ("ucx_tcp", "gpu:cuda"): ["tcp", "cuda_copy", "cuda_ipc", "sm", "self"],
    ("ucx_tcp", "gpu:rocm"): ["tcp", "rocm_copy", "rocm_ipc", "sm", "self"],
    ("ucx_tcp", "host"): ["tcp"],
    ("ucx_rdma", "gpu:cuda"): ["rc", "ud", "cuda_copy", "cuda_ipc", "sm", "self"],
    ("ucx_rdma", "gpu:rocm"): ["rc", "ud", "rocm_copy", "rocm_ipc", "sm", "self"],
    ("ucx_rdma", "host"): ["rc", "ud", "sm", "self"],
}
GPU_MEMORY_TRANSPORT = {"cuda": "cuda_copy", "rocm": "rocm_copy"}
NETWORK_TRANSPORTS = {"ucx_tcp": ("tcp",),
                      "ucx_rdma": ("rc", "rc_v", "rc_x", "rc_mlx5", "ud", "ud_v", "ud_x", "ud_mlx5", "dc", "dc_x",
                                   "dc_mlx5")}
UCX_KNOWN = set(NETWORK_TRANSPORTS["ucx_tcp"] + NETWORK_TRANSPORTS["ucx_rdma"]) | {
    "self", "sm", "shm", "posix", "sysv", "xpmem", "cma", "knem", "mm", "cuda_copy", "cuda_ipc", "gdr_copy",
    "rocm_copy", "rocm_ipc", "rocm_gdr"}
GPU_TRANSPORTS = {"cuda": ("cuda_copy", "cuda_ipc", "gdr_copy"), "rocm": ("rocm_copy", "rocm_ipc", "rocm_gdr")}

BIND_HOSTS = {"ipv4": "0.0.0.0", "ipv6": "::"}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
ENGINE_NAME = re.compile(r"^engine-[1-9][0-9]*\Z")
ROLE_ENV_KEYS = ("NARWHAL_ENGINE", "NARWHAL_RECORD", "NARWHAL_MODEL_MOUNT", "NARWHAL_SERVED_MODEL_NAME",
                 "NARWHAL_BIND_FAMILY", "NARWHAL_HTTP_PORT", "NARWHAL_ADVERTISED_ADDRESS", "NARWHAL_SIDE_CHANNEL_PORT",
                 "NARWHAL_FABRIC_INTERFACE", "NARWHAL_API_KEY_FILE", "NARWHAL_RUN_ID", "NARWHAL_RUN_DIR",
                 "NARWHAL_APP_REVISION")


class PlanError(ValueError):
    """A refused input or record: the message names the field or entry and the fix; `key` names it. Secret-looking
    values in the message are redacted (redact_text): a refusal never prints a token or the API key."""

    def __init__(self, message, key=None):
        super().__init__(redact_text(message))
        self.key = key


# ------------------------------------------------------------------------------------- one-line values

def control_character(text):
    """The first character of `text` that could break a line-based file or a terminal (C0 controls, DEL, C1
    controls, U+2028/U+2029: every line boundary of str.splitlines()), or None. Tab counts too: no value needs it."""
    for ch in text:
        code = ord(ch)
        if code < 0x20 or 0x7f <= code <= 0x9f or ch in "\u2028\u2029":
            return ch
    return None


def local_host_reason(host):
    """Why `host` (an address or a name, IPv6 with or without brackets) only reaches the machine itself or no
    machine (loopback in any spelling, unspecified, link-local, multicast, an IPv4-mapped loopback, a localhost
    name), or None. Numeric spellings that resolvers accept but ipaddress does not (127.1, 0x7f.1, 2130706433)
    are the caller's to refuse as non-canonical."""
    name = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    lowered = name.lower().rstrip(".")
    if lowered in ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback") \
            or lowered.endswith(".localhost"):
        return "a localhost name"
    try:
        ip = ipaddress.ip_address(name)
    except ValueError:
        return None
    mapped = getattr(ip, "ipv4_mapped", None)
    if mapped is not None and (mapped.is_loopback or mapped.is_unspecified):
        return "an IPv4-mapped loopback or unspecified address"
    for test, why in (("is_unspecified", "the unspecified address"), ("is_loopback", "a loopback address"),
                      ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address")):
        if getattr(ip, test) or (mapped is not None and getattr(mapped, test)):
            return why
    return None


# ----------------------------------------------------------------------------------------- role environment

def install_paths(checkout, engine, run_id):
    """Where install puts an engine's files in the engine checkout, and the launcher's run directory."""
    return {
        "record": "%s/config/engine-launch.%s.json" % (checkout, engine),
        "role_env": "%s/config/%s.env" % (checkout, engine),
        "launcher": "%s/bin/launch_engine.pyz" % checkout,
        "api_key": "%s/config/engine-api.key" % checkout,
        "run_dir": "%s/runs/%s" % (checkout, run_id),
    }


def model_mount(record):
    """The container path of the checkpoint: /models/<served model name, / as _>."""
    served = record["runtime"]["served_model_name"]
    return "/models/%s" % served.replace("/", "_")


def role_environment(record, checkout, run_id, revision=None):
    """The role environment prepare writes and the launcher reads (-> {key: value})."""
    node = record["node"]
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
    }
    if revision is not None:
        env["NARWHAL_APP_REVISION"] = revision
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

API_KEY_MAX_BYTES = 65536


def api_key_from(raw, mode, path):
    """The engine API key held by a key file (its bytes and st_mode), the one rule for prepare and the launcher:
    mode 0600 or 0400 (no group or other bits), one non-empty line of UTF-8 text, at most API_KEY_MAX_BYTES.
    Raises PlanError naming the file, never the key."""
    key_name = "NARWHAL_API_KEY_FILE"
    if mode & 0o077:
        raise PlanError("the engine API key file %s has mode %04o; it must be 0600 or 0400 (chmod 600 %s)"
                        % (path, mode & 0o7777, path), key_name)
    lines = [line for line in raw.splitlines() if line.strip()]
    if len(raw) > API_KEY_MAX_BYTES or b"\x00" in raw or len(lines) != 1:
        raise PlanError("the engine API key file %s must hold exactly one non-empty line (it has %d%s); write the "
                        "key alone into it" % (path, len(lines), ", or NUL bytes or over %d bytes"
                                               % API_KEY_MAX_BYTES if len(lines) == 1 else ""), key_name)
    try:
        return lines[0].decode("utf-8").strip()
    except UnicodeDecodeError:
        raise PlanError("the engine API key file %s is not UTF-8 text; write the key alone into it" % path, key_name)


def canonical_flag(head, known):
    """`head` (a `--flag` without `=value`) as vLLM's parser reads it: --x_y is --x-y, and an unambiguous prefix
    of one of `known` (argparse abbreviations, which vLLM's parser allows) is that flag."""
    if not head.startswith("--"):
        return head
    head = "--" + head[2:].replace("_", "-")
    if head in known:
        return head
    matches = [flag for flag in known if len(head) > 3 and flag.startswith(head)]
    return matches[0] if len(matches) == 1 else head


def flag_name(token):
    """The managed flag a token sets, or None. Handles --x_y, --flag=value, --flag.key (vLLM dotted JSON
    args), -tp/-tp=2, and unambiguous argparse abbreviations of a managed flag (--tensor-parallel)."""
    if not isinstance(token, str) or not token.startswith("-") or token in ("-", "--"):
        return None
    head = token.split("=", 1)[0]
    if head.startswith("--"):
        head = head.split(".", 1)[0].replace("_", "-")
        for flag in MANAGED_LONG_FLAGS:
            if head == flag or (len(head) > 3 and flag.startswith(head)):
                return flag
        return None
    return MANAGED_SHORT_FLAGS.get(head.split(".", 1)[0])


def split_args(text, where):
    """Shell words of an extra-arguments input; unbalanced quotes are refused by name."""
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise PlanError("%s is not valid shell words (%s); balance its quotes" % (where, exc), where)


def check_args(args, where, allowed=()):
    """Refuse arguments that set a launcher-managed flag (`allowed`: derived flags the record may carry)."""
    for index, token in enumerate(args):
        if not isinstance(token, str):
            raise PlanError("%s[%d]=%r is not a string" % (where, index, token), where)
        flag = flag_name(token)
        if flag and flag not in allowed:
            how = ("is derived by discovery from the checkpoint (an auto_map in config.json or "
                   "tokenizer_config.json)" if flag in DERIVED_FLAGS else
                   "is set by the launcher from the record and the role environment")
            raise PlanError("%s[%d]=%r overrides launcher-managed %s, which %s; remove it (change the corresponding "
                            "NARWHAL_ input instead)" % (where, index, token, flag, how), where)
        if is_secret_flag(token):
            raise PlanError("%s[%d] sets %s, which takes a credential and would be written into the launch records, "
                            "the manifest and plan.json; remove it (the engines load the model from "
                            "NARWHAL_MODEL_PATH and need no hub token; the engine API key comes from "
                            "NARWHAL_API_KEY_FILE)" % (where, index, token.split("=", 1)[0]), where)
    return list(args)


SECRET_NAME = re.compile(r"PASSW|PASSPHRASE|PRIVATE|AUTH|_KEY\Z|^KEY\Z")


def is_secret_name(name):
    """A variable name whose value looks secret (the one rule: records, image facts, redaction)."""
    upper = name.upper()
    return any(s in upper for s in SECRETISH) or bool(SECRET_NAME.search(upper))


# ------------------------------------------------------------------------------------------------ redaction
# One owner for what is printed or recorded: redact_text() on any message, redact_argv() on an argv list. A value is
# secret when its name looks secret (SECRETISH; a *_FILE/_PATH/_DIR name holds a path, not the secret), when it
# follows a secret-looking flag (--api-key, --hf-token, --*-password ...), when it is the password of a URL, a
# bearer credential or shaped like a well-known token (hf_..., ghp_..., sk-...), or when it is a registered secret
# (the API key the launcher read).

_SECRET_VALUES = set()
_MIN_SECRET = 6  # shorter strings are not registered: redacting "abc" everywhere would garble messages
_PATH_NAME = re.compile(r"_(FILE|PATH|DIR)$", re.IGNORECASE)
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]*"
_STOP = r"""\s'",;&)\]}>"""
_SECRET_FLAG = re.compile(r"^--(?:[a-z0-9]+-)*(?:token|secret|password|passwd|passphrase|credentials?|key)$")
_PAIR = re.compile(r"(?P<name>\b%s)(?P<sep>=)(?P<value>[^<%s][^%s]*)" % (_NAME, _STOP, _STOP))
_QUOTED_PAIR = re.compile(r"""(?P<q>["'])(?P<name>%s)(?P=q)(?P<sep>\s*[:=]\s*\[?\s*)(?P<q2>["'])"""
                          r"""(?P<value>[^"'\n]*)(?P=q2)""" % _NAME)
_FLAG_VALUE = re.compile(r"""(?P<flag>--[A-Za-z0-9_-]+)(?P<sep>=|['"],\s*['"]|[ \t]+)(?P<value>[^-<%s][^%s]*)"""
                         % (_STOP, _STOP))
_PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_]{0,15}|<[a-z]+>)$")  # KEY=VALUE, NAME=<redacted> in prose
# After a space, only a word that looks like a credential is a flag's value ("--api-key is refused" stays prose).
_CREDENTIAL_WORD = re.compile(r"^(?=.{16,}|.*[0-9A-Z_+/=.:-]).{6,}$")
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<value>[^/\s@]+)(?P<tail>@)")
_BEARER = re.compile(r"(?P<head>\b(?:Bearer|Basic)\s+)(?P<value>[A-Za-z0-9._~+/=-]{6,})", re.IGNORECASE)
_TOKEN_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|"
                           r"xox[abpr]-[A-Za-z0-9-]{10,})\b")


def register_secret(value):
    """Redact `value` (e.g. the API key just read) in every later message of this process."""
    if isinstance(value, str) and len(value.strip()) >= _MIN_SECRET:
        _SECRET_VALUES.add(value.strip())


def secret_values(*mappings):
    """The values of the secret-looking names of environment-like mappings (not *_FILE/_PATH/_DIR paths), to
    pass to redact_text as known secrets: a token of the controller's environment stays hidden wherever it is
    pasted."""
    return [v for mapping in mappings for k, v in (mapping or {}).items()
            if isinstance(k, str) and isinstance(v, str) and v and holds_secret(k)]


def is_secret_flag(token):
    """True for a flag whose value is a credential: --api-key, --hf-token, --db-password (not --ssl-keyfile or
    --max-num-batched-tokens), and argparse abbreviations of vLLM's own (--hf-tok)."""
    if not isinstance(token, str) or not token.startswith("--"):
        return False
    head = token.split("=", 1)[0].split(".", 1)[0].replace("_", "-").lower()
    return bool(_SECRET_FLAG.match(head)) or (len(head) > 4 and any(f.startswith(head) for f in SECRET_FLAGS))


def holds_secret(name):
    """A secret-looking name whose value is the secret (NARWHAL_API_KEY_FILE holds a path: not one)."""
    return is_secret_name(name) and not _PATH_NAME.search(name)


def redact_text(text, secrets=()):
    """`text` with every secret value replaced by <redacted> (see above); `secrets` are further known values."""
    if not isinstance(text, str) or not text:
        return text
    for value in sorted(set(secrets or ()) | _SECRET_VALUES, key=len, reverse=True):
        if isinstance(value, str) and len(value.strip()) >= _MIN_SECRET:
            text = text.replace(value.strip(), REDACTED)

    def pair(match):
        if not holds_secret(match.group("name")) or _PLACEHOLDER.match(match.group("value")):
            return match.group(0)
        return match.group(0)[:match.start("value") - match.start(0)] + REDACTED + \
            match.group(0)[match.end("value") - match.start(0):]

    def flag(match):
        if not is_secret_flag(match.group("flag")):
            return match.group(0)
        if not match.group("sep").strip() and not _CREDENTIAL_WORD.match(match.group("value")):
            return match.group(0)
        return match.group("flag") + match.group("sep") + REDACTED

    text = _QUOTED_PAIR.sub(pair, text)
    text = _PAIR.sub(pair, text)
    text = _FLAG_VALUE.sub(flag, text)
    text = _URL_PASSWORD.sub(lambda m: m.group("head") + REDACTED + m.group("tail"), text)
    text = _BEARER.sub(lambda m: m.group("head") + REDACTED, text)
    return _TOKEN_SHAPES.sub(REDACTED, text)


def redact_argv(argv):
    """A copy of an argv list with the values of secret-looking flags and NAME=VALUE words redacted."""
    if not isinstance(argv, (list, tuple)):
        return argv
    out, hide_next = [], False
    for word in argv:
        if not isinstance(word, str):
            out.append(word)
            hide_next = False
            continue
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if is_secret_flag(word):
            if "=" in word:
                out.append(word.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(redact_text(word))
    return out


def check_env(env, where, allowed=()):
    """Refuse launcher-managed, secret-looking and malformed variables in an environment mapping."""
    if not isinstance(env, dict):
        raise PlanError("%s must be a mapping of variables; %s" % (where, RERUN), where)
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name) or not isinstance(value, str) \
                or "\x00" in value:
            raise PlanError("%s entry %r must be a NAME=string variable" % (where, name), where)
        if name in MANAGED_ENV and name not in allowed:
            raise PlanError("%s sets %s, which is launcher-managed (the launcher sets it from the record and the role "
                            "environment); remove it (change the corresponding NARWHAL_ input instead)"
                            % (where, name), where)
        if is_secret_name(name):
            raise PlanError("%s sets %s, which looks like a secret and would be written into the launch records; "
                            "remove it (the engine API key comes from NARWHAL_API_KEY_FILE)" % (where, name), where)
    return dict(env)


def parse_env_words(text, where):
    """KEY=VALUE shell words (NARWHAL_ENGINE_ENV) -> {KEY: VALUE}, checked like a record environment."""
    result = {}
    for entry in split_args(text, where):
        key, sep, value = entry.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise PlanError("%s entry %r is not KEY=VALUE" % (where, entry), where)
        if key in result:
            raise PlanError("%s sets %s twice" % (where, key), where)
        result[key] = value
    return check_env(result, where)


def ucx_tls(transport, platform, kv_buffer_device):
    """The UCX transport list of a (transport, platform, KV buffer device); see UCX_TLS_TABLE."""
    memory = "host" if kv_buffer_device == "cpu" or platform == "cpu" else "gpu:%s" % platform
    try:
        return list(UCX_TLS_TABLE[(transport, memory)])
    except KeyError:
        raise PlanError("transport %r with platform %r and kv_buffer_device %r is not supported (ucx_tcp|ucx_rdma "
                        "on cuda|rocm|cpu)" % (transport, platform, kv_buffer_device), "NARWHAL_TRANSPORT")


def check_ucx_tls(tls, transport, platform, kv_buffer_device):
    """Refuse a UCX list that real NIXL/UCX would refuse or that could bypass the fabric."""
    where = "launch record transfer.ucx_tls"
    if not isinstance(tls, list) or not tls or not all(isinstance(t, str) for t in tls):
        raise PlanError("%s must be a non-empty list of UCX transports; %s" % (where, RERUN), where)
    shown = ",".join(tls)
    unknown = [t for t in tls if t not in UCX_KNOWN]
    if unknown:
        raise PlanError("%s=%s: %s is not a UCX transport; %s" % (where, shown, ",".join(unknown), RERUN), where)
    if not any(t in NETWORK_TRANSPORTS.get(transport, ()) for t in tls):
        raise PlanError("%s=%s has no %s network transport (%s): nothing would carry KV between hosts; %s"
                        % (where, shown, transport, "|".join(NETWORK_TRANSPORTS.get(transport, ())), RERUN), where)
    other = [t for t in tls if t in NETWORK_TRANSPORTS["ucx_rdma" if transport == "ucx_tcp" else "ucx_tcp"]]
    if other:
        raise PlanError("%s=%s mixes in %s, which is not the recorded transfer.transport %s; %s"
                        % (where, shown, ",".join(other), transport, RERUN), where)
    gpu = GPU_MEMORY_TRANSPORT.get(platform)
    if gpu and kv_buffer_device != "cpu" and gpu not in tls:
        raise PlanError("%s=%s lacks %s: the KV cache is in GPU memory (runtime.kv_buffer_device=%s on %s), and UCX "
                        "without its GPU memory transport classifies VRAM as host memory, so NIXL refuses to register "
                        "it (NIXL_ERR_BACKEND: VRAM memory is detected as host by UCX); %s (the list is derived from "
                        "NARWHAL_TRANSPORT and the image's platform)"
                        % (where, shown, gpu, kv_buffer_device, platform, RERUN), where)
    foreign = [t for t in tls for p, names in GPU_TRANSPORTS.items() if p != platform and t in names]
    if foreign:
        raise PlanError("%s=%s names %s, a GPU transport of another platform than %s; %s"
                        % (where, shown, ",".join(foreign), platform, RERUN), where)
    return tls


def side_channel_host(address):
    """VLLM_NIXL_SIDE_CHANNEL_HOST: advertised to the peers, so never unspecified or loopback."""
    if not address:
        raise PlanError("role env NARWHAL_ADVERTISED_ADDRESS is not set; it must be the node's fabric address",
                        "NARWHAL_ADVERTISED_ADDRESS")
    name = address.strip("[]")
    bad = local_host_reason(name) is not None
    try:
        ipaddress.ip_address(name)
    except ValueError:
        bad = True  # the side channel is advertised by address: a name is refused too
    if bad:
        raise PlanError("role env NARWHAL_ADVERTISED_ADDRESS=%s cannot be VLLM_NIXL_SIDE_CHANNEL_HOST: it is "
                        "advertised to the other engines, so use the node's global fabric address (record "
                        "node.address)" % address, "NARWHAL_ADVERTISED_ADDRESS")
    return name


def version_tuple(text, where="launch record runtime.vllm_version"):
    parts = []
    for piece in str(text).split("+", 1)[0].split("."):
        match = re.match(r"[0-9]+", piece)
        if not match:
            break
        parts.append(int(match.group(0)))
    if len(parts) < 2:
        raise PlanError("%s=%r is not a version; %s" % (where, text, RERUN), where)
    return tuple(parts)


def kv_transfer_config(record):
    """NixlConnector, kv_both, UCX, failure propagation where the image's vLLM knows the field (>= 0.14)."""
    runtime = record.get("runtime") or {}
    version = version_tuple(runtime.get("vllm_version", ""))
    config = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    if version >= (0, 14):
        # the image's own KVTransferConfig validates the value (the image check)
        config["kv_load_failure_policy"] = runtime.get("kv_load_failure_policy") or "fail"
    if runtime.get("kv_buffer_device") == "cpu":
        config["kv_buffer_device"] = "cpu"
    config["kv_connector_extra_config"] = {"backends": ["UCX"]}
    return config


# ------------------------------------------------------------------------------------------------- plan

def _field(record, dotted, kind, allow_empty=True):
    value = record
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            raise PlanError("launch record field %s is missing; %s" % (dotted, RERUN), dotted)
        value = value[part]
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise PlanError("launch record field %s must be %s, got %r; %s"
                        % (dotted, getattr(kind, "__name__", kind), value, RERUN), dotted)
    if not allow_empty and not value and value != 0:
        raise PlanError("launch record field %s is empty; %s" % (dotted, RERUN), dotted)
    return value


def _role(role_env, key):
    value = role_env.get(key, "")
    if not value:
        raise PlanError("role env %s is not set; rerun install (prepare a new run) to write the engine's role "
                        "environment" % key, key)
    return value


def _port(role_env, key):
    value = _role(role_env, key)
    if not (value.isascii() and value.isdigit()) or not 0 < int(value) < 65536:
        raise PlanError("role env %s=%r is not a TCP port (1-65535)" % (key, value), key)
    return int(value)


def _device(path, where):
    parts = path.split("/") if isinstance(path, str) else []
    if not isinstance(path, str) or not path.startswith("/dev/") or ":" in path or "," in path \
            or any(p in ("..", ".") for p in parts) or "//" in path:
        raise PlanError("launch record %s entry %r is not a /dev path; %s" % (where, path, RERUN), where)
    return "%s:%s:rwm" % (path, path)


def _abs_path(path, where):
    if not isinstance(path, str) or not path.startswith("/") or "," in path or ".." in path.split("/") \
            or any(ch in path for ch in "\r\n\x00"):
        raise PlanError("%s=%r must be an absolute path without commas or '..'" % (where, path), where)
    return path


def container_spec(record, role_env):
    """The container the engine runs, as data (pure). The API key is a placeholder (REDACTED)."""
    engine = _role(role_env, "NARWHAL_ENGINE")
    if not ENGINE_NAME.match(engine):
        raise PlanError("role env NARWHAL_ENGINE=%r must be engine-<n>" % engine, "NARWHAL_ENGINE")
    if record.get("engine") != engine:
        raise PlanError("launch record engine=%r does not match role env NARWHAL_ENGINE=%s; install the engine's own "
                        "record" % (record.get("engine"), engine), "engine")
    vendor = _field(record, "accelerator.vendor", str)
    image_id = _field(record, "runtime.image_id", str, allow_empty=False)
    platform = _field(record, "runtime.platform", str)
    transport = _field(record, "transfer.transport", str)
    kv_buffer_device = _field(record, "runtime.kv_buffer_device", str, allow_empty=False)
    if platform not in ("cuda", "rocm", "cpu") or transport not in NETWORK_TRANSPORTS:
        raise PlanError("launch record transfer.transport=%r / runtime.platform=%r is not supported (ucx_tcp|ucx_rdma "
                        "on cuda|rocm|cpu)" % (transport, platform), "transfer.transport")
    if {"cuda": "nvidia", "rocm": "amd", "cpu": "cpu"}[platform] != vendor:
        raise PlanError("launch record runtime.platform=%s does not fit accelerator.vendor=%s; %s"
                        % (platform, vendor, RERUN), "runtime.platform")
    tls = check_ucx_tls(_field(record, "transfer.ucx_tls", list), transport, platform, kv_buffer_device)
    if _field(record, "network_mode", str) != "host":
        raise PlanError("launch record network_mode must be host; %s" % RERUN, "network_mode")
    gpu_ids = [str(g) for g in _field(record, "gpu_ids", list)]
    host_indices = _field(record, "gpu_host_indices", list)
    tp = _field(record, "tensor_parallel_size", int)
    if tp < 1:
        raise PlanError("launch record tensor_parallel_size=%d must be >= 1" % tp, "tensor_parallel_size")
    if gpu_ids and len(gpu_ids) != tp:
        raise PlanError("launch record gpu_ids has %d entries but tensor_parallel_size is %d; %s"
                        % (len(gpu_ids), tp, RERUN), "gpu_ids")
    if len(host_indices) != len(gpu_ids) or len(set(gpu_ids)) != len(gpu_ids) \
            or any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in host_indices) \
            or len(set(host_indices)) != len(host_indices):
        raise PlanError("launch record gpu_host_indices %r and gpu_ids %r must be distinct, non-negative and of the "
                        "same length; %s" % (host_indices, gpu_ids, RERUN), "gpu_host_indices")
    if vendor in ("nvidia", "amd") and not gpu_ids:
        raise PlanError("launch record accelerator.vendor=%s but gpu_ids is empty; %s" % (vendor, RERUN), "gpu_ids")
    accel_devices = _field(record, "accelerator_devices", list)
    transfer_devices = _field(record, "transfer.devices", list)
    runtime = record["runtime"]
    runtime_env = check_env(_field(record, "runtime.environment", dict), "launch record runtime.environment")
    derived_env = check_env(_field(record, "runtime.derived_environment", dict),
                            "launch record runtime.derived_environment", allowed=DERIVED_ENV)
    trust = runtime.get("trust_remote_code") is True
    extra_args = check_args(_field(record, "runtime.extra_args", list), "launch record runtime.extra_args",
                            allowed=DERIVED_FLAGS if trust else ())
    if trust and "--trust-remote-code" not in extra_args:
        raise PlanError("launch record runtime.trust_remote_code is true but runtime.extra_args lacks "
                        "--trust-remote-code; %s" % RERUN, "runtime.extra_args")
    if runtime.get("ssm_conv_state") and derived_env.get(SSM_LAYOUT_ENV) != "DS":
        raise PlanError("launch record runtime.ssm_conv_state is true but runtime.derived_environment lacks "
                        "%s=DS; %s" % (SSM_LAYOUT_ENV, RERUN), "runtime.derived_environment")

    mount = _abs_path(_role(role_env, "NARWHAL_MODEL_MOUNT"), "role env NARWHAL_MODEL_MOUNT")
    model_path = _abs_path(_field(record, "runtime.model_path", str, allow_empty=False),
                           "launch record runtime.model_path")
    served = _role(role_env, "NARWHAL_SERVED_MODEL_NAME")
    if served != runtime.get("served_model_name") or mount != model_mount(record):
        raise PlanError("role env NARWHAL_SERVED_MODEL_NAME=%s / NARWHAL_MODEL_MOUNT=%s do not match the record's "
                        "runtime.served_model_name %s; prepare a new run"
                        % (served, mount, runtime.get("served_model_name")), "NARWHAL_SERVED_MODEL_NAME")
    family = _role(role_env, "NARWHAL_BIND_FAMILY")
    if family not in BIND_HOSTS:
        raise PlanError("role env NARWHAL_BIND_FAMILY=%r must be ipv4 or ipv6" % family, "NARWHAL_BIND_FAMILY")
    http_port = _port(role_env, "NARWHAL_HTTP_PORT")
    side_port = _port(role_env, "NARWHAL_SIDE_CHANNEL_PORT")
    side_host = side_channel_host(role_env.get("NARWHAL_ADVERTISED_ADDRESS", ""))

    try:
        net_devices = resolve_values(_field(record, "transfer.net_devices", list, allow_empty=False),
                                     dict((k, v) for k, v in role_env.items() if v),
                                     "launch record transfer.net_devices")
    except SubstitutionError as exc:
        raise PlanError("%s; the role env provides NARWHAL_FABRIC_INTERFACE (prepare a new run)" % exc,
                        "transfer.net_devices")
    for index, dev in enumerate(net_devices):
        if not isinstance(dev, str) or not re.match(r"^[A-Za-z0-9_.@-]+(:[0-9]+)?\Z", dev):
            raise PlanError("launch record transfer.net_devices[%d]=%r is not an interface or HCA:port; %s"
                            % (index, dev, RERUN), "transfer.net_devices")

    devices, device_requests, verify_devices = [], [], []
    if vendor == "nvidia":
        # GPUs through the NVIDIA runtime's device request (it also brings the driver libraries); the recorded
        # /dev/nvidia* nodes are checked on the host, not mapped.
        verify_devices = [_device(d, "accelerator_devices").split(":", 1)[0] for d in accel_devices]
        device_requests = [{"driver": "nvidia", "device_ids": [str(i) for i in host_indices],
                            "capabilities": [["gpu"]]}]
    else:
        devices = [_device(d, "accelerator_devices") for d in accel_devices]
    devices += [_device(d, "transfer.devices") for d in transfer_devices]

    environment = dict(runtime_env)
    environment.update(derived_env)
    if gpu_ids:
        visibility = _field(record, "gpu_visibility_env", str)
        if visibility != VISIBILITY_BY_VENDOR.get(vendor):
            raise PlanError("launch record gpu_visibility_env=%r is not the visibility variable of %s GPUs (%s); %s"
                            % (visibility, vendor, VISIBILITY_BY_VENDOR.get(vendor), RERUN), "gpu_visibility_env")
        environment[visibility] = ",".join(gpu_ids)
    environment["UCX_NET_DEVICES"] = ",".join(net_devices)
    environment["UCX_TLS"] = ",".join(tls)
    environment["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_host
    environment["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side_port)
    environment[API_KEY_ENV] = REDACTED

    command = [
        "serve", mount,
        "--served-model-name", served,
        "--host", BIND_HOSTS[family],
        "--port", str(http_port),
        "--tensor-parallel-size", str(tp),
        "--kv-transfer-config", json.dumps(kv_transfer_config(record), separators=(",", ":")),
        "--dtype", _field(record, "runtime.model_dtype", str, allow_empty=False),
        "--kv-cache-dtype", _field(record, "runtime.kv_cache_dtype", str, allow_empty=False),
        "--block-size", str(_field(record, "runtime.block_size", int)),
    ] + [str(a) for a in extra_args]

    rdma = transport == "ucx_rdma"
    return {
        "engine": engine,
        "name": "narwhal-%s" % engine,
        "image": image_id,
        "image_ref": runtime.get("image", ""),
        "entrypoint": ["vllm"],
        "command": command,
        "environment": dict(sorted(environment.items())),
        "network_mode": "host",
        "ipc_mode": "host",
        "devices": devices,
        "device_requests": device_requests,
        "verify_devices": verify_devices,
        "group_add": ["video", "render"] if vendor == "amd" else [],
        "cap_add": ["IPC_LOCK"] if rdma else [],
        "ulimits": [{"name": "memlock", "soft": -1, "hard": -1}] if rdma else [],
        "security_opt": ["seccomp=unconfined"] if vendor == "amd" else [],
        "mounts": [{"type": "bind", "source": model_path, "target": mount, "read_only": True}],
        "labels": {ENGINE_LABEL: engine},
        "restart_policy": {"name": RESTART_POLICY},
    }


def redacted(plan):
    plan = copy.deepcopy(plan)
    if API_KEY_ENV in plan.get("environment", {}):
        plan["environment"][API_KEY_ENV] = REDACTED
    return plan


def plan_hash(plan):
    """sha256 of the canonical JSON of the plan, the API key excluded: the same on the controller and host."""
    canonical = json.dumps(redacted(plan), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def create_labels(plan, run_id=None):
    """The container's labels: the plan's, the plan hash, and the run that creates it (RUN_ID_LABEL, when given).
    The last two are added at create time, outside the hashed plan."""
    labels = dict(plan["labels"])
    labels[PLAN_HASH_LABEL] = plan_hash(plan)
    if run_id:
        labels[RUN_ID_LABEL] = run_id
    return labels


def docker_run_argv(plan, group_ids=None, run_id=None):
    """The complete container command as `docker run` reads it (API key redacted). `group_ids` maps the plan's
    group names to the host's numeric IDs (the launcher passes them; see its start); `run_id` is the creating
    run's label."""
    plan = redacted(plan)
    argv = ["docker", "run", "-d", "--name", plan["name"], "--network", plan["network_mode"],
            "--ipc", plan["ipc_mode"], "--restart", plan["restart_policy"]["name"]]
    for device in plan["devices"]:
        argv += ["--device", device]
    for request in plan["device_requests"]:
        argv += ["--gpus", '"device=%s"' % ",".join(request["device_ids"])]
    for group in plan["group_add"]:
        argv += ["--group-add", (group_ids or {}).get(group, group)]
    for cap in plan["cap_add"]:
        argv += ["--cap-add", cap]
    for ulimit in plan["ulimits"]:
        argv += ["--ulimit", "%s=%d:%d" % (ulimit["name"], ulimit["soft"], ulimit["hard"])]
    for opt in plan["security_opt"]:
        argv += ["--security-opt", opt]
    for mount in plan["mounts"]:
        argv += ["--mount", "type=%s,source=%s,target=%s%s" % (mount["type"], mount["source"], mount["target"],
                                                               ",readonly" if mount["read_only"] else "")]
    labels = create_labels(plan, run_id)
    for key in sorted(labels):
        argv += ["--label", "%s=%s" % (key, labels[key])]
    for key in sorted(plan["environment"]):
        argv += ["-e", "%s=%s" % (key, plan["environment"][key])]
    argv += ["--entrypoint", plan["entrypoint"][0], plan["image"]] + plan["entrypoint"][1:] + plan["command"]
    return argv
