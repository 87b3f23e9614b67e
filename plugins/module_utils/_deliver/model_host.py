# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The checkpoint on an engine host: the work of model_delivery (plugins/modules/model_delivery.py), and the walk and
the chunked sha256 that the source's manifest (the model_manifest step, _deliver/model_source.py) shares, so that the
controller and the hosts agree on which files a checkpoint holds (docs/delivery.md, "Checkpoints").

state=check compares the checkpoint a host holds with the source's manifest: fast, the STAMP the last commit wrote
(_deliver/manifest.py) against one stat of every file (size and mtime_ns); full, the sha256 of every file. Nothing
changes. state=commit checks the copy the sync made beside the checkpoint (<dest>.narwhal-partial) whole against the
manifest, writes the STAMP into it and swaps it into place: dest -> <dest>.narwhal-previous, partial -> dest (two
renames in one directory: the checkpoint is either the old one, for an instant absent, or the new one, checked whole;
never a half copy). Python 3.8 and the standard library: it ships to the hosts.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile

from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import file_sha256
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.manifest import (
    MANIFEST_VERSION,
    STAMP,
    STAMP_MAX_BYTES,
    canonical_files,
    describe_difference,
    differing_files,
    manifest_digest,
)

PARTIAL = ".narwhal-partial"  # the sync's copy beside the checkpoint: <dest>.narwhal-partial
PREVIOUS = ".narwhal-previous"  # the checkpoint a commit moved aside: <dest>.narwhal-previous
RESYNC = ("rerun the deliver stage (ansible-playbook narwhal.deploy.deliver), which syncs the copy again comparing "
          "every file by checksum")


class DeliveryError(Exception):
    """A refusal of model_delivery: the message names the host path and the fix; `differing` the files concerned."""

    def __init__(self, msg, differing=None):
        super().__init__(msg)
        self.differing = list(differing or [])


# ------------------------------------------------------------------------------------------------
# the files of a checkpoint directory (shared with the source's manifest)


