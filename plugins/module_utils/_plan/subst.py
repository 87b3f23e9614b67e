# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Complete-value substitution (docs/architecture.md, "Complete-value substitution"; docs/substitution.md), shared by
the resolve_values filter, the fleet lookup, the narwhal-fleet command and the planner.

A JSON string that is exactly ${NAME} becomes NAME's value; any other string holding "${" is an error;
an unset NAME is an error naming it; the result is not substituted again. A blank value (empty or only white space)
is unset, as it is for discovery (_inputs/validate.py::load_inputs): `NARWHAL_NODE_1_URL=` in .env leaves the URL
discovery derived in config/deployment.env in force, never an empty URL.
"""

from __future__ import annotations

import re

__metaclass__ = type

COMPLETE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")


class SubstitutionError(ValueError):
    pass


def resolve_values(data, env, where="$"):
    """Return a copy of `data` (JSON-like) with complete ${NAME} values replaced from `env`."""
    if isinstance(data, dict):
        return dict((k, resolve_values(v, env, "%s.%s" % (where, k))) for k, v in data.items())
    if isinstance(data, list):
        return [resolve_values(v, env, "%s[%d]" % (where, i)) for i, v in enumerate(data)]
    if isinstance(data, str) and "${" in data:
        m = COMPLETE.match(data)
        if not m:
            raise SubstitutionError(
                "%s: %r is not a complete ${NAME} value; only whole values are substituted "
                "(write the full value in the environment and reference it as \"${NAME}\")" % (where, data))
        name = m.group(1)
        if is_blank(env.get(name)):
            raise SubstitutionError(
                "%s: ${%s} is not set%s; define %s in the environment, .env or config/deployment.env "
                "(run discovery to generate the NARWHAL_NODE_<n>_* values)"
                % (where, name, "" if env.get(name) is None else " (its value is blank, which counts as unset)", name))
        return env[name]
    return data


def is_blank(value):
    """None, or a string of nothing but white space: unset, for discovery and for substitution alike."""
    return value is None or (isinstance(value, str) and not value.strip())


def layered_env(process_env, dotenv, deployment_env):
    """Values from the process environment over .env over config/deployment.env; a blank value hides nothing
    below it (it is unset, as discovery reads it)."""
    merged = {}
    for layer in (deployment_env, dotenv, process_env):
        merged.update((k, v) for k, v in (layer or {}).items() if not is_blank(v))
    return merged
