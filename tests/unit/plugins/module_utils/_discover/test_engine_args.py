# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An engine's extra arguments and environment as discovery records them
(plugins/module_utils/_discover/engine_args.py): the derived flag, NARWHAL_EXTRA_ARGS, NARWHAL_ENGINE_ARGS and
NARWHAL_NODE_<n>_EXTRA_ARGS in that order, NARWHAL_ENGINE_ENV and NARWHAL_NODE_<n>_ENGINE_ENV over the image's
environment, with their sources, and the launcher-managed, secret and credential refusals naming the input. The
builders: tests/unit/plugins/test_support/records.py."""

from __future__ import annotations

import pytest
from test_support.records import (
    build,
    image,
    model,
    nv_pair,
    refused,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError


@pytest.mark.parametrize("src", ["syjjhl__chatglm2-6b", "helpy__DeepSeek-V3"])
def test_trust_remote_code_model(tmp_path, dev, src):
    mdl = model(tmp_path, src)
    assert mdl["trust_remote_code"] is True
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_EXTRA_ARGS": "--max-model-len 4096"},
                 nv_pair(tmp_path, mdl=mdl))
    rt = recs["engine-1"]["runtime"]
    assert rt["extra_args"] == ["--trust-remote-code", "--max-model-len", "4096"]
    assert rt["trust_remote_code"] is True


@pytest.mark.parametrize("args,flag", [
    ("--port 9000", "--port"),
    ("--max-model-len 4096 --tensor-parallel-size=2", "--tensor-parallel-size"),
    ("--api-key x", "--api-key"),
    ("--trust-remote-code", "--trust-remote-code"),
    ("-tp 2", "-tp"),
])
def test_managed_extra_args_refused(tmp_path, dev, args, flag):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_EXTRA_ARGS" and "overrides launcher-managed" in str(err) and flag in str(err)


@pytest.mark.parametrize("args", ["--tensor_parallel_size=2", "--api_key x"])
def test_managed_extra_args_with_underscores_refused(tmp_path, dev, args):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_EXTRA_ARGS"


def test_harmless_extra_args_kept_in_order(tmp_path, dev):
    args = "--max-model-len 8192 --gpu-memory-utilization=0.85 --enable-prefix-caching --chat-template '/a b.j2'"
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert recs["engine-2"]["runtime"]["extra_args"] == [
        "--max-model-len", "8192", "--gpu-memory-utilization=0.85", "--enable-prefix-caching", "--chat-template",
        "/a b.j2"]


def test_managed_and_secret_image_env_dropped(tmp_path, dev):
    img = image()
    img["env"] = {"NVIDIA_VISIBLE_DEVICES": "all", "HF_TOKEN": "x", "GITHUB_TOKEN": "y", "UCX_TLS": "all",
                  "CUDA_VISIBLE_DEVICES": "0", "VLLM_API_KEY": "k", "PATH": "/bin", "UCX_HOME": "/usr/local/ucx",
                  "CUDA_VERSION": "12.9.1"}
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path, img=img))
    assert recs["engine-1"]["runtime"]["environment"] == {"CUDA_VERSION": "12.9.1", "UCX_HOME": "/usr/local/ucx"}


def test_site_engine_env_recorded_over_the_image_env(tmp_path, dev):
    img = image()
    img["env"] = {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "WARNING"}
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4",
                  "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG HF_HUB_OFFLINE=1 'X_OPTS=a b'"},
                 nv_pair(tmp_path, img=img))
    for rec in recs.values():
        assert rec["runtime"]["environment"] == {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "DEBUG",
                                                 "HF_HUB_OFFLINE": "1", "X_OPTS": "a b"}
        assert "NARWHAL_ENGINE_ENV (HF_HUB_OFFLINE, VLLM_LOGGING_LEVEL, X_OPTS)" in rec["sources"]["environment"]


@pytest.mark.parametrize("text,word", [
    ("UCX_TLS=rc", "sets UCX_TLS, which is launcher-managed"),
    ("CUDA_VISIBLE_DEVICES=0", "sets CUDA_VISIBLE_DEVICES, which is launcher-managed"),
    ("HF_TOKEN=hf_abc", "sets HF_TOKEN, which looks like a secret"),
    ("VLLM_LOGGING_LEVEL", "is not KEY=VALUE"),
    ("1BAD=x", "is not KEY=VALUE"),
    ("A='unterminated", "not valid shell words"),
])
def test_bad_site_engine_env_refused_by_name(tmp_path, dev, text, word):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENGINE_ENV": text}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_ENGINE_ENV" and word in str(err)


def test_node_extra_args_follow_the_site_args_for_that_engine_only(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_EXTRA_ARGS": "--max-model-len 4096 --max-num-seqs 64",
                  "NARWHAL_NODE_2_EXTRA_ARGS": "--max_num_seqs=8 --enable-chunked-prefill"}, nv_pair(tmp_path))
    e1, e2 = recs["engine-1"], recs["engine-2"]
    assert e1["runtime"]["extra_args"] == ["--max-model-len", "4096", "--max-num-seqs", "64"]
    # the node's words last: vLLM's parser keeps the last --max-num-seqs, so the node's 8 wins
    assert e2["runtime"]["extra_args"] == ["--max-model-len", "4096", "--max-num-seqs", "64", "--max_num_seqs=8",
                                           "--enable-chunked-prefill"]
    assert e1["sources"]["extra_args"] == "NARWHAL_EXTRA_ARGS (--max-model-len 4096 --max-num-seqs 64)"
    assert e2["sources"]["extra_args"] == (
        "NARWHAL_EXTRA_ARGS (--max-model-len 4096 --max-num-seqs 64) + NARWHAL_NODE_2_EXTRA_ARGS "
        "(--max_num_seqs=8 --enable-chunked-prefill); the node's --max-num-seqs wins over the site's (vLLM takes "
        "the last)")


def test_node_extra_args_come_after_the_derived_flag(tmp_path, dev):
    mdl = model(tmp_path, "syjjhl__chatglm2-6b")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_NODE_1_EXTRA_ARGS": "--max-num-batched-tokens 16384"},
                 nv_pair(tmp_path, mdl=mdl))
    assert recs["engine-1"]["runtime"]["extra_args"] == ["--trust-remote-code", "--max-num-batched-tokens", "16384"]
    assert recs["engine-2"]["runtime"]["extra_args"] == ["--trust-remote-code"]
    assert recs["engine-1"]["sources"]["extra_args"].startswith("derived --trust-remote-code (auto_map")
    assert "NARWHAL_NODE_1_EXTRA_ARGS (--max-num-batched-tokens 16384)" in recs["engine-1"]["sources"]["extra_args"]
    assert "NARWHAL_NODE_1" not in recs["engine-2"]["sources"]["extra_args"]


def test_no_extra_args_says_so(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    assert recs["engine-2"]["runtime"]["extra_args"] == []
    assert recs["engine-2"]["sources"]["extra_args"] == (
        "none (no derived flag, NARWHAL_EXTRA_ARGS, NARWHAL_ENGINE_ARGS and NARWHAL_NODE_2_EXTRA_ARGS unset)")


def test_node_engine_env_over_the_site_env(tmp_path, dev):
    img = image()
    img["env"] = {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "WARNING"}
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=INFO HF_HUB_OFFLINE=1",
                  "NARWHAL_NODE_1_ENGINE_ENV": "VLLM_LOGGING_LEVEL=DEBUG 'X_OPTS=a b'"}, nv_pair(tmp_path, img=img))
    e1, e2 = recs["engine-1"], recs["engine-2"]
    assert e1["runtime"]["environment"] == {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "DEBUG",
                                            "HF_HUB_OFFLINE": "1", "X_OPTS": "a b"}
    assert e2["runtime"]["environment"] == {"UCX_HOME": "/usr/local/ucx", "VLLM_LOGGING_LEVEL": "INFO",
                                            "HF_HUB_OFFLINE": "1"}
    assert e1["sources"]["environment"].endswith(
        " + NARWHAL_ENGINE_ENV (HF_HUB_OFFLINE, VLLM_LOGGING_LEVEL) + NARWHAL_NODE_1_ENGINE_ENV (VLLM_LOGGING_LEVEL, "
        "X_OPTS; over the site's VLLM_LOGGING_LEVEL)")
    assert "NARWHAL_NODE_1" not in e2["sources"]["environment"]


@pytest.mark.parametrize("args,flag", [
    ("--port 9000", "--port"),
    ("--max-num-seqs 8 --tensor_parallel_size=2", "--tensor-parallel-size"),
    ("--trust-remote-code", "--trust-remote-code"),
    ("-tp 2", "-tp"),
])
def test_managed_flag_in_node_extra_args_refused_naming_the_node_key(tmp_path, dev, args, flag):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_2_EXTRA_ARGS": args}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_2_EXTRA_ARGS"
    assert str(err).startswith("NARWHAL_NODE_2_EXTRA_ARGS: NARWHAL_NODE_2_EXTRA_ARGS[")
    assert "overrides launcher-managed %s" % flag.replace("-tp", "--tensor-parallel-size") in str(err)


@pytest.mark.parametrize("text,word", [
    ("UCX_TLS=rc", "sets UCX_TLS, which is launcher-managed"),
    ("ROCR_VISIBLE_DEVICES=1", "sets ROCR_VISIBLE_DEVICES, which is launcher-managed"),
    ("PATH=/opt/bin", "sets PATH, which is launcher-managed"),
    ("HF_TOKEN=hf_abc", "sets HF_TOKEN, which looks like a secret"),
    ("MY_API_KEY=abc", "sets MY_API_KEY, which looks like a secret"),
    ("VLLM_LOGGING_LEVEL", "is not KEY=VALUE"),
])
def test_bad_node_engine_env_refused_naming_the_node_key(tmp_path, dev, text, word):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENGINE_ENV": "VLLM_LOGGING_LEVEL=INFO",
                   "NARWHAL_NODE_1_ENGINE_ENV": text}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_1_ENGINE_ENV" and word in str(err)


def test_engine_args_recorded_after_extra_args_and_before_node_args(tmp_path, dev):
    """NARWHAL_ENGINE_ARGS (plugins/module_utils/_inputs/catalogue.py) is a real input: recorded with its source,
    derived flags kept."""
    mdl = model(tmp_path, "syjjhl__chatglm2-6b")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_EXTRA_ARGS": "--max-model-len 4096",
                  "NARWHAL_ENGINE_ARGS": "--max-num-seqs 64", "NARWHAL_NODE_2_EXTRA_ARGS": "--max-num-seqs 8"},
                 nv_pair(tmp_path, mdl=mdl))
    assert recs["engine-2"]["runtime"]["extra_args"] == ["--trust-remote-code", "--max-model-len", "4096",
                                                         "--max-num-seqs", "64", "--max-num-seqs", "8"]
    assert "NARWHAL_ENGINE_ARGS (--max-num-seqs 64)" in recs["engine-1"]["sources"]["extra_args"]
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_ENGINE_ARGS": "--port 1"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_ENGINE_ARGS" and "overrides launcher-managed --port" in str(err)


@pytest.mark.parametrize("key, value, flag", [
    ("NARWHAL_EXTRA_ARGS", "--hf-token hf_operatorToken0123456789abcdef", "--hf-token"),
    ("NARWHAL_EXTRA_ARGS", "--hf_token=hf_operatorToken0123456789abcdef", "--hf_token"),
    ("NARWHAL_NODE_2_EXTRA_ARGS", "--enforce-eager --hf-tok hf_operatorToken0123456789abcdef", "--hf-tok"),
])
def test_credential_flags_in_extra_args_are_refused_without_their_value(tmp_path, key, value, flag):
    with pytest.raises(InputError) as info:
        build({key: value}, nv_pair(tmp_path))
    assert info.value.key == key
    assert "sets %s, which takes a credential" % flag in str(info.value)
    assert "hf_operatorToken" not in str(info.value)
