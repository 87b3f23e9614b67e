# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""model_manifest, the step (_common/step.py; plugins/modules/model_manifest.py documents it,
plugins/action/model_manifest.py runs it in the controller's process): the manifest of the checkpoint in
NARWHAL_MODEL_SOURCE, made once at the source (docs/delivery.md, "Checkpoints").

Every file of the directory (_deliver/model_host.py::checkpoint_files, the walk the hosts use: symbolic links inside it
followed, the STAMP and directories named .* left out) is hashed 1 MiB at a time, except a file whose size and
mtime_ns equal what the previous run recorded in <config_dir>/model-manifest.json: its sha256 is taken from there.
That file holds the manifest (_deliver/manifest.py) with the source and what was seen of each file, and is written
whole (_outputs/private_file.py::write_whole) only when it differs: a rerun over an unchanged checkpoint hashes
nothing and writes nothing.
"""

from __future__ import annotations

import json
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import file_sha256
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver import model_host
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import manifest
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.private_file import write_whole

INPUT = "NARWHAL_MODEL_SOURCE"
# what a checkpoint's top holds (a Hugging Face config; Mistral's params.json, which discovery's reader takes too)
CONFIG_NAMES = ("config.json", "params.json")
FIX = ("set %s in .env to the controller directory that holds the checkpoint (Hugging Face format: config.json, the "
       "tokenizer files, the *.safetensors shards and their index), or unset it to deliver no checkpoint" % INPUT)


def module_spec():
    """The argument spec of model_manifest (its action plugin validates with it; the module documents it)."""
    return dict(
        argument_spec=dict(
            source=dict(type="path", required=True),
            root=dict(type="path"),
            dest=dict(type="path", required=True),
        ),
        supports_check_mode=True,
    )


def _refuse(msg):
    raise StepError("%s: %s" % (INPUT, msg), input=INPUT)


def _source_files(source):
    """{rel: os.stat_result} of the checkpoint at `source`, or the refusal naming NARWHAL_MODEL_SOURCE and the fix."""
    if not os.path.isdir(source):
        _refuse("%s is not a directory on the controller; %s" % (source, FIX))
    try:
        files, links_out, odd = model_host.checkpoint_files(source)
    except OSError as exc:
        _refuse("cannot read %s: %s; make it readable by the user that runs ansible-playbook"
                % (exc.filename or source, exc.strerror or exc))
    if links_out:
        rel, target = links_out[0]
        _refuse("%s/%s is a symbolic link to %s, outside the directory (a Hugging Face cache snapshot links into its "
                "blobs); copy the checkpoint with its links resolved (cp -rL, or huggingface-cli download --local-dir "
                "<dir>) and point %s at the copy" % (source, rel, target, INPUT))
    if odd:
        _refuse("%s holds %s, which is not a regular file or directory (a dangling link, a FIFO, a socket, or a link "
                "to a directory above it); remove it" % (source, ", ".join("%s/%s" % (source, r) for r in odd)))
    if not files:
        _refuse("%s holds no files; %s" % (source, FIX))
    if not any(name in files for name in CONFIG_NAMES):
        _refuse("%s has no config.json, so it is not a checkpoint directory; %s" % (source, FIX))
    return files


def _previous(dest, source):
    """{rel: (size, mtime_ns, sha256)} of what the previous run recorded for this source in the cache file `dest`
    ({} when there is none, it is not one, or it was made for another directory)."""
    try:
        with open(dest, "rb") as fh:
            document = json.loads(fh.read().decode("utf-8"))
        if document.get("source") != source:
            return {}
        files, seen = document["files"], document["seen"]
        return dict((rel, (int(seen[rel][0]), int(seen[rel][1]), str(files[rel]["sha256"])))
                    for rel in files if rel in seen and int(files[rel]["size"]) == int(seen[rel][0]))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return {}


def _hash(source, rel, st):
    """The sha256 of source/rel, refused when the file changed while it was read (its size or mtime_ns)."""
    path = os.path.join(source, rel)
    try:
        sha256 = file_sha256(path)
        after = os.stat(path)
    except OSError as exc:
        _refuse("cannot read %s: %s; make it readable by the user that runs ansible-playbook"
                % (path, exc.strerror or exc))
    if (after.st_size, after.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
        _refuse("%s changed while it was hashed; rerun once nothing writes the checkpoint" % path)
    return sha256


def source_manifest(source, previous):
    """(files, seen, hashed) of the checkpoint at `source`: the manifest's files map, {rel: [size, mtime_ns]}, and
    the files hashed this time (the others' sha256 from `previous`, _previous()'s map)."""
    files, seen, hashed = {}, {}, []
    for rel, st in sorted(_source_files(source).items()):
        known = previous.get(rel)
        if known and known[:2] == (st.st_size, st.st_mtime_ns):
            sha256 = known[2]
        else:
            sha256 = _hash(source, rel, st)
            hashed.append(rel)
        files[rel] = {"size": st.st_size, "sha256": sha256}
        seen[rel] = [st.st_size, st.st_mtime_ns]
    return files, seen, hashed


def _cache_text(source, document, seen):
    body = dict(document, source=source, seen=seen)
    return json.dumps(body, sort_keys=True, indent=1) + "\n"


def _current(dest):
    try:
        with open(dest, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StepError("cannot read %s: %s; remove it (the deliver stage makes it again)" % (dest, exc.strerror),
                        dest=dest)


def model_manifest(run):
    """The step: {changed, source, dest, digest, files, bytes, count, hashed}."""
    params = run.params
    raw = params["source"]
    source = raw if os.path.isabs(raw) or not params.get("root") else os.path.join(params["root"], raw)
    source = os.path.realpath(source)
    dest = params["dest"]
    if not os.path.isabs(dest) and params.get("root"):
        dest = os.path.join(params["root"], dest)
    files, seen, hashed = source_manifest(source, _previous(dest, source))
    document = manifest(files)
    data = _cache_text(source, document, seen).encode("utf-8")
    changed = _current(dest) != data
    if changed and not run.check_mode:
        try:
            os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
            write_whole(dest, data, mode=0o644)
        except OSError as exc:
            raise StepError("cannot write %s: %s; check that NARWHAL_CONFIG_DIR is a writable directory"
                            % (dest, exc.strerror or exc), dest=dest)
    return {"changed": changed, "source": source, "dest": dest, "digest": document["digest"],
            "files": document["files"], "bytes": sum(e["size"] for e in files.values()), "count": len(files),
            "hashed": hashed}
