# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Small checkpoints for the deliver stage's tests (_deliver/model_source.py, _deliver/model_host.py, model_delivery): a
directory of files with known contents, and their manifest computed here with hashlib (not by the code under test)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

# config, tokenizer, an index and two shards, one in a subdirectory; a shard larger than one 1 MiB read
CHECKPOINT = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}\n',
    "tokenizer.json": b'{"version": "1.0"}\n',
    "model.safetensors.index.json": b'{"weight_map": {"a": "model-00001-of-00002.safetensors"}}\n',
    "model-00001-of-00002.safetensors": bytes(range(256)) * 10000,
    "shards/model-00002-of-00002.safetensors": b"\x01\x02\x03" * 1000,
}


def make_checkpoint(root, files=None):
    """`files` (rel -> bytes; CHECKPOINT by default) written under `root`, made with its parents; returns root."""
    for rel, data in (CHECKPOINT if files is None else files).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def expected_files(files=None):
    """The manifest's files map of `files` (rel -> bytes), by hashlib."""
    return {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            for rel, data in (CHECKPOINT if files is None else files).items()}


def expected_digest(files=None):
    text = json.dumps(expected_files(files), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def copy_checkpoint(src, dest):
    """What the sync makes: a copy of `src` with each file's mtime kept (rsync --archive)."""
    shutil.copytree(src, dest, copy_function=shutil.copy2)
    return dest


def set_mtime(path, mtime_ns):
    os.utime(path, ns=(mtime_ns, mtime_ns))
