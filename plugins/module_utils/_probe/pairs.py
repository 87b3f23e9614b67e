# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which prefill/decode pairs a fleet has (pure): the probe stage's pairs (plugins/filter/narwhal.py::probe_pairs, the
schedule of _probe/schedule.py) and the pairs launch probes again after it replaced engines (_launch/peers.py).
"""

from __future__ import annotations

__metaclass__ = type


def probe_pairs(fleet, engines=None):
    """Every [producer, consumer] pair of the fleet (a list of {engine, role}, in its order): each prefill with each
    decode, then each decode with each prefill (kv_both); with `engines`, only the pairs one of them is in."""
    prefill = [e["engine"] for e in fleet if e.get("role") == "prefill"]
    decode = [e["engine"] for e in fleet if e.get("role") == "decode"]
    pairs = [[p, d] for p in prefill for d in decode] + [[d, p] for d in decode for p in prefill]
    if engines is None:
        return pairs
    wanted = set(engines)
    return [pair for pair in pairs if wanted & set(pair)]
