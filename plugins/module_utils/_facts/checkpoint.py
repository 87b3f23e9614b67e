# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader of a checkpoint directory on a host: config.json (or params.json), tokenizer_config.json
and the names of the tokenizer files, each read as a bounded regular file (_common/tools.py); read_model is the
same read for a module (narwhal_model), failing it with the message that names the path.
"""

from __future__ import annotations

import json
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    NotRegularFileError,
    path_kind,
    read_regular,
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


def read_checkpoint(path):
    """Read ``config.json`` (+ ``tokenizer_config.json`` and tokenizer file names) below ``path``.

    Returns the facts of :func:`model_facts`; raises ModelConfigError naming the path on any problem.
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
    return model_facts(path, config_bytes, config, tokenizer_config, tokenizer_files)


def read_model(module, path):
    """narwhal_model: the checkpoint's config (config.json, tokenizer_config.json); no container, no cache
    (the read is two small files, as cheap as hashing them for a cache key)."""
    try:
        return read_checkpoint(path)
    except ModelConfigError as exc:
        module.fail_json(msg=str(exc))
    return None  # not reached
