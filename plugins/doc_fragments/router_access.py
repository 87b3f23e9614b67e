# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    # The router and its fleet as a module on a router host reaches them; the argument spec is ROUTER_ACCESS_SPEC in
    # plugins/module_utils/_common/specs.py.
    DOCUMENTATION = r"""
options:
  url:
    description: The router's base URL as the router host reaches it.
    type: str
    required: true
  engines:
    description: The resolved fleet (the C(narwhal.deploy.fleet) lookup), each entry with C(engine), C(role) and C(url).
    type: list
    elements: dict
    required: true
  api_key_file:
    description: The engines' API key file on the router host (mode 0600 or 0400, one line).
    type: path
    required: true
  ca_file:
    description:
      - The CA certificate (PEM) the router's and the engines' https certificates are verified against, the only one
        trusted (the router stage installs it as C(<NARWHAL_ROUTER_DIR>/tls/ca.crt)); unset, the system's CAs.
    type: path
"""
