#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_delivery
short_description: Read, pull, tag or load the images a host runs, over its Docker Engine API
version_added: 0.3.0
description:
  - The deliver stage's host module (docs/delivery.md, "Images"); the role C(narwhal.deploy.deliver) runs it on the
    engine and router hosts, and the C(narwhal.deploy.image_plan) filter decides what each host does.
  - Talks to the host's Docker daemon over its Engine API with the standard library (no Docker SDK, no C(docker)
    command on the host).
  - O(state=read) inspects each of O(references) and lists the image IDs the host holds; read-only.
  - O(state=pull) pulls O(image) (C(POST /images/create), reading the daemon's progress stream to its end) unless
    O(image) is a C(<repository>@sha256:...) the host already holds; with O(tag), tags the result as O(reference).
    Credentials come from O(auth_file), a Docker C(config.json) on the host whose entry for the image's registry
    becomes the C(X-Registry-Auth) header; they never appear in an option, a result or a message.
  - A failed pull is refused naming the host, the reference, its C(.env) key, the registry and the input that fixes
    it - C(NARWHAL_REGISTRY_AUTH_FILE) (unauthorized, no basic auth credentials), C(NARWHAL_REGISTRY_CA_FILE)
    (x509 - certificate signed by unknown authority), the reference's key (manifest unknown, not found), or the
    registry's address (connection refused, no such host).
  - O(state=tag) tags O(image) (an image ID the host holds) as O(reference) (C(POST /images/{name}/tag)).
  - O(state=load) checks the sha256 of the archive at O(path) against O(sha256), then loads it
    (C(POST /images/load), the file streamed in 1 MiB blocks) unless the host already holds O(image_id); with O(tag)
    tags the image as O(reference); with O(remove) the archive's copy is removed, whatever happened.
options:
  state:
    description: What to do.
    type: str
    choices: [read, pull, tag, load]
    required: true
  references:
    description: The references to read (O(state=read)), each with the C(.env) key that names it.
    type: list
    elements: dict
    default: []
    suboptions:
      reference:
        description: An image reference or ID, as C(.env) gives it.
        type: str
        required: true
      key:
        description: The C(.env) key of the reference (C(NARWHAL_IMAGE), C(NARWHAL_NODE_<n>_IMAGE),
          C(NARWHAL_ROUTER_IMAGE)), for the messages.
        type: str
        default: NARWHAL_IMAGE
  reference:
    description: The reference as C(.env) gives it - the tag to set, and the name in messages (O(state=pull),
      O(state=tag), O(state=load)).
    type: str
  key:
    description: The C(.env) key of O(reference), for the messages.
    type: str
    default: NARWHAL_IMAGE
  image:
    description:
      - O(state=pull) - what to pull, the reference itself (a resolver) or C(<repository>@sha256:<digest>).
      - O(state=tag) - the image to tag, by ID.
    type: str
  image_id:
    description: The image ID the pull or the load must give (the pin); a load is skipped when the host holds it.
    type: str
  tag:
    description: Tag the pulled or loaded image as O(reference).
    type: bool
    default: false
  auth_file:
    description: A Docker C(config.json) on the host (the role's 0600 copy of C(NARWHAL_REGISTRY_AUTH_FILE)); unset,
      pulls are anonymous.
    type: path
  path:
    description: The docker save archive's copy on the host (O(state=load)).
    type: path
  sha256:
    description: The archive's sha256, hex (O(state=load)).
    type: str
  remove:
    description: Remove the archive's copy at O(path) once the load ends, loaded or refused (O(state=load)).
    type: bool
    default: true
  host:
    description: The inventory name of this host, for the messages.
    type: str
  timeout:
    description: Seconds per Docker API call.
    type: int
    default: 60
  stream_timeout:
    description: Seconds a pull or a load may go without a word from the Docker daemon.
    type: int
    default: 600
attributes:
  check_mode:
    description: Reports what a pull, a tag or a load would change and changes nothing (a resolver reports no image).
    support: full
  diff_mode:
    description: Returns no diff.
    support: none
  platform:
    platforms: linux
    details:
      - Runs on an engine or router host with a Docker daemon.
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.docker_access
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Read the images this host runs
  narwhal.deploy.image_delivery:
    state: read
    references:
      - key: NARWHAL_IMAGE
        reference: registry.example:5000/vllm/vllm-openai:v0.33.0
  become: true
  register: __read

- name: Pull the pinned digest and tag it as the reference
  narwhal.deploy.image_delivery:
    state: pull
    image: registry.example:5000/vllm/vllm-openai@sha256:4f0e6c1a2b3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7
    reference: registry.example:5000/vllm/vllm-openai:v0.33.0
    tag: true
    auth_file: /root/.narwhal-registry-auth.json
    host: "{{ inventory_hostname }}"
  become: true
"""

RETURN = r"""
images:
  description: Per reference (O(state=read)) - C(key), C(reference), C(present), C(image_id), C(repo_digests),
    C(repo_tags).
  returned: when state is read
  type: list
  elements: dict
held:
  description: The IDs of every image the host holds (O(state=read)).
  returned: when state is read
  type: list
  elements: str
image_id:
  description: The image's ID after the pull, tag or load (null for a pull in check mode).
  returned: when state is pull, tag or load
  type: str
  sample: sha256:6a0bf322ed5f000000000000000000000000000000000000000000000000000000
digest:
  description: The image's RepoDigest of the reference's repository, C(<repository>@sha256:...), or null.
  returned: when state is pull
  type: str
repo_digests:
  description: The image's RepoDigests after the pull.
  returned: when state is pull
  type: list
  elements: str
pulled:
  description: Whether the registry was asked (false - the host already held the digest).
  returned: when state is pull
  type: bool
loaded:
  description: Whether the archive was loaded (false - the host already held the image).
  returned: when state is load
  type: bool
reference:
  description: O(reference), echoed for the plan's second pass.
  returned: when state is pull, tag or load
  type: str
host:
  description: O(host), echoed for the plan's second pass.
  returned: when state is pull, tag or load
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.narwhal.deploy.plugins.module_utils._deliver.image_host import run_module


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", required=True, choices=["read", "pull", "tag", "load"]),
            references=dict(type="list", elements="dict", default=[],
                            options=dict(reference=dict(type="str", required=True),
                                         key=dict(type="str", default="NARWHAL_IMAGE", no_log=False))),
            reference=dict(type="str"),
            key=dict(type="str", default="NARWHAL_IMAGE", no_log=False),
            image=dict(type="str"),
            image_id=dict(type="str"),
            tag=dict(type="bool", default=False),
            auth_file=dict(type="path"),
            path=dict(type="path"),
            sha256=dict(type="str"),
            remove=dict(type="bool", default=True),
            host=dict(type="str"),
            docker_host=dict(type="str", default="unix:///var/run/docker.sock"),
            timeout=dict(type="int", default=60),
            stream_timeout=dict(type="int", default=600),
        ),
        required_if=[("state", "pull", ("image", "reference")), ("state", "tag", ("image", "reference")),
                     ("state", "load", ("path", "sha256", "image_id"))],
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
