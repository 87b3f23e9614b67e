# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launcher-managed flags and variables: what no extra argument or environment entry of a record may
set, because the planner derives it (flag_name, check_args, check_env, parse_env_words).
"""

from __future__ import annotations

import shlex

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import ENV_NAME
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import (
    API_KEY_ENV,
    is_secret_flag,
    is_secret_name,
)

__metaclass__ = type


# Flags whose value the launcher owns (normalised: `--x_y` -> `--x-y`). `--config` (a YAML file of arguments)
# could set any of them, `--uds` replaces the HTTP host/port, `--kv-events-config` binds its own endpoints.
MANAGED_LONG_FLAGS = (
    "--port", "--host", "--tensor-parallel-size", "--kv-transfer-config", "--api-key", "--served-model-name",
    "--model", "--dtype", "--kv-cache-dtype", "--block-size", "--data-parallel-size", "--pipeline-parallel-size",
    "--config", "--uds", "--kv-events-config", "--trust-remote-code", "--shutdown-timeout",
    # data and expert parallelism: the size and EP from their inputs; the rest (the rank layout and rendezvous of a
    # DP engine, vLLM 0.32.0 engine/arg_utils.py:1208-1276, serve --headless) is the planner's too
    "--enable-expert-parallel", "--data-parallel-rank", "--data-parallel-start-rank", "--data-parallel-size-local",
    "--data-parallel-address", "--data-parallel-rpc-port", "--data-parallel-backend", "--data-parallel-hybrid-lb",
    "--data-parallel-external-lb", "--data-parallel-multi-port-external-lb", "--headless",
    # who gets in (issue 35): the key guard (--middleware narwhal_guard.KeyGuard, the only middleware), the TLS of
    # the HTTP server (vLLM 0.32.0 entrypoints/launchers/cli_args.py:336-351: --ssl-keyfile, --ssl-certfile,
    # --ssl-ca-certs, --ssl-cert-reqs, --ssl-ciphers, handed to uvicorn by launchers/api_server/entry.py:147-158)
    # and --host above
    "--middleware", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs", "--ssl-ciphers",
)

# managed flags one input owns
FLAG_INPUTS = {"--shutdown-timeout": "NARWHAL_SHUTDOWN_TIMEOUT", "--data-parallel-size": "NARWHAL_DATA_PARALLEL_SIZE",
               "--enable-expert-parallel": "NARWHAL_ENABLE_EXPERT_PARALLEL", "--host": "NARWHAL_ENGINE_BIND",
               "--ssl-keyfile": "NARWHAL_TLS", "--ssl-certfile": "NARWHAL_TLS", "--ssl-ca-certs": "NARWHAL_TLS",
               "--ssl-cert-reqs": "NARWHAL_TLS", "--ssl-ciphers": "NARWHAL_TLS",
               "--kv-events-config": "NARWHAL_KV_EVENTS"}

MANAGED_SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size",
                       "-pp": "--pipeline-parallel-size", "-ep": "--enable-expert-parallel",
                       "-dpn": "--data-parallel-rank", "-dpr": "--data-parallel-start-rank",
                       "-dpl": "--data-parallel-size-local", "-dpa": "--data-parallel-address",
                       "-dpp": "--data-parallel-rpc-port", "-dpb": "--data-parallel-backend",
                       "-dph": "--data-parallel-hybrid-lb", "-dpe": "--data-parallel-external-lb",
                       "-dpm": "--data-parallel-multi-port-external-lb"}


# Derived by discovery from the checkpoint (auto_map): in a record's runtime.extra_args only when
# runtime.trust_remote_code says so, never from an operator's extra arguments.
DERIVED_FLAGS = ("--trust-remote-code",)

VISIBILITY_ENV = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

VISIBILITY_BY_VENDOR = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}

SSM_LAYOUT_ENV = "VLLM_SSM_CONV_STATE_LAYOUT"

MANAGED_ENV = VISIBILITY_ENV + (
    "UCX_NET_DEVICES", "UCX_TLS", "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", API_KEY_ENV,
    SSM_LAYOUT_ENV, "VLLM_HOST_IP", "VLLM_PORT", "PATH", "NARWHAL_GUARD_KEY_FILE",
)

DERIVED_ENV = (SSM_LAYOUT_ENV,)  # managed (no extra may set it) but carried in runtime.derived_environment

# Prefixed by the planner: the key guard's directory goes first on PYTHONPATH (_plan/container.py), before the value
# the record's runtime.environment carries (the image's own PYTHONPATH, which discovery copies from the image's
# Env: _facts/image.py ENV_PREFIXES). So a record may carry it, but no operator input may set it.
PREFIXED_ENV = ("PYTHONPATH",)


# The KV lease: how long a prefill keeps KV blocks a decode has not read yet. One input owns it
# (NARWHAL_KV_LEASE_SECONDS) and the planner writes the name the image's vLLM reads (_plan/lifecycle.py::kv_lease):
# - vLLM <= 0.21: the environment variable VLLM_NIXL_ABORT_REQUEST_TIMEOUT (vLLM 0.21.0 vllm/envs.py:205,1472-1474,
#   read by nixl/scheduler.py:555-566), default 480 s;
# - vLLM >= 0.22: kv_connector_extra_config.kv_lease_duration of --kv-transfer-config (vLLM 0.22.0
#   nixl/scheduler.py:72-76, 0.32.0 nixl/base_scheduler.py:82-88), default 30 s; the variable is gone from envs.py
#   (0.32.0 only logs "Unknown vLLM environment variable detected", platforms/interface.py:1446-1459).
# vLLM reads kv_connector_extra_config with .get(key, default) (config/kv_transfer.py): a misspelt or wrong-version
# key is silently ignored, so a lease set by hand is refused by name, with the name the version reads.
LEASE_ENV = "VLLM_NIXL_ABORT_REQUEST_TIMEOUT"
LEASE_EXTRA_KEY = "kv_lease_duration"
LEASE_INPUT = "NARWHAL_KV_LEASE_SECONDS"
LEASE_KEY_VERSION = (0, 22)  # the first vLLM that reads kv_lease_duration (and no longer the variable)


def lease_like(name):
    """Whether a variable name or flag sets the KV lease by hand: the variable of vLLM <= 0.21, or anything spelt
    like the extra-config key of vLLM >= 0.22 (kv_lease_duration, --kv-lease-duration, VLLM_KV_LEASE_DURATION)."""
    word = str(name).split("=", 1)[0].lstrip("-").replace("-", "_").upper()
    return word == LEASE_ENV or "KV_LEASE" in word or ("ABORT_REQUEST_TIMEOUT" in word and "NIXL" in word)


def lease_names(release):
    """(the name, where it goes) of the KV lease for a vLLM (major, minor, patch), as the planner writes it."""
    if tuple(release)[:2] >= LEASE_KEY_VERSION:
        return "kv_connector_extra_config.%s" % LEASE_EXTRA_KEY, "--kv-transfer-config"
    return LEASE_ENV, "the environment"


def lease_refusal(where, name, release=None):
    """The message for a KV lease set by hand (`name`, a variable or flag) in `where`; `release`: the image's vLLM
    (major, minor, patch) when known."""
    name = name.split("=", 1)[0]
    if release is None:
        right = ("vLLM <= 0.21 reads the environment variable %s, vLLM >= 0.22 reads kv_connector_extra_config.%s "
                 "of --kv-transfer-config, and each ignores the other name" % (LEASE_ENV, LEASE_EXTRA_KEY))
    else:
        right_name, place = lease_names(release)
        right = "the image's vLLM %s reads the KV lease from %s (%s)%s" % (
            ".".join(str(p) for p in tuple(release)[:3]), right_name, place,
            "" if right_name == name else ", and would ignore %s" % name)
    return ("%s sets %s, the KV lease, by hand; %s: set %s=<seconds> instead, and the planner writes the name the "
            "image's vLLM reads" % (where, name, right, LEASE_INPUT))


# vLLM builds its serve options from typed config fields (vllm/engine/arg_utils.py, _compute_kwargs, used by
# EngineArgs.add_cli_args): a bool field gets action=argparse.BooleanOptionalAction ("Creates --no-<name> and
# --<name> flags"), so it also answers to `--no-<flag>`
# (--no-trust-remote-code sets trust_remote_code to False). The `--no-` form of a managed flag is therefore the same
# managed flag: it would cancel what the launcher or discovery derived.
NEGATION = "--no-"


def flag_name(token):
    """The managed flag a token sets, or None. Handles --x_y, --flag=value, --flag.key (vLLM dotted JSON
    args), -tp/-tp=2, the `--no-` form of a flag (BooleanOptionalAction), and unambiguous argparse abbreviations of
    a managed flag (--tensor-parallel, --no-trust-remote)."""
    if not isinstance(token, str) or not token.startswith("-") or token in ("-", "--"):
        return None
    head = token.split("=", 1)[0]
    if head.startswith("--"):
        head = head.split(".", 1)[0].replace("_", "-")
        if head in MANAGED_LONG_FLAGS:  # before the abbreviations: --data-parallel-size abbreviates -size-local
            return head
        for flag in MANAGED_LONG_FLAGS:
            if head == flag or (len(head) > 3 and flag.startswith(head)):
                return flag
            negated = NEGATION + flag[2:]
            if head == negated or (len(head) > len(NEGATION) and negated.startswith(head)):
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
        negated = bool(flag) and token.split("=", 1)[0].replace("_", "-").startswith(NEGATION)
        if lease_like(token) and token.startswith("--"):
            raise PlanError(lease_refusal("%s[%d]" % (where, index), token), where)
        if flag and (flag not in allowed or negated):
            how = ("is derived by discovery from the checkpoint (an auto_map in config.json or "
                   "tokenizer_config.json)" if flag in DERIVED_FLAGS else
                   "is set by the launcher from the record and the role environment")
            form = " (its --no- form: vLLM's parser generates one for every boolean option)" if negated else ""
            fix = "set %s instead" % FLAG_INPUTS[flag] if flag in FLAG_INPUTS else \
                "change the corresponding NARWHAL_ input instead"
            raise PlanError("%s[%d]=%r overrides launcher-managed %s%s, which %s; remove it (%s)"
                            % (where, index, token, flag, form, how, fix), where)
        if is_secret_flag(token):
            raise PlanError("%s[%d] sets %s, which takes a credential and would be written into the launch records, "
                            "the manifest and plan.json; remove it (the engines load the model from "
                            "NARWHAL_MODEL_PATH and need no hub token; the engine API key comes from "
                            "NARWHAL_API_KEY_FILE)" % (where, index, token.split("=", 1)[0]), where)
    return list(args)


def check_env(env, where, allowed=(), release=None):
    """Refuse launcher-managed, secret-looking and malformed variables in an environment mapping (`release`: the
    image's vLLM (major, minor, patch) when known, for the KV lease's name)."""
    if not isinstance(env, dict):
        raise PlanError("%s must be a mapping of variables; %s" % (where, RERUN), where)
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name) or not isinstance(value, str) \
                or "\x00" in value:
            raise PlanError("%s entry %r must be a NAME=string variable" % (where, name), where)
        if lease_like(name):
            raise PlanError(lease_refusal(where, name, release), where)
        if name in MANAGED_ENV and name not in allowed:
            raise PlanError("%s sets %s, which is launcher-managed (the launcher sets it from the record and the role "
                            "environment); remove it (change the corresponding NARWHAL_ input instead)"
                            % (where, name), where)
        if is_secret_name(name):
            raise PlanError("%s sets %s, which looks like a secret and would be written into the launch records; "
                            "remove it (the engine API key comes from NARWHAL_API_KEY_FILE)" % (where, name), where)
    return dict(env)


def parse_env_words(text, where, release=None):
    """KEY=VALUE shell words (NARWHAL_ENGINE_ENV) -> {KEY: VALUE}, checked like a record environment."""
    result = {}
    for entry in split_args(text, where):
        key, sep, value = entry.partition("=")
        if not sep or not ENV_NAME.match(key):
            raise PlanError("%s entry %r is not KEY=VALUE" % (where, entry), where)
        if key in result:
            raise PlanError("%s sets %s twice" % (where, key), where)
        if key in PREFIXED_ENV:
            raise PlanError("%s sets %s, which is launcher-managed (the launcher puts the engine's key guard first on "
                            "it, then the image's own %s); remove it" % (where, key, key), where)
        result[key] = value
    return check_env(result, where, release=release)
