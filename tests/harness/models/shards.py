#!/usr/bin/env python3
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A checkpoint directory for the deliver stage to carry: the configuration files of another checkpoint (--like,
e.g. tests/harness/models/tiny-llama) and N weight shards of random bytes with their index, as a sharded Hugging Face
checkpoint lays them out:

  OUT_DIR/config.json, tokenizer_config.json, ...     copied from --like
  OUT_DIR/model-00001-of-0000N.safetensors ...        each a valid safetensors file: one U8 tensor of --shard-mib MiB
  OUT_DIR/model.safetensors.index.json                weight_map of those tensors, metadata.total_size

The bytes are a function of --seed, the shard's number and the size only, so a shard written again is the same file.
A file already holding what it must hold is left alone (same mtime: the deliver stage's manifest reuses its sha256).
The stand-in engine never loads the weights: they are there to be delivered, checked and damaged (scripts/demo.sh,
the installed gate's refusals, bench/delivery.py).

Usage: shards.py OUT_DIR [--like DIR] [--shards N] [--shard-mib M] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys

CHUNK = 64 << 20


def shard_name(i, n):
    return "model-%05d-of-%05d.safetensors" % (i, n)


def header(tensor, size):
    """The safetensors header of one U8 tensor of `size` bytes: 8-byte little-endian length, then JSON padded to 8."""
    doc = json.dumps({"__metadata__": {"format": "pt"},
                      tensor: {"dtype": "U8", "shape": [size], "data_offsets": [0, size]}}, separators=(",", ":"))
    doc += " " * (-len(doc) % 8)
    return struct.pack("<Q", len(doc)) + doc.encode()


def write_shard(path, tensor, size, seed):
    head = header(tensor, size)
    if os.path.isfile(path) and os.path.getsize(path) == len(head) + size:
        with open(path, "rb") as fh:
            if fh.read(len(head)) == head:
                return False
    part = path + ".part"
    with open(part, "wb") as fh:
        fh.write(head)
        done = 0
        while done < size:
            n = min(CHUNK, size - done)
            fh.write(random.Random("%s/%s/%d" % (seed, tensor, done)).randbytes(n))
            done += n
    os.replace(part, path)
    return True


def write_if_differs(path, data):
    try:
        with open(path, "rb") as fh:
            if fh.read() == data:
                return False
    except FileNotFoundError:
        pass
    with open(path + ".part", "wb") as fh:
        fh.write(data)
    os.replace(path + ".part", path)
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("out")
    ap.add_argument("--like", help="a checkpoint directory whose regular files (config, tokenizer) are copied")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--shard-mib", type=float, default=4)
    ap.add_argument("--seed", default="narwhal")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    written = []
    if args.like:
        for name in sorted(os.listdir(args.like)):
            src = os.path.join(args.like, name)
            if os.path.isfile(src) and not name.startswith("."):
                with open(src, "rb") as fh:
                    if write_if_differs(os.path.join(args.out, name), fh.read()):
                        written.append(name)
    size = int(args.shard_mib * (1 << 20))
    weight_map = {}
    for i in range(1, args.shards + 1):
        name, tensor = shard_name(i, args.shards), "narwhal.shard_%d.weight" % i
        weight_map[tensor] = name
        if write_shard(os.path.join(args.out, name), tensor, size, args.seed):
            written.append(name)
    for name in sorted(os.listdir(args.out)):  # shards of another --shards count
        if name.startswith("model-") and name.endswith(".safetensors") and name not in weight_map.values():
            os.remove(os.path.join(args.out, name))
    index = {"metadata": {"total_size": size * args.shards}, "weight_map": weight_map}
    if write_if_differs(os.path.join(args.out, "model.safetensors.index.json"),
                        (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()):
        written.append("model.safetensors.index.json")
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out)
                if os.path.isfile(os.path.join(args.out, f)))
    print("%s: %d shards of %d bytes, %d bytes in all; written: %s"
          % (args.out, args.shards, size, total, ", ".join(written) or "nothing (already there)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
