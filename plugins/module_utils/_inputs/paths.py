# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Where discovery and prepare write, checked before anything is written.

Every output (the fleet, the launch records, the files discovery writes into NARWHAL_CONFIG_DIR, the run
directory) must have a path of its own, none may be an input (the .env file, the engine API key file), and an
output inside the checkout must be git-ignored: the records carry site data (addresses, hardware, image pins),
so a tracked place (NARWHAL_CONFIG_DIR=docs) would have them committed.

`check_paths` is pure: it takes the resolver (os.path.realpath in the modules) and the git question as
functions. `git_ignore_checker` is the one part that runs a command (git, through _common/tools.py).
"""

from __future__ import annotations

import fnmatch
import os

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import FIX, InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import (
    DEPLOYMENT_ENV,
    INSPECTION_FILE,
    POLICY_FILE,
    SOURCES_FILE,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    CommandTimeoutError,
    bin_path,
    host_name,
    run_bounded,
)

__metaclass__ = type

# Names discovery owns inside NARWHAL_CONFIG_DIR (it removes stale inspection extracts by name).
OWNED_NAMES = (DEPLOYMENT_ENV, POLICY_FILE, SOURCES_FILE, INSPECTION_FILE % "*")


# When git cannot be asked (no git, no repository): the site paths the shipped .gitignore ignores.
FALLBACK_IGNORED = ("config/fleet.json", "config/fleet.*.json", "config/engine-launch.*.json",
                    "config/" + DEPLOYMENT_ENV, "config/*/*", "config/*.key", "runs/*")


def _entries(root, site, engines, env_file, resolve):
    """(key, what, written path, resolved path, kind) in the order collisions are reported: inputs first, then
    the fixed names of the config directory, the directories, and last the outputs whose whole path is a setting,
    so a collision names the setting to change. kind: input (read), file (written), dir (written into)."""
    def entry(key, what, value, kind, base=root):
        path = os.path.normpath(value if os.path.isabs(value) else os.path.join(base, value))
        return (key, what, path, resolve(path), kind)

    config = os.path.normpath(os.path.join(root, site["NARWHAL_CONFIG_DIR"]))
    out = []
    if env_file:
        # site_inputs reads it relative to the controller's working directory, not to the checkout
        out.append(entry("NARWHAL_ENV_FILE", "the site inputs (.env)", os.path.abspath(env_file), "input"))
    out.append(entry("NARWHAL_API_KEY_FILE", "the engine API key file", site["NARWHAL_API_KEY_FILE"], "input"))
    names = [(DEPLOYMENT_ENV, DEPLOYMENT_ENV), (POLICY_FILE, "the policy extract"),
             (SOURCES_FILE, "the sources index")]
    names += [(INSPECTION_FILE % e, "the inspection extract of %s" % e) for e in (engines or ["engine-1"])]
    out += [entry("NARWHAL_CONFIG_DIR", what, name, "file", config) for name, what in names]
    out.append(entry("NARWHAL_CONFIG_DIR", "the output directory", config, "dir"))
    out.append(entry("NARWHAL_RUNS_DIR", "the run directory", site["NARWHAL_RUNS_DIR"], "dir"))
    out.append(entry("NARWHAL_FLEET", "the fleet file", site["NARWHAL_FLEET"], "file"))
    out.append(entry("NARWHAL_LAUNCH_CONFIG", "the launch records", site["NARWHAL_LAUNCH_CONFIG"], "file"))
    if "NARWHAL_TLS_DIR" in site:
        out.append(entry("NARWHAL_TLS_DIR", "the TLS material", site["NARWHAL_TLS_DIR"], "dir"))
    return out


def _inside(path, directory):
    return path != directory and path.startswith(directory.rstrip(os.sep) + os.sep)


def _refuse(key, site, message, fix="give each output a path of its own"):
    shown = "%r: " % site[key] if key in site else ""
    raise InputError(key, "; ".join([shown + message] + ([fix] if fix else []) + [FIX]))


def check_paths(root, site, engines=(), env_file=None, ignored=None, resolve=None):
    """Refuse output paths that collide with each other or with an input, or that would put site data into a
    git-tracked place inside the checkout `root`.

    `ignored(relative_paths)` returns the set of those git ignores, or None when git cannot tell (then the
    shipped .gitignore's site paths, FALLBACK_IGNORED, decide); `resolve` maps a normalised path to the file it
    reaches (os.path.realpath). Returns {"fleet", "launch_config", "config_dir", "runs_dir", "api_key_file",
    "tls_dir"}: the normalised (unresolved) paths to use.
    """
    resolve = resolve or (lambda p: p)
    entries = _entries(root, site, list(engines or ()), env_file, resolve)
    runs = [e for e in entries if e[0] == "NARWHAL_RUNS_DIR"][0]
    config = [e for e in entries if e[4] == "dir" and e[0] == "NARWHAL_CONFIG_DIR"][0]
    # the same file or directory twice first (the plainest message), then one inside another, then owned names
    for j, (key, what, path, real, _kind) in enumerate(entries):
        for okey, owhat, _opath, oreal, _okind in entries[:j]:
            if real == oreal:
                _refuse(key, site, "%s would be %s, which is also %s (%s)" % (what, path, owhat, okey))
    for j, (key, what, path, real, kind) in enumerate(entries):
        for okey, owhat, opath, oreal, okind in entries[:j]:
            if okind in ("file", "input") and _inside(real, oreal):
                _refuse(key, site, "%s (%s) would lie inside %s, which is %s (%s)" % (what, path, opath, owhat, okey))
            if kind in ("file", "input") and _inside(oreal, real):
                _refuse(key, site, "%s (%s) is a file, but %s (%s) would lie inside it" % (what, path, owhat, okey))
        if kind in ("file", "input") and _inside(real, runs[3]):
            _refuse(key, site, "%s (%s) would lie inside the run directory %s (NARWHAL_RUNS_DIR), which holds only "
                               "prepared runs" % (what, path, runs[2]))
    for key, what, path, real, _kind in entries:
        if key in ("NARWHAL_FLEET", "NARWHAL_LAUNCH_CONFIG") and os.path.dirname(real) == config[3] \
                and any(fnmatch.fnmatchcase(os.path.basename(real), name) for name in OWNED_NAMES):
            _refuse(key, site, "%s (%s) is named like a file discovery owns in NARWHAL_CONFIG_DIR (%s), and discovery "
                               "replaces or removes those by name" % (what, path, ", ".join(OWNED_NAMES)))
    _check_ignored(root, site, entries, ignored, resolve)
    by_key = dict((e[0], e[2]) for e in entries if e[0] != "NARWHAL_CONFIG_DIR")
    return {"fleet": by_key["NARWHAL_FLEET"], "launch_config": by_key["NARWHAL_LAUNCH_CONFIG"],
            "config_dir": config[2], "runs_dir": runs[2], "api_key_file": by_key["NARWHAL_API_KEY_FILE"],
            "tls_dir": by_key.get("NARWHAL_TLS_DIR")}


def _check_ignored(root, site, entries, ignored, resolve):
    real_root = resolve(os.path.normpath(root))
    private = []
    for key, what, path, real, kind in entries:
        if key == "NARWHAL_ENV_FILE" or (kind == "dir" and key == "NARWHAL_CONFIG_DIR"):
            continue  # .env is the operator's; the config directory is checked file by file
        if key == "NARWHAL_TLS_DIR":  # private keys: the site CA's and each host's
            real, what = os.path.join(real, "ca.key"), "the site CA's private key (%s/ca.key)" % path
        elif kind == "dir":
            real, what = os.path.join(real, "run-0"), "a prepared run (%s/<run-id>)" % path
        rel = os.path.relpath(real, real_root)
        if rel != ".." and not rel.startswith(".." + os.sep) and not os.path.isabs(rel):
            private.append((key, what, rel))
    if not private:
        return
    answer = ignored([rel for _key, _what, rel in private]) if ignored else None
    for key, what, rel in private:
        if answer is None:
            if not any(fnmatch.fnmatchcase(rel, pattern) for pattern in FALLBACK_IGNORED):
                _refuse(key, site, "%s would be %s inside the checkout, which is not one of the git-ignored site "
                                   "paths (%s; git could not be asked), so private site data could be committed: use "
                                   "one of those or a path outside the checkout"
                        % (what, rel, ", ".join(FALLBACK_IGNORED)), None)
        elif rel not in answer:
            _refuse(key, site, "%s would be %s inside the checkout, which git does not ignore, so private site data "
                               "(addresses, records, keys) could be committed: use a git-ignored path (the defaults "
                               "under config/ and runs/ are), a path outside the checkout, or add it to .gitignore"
                    % (what, rel), None)


GIT_TIMEOUT = 60  # seconds each git command may take (a hung git names itself, see _common/tools.py::run_bounded)


def git_ignore_checker(root, timeout=GIT_TIMEOUT):
    """`ignored` for check_paths: `git check-ignore` in `root` (each call bounded by `timeout`); None without
    git. A git that does not answer is refused naming it (InputError), never waited on."""
    git = bin_path("git")
    if not git:
        return None

    def run(*args):
        try:
            return run_bounded([git, "-C", root] + list(args), timeout, {"LC_ALL": "C"})[0]
        except CommandTimeoutError:
            raise InputError("git", "'git %s' in %s on host %s did not answer within %s s (timed out, killed) "
                                    "while checking that the outputs are git-ignored; git hangs on an unreachable "
                                    "network file system or a held repository lock (.git/index.lock): check the "
                                    "checkout, then rerun" % (" ".join(args[:2]), root, host_name(), timeout))
        except OSError:
            return None

    def ignored(paths):
        if run("rev-parse", "--is-inside-work-tree") != 0:
            return None  # not a repository (or no usable git): the fallback decides
        found = set()
        for path in paths:
            # one path per call: no stdin (git may exit before reading it) and no quoted output to decode
            rc = run("check-ignore", "-q", "--", path)
            if rc == 0:
                found.add(path)
            elif rc != 1:
                return None  # e.g. a path beyond a symbolic link: the fallback decides
        return found

    return ignored
