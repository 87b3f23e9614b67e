# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fake Docker Engine API client (the calls image_facts makes through
plugins/module_utils/_docker/engine_api.py) and the stand-in image's attributes and versions."""

from __future__ import annotations

import json

from ansible_collections.narwhal.deploy.plugins.module_utils._docker import engine_api as _engine_api

IMAGE_ID = "sha256:" + "6a0bf322ed5f" + "0" * 52
STANDIN_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "NVIDIA_VISIBLE_DEVICES=all",
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    "CUDA_VERSION=12.9.1",
    "LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64",
    "VLLM_USAGE_SOURCE=production-docker-image",
    "VLLM_WORKER_MULTIPROC_METHOD=spawn",
    "UCX_HOME=/usr/local/ucx",
    "NIXL_PLUGIN_DIR=/usr/local/lib/python3.11/dist-packages/nixl_cu12.libs/nixl",
    "HF_TOKEN=hf_secret",
    "AWS_SECRET_ACCESS_KEY=abc",
    "VLLM_API_KEY=sk-secret",
    "GITHUB_TOKEN=ghp_x",
    "HOME=/root",
]


class FakeContainer:
    def __init__(self, client, body):
        self.client = client
        self.entrypoint = body["Entrypoint"]
        self.command = body["Cmd"]
        self.removed = False


class FakeClient:
    def __init__(self, attrs, versions, pythons=("python3",), answering=True, hang=False):
        self.attrs = attrs
        self.versions = versions
        self.pythons = pythons
        self.answering = answering
        self.hang = hang
        self.created = []
        self.killed = 0

    def image(self, ref):
        if not self.answering:
            raise _engine_api.DaemonUnreachable("the Docker daemon does not answer at tcp://h:2375 "
                                                "([Errno 111] Connection refused)")
        if ref not in self.attrs["RepoTags"] and ref != self.attrs["Id"]:
            raise _engine_api.NotFound("404 Not Found (GET /images/%s/json): No such image: %s" % (ref, ref), 404)
        return self.attrs

    def config(self, image, **kwargs):
        return _engine_api.container_config(image, **kwargs)

    def create(self, name, body):
        assert body["Image"] == self.attrs["Id"]
        assert body["HostConfig"]["NetworkMode"] == "none"
        self.created.append(FakeContainer(self, body))
        return {"Id": str(len(self.created) - 1), "Warnings": []}

    def start(self, ident):
        container = self.created[int(ident)]
        if container.entrypoint[0] not in self.pythons:
            raise _engine_api.EngineAPIError(
                '400 Bad Request (POST /containers/%s/start): OCI runtime create failed: exec: "%s": executable '
                'file not found in $PATH' % (ident, container.entrypoint[0]), 400)

    def wait(self, ident, timeout=None):
        if self.hang:
            raise _engine_api.Timeout("POST /containers/%s/wait: no answer within %s s" % (ident, timeout))
        return {"StatusCode": 0}

    def logs(self, ident, stdout=True, stderr=True, tail="all", tty=False):
        if stdout:
            command = self.created[int(ident)].command
            found = {k: v for k, v in self.versions.items() if k in command}
            return ("NARWHAL_IMAGE_FACTS:" + json.dumps(found) + "\n").encode()
        return b""

    def kill(self, ident):
        self.killed += 1

    def remove(self, ident, force=False):
        self.created[int(ident)].removed = True


STANDIN_ATTRS = {
    "Id": IMAGE_ID,
    "RepoTags": ["narwhal-sim/engine-standin:latest"],
    "RepoDigests": [],
    "Architecture": "amd64",
    "Os": "linux",
    "Config": {
        "Env": STANDIN_ENV,
        "Entrypoint": ["vllm", "serve"],
        "Cmd": None,
        "Labels": {"org.narwhal.standin": "gpu-vllm-image"},
    },
}
STANDIN_VERSIONS = {"vllm": "0.33.0", "nixl": "1.5.1", "nixl-cu12": "1.5.1"}
