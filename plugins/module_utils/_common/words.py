# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Words: one-line values (no control character), vLLM's flag spelling (--x_y is --x-y, unambiguous prefixes)
and the natural order of names like card10. No imports beyond the standard library: every host module may carry it.
"""

from __future__ import annotations

import re

__metaclass__ = type


def natural_key(text):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


# ------------------------------------------------------------------------------------- one-line values

def control_character(text):
    """The first character of `text` that could break a line-based file or a terminal (C0 controls, DEL, C1
    controls, U+2028/U+2029: every line boundary of str.splitlines()), or None. Tab counts too: no value needs it."""
    for ch in text:
        code = ord(ch)
        if code < 0x20 or 0x7f <= code <= 0x9f or ch in "\u2028\u2029":
            return ch
    return None


def canonical_flag(head, known):
    """`head` (a `--flag` without `=value`) as vLLM's parser reads it: --x_y is --x-y, and an unambiguous prefix
    of one of `known` (argparse abbreviations, which vLLM's parser allows) is that flag."""
    if not head.startswith("--"):
        return head
    head = "--" + head[2:].replace("_", "-")
    if head in known:
        return head
    matches = [flag for flag in known if len(head) > 3 and flag.startswith(head)]
    return matches[0] if len(matches) == 1 else head
