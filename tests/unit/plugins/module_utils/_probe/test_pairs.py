"""The fleet's prefill/decode pairs (plugins/module_utils/_probe/pairs.py)."""
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.pairs import probe_pairs

FLEET = [{"engine": "engine-1", "role": "prefill"}, {"engine": "engine-2", "role": "decode"},
         {"engine": "engine-3", "role": "decode"}]


def test_probe_pairs_every_pair_or_those_of_some_engines():
    assert probe_pairs(FLEET) == [["engine-1", "engine-2"], ["engine-1", "engine-3"], ["engine-2", "engine-1"],
                                  ["engine-3", "engine-1"]]
    assert probe_pairs(FLEET, ["engine-3"]) == [["engine-1", "engine-3"], ["engine-3", "engine-1"]]
    assert probe_pairs(FLEET, []) == []
