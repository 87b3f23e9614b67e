# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's GPU allocation (plugins/module_utils/_discover/gpu_allocation.py), in the records it builds from the
real fact producers: which GPUs each engine gets, the TP size, the device paths, the GPU visibility variable's value
(UUIDs or container-relative indices) and the image that does not fit the GPUs. The builders:
tests/unit/plugins/test_support/records.py."""

from __future__ import annotations

from test_support.paths import REAL
from test_support.records import (
    ROCM_DISTS,
    ROCM_ENV,
    V100S_UUIDS,
    amd,
    build,
    host,
    image,
    nv_pair,
    nvidia,
    refused,
)

from ansible_collections.narwhal.deploy.plugins.module_utils._facts import gpu as _gpu
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu_reader import nvidia_facts


def test_gpus_per_engine_splits_one_host(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    assert recs["engine-1"]["gpu_host_indices"] == [0, 1, 2, 3]
    assert recs["engine-2"]["gpu_host_indices"] == [4, 5, 6, 7]
    assert recs["engine-1"]["tensor_parallel_size"] == 4 and recs["engine-2"]["tensor_parallel_size"] == 4
    assert recs["engine-2"]["accelerator"] == {"vendor": "nvidia", "product": "Tesla V100S-PCIE-32GB", "count": 4}
    assert "lowest free" in recs["engine-2"]["sources"]["allocation"]


def test_explicit_gpu_ids(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_1_GPU_IDS": "4,5,6,7"}, nv_pair(tmp_path))
    assert recs["engine-1"]["gpu_host_indices"] == [4, 5, 6, 7]
    assert recs["engine-1"]["sources"]["allocation"] == "NARWHAL_NODE_1_GPU_IDS=4,5,6,7"
    assert recs["engine-2"]["gpu_host_indices"] == [0, 1, 2, 3]


def test_separate_hosts_each_start_at_zero(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2"}, nv_pair(tmp_path), shared=False)
    assert recs["engine-1"]["gpu_host_indices"] == [0, 1] and recs["engine-2"]["gpu_host_indices"] == [0, 1]


def test_overlapping_gpu_ids_name_key_and_other_engine(tmp_path, dev):
    err = refused({"NARWHAL_NODE_1_GPU_IDS": "2,3", "NARWHAL_NODE_2_GPU_IDS": "3,4"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_2_GPU_IDS"
    assert "engine-1" in str(err) and "GPU 3" in str(err)


def test_explicit_ids_of_a_later_engine_are_reserved(tmp_path, dev):
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_NODE_2_GPU_IDS": "0,1,2,3"}, nv_pair(tmp_path))
    assert recs["engine-1"]["gpu_host_indices"] == [4, 5, 6, 7]
    assert recs["engine-2"]["gpu_host_indices"] == [0, 1, 2, 3]


def test_nonexistent_gpu_index(tmp_path, dev):
    err = refused({"NARWHAL_NODE_1_GPU_IDS": "7,8"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_NODE_1_GPU_IDS" and "GPU index 8 does not exist" in str(err)


def test_fewer_free_gpus_than_requested(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "5"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_GPUS_PER_ENGINE"
    assert "engine-2 needs 5 GPU(s) but its host has only 3 free" in str(err) and "engine-1" in str(err)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "9"}, nv_pair(tmp_path), shared=False)
    assert err.key == "NARWHAL_GPUS_PER_ENGINE" and "engine-1 needs 9" in str(err)


def test_all_gpus_for_the_first_engine_leaves_none(tmp_path, dev):
    err = refused({}, nv_pair(tmp_path))  # default NARWHAL_GPUS_PER_ENGINE=all
    assert err.key == "NARWHAL_GPUS_PER_ENGINE" and "engine-1" in str(err)


def test_no_gpus_with_cuda_image_names_engine(tmp_path, dev):
    hosts = nv_pair(tmp_path)
    hosts["engine-2"] = host(_gpu.empty_facts("nvidia-smi"), tmp_path)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, hosts, shared=False)
    assert err.key == "engine-2" and "no GPU was found on engine-2" in str(err)


def test_tp_must_match_gpu_count(tmp_path, dev):
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4", "NARWHAL_TP_SIZE": "2"}, nv_pair(tmp_path))
    assert err.key == "NARWHAL_TP_SIZE" and "4 GPU(s)" in str(err)
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_TP_SIZE": "2"}, nv_pair(tmp_path))
    assert recs["engine-2"]["tensor_parallel_size"] == 2


def test_nvidia_engine_on_gpus_4_to_7_uses_their_uuids(tmp_path, dev):
    (dev / "nvidia-uvm-tools").write_text("")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, nv_pair(tmp_path))
    second = recs["engine-2"]
    assert second["gpu_ids"] == V100S_UUIDS[4:]
    assert second["gpu_host_indices"] == [4, 5, 6, 7]
    assert second["gpu_visibility_env"] == "CUDA_VISIBLE_DEVICES"
    assert second["accelerator_devices"] == ["/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia6", "/dev/nvidia7",
                                             "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert recs["engine-1"]["gpu_ids"] == V100S_UUIDS[:4]
    assert "UUID" in second["sources"]["visibility"]


def test_nvidia_control_nodes_only_when_present(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidiactl").write_text("")
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "1", "NARWHAL_NODE_2_GPU_IDS": "6"}, nv_pair(tmp_path))
    assert recs["engine-2"]["accelerator_devices"] == ["/dev/nvidia6", "/dev/nvidiactl"]


def test_duplicated_uuids_use_container_indices(tmp_path, dev):
    h = host(nvidia(dev, "telegraf__dual_2080-v13.xml", tmp_path), tmp_path)
    recs = build({}, {"engine-1": h, "engine-2": h}, shared=False)
    assert recs["engine-1"]["gpu_ids"] == ["0", "1"]
    assert recs["engine-1"]["gpu_host_indices"] == [0, 1]
    assert recs["engine-1"]["accelerator_devices"] == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl",
                                                       "/dev/nvidia-uvm"]
    assert "duplicated" in recs["engine-1"]["sources"]["visibility"]


def test_masked_uuid_capture_uses_container_indices(tmp_path, dev):
    text = (REAL / "nvidia" / "nvgpuexp__linux-x86_64__nvidia-h200__590.48.01.capture.txt").read_text()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# idle :: query (-q)"))
    end = next(i for i in range(start + 3, len(lines)) if lines[i].startswith("####"))
    parsed = _gpu.parse_nvidia_smi_text("\n".join(lines[start + 3:end]))
    assert [g["uuid"] for g in parsed["gpus"]] == ["GPU-00000000-0000-0000-0000-000000000000"]
    h = host(nvidia_facts(parsed, str(tmp_path), str(dev), "nvidia-smi -q"), tmp_path)
    recs = build({}, {"engine-1": h, "engine-2": h}, shared=False)
    assert recs["engine-1"]["gpu_ids"] == ["0"]
    assert recs["engine-1"]["accelerator"]["product"] == "NVIDIA H200"


def test_amd_engine_gets_container_indices_and_its_own_nodes(tmp_path):
    h = host(amd(), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"))
    recs = build({"NARWHAL_GPUS_PER_ENGINE": "2"}, {"engine-1": h, "engine-2": h})
    second = recs["engine-2"]
    assert second["gpu_host_indices"] == [2, 3]
    assert second["gpu_ids"] == ["0", "1"]
    assert second["gpu_visibility_env"] == "ROCR_VISIBLE_DEVICES"
    assert second["accelerator_devices"] == ["/dev/kfd", "/dev/dri/renderD130", "/dev/dri/card2",
                                             "/dev/dri/renderD131", "/dev/dri/card3"]
    assert recs["engine-1"]["accelerator_devices"] == ["/dev/kfd", "/dev/dri/renderD128", "/dev/dri/card0",
                                                       "/dev/dri/renderD129", "/dev/dri/card1"]
    assert second["accelerator"] == {"vendor": "amd", "product": "Arcturus GL-XL [Instinct MI100]", "count": 2}
    assert second["runtime"]["platform"] == "rocm"


def test_cuda_image_on_amd_gpus_is_refused(tmp_path):
    h = host(amd(), tmp_path)
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "2"}, {"engine-1": h, "engine-2": h})
    assert err.key == "NARWHAL_IMAGE" and "CUDA image" in str(err) and "AMD GPUs" in str(err)
    rocm = host(amd(), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"))
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "2", "NARWHAL_NODE_2_IMAGE": "vllm/vllm-openai:v0.33.0"},
                  {"engine-1": rocm, "engine-2": h})
    assert err.key == "NARWHAL_NODE_2_IMAGE"


def test_rocm_image_on_nvidia_gpus_is_refused(tmp_path, dev):
    h = host(nvidia(dev), tmp_path, img=image(ROCM_DISTS, ROCM_ENV, "rocm/vllm:0.33.0"))
    err = refused({"NARWHAL_GPUS_PER_ENGINE": "4"}, {"engine-1": h, "engine-2": h})
    assert err.key == "NARWHAL_IMAGE" and "ROCM image" in str(err)


def test_cpu_image_on_host_without_gpus(tmp_path):
    img = image({"vllm": "0.32.0+cpu", "nixl": "0.7.1", "torch": "2.9.0+cpu"}, ["PATH=/usr/bin"],
                "vllm/vllm-openai-cpu:v0.32.0")
    assert img["platform"] == "cpu"
    h = host(_gpu.empty_facts("none"), tmp_path, img=img)
    # vLLM's CPU attention backend takes multiples of 32 only (the engine dies at start with 16 + NIXL)
    err = refused({}, {"engine-1": h, "engine-2": h}, shared=False)
    assert err.key == "NARWHAL_BLOCK_SIZE" and "set NARWHAL_BLOCK_SIZE=32" in str(err)
    recs = build({"NARWHAL_BLOCK_SIZE": "64"}, {"engine-1": h, "engine-2": h}, shared=False)
    rec = recs["engine-1"]
    assert rec["runtime"]["block_size"] == 64
    assert rec["accelerator"] == {"vendor": "cpu", "product": "cpu", "count": 0}
    assert rec["gpu_ids"] == [] and rec["gpu_host_indices"] == [] and rec["accelerator_devices"] == []
    assert rec["gpu_visibility_env"] is None and rec["tensor_parallel_size"] == 1
    assert rec["runtime"]["kv_buffer_device"] == "cpu"
