#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

# Documentation only, as ansible-core's set_fact: the action plugin plugins/action/tls_material.py does the work in the
# controller's process, with the step plugins/module_utils/_tls/material.py (plugins/module_utils/_common/step.py).

from __future__ import annotations

DOCUMENTATION = r"""
---
module: tls_material
short_description: Make or check the site's TLS certificates on the controller
version_added: 0.2.0
description:
  - Runs on the controller, inside the controller's Ansible process (an action plugin, no module process).
  - The TLS material lives in O(dir) (C(NARWHAL_TLS_DIR)) - C(ca.crt) the CA certificate (mode C(0644)), C(ca.key)
    the site CA's private key (C(0600), site mode only), C(hosts/<host>.crt) the certificate of inventory host
    C(<host>) (C(0644)) and C(hosts/<host>.key) its private key (unencrypted PEM, C(0600)). See docs/tls.md.
  - With O(mode=site) it makes the site CA when neither C(ca.crt) nor C(ca.key) exists (EC P-256, C(CA:TRUE)
    pathlen 0, valid 10 years) and issues each host of O(hosts) a certificate (EC P-256, ECDSA with SHA-256, the
    host's names in its subjectAltName - addresses as iPAddress, names as dNSName -, extendedKeyUsage serverAuth,
    C(CA:FALSE), valid O(cert_days) days). A host's certificate is issued again, with a new key, when it or its key
    is missing or unreadable, when the key does not match it, when the site CA did not sign it, when its names are
    not the host's, and when fewer than 30 days are left. Only what changes is written (and a wrong file mode set
    right), all or nothing, under a lock of O(dir) (docs/outputs.md); a second run with the same hosts changes
    nothing.
  - Site mode refuses, naming the file and the fix, a C(ca.crt) without its C(ca.key) (or the reverse), a C(ca.key)
    that is not the key of C(ca.crt), and a site CA that is not valid now or has fewer than 30 days left.
  - With O(mode=operator) it writes nothing and checks the operator's files. Refused, naming the file and the fix -
    a missing C(ca.crt), host certificate or key; a file that is not PEM; a key that is not the certificate's (or is
    encrypted, or readable by group or others); a certificate not signed by a certificate of C(ca.crt) (its issuer
    name and signature); a certificate or CA expired or not yet valid; a CA certificate as a host's, or one whose
    extendedKeyUsage lacks serverAuth; a name of the host missing from its subjectAltName. A host certificate with
    fewer than 30 days left is a warning.
  - With O(mode=off) it does nothing and returns C(mode=off), no CA and no hosts.
  - No private key appears in the result or in a message.
options:
  mode:
    description: C(NARWHAL_TLS) - C(site) (the collection's own CA), C(operator) (the operator's certificates) or
      C(off) (plain HTTP).
    type: str
    required: true
    choices: [site, operator, "off"]
  dir:
    description: The TLS material's directory, an absolute path (C(narwhal_site.paths.tls_dir), C(NARWHAL_TLS_DIR)
      resolved against the project directory). Required unless O(mode=off).
    type: path
  cert_days:
    description: C(NARWHAL_TLS_CERT_DAYS) - days a certificate the site CA issues is valid (at most as long as the
      CA); more than 30.
    type: int
    default: 365
  hosts:
    description: The inventory hosts that need a certificate, each with the names it is reached at.
    type: list
    elements: dict
    default: []
    suboptions:
      host:
        description: The inventory host (the files are C(hosts/<host>.crt) and C(.key)).
        type: str
        required: true
      names:
        description: The addresses (IPv4, IPv6 with or without brackets) and DNS names clients reach the host at,
          the URL host of its engine or its router address; each must be in the certificate's subjectAltName.
        type: list
        elements: str
        required: true
attributes:
  check_mode:
    description: Reports whether anything would be made or rewritten and writes nothing; the result describes
      certificates made in memory for a host that would get a new one.
  diff_mode:
    description: Says what is made and why, and which file modes are set right (C(prepared)); never a file's text.
    support: partial
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.writer
  - narwhal.deploy.attributes.controller
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: The TLS material of the play's engine hosts
  narwhal.deploy.tls_material:
    mode: "{{ narwhal_site.site.NARWHAL_TLS }}"
    dir: "{{ narwhal_site.paths.tls_dir }}"
    cert_days: "{{ narwhal_site.site.NARWHAL_TLS_CERT_DAYS }}"
    hosts:
      - host: engine-1
        names: [10.0.0.11]
      - host: engine-2
        names: ["fd00::12", engine-2.fabric.example]
  delegate_to: localhost
  run_once: true
  register: __prepare_tls
"""

RETURN = r"""
mode:
  description: The mode (O(mode)).
  returned: always
  type: str
  sample: site
ca:
  description: The CA certificate clients verify against (C(<dir>/ca.crt)); empty with O(mode=off).
  returned: always
  type: str
  sample: /srv/narwhal/config/tls/ca.crt
hosts:
  description: Per inventory host of O(hosts), its certificate; empty with O(mode=off).
  returned: always
  type: dict
  contains:
    cert:
      description: Its certificate (C(<dir>/hosts/<host>.crt)).
      type: str
      sample: /srv/narwhal/config/tls/hosts/engine-1.crt
    key:
      description: Its private key's path (C(<dir>/hosts/<host>.key)); never the key.
      type: str
      sample: /srv/narwhal/config/tls/hosts/engine-1.key
    sha256:
      description: The hex sha256 of the certificate's DER (a new certificate changes it).
      type: str
      sample: 5f0c3e0c2b0d4f6f8a1f9c3b7d2e6a4c1b0e9d8c7f6a5b4c3d2e1f0a9b8c7d6e
    not_after:
      description: When it expires (ISO 8601 UTC).
      type: str
      sample: "2027-12-06T10:44:44Z"
    days_left:
      description: Whole days until it expires.
      type: int
      sample: 364
    names:
      description: The names its subjectAltName holds, addresses first.
      type: list
      elements: str
      sample: [10.0.0.11]
  sample:
    engine-1:
      cert: /srv/narwhal/config/tls/hosts/engine-1.crt
      key: /srv/narwhal/config/tls/hosts/engine-1.key
      sha256: 5f0c3e0c2b0d4f6f8a1f9c3b7d2e6a4c1b0e9d8c7f6a5b4c3d2e1f0a9b8c7d6e
      not_after: "2027-12-06T10:44:44Z"
      days_left: 364
      names: [10.0.0.11]
"""
