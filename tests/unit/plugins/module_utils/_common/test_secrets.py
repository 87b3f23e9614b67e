# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Redaction (plugins/module_utils/_common/secrets.py) and the errors that
use it (plugins/module_utils/_common/errors.py)."""


import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common import errors as _errors
from ansible_collections.narwhal.deploy.plugins.module_utils._common import secrets as _secrets
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError


@pytest.mark.parametrize("text, expected", [
    ("HF_TOKEN=abc123 x", "HF_TOKEN=<redacted> x"),
    ("NARWHAL_API_KEY_FILE=config/engine-api.key", "NARWHAL_API_KEY_FILE=config/engine-api.key"),  # a path
    ("{'api_key': 'abcdefgh', 'model': 'm'}", "{'api_key': '<redacted>', 'model': 'm'}"),
    ('{"hf_token": ["hf-1"]}', '{"hf_token": ["<redacted>"]}'),
    ("vllm serve m --hf-token abcdef123 --port 8000", "vllm serve m --hf-token <redacted> --port 8000"),
    ("['--api-key', 'k-0123456']", "['--api-key', '<redacted>']"),
    ("--api-key is launcher-managed", "--api-key is launcher-managed"),  # prose stays
    ("is not KEY=VALUE", "is not KEY=VALUE"),
    ("Authorization: Bearer abcdef0123", "Authorization: Bearer <redacted>"),
    ("https://u:p4ss@h.example/x", "https://u:<redacted>@h.example/x"),
    ("token hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ here", "token <redacted> here"),
    ("--max-num-batched-tokens 8192 --ssl-keyfile /k.pem", "--max-num-batched-tokens 8192 --ssl-keyfile /k.pem"),
])
def test_redact_text(text, expected):
    assert _secrets.redact_text(text) == expected


def test_redact_text_known_secrets_and_registered_key():
    assert _secrets.redact_text("key: zebra-777", ["zebra-777"]) == "key: <redacted>"
    _secrets.register_secret("registered-key-0123")
    try:
        assert str(_errors.PlanError("docker said registered-key-0123 is bad")) == "docker said <redacted> is bad"
    finally:
        _secrets._SECRET_VALUES.discard("registered-key-0123")


def test_input_error_of_a_secret_looking_key_hides_its_value():
    err = InputError("NARWHAL_NODE_1_HF_TOKEN", "%r is not valid; fix it" % "plain")
    assert str(err) == "NARWHAL_NODE_1_HF_TOKEN: '<redacted>' is not valid; fix it"
