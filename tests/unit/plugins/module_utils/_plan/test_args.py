# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The launcher-managed flags (plugins/module_utils/_plan/args.py): the `--no-` form of a managed flag, which vLLM's
parser generates for every boolean option (argparse.BooleanOptionalAction), is managed too (issue 24)."""

import pytest
from test_support.inputs import BASE

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.args import DERIVED_FLAGS, check_args, flag_name

NEGATED_FORMS = [
    ("--no-trust-remote-code", "--trust-remote-code"),
    ("--no_trust_remote_code", "--trust-remote-code"),
    ("--no-trust-remote-code=true", "--trust-remote-code"),
    ("--no-trust-remote", "--trust-remote-code"),  # an argparse abbreviation of the --no- form
    ("--no-port", "--port"),
    ("--no-kv-cache-dtype", "--kv-cache-dtype"),
]


@pytest.mark.parametrize("token, flag", NEGATED_FORMS)
def test_no_form_of_a_managed_flag_is_that_flag(token, flag):
    assert flag_name(token) == flag


@pytest.mark.parametrize("token", ["--no-enable-prefix-caching", "--no-enable-chunked-prefill", "--nothing", "--no",
                                   "--enforce-eager", "--max-model-len"])
def test_no_form_of_an_unmanaged_flag_stays_free(token):
    assert flag_name(token) is None
    assert check_args([token], "NARWHAL_EXTRA_ARGS") == [token]


@pytest.mark.parametrize("key", ["NARWHAL_EXTRA_ARGS", "NARWHAL_ENGINE_ARGS", "NARWHAL_NODE_1_EXTRA_ARGS"])
@pytest.mark.parametrize("token, flag", NEGATED_FORMS)
def test_no_form_in_an_input_is_refused_by_key(key, token, flag):
    """--no-trust-remote-code would cancel the derived --trust-remote-code: the image check passes and the model
    fails at start. Refused when the inputs are read, naming the key."""
    with pytest.raises(InputError) as err:
        load_inputs(dict(BASE, **{key: "--max-model-len 8192 %s" % token}))
    assert err.value.key == key
    assert "%s[2]=%r overrides launcher-managed %s (its --no- form" % (key, token, flag) in str(err.value)


def test_no_form_in_a_record_is_refused_even_where_the_flag_is_derived():
    """A record whose runtime.trust_remote_code allows the derived --trust-remote-code still refuses its negation."""
    args = ["--trust-remote-code", "--no-trust-remote-code"]
    with pytest.raises(PlanError) as err:
        check_args(args, "launch record runtime.extra_args", allowed=DERIVED_FLAGS)
    assert "runtime.extra_args[1]='--no-trust-remote-code' overrides launcher-managed --trust-remote-code" \
        in str(err.value) and "derived by discovery from the checkpoint" in str(err.value)
    assert check_args(args[:1], "launch record runtime.extra_args", allowed=DERIVED_FLAGS) == args[:1]
