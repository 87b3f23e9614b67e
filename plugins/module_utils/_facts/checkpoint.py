# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of a checkpoint directory on a host: config.json (or params.json), tokenizer_config.json,
the names of the tokenizer files and the manifest the deliver stage stamped there (_deliver/manifest.py's STAMP),
each read as a bounded regular file (_common/tools.py); read_model is the same read for a module (narwhal_model),
failing it with the message that names the path.
"""

from __future__ import annotations

import json
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    NotRegularFileError,
    path_kind,
    read_regular,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import (
    STAMP,
    STAMP_MAX_BYTES,
    canonical_files,
    manifest_digest,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import (
    TOKENIZER_FILE_NAMES,
    ModelConfigError,
    model_facts,
)

# --------------------------------------------------------------------------------------------------
# the file-reading helper


def load_json_file(file_path):
    """(bytes, parsed JSON) of a regular file; never blocks on a FIFO (see _common/tools.py::open_regular)."""
    try:
        raw = read_regular(file_path)
    except NotRegularFileError as exc:
        raise ModelConfigError(f"{exc}; the checkpoint's JSON files must be regular files (or links to them)") from None
    except OSError as exc:
        raise ModelConfigError(f"cannot read {file_path}: {exc.strerror or exc}") from None
    try:
        # allow_nan: Nemotron-H configs carry a bare Infinity (time_step_limit), which Python's json reads
        return raw, json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"{file_path} is not UTF-8 text: {exc}") from None
    except ValueError as exc:
        raise ModelConfigError(f"{file_path} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ModelConfigError(f"{file_path} is nested too deeply to be a model configuration (more levels of "
                               "objects or arrays than JSON readers allow); replace it with the checkpoint's "
                               "own file") from None


def _kind(path, what):
    """True when `path` is a regular file or a directory, False when nothing is there; ModelConfigError naming
    what else it is (a FIFO, a socket, a device, a symlink loop). Only stats: opening a FIFO would block."""
    try:
        kind = path_kind(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ModelConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if kind == "a symlink loop":
        raise ModelConfigError(f"{what} {path} is a symlink loop (a link that leads back to itself); point it at "
                               "the real checkpoint")
    if kind is not None and what == "model path":
        raise ModelConfigError(f"model path {path} is {kind}, not a checkpoint directory; point the model path at "
                               "the checkpoint directory that holds config.json")
    if kind is not None:
        raise ModelConfigError(f"{what} {path} is {kind}, not a regular file; replace it with the checkpoint's own "
                               "file")
    return True


def checkpoint_config_path(path):
    """The config.json of checkpoint directory `path`; ModelConfigError naming what is wrong: missing, a FIFO,
    a socket or device, a symlink loop, not a directory, no config.json. Nothing is opened (a FIFO would block)."""
    if not _kind(path, "model path"):
        if os.path.islink(path):
            raise ModelConfigError(f"model path {path} is a symlink to {os.readlink(path)}, which does not exist on "
                                   "this host; stage the checkpoint there or point the model path at it")
        raise ModelConfigError(
            f"model path {path} does not exist on this host; set the model path input to the checkpoint directory"
        )
    if not os.path.isdir(path):
        raise ModelConfigError(
            f"model path {path} is not a directory; give the checkpoint directory that holds config.json"
        )
    config_path = os.path.join(path, "config.json")
    if os.path.isdir(config_path):
        raise ModelConfigError(f"{config_path} is a directory, not a file; {path} is not a Hugging Face checkpoint "
                               "directory (point the model path at the directory that holds config.json)")
    if not _kind(config_path, "config file"):
        raise ModelConfigError(
            f"{config_path} does not exist: {path} is not a Hugging Face checkpoint directory (download the full model "
            "repository, or point the model path at the directory that holds config.json)"
        )
    return config_path


# The fix of a damaged STAMP: the deliver stage checks the checkpoint against the source's manifest again and writes
# the STAMP anew (roles/deliver, model_delivery state=commit); a site that does not deliver its checkpoint removes it.
STAMP_FIX = ("rerun the deliver stage (ansible-playbook narwhal.deploy.deliver with NARWHAL_MODEL_SOURCE set), which "
             "checks the checkpoint again and writes the file anew, then rerun discovery; on a site that does not "
             "deliver its checkpoint, remove the file")


def _stamp_files(stamp_path, document):
    """The files map of a parsed STAMP, canonical ({rel: {size, sha256}}); ModelConfigError when it has none."""
    files = document.get("files") if isinstance(document, dict) else None
    try:
        if not isinstance(files, dict) or not all(isinstance(rel, str) and isinstance(e, dict)
                                                  for rel, e in files.items()):
            raise TypeError("no files map")
        return canonical_files(files)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelConfigError(f"the model manifest {stamp_path} is damaged (its files map: {exc}); {STAMP_FIX}") \
            from None


def read_stamp(path):
    """The manifest checkpoint directory `path` holds (the STAMP the deliver stage wrote after its full check):
    {"digest", "files"} with the digest recomputed from the files (manifest_digest), or None without a STAMP.
    ModelConfigError naming the file and the fix (STAMP_FIX) when it is not a readable regular file, not JSON, has
    no files map or a digest that is not its files'."""
    stamp_path = os.path.join(path, STAMP)
    try:
        raw = read_regular(stamp_path, STAMP_MAX_BYTES)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError) and not os.path.islink(stamp_path):
            return None
        raise ModelConfigError(f"cannot read the model manifest {stamp_path}: {exc.strerror or exc}; {STAMP_FIX}") \
            from None
    if len(raw) > STAMP_MAX_BYTES:
        raise ModelConfigError(f"the model manifest {stamp_path} is larger than {STAMP_MAX_BYTES} bytes, not one the "
                               f"deliver stage wrote; {STAMP_FIX}")
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ModelConfigError(f"the model manifest {stamp_path} is not valid JSON ({exc.__class__.__name__}: "
                               f"{exc}); {STAMP_FIX}") from None
    files = _stamp_files(stamp_path, document)
    digest = manifest_digest(files)
    if document.get("digest") != digest:
        raise ModelConfigError(f"the model manifest {stamp_path} records digest {document.get('digest')!r}, but its "
                               f"files map has digest {digest}: the file was changed after the deliver stage wrote "
                               f"it; {STAMP_FIX}")
    return {"digest": digest, "files": files}


