# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Data- and expert-parallel engines as discovery records them (plugins/module_utils/_discover/parallelism.py):
DP x TP GPUs, the fields right after tensor_parallel_size (and nothing for DP 1 without EP), the per-node overrides,
EP refused for a dense model, and the side-channel ports of each engine's ranks by the image's vLLM. The builders:
tests/unit/plugins/test_support/records.py."""

from __future__ import annotations

import json

import pytest
from test_support.records import (
    CUDA_DISTS,
    build,
    host,
    image,
    model,
    nv_pair,
    refused,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu


@pytest.mark.parametrize("vllm,tp,ports", [
    ("0.33.0", 4, ([5600, 5600], [5601, 5601])),
    ("0.11.0", 4, ([5600, 5603], [5604, 5607])),
    ("0.11.0", 2, ([5600, 5601], [5602, 5603])),
])
def test_side_channel_ranges_do_not_overlap(tmp_path, dev, vllm, tp, ports):
    img = image(dict(CUDA_DISTS, vllm=vllm))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": str(tp)}, nv_pair(tmp_path, img=img))
    assert (recs["engine-1"]["node"]["side_channel_ports"], recs["engine-2"]["node"]["side_channel_ports"]) == ports
    assert recs["engine-2"]["node"]["side_channel_port"] == ports[1][0]
    apart = build({"NARWHAL_GPUS_PER_ENGINE": str(tp)}, nv_pair(tmp_path, img=img), shared=False)
    assert apart["engine-2"]["node"]["side_channel_port"] == 5600


MIXTRAL = "aiconf__mistralai--Mixtral-8x7B-v0.1"


def test_dp_engine_gets_dp_x_tp_gpus_and_a_side_channel_port_per_rank(tmp_path, dev):
    hosts = nv_pair(tmp_path, mdl=model(tmp_path, MIXTRAL))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2"}, hosts)
    one, two = recs["engine-1"], recs["engine-2"]
    assert one["gpu_host_indices"] == [0, 1, 2, 3] and two["gpu_host_indices"] == [4, 5, 6, 7]
    assert one["tensor_parallel_size"] == 2 and one["data_parallel_size"] == 2
    assert "enable_expert_parallel" not in one
    # the field sits right after tensor_parallel_size
    keys = list(one)
    assert keys[keys.index("tensor_parallel_size") + 1] == "data_parallel_size"
    # vLLM >= 0.14: base + DP rank, one port per rank; the second engine on the host starts after them
    assert one["node"]["side_channel_ports"] == [5600, 5601] and two["node"]["side_channel_ports"] == [5602, 5603]
    assert "NARWHAL_DATA_PARALLEL_SIZE=2: 2 data-parallel rank(s) of TP 2" in one["sources"]["parallelism"]


def test_dp_side_channel_span_before_0_14_is_one_port_per_worker(tmp_path, dev):
    img = image(dict(CUDA_DISTS, vllm="0.11.0"))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2"}, nv_pair(tmp_path, img=img))
    assert recs["engine-1"]["node"]["side_channel_ports"] == [5600, 5603]
    assert recs["engine-2"]["node"]["side_channel_ports"] == [5604, 5607]


def test_dp_1_and_ep_off_leave_the_record_as_it_was(tmp_path, dev):
    plain = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    explicit = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "1",
                      "NARWHAL_ENABLE_EXPERT_PARALLEL": "false"}, nv_pair(tmp_path))
    assert json.dumps(plain) == json.dumps(explicit)
    assert "data_parallel_size" not in plain["engine-1"] and "parallelism" not in plain["engine-1"]["sources"]


def test_per_node_dp_and_ep_override_the_site(tmp_path, dev):
    hosts = nv_pair(tmp_path, mdl=model(tmp_path, MIXTRAL))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "2", "NARWHAL_DATA_PARALLEL_SIZE": "2",
                  "NARWHAL_ENABLE_EXPERT_PARALLEL": "true", "NARWHAL_NODE_2_GPU_IDS": "4,5",
                  "NARWHAL_NODE_2_DATA_PARALLEL_SIZE": "1", "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL": "false"}, hosts)
    one, two = recs["engine-1"], recs["engine-2"]
    assert one["data_parallel_size"] == 2 and one["enable_expert_parallel"] is True
    assert "data_parallel_size" not in two and "enable_expert_parallel" not in two
    assert "NARWHAL_ENABLE_EXPERT_PARALLEL=true: expert parallelism over the 8 routed experts" in \
        one["sources"]["parallelism"]


def test_expert_parallel_refused_for_a_dense_model(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_ENABLE_EXPERT_PARALLEL": "true"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_ENABLE_EXPERT_PARALLEL"
    assert "a dense model" in str(err) and "set NARWHAL_ENABLE_EXPERT_PARALLEL=false" in str(err)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL": "true"},
                  nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_2_ENABLE_EXPERT_PARALLEL" and "engine-2" in str(err)


@pytest.mark.parametrize("src,experts", [
    ("helpy__DeepSeek-V3", 256), ("aiconf__moonshotai--Kimi-K2-Instruct", 384), (MIXTRAL, 8),
    ("aiconf__meta-llama--Meta-Llama-3.1-8B", None), ("aiconf__Qwen--Qwen2.5-7B", None),
])
def test_model_facts_count_experts_as_vllm_does(tmp_path, src, experts):
    assert model(tmp_path, src).get("num_experts") == experts


def test_dp_that_does_not_divide_the_gpus_is_refused(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "3", "NARWHAL_NODE_1_DATA_PARALLEL_SIZE": "2"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_1_DATA_PARALLEL_SIZE" and "cannot share equally" in str(err)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "4", "NARWHAL_DATA_PARALLEL_SIZE": "2"},
                  nv_pair(tmp_path))
    assert err.key == "NARWHAL_TP_SIZE" and "TP x DP" in str(err)


def test_cpu_engine_with_dp(tmp_path):
    h = host(_gpu.empty_facts("none"), tmp_path, img=image({"vllm": "0.32.0+cpu", "nixl": "0.7.1"}, ["PATH=/usr/bin"],
                                                           "vllm/vllm-openai-cpu:v0.32.0"))
    recs = build({"NARWHAL_BLOCK_SIZE": "64", "NARWHAL_DATA_PARALLEL_SIZE": "2"}, {"engine-1": h, "engine-2": h},
                 shared=False)
    rec = recs["engine-1"]
    assert rec["tensor_parallel_size"] == 1 and rec["data_parallel_size"] == 2 and rec["gpu_ids"] == []
    assert rec["node"]["side_channel_ports"] == [5600, 5601]
