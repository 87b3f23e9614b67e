"""The engine API key file's one rule (plugins/module_utils/_common/api_key.py): the key on the first line and,
during a rotation, the previous key on the second; anything else refused by name, with the fix, never showing a
key."""
import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.api_key import api_key_from, api_keys_from
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError

NEW = "0123456789abcdef0123456789abcdef"
OLD = "fedcba9876543210fedcba9876543210"
PATH = "/etc/narwhal/engine-api.key"


@pytest.mark.parametrize("raw, keys", [
    (NEW + "\n", [NEW]),
    (NEW, [NEW]),
    ("  %s \r\n\n\n" % NEW, [NEW]),
    ("%s\n%s\n" % (NEW, OLD), [NEW, OLD]),
    ("%s\r\n%s" % (NEW, OLD), [NEW, OLD]),
    ("%s\n%s\n\n" % (NEW, OLD), [NEW, OLD]),
])
def test_one_key_or_the_key_and_the_previous_one(raw, keys):
    assert api_keys_from(raw.encode(), 0o100600, PATH) == keys
    assert api_keys_from(raw.encode(), 0o100400, PATH) == keys
    assert api_key_from(raw.encode(), 0o100600, PATH) == keys[0]  # what every client of the engines sends


@pytest.mark.parametrize("raw, why", [
    ("", "is empty; it must hold exactly one non-empty line, the key"),
    ("\n \n", "is empty"),
    ("\n%s\n" % NEW, "has an empty first line; the key goes on the first line"),
    ("%s\n%s\nthird\n" % (NEW, OLD), "holds 3 lines; it holds the key on the first line and, during a rotation, the "
                                     "previous key on the second, nothing else"),
    ("%s\n\n%s\n" % (NEW, OLD), "holds 3 lines with an empty one"),
    ("%s\n%s\n" % (NEW, NEW), "holds the same key on both lines; the second line is the previous key during a "
                              "rotation: remove it"),
    ("%s \n" % "new key", "holds on line 1 a key with the character U+0020"),
    ("%s\nold\tkey\n" % NEW, "holds on line 2 a key with the character U+0009"),
    ("n\u00e9w\n", "holds on line 1 a key with the character U+00E9"),
    ("k\x00ey\n", "holds NUL bytes or over 65536 bytes"),
    ("k" * 65537, "holds NUL bytes or over 65536 bytes"),
])
def test_anything_else_is_refused_by_name_with_the_fix(raw, why):
    for read in (api_keys_from, api_key_from):
        with pytest.raises(PlanError) as caught:
            read(raw.encode(), 0o100600, PATH)
        assert caught.value.key == "NARWHAL_API_KEY_FILE"
        assert str(caught.value).startswith("the engine API key file %s " % PATH) and why in str(caught.value)
        assert NEW not in str(caught.value) and OLD not in str(caught.value)


def test_the_mode_and_the_encoding():
    with pytest.raises(PlanError, match="has mode 0644; it must be 0600 or 0400 \\(chmod 600 %s\\)" % PATH):
        api_keys_from(NEW.encode(), 0o100644, PATH)
    with pytest.raises(PlanError, match="is not UTF-8 text; write the key alone into it"):
        api_keys_from(b"k\xffey\n", 0o100600, PATH)
