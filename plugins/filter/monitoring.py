# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters of the monitoring stage beside prometheus_targets and prometheus_scrape (narwhal.py): prometheus_rules, the
alert rules of the fleet (_monitor/rules.py; docs/monitoring.md, "Alert rules")."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import InputError, PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.rules import rules
from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import fleet_name


def prometheus_rules(fleet, routers, fleet_file, site=None):
    """The Prometheus rules document of the resolved fleet and the routers' records (_monitor/rules.py::rules), its
    thresholds and `for` from the site inputs (NARWHAL_ALERT_*), labelled with the fleet's name (the fleet file's name
    without .json, as the targets)."""
    if not isinstance(fleet_file, str) or not fleet_file:
        raise AnsibleFilterError("prometheus_rules takes the fleet file's path (narwhal_site.paths.fleet) third")
    try:
        return rules(fleet, routers or [], fleet_name(fleet_file), site or {})
    except (InputError, PlanError) as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule:
    def filters(self):
        return {"prometheus_rules": prometheus_rules}
