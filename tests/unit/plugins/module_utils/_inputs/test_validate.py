# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Input validation (plugins/module_utils/_inputs/validate.py, load_inputs): hostile and broken site inputs are
refused by name when the inputs are read; plain values pass."""

import os.path

import pytest
from test_support.inputs import BASE

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.validate import load_inputs

# ------------------------------------------------------------------------------------------------
# hostile and broken inputs, refused when the inputs are read (issue 13, classes 1 and 4)

MINIMAL = dict(BASE)


def refused_input(extra):
    with pytest.raises(InputError) as err:
        load_inputs(dict(MINIMAL, **extra))
    return err.value


@pytest.mark.parametrize("key,value,char", [
    ("NARWHAL_SERVED_MODEL_NAME", "x\nNARWHAL_RUN_DIR=/tmp/evil", "\n"),
    ("NARWHAL_IMAGE", "vllm/vllm-openai:v0.33.0\r\nNARWHAL_X=1", "\r"),
    ("NARWHAL_EXTRA_ARGS", "--max-model-len 8192\x00", "\x00"),
    ("NARWHAL_MODEL_PATH", "/srv/models/a\u2028NARWHAL_RUN_DIR=/tmp", "\u2028"),
    ("NARWHAL_NODE_1_ENGINE_ENV", "A=1\x0bNARWHAL_RUN_DIR=/tmp/evil", "\x0b"),
    ("NARWHAL_FABRIC_INTERFACE", "eth1\t", "\t"),
    ("NARWHAL_NODE_2_URL", "http://10.0.0.12:8000\n", "\n"),
    ("NARWHAL_CONFIG_DIR", "config/\x1b[2Jsite", "\x1b"),
])
def test_values_that_could_add_a_line_are_refused(key, value, char):
    """Class 1: a value with a line break or another control character never reaches a line-based file."""
    err = refused_input({key: value})
    assert err.key == key
    assert "contains the control character %r" % char in str(err) and "one line of printable text" in str(err)


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_SERVED_MODEL_NAME": ".."}, "NARWHAL_SERVED_MODEL_NAME", "no empty, '.' or '..' component"),
    ({"NARWHAL_SERVED_MODEL_NAME": "../../etc"}, "NARWHAL_SERVED_MODEL_NAME", "/models/<name with / as _>"),
    ({"NARWHAL_SERVED_MODEL_NAME": "org/../x"}, "NARWHAL_SERVED_MODEL_NAME", "'..' component"),
    ({"NARWHAL_SERVED_MODEL_NAME": "/abs/name"}, "NARWHAL_SERVED_MODEL_NAME", "starts with a letter or digit"),
    ({"NARWHAL_SERVED_MODEL_NAME": "x,source=/etc"}, "NARWHAL_SERVED_MODEL_NAME", "not a served model name"),
    ({"NARWHAL_SERVED_MODEL_NAME": "llama 3"}, "NARWHAL_SERVED_MODEL_NAME", "not a served model name"),
    ({"NARWHAL_MODEL_PATH": "/srv/models/llama 3"}, "NARWHAL_MODEL_PATH",
     "its last component 'llama 3', the default served model name"),
    ({"NARWHAL_MODEL_PATH": "/srv/models/a,b"}, "NARWHAL_MODEL_PATH", "docker --mount separates options by commas"),
    ({"NARWHAL_MODEL_PATH": "/srv/models/../../etc"}, "NARWHAL_MODEL_PATH", "'.'/'..' component"),
    ({"NARWHAL_MODEL_PATH": "/"}, "NARWHAL_MODEL_PATH", "below /"),
    ({"NARWHAL_ENGINE_CHECKOUT": "/opt/../etc"}, "NARWHAL_ENGINE_CHECKOUT", "'.'/'..' component"),
    ({"NARWHAL_CONFIG_DIR": "../elsewhere"}, "NARWHAL_CONFIG_DIR", "'..' component"),
    ({"NARWHAL_FLEET": "~/fleet.json"}, "NARWHAL_FLEET", "'~' (which nothing expands)"),
    ({"NARWHAL_IMAGE": "--privileged"}, "NARWHAL_IMAGE", "not an image reference"),
    ({"NARWHAL_NODE_2_IMAGE": "img name"}, "NARWHAL_NODE_2_IMAGE", "not an image reference"),
    ({"NARWHAL_EXPECTED_PACKAGES": "torch,x;rm -rf /"}, "NARWHAL_EXPECTED_PACKAGES", "not a distribution name"),
])
def test_values_that_would_escape_their_directory_or_argument_are_refused(extra, key, words):
    """Class 1: names and paths stay inside their directory (/models/<name>, mounts) and their argument."""
    err = refused_input(extra)
    assert err.key == key and words in str(err), str(err)


@pytest.mark.parametrize("extra", [
    {"NARWHAL_SERVED_MODEL_NAME": "meta-llama/Llama-3.1-8B-Instruct"},
    {"NARWHAL_SERVED_MODEL_NAME": "qwen2.5:7b@q4+x"},
    {"NARWHAL_MODEL_PATH": "/srv/models/Llama-3.1-8B/"},
    {"NARWHAL_IMAGE": "registry.example:5000/vllm/vllm-openai@sha256:" + "ab" * 32},
    {"NARWHAL_NODE_1_ATTESTATION_URL": "http://10.0.0.11:8010/v1/attestation"},
    {"NARWHAL_NODE_1_URL": "https://engine-1.example.:8000"},
    {"NARWHAL_CONFIG_DIR": "/srv/site-a/config", "NARWHAL_EXPECTED_PACKAGES": "torch, flashinfer-python"},
])
def test_plain_values_still_pass(extra):
    load_inputs(dict(MINIMAL, **extra))


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_TRANSPRT": "ucx_tcp"}, "NARWHAL_TRANSPRT", "did you mean NARWHAL_TRANSPORT?"),
    ({"NARWHAL_GPU_PER_ENGINE": "4"}, "NARWHAL_GPU_PER_ENGINE", "did you mean NARWHAL_GPUS_PER_ENGINE?"),
    ({"NARWHAL_WHATEVER": "1"}, "NARWHAL_WHATEVER", "is not a site input; a misspelt key"),
    ({"NARWHAL_RUN_DIR": "/tmp/evil"}, "NARWHAL_RUN_DIR", "role environment that prepare writes"),
    ({"NARWHAL_ENV_FILE": "/x/.env"}, "NARWHAL_ENV_FILE", "not from .env"),
    ({"NARWHAL_NODE_2_ENGINE_PROT": "8001"}, "NARWHAL_NODE_2_ENGINE_PROT", "did you mean NARWHAL_NODE_2_ENGINE_PORT?"),
    ({"NARWHAL_NODE_02_ROLE": "decode"}, "NARWHAL_NODE_02_ROLE", "no leading zero"),
    ({"NARWHAL_ENGINE_PORT": "8_000"}, "NARWHAL_ENGINE_PORT", "ASCII digits 0-9"),
    ({"NARWHAL_ENGINE_PORT": "\uff18\uff10\uff10\uff10"}, "NARWHAL_ENGINE_PORT", "ASCII digits 0-9"),
    ({"NARWHAL_NODE_1_ATTEST_PORT": "+8010"}, "NARWHAL_NODE_1_ATTEST_PORT", "ASCII digits 0-9"),
    ({"NARWHAL_BLOCK_SIZE": "-16"}, "NARWHAL_BLOCK_SIZE", "must be at least 1, got -16"),
    ({"NARWHAL_BLOCK_SIZE": "1_6"}, "NARWHAL_BLOCK_SIZE", "ASCII digits 0-9"),
    ({"NARWHAL_GPUS_PER_ENGINE": "\u0664"}, "NARWHAL_GPUS_PER_ENGINE", "ASCII digits 0-9"),
    ({"NARWHAL_NODE_1_GPU_IDS": "0,0"}, "NARWHAL_NODE_1_GPU_IDS", "negative or repeated"),
    ({"NARWHAL_NODE_1_GPU_IDS": "-1,0"}, "NARWHAL_NODE_1_GPU_IDS", "negative or repeated"),
    ({"NARWHAL_NODE_1_GPU_IDS": "0,\uff11"}, "NARWHAL_NODE_1_GPU_IDS", "ASCII digits 0-9"),
    ({"NARWHAL_NODE_1_GPU_IDS": "0,1,2", "NARWHAL_TP_SIZE": "2"}, "NARWHAL_NODE_1_GPU_IDS", "NARWHAL_TP_SIZE is 2"),
    ({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "2"}, "NARWHAL_TP_SIZE", "gives engine-1 4 GPU(s)"),
    ({"NARWHAL_NODE_1_IP": "127.1"}, "NARWHAL_NODE_1_IP", "not an IPv4 or IPv6 address"),
    ({"NARWHAL_NODE_1_IP": "::ffff:127.0.0.1"}, "NARWHAL_NODE_1_IP", "IPv4-mapped loopback"),
    ({"NARWHAL_NODE_1_IP": "0.0.0.0"}, "NARWHAL_NODE_1_IP", "the unspecified address"),
    ({"NARWHAL_NODE_1_IP": "169.254.1.1"}, "NARWHAL_NODE_1_IP", "a link-local address"),
    ({"NARWHAL_NODE_1_IP": "::ffff:10.0.0.11"}, "NARWHAL_NODE_1_IP", "write the IPv4 address 10.0.0.11"),
    ({"NARWHAL_NODE_1_IP": "fd00::11"}, "NARWHAL_NODE_1_IP", "NARWHAL_BIND_FAMILY is ipv4"),
    ({"NARWHAL_NODE_1_URL": "http://localhost.:8000"}, "NARWHAL_NODE_1_URL", "a localhost name"),
    ({"NARWHAL_NODE_1_URL": "http://127.1:8000"}, "NARWHAL_NODE_1_URL", "numeric form"),
    ({"NARWHAL_NODE_1_URL": "http://2130706433:8000"}, "NARWHAL_NODE_1_URL", "numeric form"),
    ({"NARWHAL_NODE_1_URL": "http://0x7f.0.0.1:8000"}, "NARWHAL_NODE_1_URL", "numeric form"),
    ({"NARWHAL_NODE_1_URL": "http://[::ffff:127.0.0.1]:8000"}, "NARWHAL_NODE_1_URL", "IPv4-mapped loopback"),
    ({"NARWHAL_NODE_1_URL": "http://0.0.0.0:8000"}, "NARWHAL_NODE_1_URL", "the unspecified address"),
    ({"NARWHAL_NODE_1_URL": "http://[::1]:8000"}, "NARWHAL_NODE_1_URL", "a loopback address"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000/v1"}, "NARWHAL_NODE_1_URL", "has a path (/v1)"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000/"}, "NARWHAL_NODE_1_URL", "has a path (/)"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:8000?x=1"}, "NARWHAL_NODE_1_URL", "query"),
    ({"NARWHAL_NODE_1_URL": "http://10.0.0.11:\uff18\uff10\uff10\uff10"}, "NARWHAL_NODE_1_URL", "not an http(s) URL"),
    ({"NARWHAL_NODE_1_ATTESTATION_URL": "http://10.0.0.11:8010/v1/attestation#x"},
     "NARWHAL_NODE_1_ATTESTATION_URL", "fragment"),
    ({"NARWHAL_NODE_1_ATTESTATION_URL": "http://10.0.0.11:8010/v1/$(id)"},
     "NARWHAL_NODE_1_ATTESTATION_URL", "path with characters other than"),
    ({"NARWHAL_EXTRA_ARGS": "--chat-template '/a b.j2"}, "NARWHAL_EXTRA_ARGS", "not valid shell words"),
    ({"NARWHAL_NODE_1_ENGINE_ENV": "A='x"}, "NARWHAL_NODE_1_ENGINE_ENV", "not valid shell words"),
    ({"NARWHAL_FABRIC_INTERFACE": ".."}, "NARWHAL_FABRIC_INTERFACE", "not a network interface name"),
])
def test_values_that_passed_unchecked_are_refused_by_name(extra, key, words):
    """Class 4: typos, unusual digits, loopback spellings, URLs with more than a server, contradictions."""
    err = refused_input(extra)
    assert err.key == key and words in str(err), str(err)
    assert "rerun discovery" in str(err) or "remove it" in str(err) or ".env" in str(err)


def test_url_user_information_is_refused_without_repeating_it():
    err = refused_input({"NARWHAL_NODE_1_URL": "http://admin:hunter2@10.0.0.11:8000"})
    assert err.key == "NARWHAL_NODE_1_URL" and "user information" in str(err)
    assert "hunter2" not in str(err) and "admin" not in str(err)


@pytest.mark.parametrize("raw, rates", [
    ("1,2,4", [1, 2, 4]), (" 0.5 , 8,inf", [0.5, 8, "inf"]), ("16", [16]),
])
def test_benchmark_rates_are_read_in_order(raw, rates):
    assert load_inputs(dict(MINIMAL, NARWHAL_BENCH_RATES=raw))["site"]["NARWHAL_BENCH_RATES"] == rates


def test_benchmark_defaults_are_read_like_set_values():
    site = load_inputs(dict(MINIMAL))["site"]
    assert site["NARWHAL_BENCH_RATES"] == [1, 2, 4] and site["NARWHAL_BENCH_SLO_TTFT_MS"] is None


@pytest.mark.parametrize("extra, key, words", [
    ({"NARWHAL_BENCH_RATES": "1,,2"}, "NARWHAL_BENCH_RATES", "comma-separated list of request rates"),
    ({"NARWHAL_BENCH_RATES": "0,1"}, "NARWHAL_BENCH_RATES", "positive numbers"),
    ({"NARWHAL_BENCH_RATES": "-1"}, "NARWHAL_BENCH_RATES", "positive numbers"),
    ({"NARWHAL_BENCH_RATES": "2,2.0"}, "NARWHAL_BENCH_RATES", "the rate 2 twice"),
    ({"NARWHAL_BENCH_RATES": "1e3"}, "NARWHAL_BENCH_RATES", "like 1,2,4"),
    ({"NARWHAL_BENCH_SLO_TTFT_MS": "nan"}, "NARWHAL_BENCH_SLO_TTFT_MS", "positive number"),
    ({"NARWHAL_BENCH_SLO_E2EL_MS": "0"}, "NARWHAL_BENCH_SLO_E2EL_MS", "positive number"),
    ({"NARWHAL_BENCH_SLO_TPOT_MS": "-5"}, "NARWHAL_BENCH_SLO_TPOT_MS", "positive number"),
    ({"NARWHAL_BENCH_PROMPTS": "0"}, "NARWHAL_BENCH_PROMPTS", "at least 1"),
    ({"NARWHAL_BENCH_ROUTER_PORT": "70000"}, "NARWHAL_BENCH_ROUTER_PORT", "out of range"),
    ({"NARWHAL_BENCH_RATE": "1"}, "NARWHAL_BENCH_RATE", "NARWHAL_BENCH_RATES"),
])
def test_bad_benchmark_inputs_are_refused_by_name(extra, key, words):
    with pytest.raises(InputError) as err:
        load_inputs(dict(MINIMAL, **extra))
    assert err.value.key == key and words in str(err.value)


def test_slo_numbers_keep_their_value():
    site = load_inputs(dict(MINIMAL, NARWHAL_BENCH_SLO_TTFT_MS="250", NARWHAL_BENCH_SLO_TPOT_MS="12.5"))["site"]
    assert site["NARWHAL_BENCH_SLO_TTFT_MS"] == 250 and site["NARWHAL_BENCH_SLO_TPOT_MS"] == 12.5


# ------------------------------------------------------------------------------------------------
# image references: Docker's grammar and length limits (issue 24)

FIX_WORDS = "correct it in .env (or the environment), then rerun discovery"

IMAGE_KEYS = ("NARWHAL_IMAGE", "NARWHAL_NODE_2_IMAGE", "NARWHAL_ROUTER_IMAGE", "NARWHAL_BENCH_IMAGE")


@pytest.mark.parametrize("key", IMAGE_KEYS)
@pytest.mark.parametrize("value, words", [
    ("a" * (1 << 20), "it is 1048576 characters long, and Docker's grammar allows at most 520"),
    ("vllm/" + "v" * 251, "its name is 256 characters long, and Docker's limit is 255"),
    ("vllm/vllm-openai:" + "t" * 129, "is not a Docker tag (1 to 128"),
    ("vllm/vllm-openai:.hidden", "is not a Docker tag"),
    ("vllm/vllm-openai:", "its tag '' is not a Docker tag"),
    ("vllm/vllm-openai@sha256:abc", "its digest 'sha256:abc' is not sha256:"),
    ("vllm/vllm-openai@md5:" + "a" * 32, "its digest 'md5:"),
    ("vllm/vllm-openai@sha256:" + "AB" * 32, "lowercase hex digits"),
    ("VLLM/vllm-openai", ""),  # an upper-case first component is a registry host for Docker: still valid
    ("vllm/VLLM-openai:v1", "Docker refuses capital letters there"),
    ("vllm//vllm-openai", "is not a Docker repository name"),
    ("vllm/vllm___openai", "is not a Docker repository name"),
    ("vllm/vllm-openai/", "is not a Docker repository name"),
    ("registry.example:port/vllm", "is not a Docker repository name"),
    ("-registry.example/vllm", "is not a Docker repository name"),
    (":v0.33.0", "its name '' is not a Docker repository name"),
])
def test_image_references_outside_dockers_grammar_are_refused(key, value, words):
    """Every image input (engine, per-node engine, router, benchmark) takes what the Docker Engine takes as an image
    reference (distribution/reference) and nothing more; the refusal names the part and never repeats a megabyte."""
    if not words:
        load_inputs(dict(MINIMAL, **{key: value}))
        return
    err = refused_input({key: value})
    assert err.key == key and "is not an image reference" in str(err) and words in str(err), str(err)
    assert len(str(err)) < 1200 and FIX_WORDS in str(err)


@pytest.mark.parametrize("key", IMAGE_KEYS)
@pytest.mark.parametrize("value", [
    "registry.example:5000/ns/img:tag@sha256:" + "ab" * 32,
    "localhost/x",
    "narwhal-sim/vllm-cpu:latest",
    "vllm/vllm-openai:v0.33.0",
    "rocm/vllm:v0.33.0_rc1",
    "[fd00::1]:5000/vllm/vllm-openai:v0.33.0",
    "10.0.0.5:5000/vllm__x/a.b-c--d:T_1",
    "sha256:" + "0123456789abcdef" * 4,  # an image ID
    "0123456789ab",  # a short image ID
    "vllm/vllm-openai@sha512:" + "0" * 128,
    "x/" + "y" * 253,  # a name of 255 characters
])
def test_image_references_docker_takes_still_pass(key, value):
    site = load_inputs(dict(MINIMAL, **{key: value}))
    if key.startswith("NARWHAL_NODE_"):
        assert site["nodes"][2]["IMAGE"] == value
    else:
        assert site["site"][key] == value


# ------------------------------------------------------------------------------------------------
# a trailing '/' in an engine-host path (issue 24): one spelling per directory, so the served model name that the
# records, the probe and the router derive from NARWHAL_MODEL_PATH is one name


@pytest.mark.parametrize("key", ["NARWHAL_MODEL_PATH", "NARWHAL_ENGINE_CHECKOUT", "NARWHAL_ROUTER_DIR"])
@pytest.mark.parametrize("value, clean", [
    ("/srv/models/Llama-3.1-8B/", "/srv/models/Llama-3.1-8B"),
    ("/srv/models/Llama-3.1-8B//", "/srv/models/Llama-3.1-8B"),
    ("/srv/models/Llama-3.1-8B", "/srv/models/Llama-3.1-8B"),
])
def test_engine_host_paths_lose_their_trailing_slash(key, value, clean):
    assert load_inputs(dict(MINIMAL, **{key: value}))["site"][key] == clean


@pytest.mark.parametrize("path", ["/srv/models/Llama-3.1-8B/", "/srv/models/Llama-3.1-8B///"])
def test_probe_and_router_derive_the_served_name_the_records_serve(path):
    """roles/probe/vars/main.yml and roles/router/vars/main.yml take `NARWHAL_MODEL_PATH | basename` (os.path.basename)
    when no served name is set; _discover/records.py the last component. Both give the name the engines serve."""
    site = load_inputs(dict(MINIMAL, NARWHAL_MODEL_PATH=path))["site"]
    assert os.path.basename(site["NARWHAL_MODEL_PATH"]) == "Llama-3.1-8B"
    assert site["NARWHAL_MODEL_PATH"].rstrip("/").rsplit("/", 1)[-1] == "Llama-3.1-8B"


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_KV_LEASE_SECONDS": "0"}, "NARWHAL_KV_LEASE_SECONDS", "0 seconds is out of range 1-86400"),
    ({"NARWHAL_KV_LEASE_SECONDS": "86401"}, "NARWHAL_KV_LEASE_SECONDS", "out of range 1-86400"),
    ({"NARWHAL_KV_LEASE_SECONDS": "30s"}, "NARWHAL_KV_LEASE_SECONDS", "is not a whole number"),
    ({"NARWHAL_SHUTDOWN_TIMEOUT": "-1"}, "NARWHAL_SHUTDOWN_TIMEOUT", "-1 seconds is out of range 0-3600"),
    ({"NARWHAL_SHUTDOWN_TIMEOUT": "3601"}, "NARWHAL_SHUTDOWN_TIMEOUT", "out of range 0-3600"),
    ({"NARWHAL_SHUTDOWN_TIMEOUT": "1.5"}, "NARWHAL_SHUTDOWN_TIMEOUT", "is not a whole number"),
    # the lease by hand, in either version's name: refused at the first stage, naming both names and the input
    ({"NARWHAL_ENGINE_ENV": "VLLM_NIXL_ABORT_REQUEST_TIMEOUT=60"}, "NARWHAL_ENGINE_ENV",
     "sets VLLM_NIXL_ABORT_REQUEST_TIMEOUT, the KV lease, by hand; vLLM <= 0.21 reads the environment variable "
     "VLLM_NIXL_ABORT_REQUEST_TIMEOUT, vLLM >= 0.22 reads kv_connector_extra_config.kv_lease_duration"),
    ({"NARWHAL_NODE_1_ENGINE_ENV": "KV_LEASE_DURATION=60"}, "NARWHAL_NODE_1_ENGINE_ENV",
     "set NARWHAL_KV_LEASE_SECONDS=<seconds> instead"),
    ({"NARWHAL_EXTRA_ARGS": "--kv-lease-duration 60"}, "NARWHAL_EXTRA_ARGS", "sets --kv-lease-duration, the KV lease"),
    ({"NARWHAL_ENGINE_ARGS": "--kv-transfer-config.kv_connector_extra_config.kv_lease_duration=60"},
     "NARWHAL_ENGINE_ARGS", "the KV lease, by hand"),
    # the drain has one owner too
    ({"NARWHAL_EXTRA_ARGS": "--shutdown-timeout 60"}, "NARWHAL_EXTRA_ARGS",
     "launcher-managed --shutdown-timeout, which is set by the launcher from the record and the role environment; "
     "remove it (set NARWHAL_SHUTDOWN_TIMEOUT instead)"),
])
def test_the_lease_and_the_drain_are_checked_and_owned_by_their_inputs(extra, key, words):
    err = refused_input(extra)
    assert err.key == key
    assert words in str(err)


@pytest.mark.parametrize("extra,words", [
    # vllm-router has no refill below 1 per second (0 refills 1 per second too) and no queue timeout below 1 s
    ({"NARWHAL_ROUTER_MAX_CONCURRENT": "0"}, "0 is out of range 1-1000000"),
    ({"NARWHAL_ROUTER_MAX_CONCURRENT": "1000001"}, "1000001 is out of range 1-1000000"),
    ({"NARWHAL_ROUTER_QUEUE_SIZE": "-1"}, "-1 is out of range 0-100000"),
    ({"NARWHAL_ROUTER_QUEUE_TIMEOUT": "0"}, "0 seconds is out of range 1-3600"),
    ({"NARWHAL_ROUTER_RATE_LIMIT": "0"}, "0 is out of range 1-1000000"),
    ({"NARWHAL_ROUTER_RATE_LIMIT": "2.5"}, "is not a whole number"),
])
def test_the_routers_admission_inputs_are_bounded_by_name(extra, words):
    err = refused_input(extra)
    assert err.key == list(extra)[0] and words in str(err) and "correct it in .env" in str(err)


def test_the_routers_admission_defaults_and_values():
    site = load_inputs(dict(BASE))["site"]
    assert [site["NARWHAL_ROUTER_%s" % k] for k in ("MAX_CONCURRENT", "QUEUE_SIZE", "QUEUE_TIMEOUT", "RATE_LIMIT")] \
        == [None, 0, 1, 1]
    site = load_inputs(dict(BASE, NARWHAL_ROUTER_MAX_CONCURRENT="64", NARWHAL_ROUTER_QUEUE_SIZE="0",
                            NARWHAL_ROUTER_RATE_LIMIT="1000000"))["site"]
    assert (site["NARWHAL_ROUTER_MAX_CONCURRENT"], site["NARWHAL_ROUTER_QUEUE_SIZE"],
            site["NARWHAL_ROUTER_RATE_LIMIT"]) == (64, 0, 1000000)


@pytest.mark.parametrize("extra,values", [
    ({}, (None, None)),
    ({"NARWHAL_KV_LEASE_SECONDS": "1", "NARWHAL_SHUTDOWN_TIMEOUT": "0"}, (1, 0)),
    ({"NARWHAL_KV_LEASE_SECONDS": "600", "NARWHAL_SHUTDOWN_TIMEOUT": "3600"}, (600, 3600)),
])
def test_the_lease_and_the_drain_pass(extra, values):
    site = load_inputs(dict(BASE, **extra))["site"]
    assert (site["NARWHAL_KV_LEASE_SECONDS"], site["NARWHAL_SHUTDOWN_TIMEOUT"]) == values


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_DATA_PARALLEL_SIZE": "0"}, "NARWHAL_DATA_PARALLEL_SIZE", ""),
    ({"NARWHAL_NODE_1_DATA_PARALLEL_SIZE": "two"}, "NARWHAL_NODE_1_DATA_PARALLEL_SIZE", ""),
    ({"NARWHAL_ENABLE_EXPERT_PARALLEL": "yes"}, "NARWHAL_ENABLE_EXPERT_PARALLEL", "not true or false"),
    ({"NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL": "1"}, "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL", "not true or false"),
    # an engine's GPU count is TP x DP
    ({"NARWHAL_NODE_1_GPU_IDS": "0,1", "NARWHAL_TP_SIZE": "2", "NARWHAL_DATA_PARALLEL_SIZE": "2"},
     "NARWHAL_NODE_1_GPU_IDS", "list 4 GPU(s)"),
    ({"NARWHAL_NODE_1_GPU_IDS": "0,1,2", "NARWHAL_NODE_1_DATA_PARALLEL_SIZE": "2"},
     "NARWHAL_NODE_1_DATA_PARALLEL_SIZE", "cannot share equally"),
    ({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "4", "NARWHAL_NODE_2_DATA_PARALLEL_SIZE": "2"},
     "NARWHAL_TP_SIZE", "NARWHAL_NODE_2_DATA_PARALLEL_SIZE is 2"),
    ({"NARWHAL_GPUS_PER_ENGINE": "3", "NARWHAL_DATA_PARALLEL_SIZE": "2"},
     "NARWHAL_DATA_PARALLEL_SIZE", "multiple of 2"),
])
def test_data_and_expert_parallel_inputs_are_checked_by_name(extra, key, words):
    err = refused_input(extra)
    assert err.key == key and words in str(err)


def test_data_and_expert_parallel_inputs_read_as_numbers_and_booleans():
    inputs = load_inputs(dict(BASE, NARWHAL_DATA_PARALLEL_SIZE="2", NARWHAL_ENABLE_EXPERT_PARALLEL="TRUE",
                              NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL="false", NARWHAL_GPUS_PER_ENGINE="4",
                              NARWHAL_TP_SIZE="2"))
    site = inputs["site"]
    assert site["NARWHAL_DATA_PARALLEL_SIZE"] == 2 and site["NARWHAL_ENABLE_EXPERT_PARALLEL"] is True
    assert inputs["nodes"][2]["ENABLE_EXPERT_PARALLEL"] is False
    defaults = load_inputs(dict(BASE))["site"]
    assert defaults["NARWHAL_DATA_PARALLEL_SIZE"] == 1 and defaults["NARWHAL_ENABLE_EXPERT_PARALLEL"] is False


@pytest.mark.parametrize("extra,key,words", [
    ({"NARWHAL_LOG_MAX_SIZE": "100"}, "NARWHAL_LOG_MAX_SIZE", "'100' is not a log size"),
    ({"NARWHAL_LOG_MAX_SIZE": "100mb"}, "NARWHAL_LOG_MAX_SIZE", "a whole number and k, m or g"),
    ({"NARWHAL_LOG_MAX_SIZE": "0m"}, "NARWHAL_LOG_MAX_SIZE", "not a log size"),
    ({"NARWHAL_LOG_MAX_SIZE": "1.5g"}, "NARWHAL_LOG_MAX_SIZE", "not a log size"),
    ({"NARWHAL_LOG_MAX_SIZE": "-1"}, "NARWHAL_LOG_MAX_SIZE", "not a log size"),
    ({"NARWHAL_LOG_MAX_FILE": "0"}, "NARWHAL_LOG_MAX_FILE", ""),
    ({"NARWHAL_LOG_DRIVER": "syslog"}, "NARWHAL_LOG_DRIVER", "not one of json-file, local"),
])
def test_log_limits_are_refused_by_name(extra, key, words):
    err = refused_input(extra)
    assert err.key == key and words in str(err)


@pytest.mark.parametrize("extra,values", [
    ({}, ("json-file", "100m", 5)),
    ({"NARWHAL_LOG_DRIVER": "local", "NARWHAL_LOG_MAX_SIZE": " 20k ", "NARWHAL_LOG_MAX_FILE": "1"},
     ("local", "20k", 1)),
    ({"NARWHAL_LOG_MAX_SIZE": "999999g"}, ("json-file", "999999g", 5)),
])
def test_log_limits_pass(extra, values):
    site = load_inputs(dict(BASE, **extra))["site"]
    assert (site["NARWHAL_LOG_DRIVER"], site["NARWHAL_LOG_MAX_SIZE"], site["NARWHAL_LOG_MAX_FILE"]) == values


# ------------------------------------------------------------------------------------------------
# the router's policies and the engines' KV events (issue 38)


def test_the_policies_and_kv_events_default_to_the_shared_policy_and_auto():
    site = load_inputs(dict(MINIMAL))["site"]
    assert (site["NARWHAL_ROUTER_PREFILL_POLICY"], site["NARWHAL_ROUTER_DECODE_POLICY"]) == (None, None)
    kv = (site["NARWHAL_KV_EVENTS"], site["NARWHAL_KV_EVENTS_PORT"], site["NARWHAL_KV_HASH_SEED"])
    assert kv == ("auto", 5557, 0)
    site = load_inputs(dict(MINIMAL, NARWHAL_ROUTER_PREFILL_POLICY="kv_aware", NARWHAL_KV_HASH_SEED="4294967295",
                            NARWHAL_ENGINE_ENV="PYTHONHASHSEED=4294967295"))["site"]
    assert (site["NARWHAL_ROUTER_PREFILL_POLICY"], site["NARWHAL_KV_HASH_SEED"]) == ("kv_aware", 4294967295)


@pytest.mark.parametrize("extra, key, words", [
    ({"NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware", "NARWHAL_KV_EVENTS": "off"}, "NARWHAL_KV_EVENTS",
     "is off but NARWHAL_ROUTER_PREFILL_POLICY is kv_aware"),
    # the shared policy is the prefill policy when the role has none of its own
    ({"NARWHAL_ROUTER_POLICY": "kv_aware", "NARWHAL_KV_EVENTS": "off"}, "NARWHAL_KV_EVENTS",
     "is off but NARWHAL_ROUTER_POLICY is kv_aware"),
    ({"NARWHAL_KV_EVENTS": "on", "NARWHAL_BIND_FAMILY": "ipv6"}, "NARWHAL_KV_EVENTS", "binds tcp://*:<port> without "
                                                                                      "ZMQ_IPV6, on IPv4 only"),
    ({"NARWHAL_ROUTER_PREFILL_POLICY": "kv_aware", "NARWHAL_ENGINE_ENV": "PYTHONHASHSEED=1"}, "NARWHAL_ENGINE_ENV",
     "sets PYTHONHASHSEED=1, but while KV events are on every engine runs with PYTHONHASHSEED=0"),
    ({"NARWHAL_KV_EVENTS": "on", "NARWHAL_KV_HASH_SEED": "5", "NARWHAL_NODE_2_ENGINE_ENV": "PYTHONHASHSEED=random"},
     "NARWHAL_NODE_2_ENGINE_ENV", "remove it from NARWHAL_NODE_2_ENGINE_ENV (random is no seed all engines share)"),
    ({"NARWHAL_KV_EVENTS": "on", "NARWHAL_NODE_1_ENGINE_ENV": "PYTHONHASHSEED=7"}, "NARWHAL_NODE_1_ENGINE_ENV",
     "remove it from NARWHAL_NODE_1_ENGINE_ENV or set NARWHAL_KV_HASH_SEED=7"),
    ({"NARWHAL_KV_EVENTS": "on", "NARWHAL_NODE_1_EXTRA_ARGS": "--prefix-caching-hash-algo xxhash"},
     "NARWHAL_NODE_1_EXTRA_ARGS", "(engine-1 xxhash, engine-2 sha256)"),
    ({"NARWHAL_KV_EVENTS": "on", "NARWHAL_EXTRA_ARGS": "--prefix-caching-hash-algo=xxhash",
      "NARWHAL_NODE_2_EXTRA_ARGS": "--prefix_caching_hash_algo sha256_cbor"},
     "NARWHAL_NODE_2_EXTRA_ARGS", "(engine-1 xxhash, engine-2 sha256_cbor)"),
    ({"NARWHAL_KV_HASH_SEED": "4294967296"}, "NARWHAL_KV_HASH_SEED", "out of range 0-4294967295"),
    ({"NARWHAL_KV_HASH_SEED": "-1"}, "NARWHAL_KV_HASH_SEED", "out of range 0-4294967295"),
    ({"NARWHAL_KV_HASH_SEED": "random"}, "NARWHAL_KV_HASH_SEED", "is not a whole number"),
    ({"NARWHAL_KV_EVENTS": "yes"}, "NARWHAL_KV_EVENTS", "is not one of auto, on, off"),
    ({"NARWHAL_ROUTER_DECODE_POLICY": "least_loaded"}, "NARWHAL_ROUTER_DECODE_POLICY", "is not one of round_robin"),
    ({"NARWHAL_KV_EVENTS_PORT": "0"}, "NARWHAL_KV_EVENTS_PORT", "out of range 1-65535"),
])
def test_kv_events_inputs_are_refused_by_name(extra, key, words):
    err = refused_input(extra)
    assert err.key == key and words in str(err), str(err)


@pytest.mark.parametrize("extra", [
    # events off: the engines' seed and hash algorithms are theirs
    {"NARWHAL_ENGINE_ENV": "PYTHONHASHSEED=1", "NARWHAL_NODE_1_EXTRA_ARGS": "--prefix-caching-hash-algo xxhash"},
    {"NARWHAL_KV_EVENTS": "off", "NARWHAL_ROUTER_DECODE_POLICY": "kv_aware", "NARWHAL_BIND_FAMILY": "ipv6"},
    # events on, every engine alike: the seed given twice, one algorithm for all (the site's, or each node the same)
    {"NARWHAL_KV_EVENTS": "on", "NARWHAL_KV_HASH_SEED": "42", "NARWHAL_NODE_1_ENGINE_ENV": "PYTHONHASHSEED=42",
     "NARWHAL_EXTRA_ARGS": "--prefix-caching-hash-algo xxhash"},
    {"NARWHAL_ROUTER_POLICY": "kv_aware", "NARWHAL_NODE_1_EXTRA_ARGS": "--prefix-caching-hash-algo sha256_cbor",
     "NARWHAL_NODE_2_EXTRA_ARGS": "--prefix-caching-hash-algo=sha256_cbor"},
])
def test_kv_events_inputs_that_agree_pass(extra):
    assert load_inputs(dict(MINIMAL, **extra))["site"]
