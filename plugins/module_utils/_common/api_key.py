# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The engine API key file's one rule, for prepare (_prepare/run.py), the probes and the attestation check
(_common/http.py) and the launcher (narwhal_launcher/common.py, which carries this file). Pure: the callers read the
file (its bytes and st_mode); a refusal names the file, never the key.

The file holds the key on its first line and, while a rotation is under way (docs/security.md, "Rotating the key"),
the previous key on a second line, which the engines still accept: api_key_from gives the key (the first line: what
every client of the engines sends), api_keys_from both. The engines' key guard (roles/install/files/guard/
narwhal_guard.py) reads the same file with the same rule (a unit test holds the two to the same answers).
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError

__metaclass__ = type

API_KEY_MAX_BYTES = 65536

# the most keys a key file holds: the key and, during a rotation, the previous one
MAX_KEYS = 2

KEY_NAME = "NARWHAL_API_KEY_FILE"


def _bad_character(key):
    """The first character of `key` that cannot travel in `Authorization: Bearer <key>` as every client sends it
    (printable ASCII without spaces), or None."""
    return next((ch for ch in key if not "!" <= ch <= "~"), None)


def _name(ch):
    return "U+%04X" % ord(ch)


def api_keys_from(raw, mode, path):
    """The keys a key file (its bytes and st_mode) holds, the one rule for prepare, the launcher and the probes:
    mode 0600 or 0400 (no group or other bits), at most API_KEY_MAX_BYTES of UTF-8 text, the key on the first line
    and, during a rotation, the previous key (still accepted) on the second; each printable ASCII without spaces,
    the two different; blank lines at the end are ignored. -> [key] or [key, previous]. Raises PlanError naming the
    file and the fix, never a key."""
    if mode & 0o077:
        raise PlanError("the engine API key file %s has mode %04o; it must be 0600 or 0400 (chmod 600 %s)"
                        % (path, mode & 0o7777, path), KEY_NAME)
    if len(raw) > API_KEY_MAX_BYTES or b"\x00" in raw:
        raise PlanError("the engine API key file %s holds NUL bytes or over %d bytes; write the key alone into it"
                        % (path, API_KEY_MAX_BYTES), KEY_NAME)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PlanError("the engine API key file %s is not UTF-8 text; write the key alone into it" % path, KEY_NAME)
    lines = [line.strip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise PlanError("the engine API key file %s is empty; it must hold exactly one non-empty line, the key "
                        "(during a rotation a second line, the previous key)" % path, KEY_NAME)
    if not lines[0]:
        raise PlanError("the engine API key file %s has an empty first line; the key goes on the first line (and, "
                        "during a rotation, the previous key on the second)" % path, KEY_NAME)
    if len(lines) > MAX_KEYS or not all(lines):
        raise PlanError("the engine API key file %s holds %d lines%s; it holds the key on the first line and, during "
                        "a rotation, the previous key on the second, nothing else (docs/security.md, \"Rotating the "
                        "key\")" % (path, len(lines), " with an empty one" if not all(lines) else ""), KEY_NAME)
    for number, key in enumerate(lines, 1):
        bad = _bad_character(key)
        if bad is not None:
            raise PlanError("the engine API key file %s holds on line %d a key with the character %s (a space, a "
                            "control or a non-ASCII character), which a client cannot send as `Authorization: Bearer "
                            "<key>`; use printable ASCII, e.g. openssl rand -hex 32" % (path, number, _name(bad)),
                            KEY_NAME)
    if len(lines) == MAX_KEYS and lines[0] == lines[1]:
        raise PlanError("the engine API key file %s holds the same key on both lines; the second line is the previous "
                        "key during a rotation: remove it, or put the new key on the first line" % path, KEY_NAME)
    return lines


def api_key_from(raw, mode, path):
    """The engine API key held by a key file (its bytes and st_mode): its first line, the key every client of the
    engines sends (api_keys_from's rule). Raises PlanError naming the file, never the key."""
    return api_keys_from(raw, mode, path)[0]
