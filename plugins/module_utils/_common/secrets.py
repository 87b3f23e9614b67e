# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What is secret and how it is hidden: the secret-looking names and flags, and the one redaction applied to
every message, argv and record the collection prints or writes (redact_text, redact_argv). Standard
library only: the launcher carries it.
"""

from __future__ import annotations

import re

__metaclass__ = type

REDACTED = "<redacted>"

API_KEY_ENV = "VLLM_API_KEY"

SECRETISH = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")

SECRET_FLAGS = ("--api-key", "--hf-token")  # vLLM serve's flags that take a credential (see is_secret_flag)

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
