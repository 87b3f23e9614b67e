# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_common/held.py: which wanted paths a host does not hold as wanted (install and launch write or fetch only those)."""

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.held import differences, mode_bits, why_differs

DIR = {"path": "/opt/narwhal/config", "state": "directory", "mode": "0700", "owner": "root"}
FILE = {"path": "/opt/narwhal/config/engine-2.env", "sha256": "ab" * 32, "mode": "0600", "owner": "root"}
HELD_DIR = {"state": "directory", "mode": 0o700, "owner": "root", "uid": 0}
HELD_FILE = {"state": "file", "mode": 0o600, "owner": "root", "uid": 0, "sha256": "ab" * 32}


@pytest.mark.parametrize("mode, bits", [("0600", 0o600), ("600", 0o600), ("0755", 0o755), (0o644, 0o644),
                                        (None, None), ("", None)])
def test_mode_bits(mode, bits):
    assert mode_bits(mode) == bits


def test_held_as_wanted_differs_in_nothing():
    assert differences([DIR, FILE], {DIR["path"]: HELD_DIR, FILE["path"]: HELD_FILE}) == {}


@pytest.mark.parametrize("held, reasons", [
    ({"state": "absent"}, ["absent, not a file"]),
    (dict(HELD_FILE, state="directory"), ["directory, not a file"]),
    (dict(HELD_FILE, state="other"), ["other, not a file"]),
    (dict(HELD_FILE, sha256="cd" * 32), ["content"]),
    (dict(HELD_FILE, mode=0o644), ["mode"]),
    (dict(HELD_FILE, owner="narwhal", uid=1000), ["owner"]),
    (dict(HELD_FILE, sha256="cd" * 32, mode=0o644, owner="narwhal", uid=1000), ["content", "mode", "owner"]),
])
def test_each_difference_is_named(held, reasons):
    assert why_differs(FILE, held) == reasons
    assert differences([FILE], {FILE["path"]: held}) == {FILE["path"]: reasons}


def test_a_path_the_read_did_not_return_is_absent():
    assert differences([DIR], {}) == {DIR["path"]: ["absent, not a directory"]}


def test_an_empty_sha256_matches_no_file():
    """A controller copy that does not exist (the action plugin's '' for a missing src): the file is fetched."""
    assert why_differs(dict(FILE, sha256=""), HELD_FILE) == ["content"]


def test_what_is_not_given_is_not_compared():
    want = {"path": FILE["path"]}
    assert why_differs(want, dict(HELD_FILE, sha256="cd" * 32, mode=0o777, owner="x")) == []
    assert why_differs(dict(want, sha256=None), dict(HELD_FILE, sha256=None)) == []


def test_an_owner_given_as_uid_matches_the_uid():
    assert why_differs(dict(FILE, owner="0"), dict(HELD_FILE, owner="root", uid=0)) == []
    assert why_differs(dict(FILE, owner="1000"), dict(HELD_FILE, owner="root", uid=0)) == ["owner"]


def test_a_group_is_compared_by_name_or_gid():
    held = dict(HELD_FILE, group="root", gid=0)
    assert why_differs(dict(FILE, group="root"), held) == [] and why_differs(dict(FILE, group="0"), held) == []
    assert why_differs(dict(FILE, group="narwhal"), held) == ["group"]
    assert why_differs(dict(FILE, group="27"), dict(held, group="sudo", gid=27)) == []
    assert why_differs(FILE, dict(held, group="sudo", gid=27)) == []  # not given: not compared


def test_order_is_that_of_wanted_and_the_first_entry_of_a_path_counts():
    other = dict(FILE, path="/opt/narwhal/bin/launch_engine.pyz")
    found = differences([other, FILE, dict(FILE, sha256="cd" * 32)], {})
    assert list(found) == [other["path"], FILE["path"]]
    assert differences([FILE, dict(FILE, sha256="cd" * 32)], {FILE["path"]: HELD_FILE}) == {}
