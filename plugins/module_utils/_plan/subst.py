# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Complete-value substitution (docs/architecture.md, "Complete-value substitution"; docs/substitution.md), shared by
the resolve_values filter, the fleet lookup, the narwhal-fleet command and the planner.

A JSON string that is exactly ${NAME} becomes NAME's value; any other string holding "${" is an error;
an unset NAME is an error naming it; the result is not substituted again.
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
        if name not in env or env[name] is None:
            raise SubstitutionError(
                "%s: ${%s} is not set; define %s in the environment, .env or config/deployment.env "
                "(run discovery to generate the NARWHAL_NODE_<n>_* values)" % (where, name, name))
        return env[name]
    return data


def layered_env(process_env, dotenv, deployment_env):
    """Values from the process environment over .env over config/deployment.env."""
    merged = dict(deployment_env or {})
    merged.update(dotenv or {})
    merged.update(process_env or {})
    return merged
