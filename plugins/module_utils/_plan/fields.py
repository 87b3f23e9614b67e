# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The planner's two inputs read by name (pure): a launch record's fields (dotted paths, with their type) and the
role environment's keys. Each refusal raises PlanError(message, key) naming the field or key, so the planner, the
launcher's image check and its status name the same thing the same way."""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import RERUN, PlanError

__metaclass__ = type


def record_field(record, dotted, kind, allow_empty=True):
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


def role_value(role_env, key):
    value = role_env.get(key, "")
    if not value:
        raise PlanError("role env %s is not set; rerun install (prepare a new run) to write the engine's role "
                        "environment" % key, key)
    return value


def role_port(role_env, key):
    value = role_value(role_env, key)
    if not (value.isascii() and value.isdigit()) or not 0 < int(value) < 65536:
        raise PlanError("role env %s=%r is not a TCP port (1-65535)" % (key, value), key)
    return int(value)
