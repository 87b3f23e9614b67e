"""The KV lease and the graceful stop (plugins/module_utils/_plan/lifecycle.py): a lease or drain set by hand in a
record is refused by the planner by name, the stop's grace is the drain plus the workers' teardown plus a margin,
and a prefill whose drain is shorter than its lease is warned. (That the lease takes the name of the image's vLLM
in the plan the launcher starts is the planner's contract: test_container.py.)"""
import pytest
from test_support.launcher import le, record, role_env

from ansible_collections.narwhal.deploy.plugins.module_utils._plan.lifecycle import drain_warning, stop_grace


@pytest.mark.parametrize("runtime,words", [
    ({"environment": {"VLLM_NIXL_ABORT_REQUEST_TIMEOUT": "60"}},
     "launch record runtime.environment sets VLLM_NIXL_ABORT_REQUEST_TIMEOUT, the KV lease, by hand; the image's "
     "vLLM 0.33.0 reads the KV lease from kv_connector_extra_config.kv_lease_duration"),
    ({"environment": {"VLLM_KV_LEASE_DURATION": "60"}}, "sets VLLM_KV_LEASE_DURATION, the KV lease, by hand"),
    ({"extra_args": ["--kv-transfer-config.kv_connector_extra_config.kv_lease_duration=60"]},
     "the KV lease, by hand"),
    ({"extra_args": ["--shutdown-timeout", "5"]}, "overrides launcher-managed --shutdown-timeout"),
    ({"kv_lease_seconds": 0}, "runtime.kv_lease_seconds=0 must be a whole number of seconds from 1 to 86400"),
    ({"shutdown_timeout": -1}, "runtime.shutdown_timeout=-1 must be a whole number of seconds from 0 to 3600"),
    ({"shutdown_timeout": 30, "vllm_version": "0.17.1", "expected_packages": {"vllm": "0.17.1", "nixl": "0.7.1"}},
     "runtime.shutdown_timeout=30 but the image's vLLM 0.17.1 has no --shutdown-timeout"),
])
def test_a_hand_set_lease_or_drain_is_refused_by_the_planner(runtime, words):
    rec = record("engine-1")
    rec["runtime"].update(runtime)
    with pytest.raises(le.LaunchError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        le.build_plan(role_env(), rec)


@pytest.mark.parametrize("command,environment,grace", [
    (["serve", "/m", "--shutdown-timeout", "30"], {}, 45),
    (["serve", "/m", "--shutdown-timeout=0"], {}, 15),
    (["serve", "/m", "--shutdown-timeout", "120"], {"VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "20"}, 150),
    (["serve", "/m"], {}, 30),  # started before the input: the grace every stop gave
])
def test_stop_grace_is_the_drain_plus_worker_teardown_plus_a_margin(command, environment, grace):
    assert stop_grace(command, environment) == grace


@pytest.mark.parametrize("role,runtime,warned", [
    ("prefill", {"shutdown_timeout": 10}, "NARWHAL_SHUTDOWN_TIMEOUT=10 is shorter than its KV lease of 30 s"),
    ("prefill", {"shutdown_timeout": 60, "kv_lease_seconds": 90}, "shorter than its KV lease of 90 s"),
    ("prefill", {"shutdown_timeout": 30}, None),
    ("prefill", {"shutdown_timeout": 10, "kv_lease_seconds": 5}, None),
    ("decode", {"shutdown_timeout": 0}, None),
    ("prefill", {"shutdown_timeout": 30, "vllm_version": "0.21.0"}, "shorter than its KV lease of 480 s"),
])
def test_a_prefill_whose_drain_is_shorter_than_its_lease_is_warned(role, runtime, warned):
    rec = record("engine-1")
    rec["role"] = role
    rec["runtime"].update(runtime)
    warning = drain_warning(rec)
    assert (warning is None) if warned is None else (warned in warning)
