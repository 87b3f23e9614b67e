# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An engine's extra arguments and environment as discovery records them (pure): runtime.extra_args (the derived
flags, then NARWHAL_EXTRA_ARGS, NARWHAL_ENGINE_ARGS and NARWHAL_NODE_<n>_EXTRA_ARGS, so the node's value of a flag
wins) and runtime.environment (the image's runtime variables, then NARWHAL_ENGINE_ENV, then the node's), each with
the words of its `sources` entry. Launcher-managed flags and variables and secret-looking names are refused by
the planner's rules (_plan/args.py), naming the input."""

from __future__ import annotations

import shlex

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import is_secret_name
from ansible_collections.narwhal.deploy.plugins.module_utils._common.versions import release_tuple
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import (
    MANAGED_ENV,
    check_args,
    lease_like,
    parse_env_words,
    split_args,
)

__metaclass__ = type


def check_extra_args(key, words):
    """Refuse launcher-managed flags in an extra-arguments input, in the planner's words, naming `key`."""
    try:
        return check_args(words, key)
    except PlanError as exc:
        raise InputError(key, str(exc))


def site_environment(text, key="NARWHAL_ENGINE_ENV", release=None):
    """NARWHAL_ENGINE_ENV -> {name: value}; launcher-managed and secret-looking names refused (the planner's
    rule, naming `key`; `release`: the image's vLLM, for the KV lease's name)."""
    try:
        return parse_env_words(text, key, release)
    except PlanError as exc:
        raise InputError(key, str(exc))


def _checked_args(key, text):
    try:
        return check_extra_args(key, split_args(text, key))
    except PlanError as exc:
        raise InputError(key, str(exc))


def _words(words):
    return " ".join(shlex.quote(w) for w in words)


def _flags(words):
    return [w.split("=", 1)[0].replace("_", "-") for w in words if w.startswith("--")]


def engine_args(n, node_policy, site, model):
    """-> (extra_args, source): derived flags + NARWHAL_EXTRA_ARGS + NARWHAL_ENGINE_ARGS +
    NARWHAL_NODE_<n>_EXTRA_ARGS, in that order, so that vLLM's parser (the last occurrence wins) gives the
    node's value of a flag the site also sets, and the derived flags are kept whatever the extras say."""
    node_key = "NARWHAL_NODE_%d_EXTRA_ARGS" % n
    site_parts = [(key, _checked_args(key, site.get(key))) for key in ("NARWHAL_EXTRA_ARGS", "NARWHAL_ENGINE_ARGS")]
    site_args = [word for _key, words in site_parts for word in words]
    node_args = _checked_args(node_key, node_policy.get("EXTRA_ARGS"))
    derived = ["--trust-remote-code"] if model.get("trust_remote_code") else []
    parts = []
    if derived:
        parts.append("derived --trust-remote-code (auto_map in the checkpoint's model or tokenizer config)")
    parts += ["%s (%s)" % (key, _words(words)) for key, words in site_parts if words]
    if node_args:
        repeated = sorted(set(_flags(site_args)) & set(_flags(node_args)))
        parts.append("%s (%s)%s" % (node_key, _words(node_args),
                                    "; the node's %s wins over the site's (vLLM takes the last)" % ", ".join(repeated)
                                    if repeated else ""))
    source = " + ".join(parts) if parts else (
        "none (no derived flag, NARWHAL_EXTRA_ARGS, NARWHAL_ENGINE_ARGS and %s unset)" % node_key)
    return derived + site_args + node_args, source


def engine_environment(n, node_policy, site, image, sources):
    """The record's runtime.environment: the image's runtime variables, then NARWHAL_ENGINE_ENV, then the node's."""
    release = release_tuple(image["distributions"]["vllm"])
    environment = dict((k, v) for k, v in sorted((image.get("env") or {}).items())
                       if not is_secret_name(k) and k not in MANAGED_ENV and not lease_like(k))
    site_env = site_environment(site.get("NARWHAL_ENGINE_ENV"), release=release)
    node_key = "NARWHAL_NODE_%d_ENGINE_ENV" % n
    node_env = site_environment(node_policy.get("ENGINE_ENV"), node_key, release)
    environment.update(site_env)
    environment.update(node_env)  # the node's value wins
    over = sorted(set(site_env) & set(node_env))
    sources["environment"] = "image %s env (secret-looking and launcher-managed names dropped)%s%s" % (
        image.get("image"), " + NARWHAL_ENGINE_ENV (%s)" % ", ".join(sorted(site_env)) if site_env else "",
        " + %s (%s%s)" % (node_key, ", ".join(sorted(node_env)),
                          "; over the site's %s" % ", ".join(over) if over else "") if node_env else "")
    return environment
