# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: probe_engines
short_description: What the transfer probe knows of each engine from discovery's files
version_added: 0.1.0
description:
  - Reads the launch config and, for each of its engines, the inspection extract its record names
    (C(sources.host.file), C(engine-launch.<engine>.inspection.json) in O(config_dir)), and returns what
    M(narwhal.deploy.transfer_probe) takes as O(narwhal.deploy.transfer_probe#module:links) and
    O(narwhal.deploy.transfer_probe#module:max_model_len).
  - An engine's link is what its record moves KV over (C(transfer.transport), C(transfer.net_devices)) with the nominal
    rate discovery read on its host - the fabric interface's speed from C(/sys/class/net/<if>/speed) for C(ucx_tcp),
    each HCA port's rate from C(/sys/class/infiniband/<hca>/ports/<port>/rate) for C(ucx_rdma). An extract that is
    missing, unreadable or from an earlier discovery gives an unknown rate with the reason, never an error.
  - An engine's max_model_len is the record's C(--max-model-len), else the checkpoint's own bound as discovery read it
    (M(narwhal.deploy.model_facts)'s C(max_model_len)).
  - Reads only; the records, the fleet and the plans are not touched.
options:
  _terms:
    description: Path of the launch config (C(NARWHAL_LAUNCH_CONFIG)).
    required: true
  config_dir:
    description: The directory of discovery's extracts (C(NARWHAL_CONFIG_DIR)); the launch config's own directory when
      not given.
    type: path
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: The links and length bounds of the fleet's engines
  ansible.builtin.debug:
    msg: "{{ lookup('narwhal.deploy.probe_engines', 'config/engine-launch.local.json', config_dir='config') }}"
"""

RETURN = r"""
_raw:
  description:
    - One dict. C(links) maps each engine to its link (C(transport), C(rails) - each with C(rail), C(nominal_bits_s),
      C(rate), C(virtual) and C(why) - C(nominal_bits_s), the sum of its rails', and C(why) when that is unknown).
      C(max_model_len) maps each engine to the longest sequence it serves (null when unknown) and C(max_model_len_from)
      says where that was read, or why it is unknown.
  type: list
  elements: dict
"""

import json
import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.narwhal.deploy.plugins.module_utils._bench.plan import from_record
from ansible_collections.narwhal.deploy.plugins.module_utils._common.names import INSPECTION_FILE
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import read_regular
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.fabric import engine_link, max_model_len

# discovery's files are small JSON documents; a larger one is not one of them
LIMIT = 64 * 1024 * 1024


def _read_json(path):
    return json.loads(read_regular(path, LIMIT).decode("utf-8"))


def probe_engines(launch_config, config_dir, read=_read_json):
    """-> {"links", "max_model_len", "max_model_len_from"} of every engine of the launch config document."""
    engines = (launch_config or {}).get("engines") or {}
    out = {"links": {}, "max_model_len": {}, "max_model_len_from": {}}
    for engine, record in sorted(engines.items()):
        name = ((record.get("sources") or {}).get("host") or {}).get("file") or INSPECTION_FILE % engine
        where = os.path.join(config_dir, os.path.basename(name))
        try:
            extract = read(where)
        except (OSError, ValueError, RecursionError) as exc:
            extract, problem = None, getattr(exc, "strerror", None) or str(exc)
        else:
            problem = None if isinstance(extract, dict) else "not a JSON object"
            extract = extract if problem is None else None
        link = engine_link(engine, record, (extract or {}).get("host"))
        if problem:
            link["why"] = "cannot read %s (%s); rerun discovery" % (where, problem)
        out["links"][engine] = link
        limit, source = max_model_len(from_record(record)[1], (extract or {}).get("model"))
        out["max_model_len"][engine] = limit
        out["max_model_len_from"][engine] = source
    return out


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        out = []
        for term in terms:
            try:
                document = _read_json(term)
            except (OSError, ValueError, RecursionError) as exc:
                raise AnsibleLookupError("narwhal.deploy.probe_engines: cannot read the launch config %s: %s; run "
                                         "discovery first" % (term, getattr(exc, "strerror", None) or exc))
            if not isinstance(document, dict):
                raise AnsibleLookupError("narwhal.deploy.probe_engines: %s is not a launch config (a JSON object with "
                                         "engines)" % term)
            out.append(probe_engines(document, self.get_option("config_dir") or os.path.dirname(term)))
        return out
