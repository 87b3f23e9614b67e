# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Discovery's engine table (the filter table_row): one fixed-width row per engine, a kept engine's note at its end."""

from ansible_collections.narwhal.deploy.plugins.filter.narwhal import table_row
from ansible_collections.narwhal.deploy.plugins.module_utils._discover.kept import KEPT_NOTE

ROW = {"engine": "engine-3", "interface": "eth1", "address": "10.0.0.13", "url": "http://10.0.0.13:8000",
       "attestation_url": "http://10.0.0.13:8010/v1/attestation", "role": "prefill"}


def test_a_kept_engines_row_ends_with_its_note():
    plain = table_row(ROW, {"engine-3": "gpu-c3"})
    assert plain.split() == ["engine-3", "gpu-c3", "eth1", "10.0.0.13", "http://10.0.0.13:8000",
                             "http://10.0.0.13:8010/v1/attestation", "prefill"]
    kept = table_row(dict(ROW, note=KEPT_NOTE), {"engine-3": "gpu-c3"})
    assert kept == plain + "   unreachable: kept its last record"
