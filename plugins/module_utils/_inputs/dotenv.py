# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of `.env` files on the controller (site_inputs, the fleet lookup, scripts/narwhal-fleet).

Values are literal: python-dotenv's `${VAR}` expansion is off (interpolate=False), so nothing of the controller's
environment (a token, $HOME) is pulled into a value or an error message. The only substitution narwhal.deploy
does is the complete-value `${NAME}` of the fleet file (_plan/subst.py, docs/substitution.md), which is separate.
The file is read once, as a regular file (a FIFO never blocks the read, see _common/tools.py::open_regular), as UTF-8.
"""

from __future__ import annotations

import io
import re
import traceback

from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import read_regular

__metaclass__ = type

try:
    from dotenv import dotenv_values
except ImportError:
    dotenv_values = None
    DOTENV_IMPORT_ERROR = traceback.format_exc()
else:
    DOTENV_IMPORT_ERROR = None

MAX_BYTES = 1024 * 1024  # a site .env is a few KiB; a bigger file is not one

EXPANSION = re.compile(r"\$\{[^}]*\}")


class DotenvError(ValueError):
    """The file cannot be read as a .env; the message names it and the cause."""


def parse_dotenv(text):
    """{name: value} of .env text, values literal (no ${VAR} expansion); a name without '=' maps to None."""
    if dotenv_values is None:
        raise DotenvError("python-dotenv is not installed on the controller (pip install python-dotenv)")
    return dict(dotenv_values(stream=io.StringIO(text), interpolate=False))


def read_dotenv_bytes(path):
    """The raw bytes of a .env file; DotenvError naming the path when it is not a readable regular file."""
    try:
        raw = read_regular(path, MAX_BYTES)
    except OSError as exc:
        raise DotenvError("cannot read %s (%s)" % (path, exc.strerror or exc)) from None
    if len(raw) > MAX_BYTES:
        raise DotenvError("%s is larger than %d bytes, which no .env is" % (path, MAX_BYTES))
    return raw


def decode_dotenv(path, raw):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DotenvError("%s is not UTF-8 text (%s)" % (path, exc)) from None


def read_dotenv(path):
    """{name: value} of the .env file at `path` (literal values); DotenvError naming the path on any problem."""
    return parse_dotenv(decode_dotenv(path, read_dotenv_bytes(path)))


def literal_expansions(values):
    """Names whose value holds a `${...}` that stays literal (for a warning: shells and older tools expand it)."""
    return sorted(k for k, v in values.items() if isinstance(v, str) and EXPANSION.search(v))
