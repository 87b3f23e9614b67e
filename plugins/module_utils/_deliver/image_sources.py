# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""image_sources, the step (_common/step.py; plugins/modules/image_sources.py documents it,
plugins/action/image_sources.py runs it in the controller's process): what the controller holds for the image plan
(docs/delivery.md, "Images") - the pin file's pins, the archive index of NARWHAL_IMAGE_ARCHIVE_DIR, and the
registries NARWHAL_REGISTRY_AUTH_FILE has credentials for (the file refused unless it is mode 0600 or stricter and
Docker's config.json format; nothing of it but the registries' names leaves this step).

The archive index: each `*.tar` of the directory, its images (manifest.json's Config and RepoTags, read with tarfile)
and its sha256 - from `<name>.tar.sha256` (sha256sum's format) when there is one, else computed once and kept in
`archive_cache` (<config_dir>/image-archives.json) by path, size and mtime; the cache is written (0644) only when it
changes and not in check mode.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.step import StepError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    NotRegularFileError,
    file_sha256,
    read_regular,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.images import (
    ARCHIVE_KEY,
    AUTH_KEY,
    archive_images,
    auth_registries,
    read_pins,
    sidecar_sha256,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._outputs.private_file import write_whole

__metaclass__ = type

CACHE_VERSION = 1


def module_spec():
    """The argument spec of image_sources (its action plugin validates with it; the module documents it)."""
    return dict(
        argument_spec=dict(
            pin_file=dict(type="path", required=True),
            archive_dir=dict(type="path"),
            archive_cache=dict(type="path"),
            auth_file=dict(type="path"),
        ),
        required_by={"archive_dir": ("archive_cache",)},
        supports_check_mode=True,
    )


def _text(path, what):
    """The text of a regular file, None when it is absent; StepError naming `what` otherwise."""
    try:
        return read_regular(path).decode("utf-8")
    except FileNotFoundError:
        return None
    except (NotRegularFileError, OSError, UnicodeDecodeError) as exc:
        raise StepError("%s: %s cannot be read (%s); correct it, then rerun"
                        % (what, path, getattr(exc, "strerror", None) or exc))


def auth_check(path):
    """The registries of the auth file; StepError naming NARWHAL_REGISTRY_AUTH_FILE when it is missing, readable by
    others than its owner, or not Docker's config.json format (never quoting it)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as exc:
        raise StepError("%s: %s cannot be read (%s); correct the path, then rerun" % (AUTH_KEY, path, exc.strerror))
    if mode & 0o077:
        raise StepError("%s: %s has mode %04o; it holds registry credentials and must be readable by its owner only: "
                        "chmod 600 %s, then rerun" % (AUTH_KEY, path, mode, path))
    text = _text(path, AUTH_KEY)
    try:
        return auth_registries(text or "")
    except InputError as exc:
        raise StepError("%s (%s)" % (exc, path))


def _manifest(path, name):
    """The images of a docker save archive (its manifest.json, read with tarfile)."""
    try:
        with tarfile.open(path, "r:") as archive:
            member = archive.extractfile("manifest.json")
            text = member.read().decode("utf-8") if member is not None else ""
    except (tarfile.TarError, KeyError, OSError, UnicodeDecodeError):
        text = ""
    return archive_images(text, name)


def _entry(path, name, seen):
    """The index entry of one archive: {"path", "name", "size", "mtime_ns", "sha256", "images"}; `seen` the cache's
    entry for it, reused when size and mtime are unchanged."""
    st = os.stat(path)
    sidecar = _text(path + ".sha256", ARCHIVE_KEY)
    if seen and (seen.get("size"), seen.get("mtime_ns")) == (st.st_size, st.st_mtime_ns):
        entry = dict(seen)
    else:
        entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "images": _manifest(path, name),
                 "sha256": None if sidecar is not None else file_sha256(path)}
    if sidecar is not None:
        entry["sha256"] = sidecar_sha256(sidecar, name)
    elif not entry.get("sha256"):
        entry["sha256"] = file_sha256(path)
    return dict(entry, path=path, name=name)


def archive_index(directory, cache_path, check_mode):
    """[index entries] of directory's *.tar, in name order; the cache rewritten when it changed."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".tar"))
    except OSError as exc:
        raise StepError("%s: %s cannot be listed (%s); correct it, then rerun" % (ARCHIVE_KEY, directory, exc.strerror))
    try:
        cached = json.loads(_text(cache_path, "the archive index") or "{}").get("archives") or {}
    except (ValueError, AttributeError):
        cached = {}
    index = []
    for name in names:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            try:
                index.append(_entry(path, name, cached.get(path)))
            except InputError as exc:
                raise StepError(str(exc))
    document = {"version": CACHE_VERSION,
                "archives": dict((e["path"], {k: e[k] for k in ("size", "mtime_ns", "sha256", "images")})
                                 for e in index)}
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if not check_mode and text != _text(cache_path, "the archive index"):
        try:
            write_whole(cache_path, text.encode("utf-8"), 0o644)
        except OSError as exc:
            run_warning = "the archive index %s was not written (%s)" % (cache_path, exc.strerror or exc)
            return index, run_warning
    return index, None


def image_sources(run):
    params = run.params
    text = _text(params["pin_file"], "the pin file")
    try:
        pins = read_pins(text, params["pin_file"])
    except InputError as exc:
        raise StepError(str(exc), pin_file=params["pin_file"])
    archives = []
    if params.get("archive_dir"):
        archives, warning = archive_index(params["archive_dir"], params["archive_cache"], run.check_mode)
        if warning:
            run.warnings.append(warning)
    registries = auth_check(params["auth_file"]) if params.get("auth_file") else []
    return {"changed": False, "pins": pins, "archives": archives, "auth_registries": registries}
