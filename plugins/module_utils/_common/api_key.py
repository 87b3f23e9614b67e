# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine API key file's one rule, for prepare (_prepare/run.py), the probes and the attestation check
(_common/http.py) and the launcher (narwhal_launcher/common.py, which carries this file). Pure: the callers read the
file (its bytes and st_mode); a refusal names the file, never the key.
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError

__metaclass__ = type

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
