# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: fleet
short_description: The fleet file with its ${NAME} values resolved
version_added: 0.1.0
description:
  - Reads the fleet file and resolves it with complete-value substitution (see docs/substitution.md). Values come
    from the controller's process environment, over the site C(.env), over C(deployment.env); it is the same code
    as the C(narwhal.deploy.resolve_values) filter and C(scripts/narwhal-fleet).
  - The C(.env) files are read with literal values (python-dotenv's own C(${VAR}) expansion is off); only a fleet
    value that is exactly C(${NAME}) is substituted. Secret-looking values in error messages show as
    C(<redacted>).
  - A resolved C(url) or C(attestation_url) with user information (C(http://user:KEY@host:port)) is refused, naming
    the fleet file, the entry and the field, with the user information shown as C(<redacted>); the engines take the
    key as a Bearer header from C(NARWHAL_API_KEY_FILE), never from a URL.
  - Without a path, the site's fleet - C(narwhal_site.paths.fleet) with C(narwhal_site.env_file) and
    C(narwhal_site.paths.deployment_env), the fact the opening play sets (playbooks/boilerplate.yml). The fleet is
    then resolved once per run - the opening play keeps it as the fact C(narwhal_fleet) (O(stamped)) - and returned
    from that fact while its three files are the files it was resolved from (path, inode, size and modification
    time; discovery replaces them by rename), else resolved again.
options:
  _terms:
    description: Path of the fleet file; the site's when none is given.
    required: false
  env_file:
    description: The site C(.env); the site's when no fleet path is given.
    type: path
  deployment_env:
    description: The generated C(deployment.env); the site's when no fleet path is given.
    type: path
  stamped:
    description: Return C({stamp, fleet}) for the site's fleet, the stamp naming the files it was resolved from (the
      opening play keeps it as C(narwhal_fleet)).
    type: bool
    default: false
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: The site's fleet (resolved once per run)
  ansible.builtin.debug:
    msg: "{{ lookup('narwhal.deploy.fleet') | map(attribute='url') }}"

- name: Engine URLs
  ansible.builtin.debug:
    msg: "{{ lookup('narwhal.deploy.fleet', 'config/fleet.json', env_file='.env', deployment_env='config/deployment.env') }}"
"""

RETURN = r"""
_raw:
  description: The resolved fleet (one list).
  type: list
  elements: dict
"""

import json
import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import refuse_fleet_userinfo
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.secrets import redact_text, secret_values
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import read_regular
from ansible_collections.narwhal.deploy.plugins.module_utils._inputs.dotenv import (
    DOTENV_IMPORT_ERROR,
    DotenvError,
    read_dotenv,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._plan.subst import (
    SubstitutionError,
    layered_env,
    resolve_values,
)


def stamp(paths):
    """[[path, inode, size, mtime_ns] or [path, None]] of the files a fleet is resolved from."""
    out = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            out.append([path, None])
            continue
        out.append([path, st.st_ino, st.st_size, st.st_mtime_ns])
    return out


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        if DOTENV_IMPORT_ERROR:
            raise AnsibleLookupError("narwhal.deploy.fleet needs python-dotenv on the controller")
        if terms:
            env_file, deployment = self.get_option("env_file"), self.get_option("deployment_env")
            if not env_file or not deployment:
                raise AnsibleLookupError("narwhal.deploy.fleet: a fleet path needs env_file and deployment_env")
            return self.resolved(terms, env_file, deployment)
        site = (variables or {}).get("narwhal_site") or {}
        paths = site.get("paths") or {}
        if not paths.get("fleet"):
            raise AnsibleLookupError("narwhal.deploy.fleet: no site inputs to take the fleet from (the fact narwhal_site "
                                     "of playbooks/boilerplate.yml); run the playbook's opening play, or give the "
                                     "fleet's path with env_file and deployment_env")
        files = [paths["fleet"], site["env_file"], paths["deployment_env"]]
        now = stamp(files)
        if self.get_option("stamped"):
            return [{"stamp": now, "fleet": self.resolved(files[:1], files[1], files[2])[0]}]
        kept = (variables or {}).get("narwhal_fleet")
        if isinstance(kept, dict) and [list(s) for s in kept.get("stamp") or []] == now:
            return [kept["fleet"]]
        return self.resolved(files[:1], files[1], files[2])

    def resolved(self, terms, env_file, deployment):
        """The fleets of `terms`, each resolved over the process environment, .env and deployment.env."""
        try:
            env = layered_env(dict(os.environ),
                              read_dotenv(env_file) if os.path.exists(env_file) else {},
                              read_dotenv(deployment) if os.path.exists(deployment) else {})
        except DotenvError as exc:
            raise AnsibleLookupError("narwhal.deploy.fleet: %s" % exc)
        secrets = secret_values(env)
        out = []
        for term in terms:
            try:
                out.append(refuse_fleet_userinfo(resolve_values(json.loads(read_regular(term).decode("utf-8")), env),
                                                 term))
            except SubstitutionError as exc:
                raise AnsibleLookupError(redact_text("%s: %s" % (term, exc), secrets))
            except PlanError as exc:  # names the fleet file itself
                raise AnsibleLookupError(redact_text(str(exc), secrets))
            except (OSError, ValueError, RecursionError) as exc:
                if isinstance(exc, RecursionError):
                    exc = "nested too deeply to be a fleet"
                raise AnsibleLookupError(redact_text("cannot read the fleet %s: %s; run discovery first"
                                                     % (term, exc), secrets))
        return out
