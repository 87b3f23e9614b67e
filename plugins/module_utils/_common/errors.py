# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The refusals every stage raises: InputError (a bad `.env` input, named by its key) and PlanError (a record
or role-environment field the planner refuses, named by the field), with the advice that ends them.
Messages pass through the one redaction (_common/secrets.py): a refusal never prints a token or the key.
"""

from __future__ import annotations

import re

from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import REDACTED, holds_secret, redact_text

__metaclass__ = type

FIX = "correct it in .env (or the environment), then rerun discovery"


class InputError(ValueError):
    """A bad input: `key` names it, the message says what is wrong and how to fix it. The value of a
    secret-looking input and every other secret-looking value in the message show as <redacted>
    (_common/secrets.py::redact_text): an error never prints a token."""

    def __init__(self, key, message):
        if holds_secret(key):
            message = re.sub(r"'[^']*'|\"[^\"]*\"", repr(REDACTED), message)  # a %r of the value itself
        super().__init__(redact_text("%s: %s" % (key, message)))
        self.key = key


# The advice that ends a refusal of generated configuration (prepare's gates).
REGENERATE = ("correct the named input, regenerate the affected configuration (rerun discovery) and prepare a "
              "new run")

RERUN = "rerun discovery"


class PlanError(ValueError):
    """A refused input or record: the message names the field or entry and the fix; `key` names it. Secret-looking
    values in the message are redacted (redact_text): a refusal never prints a token or the API key."""

    def __init__(self, message, key=None):
        super().__init__(redact_text(message))
        self.key = key
