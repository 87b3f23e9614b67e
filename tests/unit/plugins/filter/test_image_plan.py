"""The image_plan filter: a thin call of _deliver/images.py::plan_images over the registered reads (a host whose read
was skipped left out), the image_sources result and the resolvers' registered pulls; a refusal is a filter error."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.filter.narwhal import image_plan

REF = "registry.example:5000/vllm/vllm-openai:v1"
ID_A, ID_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
DIGEST = "registry.example:5000/vllm/vllm-openai@sha256:" + "1" * 64


def _read(image_id=None):
    return {"changed": False, "held": [image_id] if image_id else [],
            "images": [{"key": "NARWHAL_IMAGE", "reference": REF, "present": bool(image_id), "image_id": image_id,
                        "repo_digests": [], "repo_tags": []}]}


def test_the_plan_from_registered_results():
    reads = {"engine-1": _read(), "engine-2": _read(), "router-1": {"skipped": True, "changed": False}}
    sources = {"pins": {}, "archives": [], "auth_registries": []}
    first = image_plan(reads, sources)
    assert first["resolvers"] == {REF: "engine-1"} and sorted(first["hosts"]) == ["engine-1", "engine-2"]
    pulled = [{"results": [{"reference": REF, "host": "engine-1", "image_id": ID_A, "digest": DIGEST}]},
              {"results": []}]
    second = image_plan(reads, sources, False, pulled, "/p/image-pins.json")
    assert [a["image"] for a in second["hosts"]["engine-2"]] == [DIGEST] and second["pending"] == []


def test_a_refusal_is_a_filter_error():
    sources = {"pins": {REF: {"image_id": ID_A, "digest": None, "source": "hosts"}}, "archives": []}
    with pytest.raises(AnsibleFilterError, match="on host engine-1, .* the tag moved"):
        image_plan({"engine-1": _read(ID_B)}, sources, False, None, "/p/image-pins.json")