def read_checkpoint(path):
    """Read ``config.json`` (+ ``tokenizer_config.json``, tokenizer file names and the STAMP) below ``path``.

    Returns the facts of :func:`model_facts`, with ``manifest`` (read_stamp) only when the checkpoint holds a STAMP
    (so a checkpoint without one has the facts it had before delivery); raises ModelConfigError naming the path on
    any problem.
    """
    config_path = checkpoint_config_path(path)
    config_bytes, config = load_json_file(config_path)
    tokenizer_config = None
    tokenizer_config_path = os.path.join(path, "tokenizer_config.json")
    if not os.path.isdir(tokenizer_config_path) and _kind(tokenizer_config_path, "tokenizer config"):
        _raw, tokenizer_config = load_json_file(tokenizer_config_path)
    try:
        names = set(os.listdir(path))
    except OSError as exc:
        raise ModelConfigError(f"cannot list {path}: {exc}") from None
    tokenizer_files = [name for name in names if name in TOKENIZER_FILE_NAMES or name.endswith(".tiktoken")]
    facts = model_facts(path, config_bytes, config, tokenizer_config, tokenizer_files)
    manifest = read_stamp(path)
    if manifest is not None:
        facts["manifest"] = manifest
    return facts


def read_model(module, path):
    """narwhal_model: the checkpoint's config (config.json, tokenizer_config.json); no container, no cache
    (the read is two small files, as cheap as hashing them for a cache key)."""
    try:
        return read_checkpoint(path)
    except ModelConfigError as exc:
        module.fail_json(msg=str(exc))
    return None  # not reached
