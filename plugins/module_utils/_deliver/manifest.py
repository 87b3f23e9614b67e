# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A checkpoint's manifest: the size and sha256 of every file, and its digest (docs/delivery.md, "The manifest").

One owner of the manifest's shape and digest for the deliver stage (made at the source, checked on the hosts), the
host reader of discovery (the manifest a host holds, whose digest goes into the launch record) and prepare (which
compares the manifests of a prefill/decode pair and of an engine's hosts, naming the files that differ). Pure and
Python 3.8 + standard library: it ships to the hosts.

A manifest's `files` maps each file's path relative to the checkpoint directory ('/'-separated) to
{"size": bytes, "sha256": hex}; the digest is "sha256:" + the sha256 of that map's canonical JSON, so two
checkpoints with the same files have the same digest wherever and whenever they were hashed. STAMP, the manifest a
host's checkpoint holds after its full check, is never part of a manifest.
"""

from __future__ import annotations

import hashlib
import json

__metaclass__ = type

STAMP = ".narwhal-manifest.json"
# The largest STAMP a reader takes (discovery's, _facts/checkpoint.py, and the deliver stage's check,
# _deliver/model_host.py): a manifest entry is about 120 bytes, so this holds some 500 000 files (a checkpoint has tens
# to thousands); a larger file is not one the deliver stage wrote.
STAMP_MAX_BYTES = 64 * 1024 * 1024
MANIFEST_VERSION = 1


def canonical_files(files):
    """The {"size", "sha256"} of each file (any other key, such as a host's mtime, left out), in a new dict."""
    return dict((rel, {"size": int(entry["size"]), "sha256": str(entry["sha256"])}) for rel, entry in files.items())


def manifest_digest(files):
    """"sha256:<hex>" of the canonical JSON of canonical_files(files)."""
    text = json.dumps(canonical_files(files), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def manifest(files):
    """The manifest document of a checkpoint's files: version, digest, files (canonical)."""
    canonical = canonical_files(files)
    return {"version": MANIFEST_VERSION, "digest": manifest_digest(canonical), "files": canonical}


def differing_files(expected, found):
    """Sorted relative paths whose entry differs between two files maps: missing from one, another size or sha256."""
    expected, found = canonical_files(expected), canonical_files(found)
    return sorted(rel for rel in set(expected) | set(found) if expected.get(rel) != found.get(rel))


def describe_difference(expected, found, limit=5):
    """A short text naming the files that differ and how: 'model-00002.safetensors (sha256 differs), x (missing)'."""
    expected, found = canonical_files(expected), canonical_files(found)
    names = differing_files(expected, found)
    words = []
    for rel in names[:limit]:
        if rel not in found:
            words.append("%s (missing)" % rel)
        elif rel not in expected:
            words.append("%s (not in the manifest)" % rel)
        elif expected[rel]["size"] != found[rel]["size"]:
            words.append("%s (%d bytes, expected %d)" % (rel, found[rel]["size"], expected[rel]["size"]))
        else:
            words.append("%s (sha256 differs)" % rel)
    if len(names) > limit:
        words.append("and %d more" % (len(names) - limit))
    return ", ".join(words)
