#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/image_sources.py does the work in the
# controller's process, with the step plugins/module_utils/_deliver/image_sources.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: image_sources
short_description: What the controller holds for the image plan (pins, image archives, registry credentials)
version_added: 0.3.0
description:
  - Reads the pin file O(pin_file) (C(<config_dir>/image-pins.json), the image each reference is pinned to; absent -
    no pins), refusing one that is not a pin file by name.
  - With O(archive_dir) (C(NARWHAL_IMAGE_ARCHIVE_DIR)), indexes each C(*.tar) docker save archive there - the images
    its C(manifest.json) names (C(Config), the image ID, and C(RepoTags)) and its sha256, from C(<name>.tar.sha256)
    (sha256sum's format) when there is one, else computed once and kept in O(archive_cache) by path, size and mtime.
  - With O(auth_file) (C(NARWHAL_REGISTRY_AUTH_FILE)), refuses the file unless it is mode 0600 or stricter and
    Docker's C(config.json) format, and returns only the names of the registries it holds credentials for.
  - Nothing on the hosts changes; O(archive_cache) is rewritten (0644) only when it changes, and not in check mode.
options:
  pin_file:
    description: The pin file.
    type: path
    required: true
  archive_dir:
    description: The directory of docker save archives.
    type: path
  archive_cache:
    description: The archive index's cache (needed with O(archive_dir)).
    type: path
  auth_file:
    description: The registry credentials, a Docker C(config.json).
    type: path
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.read_only
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Read the pins, the archives and the registries of the auth file
  narwhal.deploy.image_sources:
    pin_file: "{{ narwhal_site.paths.config_dir }}/image-pins.json"
    archive_dir: /srv/images
    archive_cache: "{{ narwhal_site.paths.config_dir }}/image-archives.json"
  delegate_to: localhost
  run_once: true
  register: __sources
"""

RETURN = r"""
pins:
  description: The pin file's pins - per reference its C(image_id), C(digest) and C(source); empty without a pin file.
  returned: always
  type: dict
archives:
  description: The archive index - per archive C(path), C(name), C(size), C(mtime_ns), C(sha256) and C(images)
    (C(image_id), C(repo_tags)).
  returned: always
  type: list
  elements: dict
auth_registries:
  description: The registries (C(host[:port]), C(docker.io)) O(auth_file) holds credentials for.
  returned: always
  type: list
  elements: str
"""