def _inside(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def checkpoint_files(root):
    """The files of checkpoint directory `root`: (files, links_out, odd). `files` maps each regular file's path
    relative to root ('/'-separated) to its os.stat_result (symbolic links followed); `links_out` lists (rel, target)
    of each symbolic link that leads out of root; `odd` the relative paths that are neither a file nor a directory
    (a dangling link, a FIFO, a socket, a device) or a link back to a directory above it. Not part of a checkpoint:
    the STAMP at its top and every directory whose name starts with '.' (.cache, .git: a download tool's, not the
    model's)."""
    real_root = os.path.realpath(root)
    files, links_out, odd = {}, [], []
    _visit(root, "", (real_root,), real_root, files, links_out, odd)
    return files, links_out, odd


def _visit(directory, prefix, above, real_root, files, links_out, odd):
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        rel = prefix + entry.name
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if not _inside(target, real_root):
                links_out.append((rel, os.readlink(entry.path)))
                continue
        if entry.is_dir():
            real = os.path.realpath(entry.path)
            if entry.name.startswith("."):
                continue
            if real in above:
                odd.append(rel)
                continue
            _visit(entry.path, rel + "/", above + (real,), real_root, files, links_out, odd)
        elif entry.is_file():
            if rel != STAMP:
                files[rel] = os.stat(entry.path)
        else:
            odd.append(rel)


# ------------------------------------------------------------------------------------------------
# the STAMP


def read_stamp(path):
    """The STAMP of checkpoint directory `path` as written by a commit ({"version", "digest", "files": {rel: {size,
    sha256, mtime_ns}}}), or None when there is none or it is not one (unreadable, not JSON, no files map). Lenient on
    purpose, unlike discovery's strict reader (_facts/checkpoint.py::read_stamp, which this host module may not ship):
    here a damaged STAMP only means the host does not match, so it is synced, checked and stamped again."""
    stamp_path = os.path.join(path, STAMP)
    try:
        st = os.lstat(stamp_path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > STAMP_MAX_BYTES:
            return None
        with open(stamp_path, "rb") as fh:
            document = json.loads(fh.read().decode("utf-8"))
        files = document["files"]
        canonical_files(files)
        if not isinstance(document["digest"], str):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return document


def stamp_document(digest, files, stats):
    """The STAMP a commit writes: the manifest (version, digest, files) with each file's mtime_ns on this host."""
    entries = dict((rel, dict(entry, mtime_ns=stats[rel].st_mtime_ns)) for rel, entry in canonical_files(files).items())
    return {"version": MANIFEST_VERSION, "digest": digest, "files": entries}


def _write_stamp(directory, document):
    """The STAMP into `directory` whole (a temporary file of the same directory, fsync, rename), mode 0644."""
    data = (json.dumps(document, sort_keys=True, indent=1) + "\n").encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=".narwhal-stamp.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, os.path.join(directory, STAMP))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ------------------------------------------------------------------------------------------------
# state=check


def _fast_differing(files, stamp, found):
    """{rel: why} of the files whose stat differs from what the STAMP recorded, or that the STAMP does not hold as
    the manifest does (missing, extra, another size or sha256)."""
    recorded = stamp["files"] if stamp else {}
    why = {}
    for rel in sorted(set(files) | set(found)):
        if rel not in found:
            why[rel] = "missing"
        elif rel not in files:
            why[rel] = "not in the manifest"
        elif found[rel].st_size != files[rel]["size"]:
            why[rel] = "%d bytes, expected %d" % (found[rel].st_size, files[rel]["size"])
        elif not isinstance(recorded.get(rel), dict) or canonical_files({rel: recorded[rel]}) != {rel: files[rel]}:
            why[rel] = "not checked yet"
        elif recorded[rel].get("mtime_ns") != found[rel].st_mtime_ns:
            why[rel] = "modified since its last check"
    return why


def _describe(why, limit=5):
    words = ["%s (%s)" % (rel, text) for rel, text in sorted(why.items())[:limit]]
    if len(why) > limit:
        words.append("and %d more" % (len(why) - limit))
    return ", ".join(words)


def _stamp_holds(stamp, digest, files, found):
    """The STAMP holds this manifest and records the mtime_ns each file has now."""
    return (stamp is not None and stamp["digest"] == digest and canonical_files(stamp["files"]) == files
            and all(stamp["files"][rel].get("mtime_ns") == st.st_mtime_ns for rel, st in found.items()))


def rsync_opts(path, exists):
    """The rsync options of the sync into <path>.narwhal-partial/ beside checkpoint `path` (besides synchronize's
    own): the source's STAMP and its directories named .* are not part of the checkpoint (checkpoint_files), and
    with a checkpoint in place, every file it holds unchanged is hard-linked from it (--link-dest) instead of sent."""
    opts = ["--exclude=/" + STAMP, "--exclude=.*/"]
    if exists:
        opts.append("--link-dest=" + path.rstrip("/"))
    return opts


def check(path, digest, files, verify):
    """state=check: {match, exists, parent_exists, stamp_digest, differing, damaged, difference, reason,
    rsync_opts} of the checkpoint at `path` against the manifest (digest, files); `verify` fast (stat against the
    STAMP) or full (sha256: `damaged` names the files of the manifest's size whose sha256 differs, which rsync's
    quick check on size and mtime would keep)."""
    files = canonical_files(files)
    result = {"path": path, "match": False, "exists": os.path.isdir(path), "stamp_digest": None, "damaged": [],
              "parent_exists": os.path.isdir(os.path.dirname(path.rstrip("/")) or "/")}
    result["rsync_opts"] = rsync_opts(path, result["exists"])
    if not result["exists"]:
        result.update(differing=sorted(files), difference="no checkpoint at %s" % path,
                      reason="%s holds no checkpoint" % path)
        return result
    stamp = read_stamp(path)
    result["stamp_digest"] = stamp["digest"] if stamp else None
    found, _links_out, odd = checkpoint_files(path)
    if verify == "full":
        hashed = dict((rel, {"size": st.st_size, "sha256": file_sha256(os.path.join(path, rel))})
                      for rel, st in found.items())
        differing = differing_files(files, hashed)
        difference = describe_difference(files, hashed)
        result["damaged"] = [rel for rel in differing if rel in files and rel in hashed
                             and hashed[rel]["size"] == files[rel]["size"]]
    else:
        why = _fast_differing(files, stamp, found)
        differing, difference = sorted(why), _describe(why)
    differing = sorted(set(differing) | set(odd))
    if odd:
        difference = ", ".join(w for w in (difference, "%s (not a regular file)" % ", ".join(odd)) if w)
    result.update(differing=differing, difference=difference)
    if differing:
        result["reason"] = "%s differs from the manifest %s: %s" % (path, digest, difference)
    elif not _stamp_holds(stamp, digest, files, found):
        result["reason"] = ("%s holds the manifest's files, but its %s does not record them as they are now (no "
                            "check by the deliver stage since they were written)" % (path, STAMP))
    else:
        result.update(match=True, reason="%s holds the manifest %s (%s check)" % (path, digest, verify))
    return result


# ------------------------------------------------------------------------------------------------
# state=commit


def _verified(partial, digest, files):
    """The os.stat_result of each file of the copy at `partial`, once every file's sha256 matched the manifest;
    DeliveryError naming the copy and describe_difference() otherwise (its `differing`: the files to sync again)."""
    if manifest_digest(files) != digest:
        raise DeliveryError("the manifest given for %s is not %s (its files digest to %s): pass the files and the "
                            "digest of one model_manifest result" % (partial, digest, manifest_digest(files)))
    found, links_out, odd = checkpoint_files(partial)
    strange = odd + [rel for rel, _target in links_out]
    if strange:
        raise DeliveryError("the copy at %s holds %s, which %s not a regular file; remove %s and rerun the deliver "
                            "stage" % (partial, ", ".join(strange), "is" if len(strange) == 1 else "are", partial),
                            strange)
    hashed = dict((rel, {"size": st.st_size, "sha256": file_sha256(os.path.join(partial, rel))})
                  for rel, st in found.items())
    differing = differing_files(files, hashed)
    if differing:
        raise DeliveryError("the copy at %s does not match the manifest %s: %s; %s"
                            % (partial, digest, describe_difference(files, hashed), RESYNC), differing)
    return found


def _received(found, dest):
    """(received, replaced): the files of the copy that are not hard links of dest's (the sync wrote them: rsync's
    --link-dest links every file dest holds unchanged), and those of them that dest held under the same name."""
    received, replaced = [], []
    for rel, st in sorted(found.items()):
        try:
            held = os.stat(os.path.join(dest, rel))
        except OSError:
            received.append(rel)
            continue
        if (held.st_dev, held.st_ino) != (st.st_dev, st.st_ino):
            received.append(rel)
            replaced.append(rel)
    return received, replaced


def _fsync_dir(directory):
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def swap(partial, dest):
    """dest -> dest.narwhal-previous (an older one removed first), partial -> dest; the previous name of dest when it
    existed. A failed second rename puts dest back."""
    previous = dest + PREVIOUS
    held = os.path.lexists(dest)
    if held and not os.path.isdir(dest):
        raise DeliveryError("%s is not a directory; move it away and rerun the deliver stage" % dest)
    if os.path.lexists(previous):
        if os.path.isdir(previous) and not os.path.islink(previous):
            shutil.rmtree(previous)
        else:
            os.unlink(previous)
    if held:
        os.rename(dest, previous)
    try:
        os.rename(partial, dest)
    except OSError:
        if held:
            os.rename(previous, dest)
        raise
    _fsync_dir(os.path.dirname(dest) or "/")
    return previous if held else None


def _already_committed(dest, digest, files):
    stamp = read_stamp(dest)
    return stamp is not None and stamp["digest"] == digest and canonical_files(stamp["files"]) == files


def commit(partial, dest, digest, files, check_mode=False):
    """state=commit: the copy at `partial` checked whole against the manifest, its STAMP written, then swapped into
    `dest`. {changed, dest, previous, digest, received, received_bytes, replaced}. Without a copy, a dest whose
    STAMP already holds the manifest is no change (a rerun); anything else is refused naming the path."""
    files = canonical_files(files)
    result = {"changed": False, "dest": dest, "previous": None, "digest": digest, "received": [],
              "received_bytes": 0, "replaced": []}
    if not os.path.isdir(partial):
        if _already_committed(dest, digest, files):
            return result
        if check_mode:  # the sync ran with --dry-run: nothing to check yet
            return dict(result, changed=True)
        raise DeliveryError("no copy of the checkpoint at %s to move into %s: the sync did not run or failed; rerun "
                            "the deliver stage" % (partial, dest))
    if check_mode:
        return dict(result, changed=True)
    found = _verified(partial, digest, files)
    received, replaced = _received(found, dest)
    _write_stamp(partial, stamp_document(digest, files, found))
    try:
        previous = swap(partial, dest)
    except OSError as exc:
        raise DeliveryError("cannot move the checked copy %s into %s: %s; the copy stays (resumable): free %s (a "
                            "mount point or a busy directory cannot be renamed) and rerun the deliver stage"
                            % (partial, dest, exc.strerror or exc, dest))
    return dict(result, changed=True, previous=previous, received=received, replaced=replaced,
                received_bytes=sum(files[rel]["size"] for rel in received))


# ------------------------------------------------------------------------------------------------
# the module


def run_module(module):
    """model_delivery's main(): check or commit -> exit_json; a refusal -> fail_json with `differing`."""
    p = module.params
    try:
        if p["state"] == "check":
            result = check(p["path"], p["digest"], p["files"], p["verify"])
            if not result["match"] and not module.get_bin_path("rsync"):
                module.fail_json(msg="%s does not hold the checkpoint and this host has no rsync, which the deliver "
                                 "stage syncs it with: install rsync (apt-get install rsync, dnf install rsync)"
                                 % p["path"], **result)
            module.exit_json(changed=False, **result)
        module.exit_json(**commit(p["path"], p["dest"], p["digest"], p["files"], module.check_mode))
    except DeliveryError as exc:
        module.fail_json(msg=str(exc), differing=exc.differing)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        reason = "%s: %s" % (exc.filename, exc.strerror) if getattr(exc, "filename", None) else exc
        module.fail_json(msg="model_delivery state=%s on %s: %s" % (p["state"], p["path"], reason))
