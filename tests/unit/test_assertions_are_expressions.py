"""Every `that:` of an ansible.builtin.assert in the collection's YAML (roles, playbooks, molecule scenarios, the
harness) is a list of expression strings. A plain YAML scalar holding ': ' (as in search('engine-2: PASS')) parses
as a mapping, which Ansible then takes as a truthy value: the assertion could never fail."""
import pathlib

import pytest
import yaml
from test_support.paths import REPO

FILES = sorted(p for pattern in ("roles/*/tasks/*.yml", "playbooks/*.yml", "extensions/molecule/*/*.yml",
                                 "tests/harness/**/*.yml")
               for p in REPO.glob(pattern))


def _thats(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "that":
                yield from (value if isinstance(value, list) else [value])
            else:
                yield from _thats(value)
    elif isinstance(node, list):
        for item in node:
            yield from _thats(item)


def test_the_files_are_found():
    assert len(FILES) > 40 and any(p.name == "verify_router.yml" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_assertion_is_an_expression(path: pathlib.Path):
    document = yaml.safe_load(path.read_text())
    bad = [item for item in _thats(document) if not isinstance(item, str)]
    assert not bad, "%s: assert items that parse as %s, not expressions (quote them): %s" % (
        path.relative_to(REPO), sorted({type(b).__name__ for b in bad}), bad)


def test_a_colon_in_a_plain_scalar_is_caught():
    broken = yaml.safe_load("- assert:\n    that:\n      - out is search('engine-2: PASS')\n")
    assert [type(item).__name__ for item in _thats(broken)] == ["dict"]
