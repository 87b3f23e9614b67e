"""The transfer probe's schedule (plugins/module_utils/_probe/schedule.py): rounds that are matchings over all
engines, as few as König's theorem allows, bounded by `parallel`; and the `cover` choice."""

import random

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._launch.peers import after_launch, probe_pairs
from ansible_collections.narwhal.deploy.plugins.module_utils._probe.schedule import (
    changed_pairs,
    cover_pairs,
    probe_rounds,
)


def fleet(prefill, decode):
    return ([{"engine": "p%d" % i, "role": "prefill"} for i in range(prefill)]
            + [{"engine": "d%d" % i, "role": "decode"} for i in range(decode)])


def check_rounds(pairs, rounds, parallel):
    """Every pair exactly once; no engine twice in a round (in either role); no round above the bound."""
    assert sorted(i for members in rounds for i in members) == list(range(len(pairs)))
    for members in rounds:
        engines = [e for i in members for e in pairs[i]]
        assert len(engines) == len(set(engines)), members
        assert parallel is None or len(members) <= parallel
        assert members == sorted(members)


def degree(pairs):
    seen = {}
    for pair in pairs:
        for engine in pair:
            seen[engine] = seen.get(engine, 0) + 1
    return max(seen.values()) if seen else 0


SIZES = [(p, d) for p in range(1, 9) for d in range(1, 9)] + [(16, 16), (3, 29), (32, 32)]


@pytest.mark.parametrize("parallel", [None, 1, 2, 3, 8, 64])
@pytest.mark.parametrize("prefill,decode", SIZES)
def test_all_pairs_in_the_fewest_rounds(prefill, decode, parallel):
    pairs = probe_pairs(fleet(prefill, decode))
    rounds = probe_rounds(pairs, parallel)
    check_rounds(pairs, rounds, parallel)
    if parallel == 1:
        assert rounds == [[i] for i in range(len(pairs))]  # today's serial order
        return
    # max(P, D) rounds per direction; more only where the bound needs them
    least = 2 * max(prefill, decode)
    if parallel is not None:
        least = max(least, -(-len(pairs) // parallel))
    assert len(rounds) == least


@pytest.mark.parametrize("prefill,decode", [(4, 4), (3, 5), (16, 16)])
def test_each_direction_alone_takes_max_p_d_rounds(prefill, decode):
    pairs = [pair for pair in probe_pairs(fleet(prefill, decode)) if pair[0].startswith("p")]
    rounds = probe_rounds(pairs)
    check_rounds(pairs, rounds, None)
    assert len(rounds) == max(prefill, decode)


@pytest.mark.parametrize("seed", range(40))
def test_any_subset_of_pairs_and_duplicates(seed):
    """Launch probes the pairs of some engines only; a caller may name a pair twice (a multigraph)."""
    rng = random.Random(seed)
    every = probe_pairs(fleet(rng.randint(1, 9), rng.randint(1, 9)))
    pairs = [pair for pair in every if rng.random() < 0.6] + rng.sample(every, min(3, len(every)))
    parallel = rng.choice([None, 2, 3, 5])
    rounds = probe_rounds(pairs, parallel)
    check_rounds(pairs, rounds, parallel)
    least = degree(pairs) if parallel is None else max(degree(pairs), -(-len(pairs) // parallel))
    assert len(rounds) == least


def test_launch_pairs_of_one_replaced_engine():
    pairs = probe_pairs(fleet(3, 4), ["p1"])
    rounds = probe_rounds(pairs, 8)
    check_rounds(pairs, rounds, 8)
    assert len(rounds) == 8  # p1 is in every pair: one at a time, as before


def test_a_list_that_is_not_bipartite_still_gets_matchings():
    pairs = [["a", "b"], ["b", "c"], ["c", "a"], ["a", "d"]]
    rounds = probe_rounds(pairs, 8)
    check_rounds(pairs, rounds, 8)
    assert probe_rounds([], 8) == []
    with pytest.raises(ValueError):
        probe_rounds(pairs, 0)


@pytest.mark.parametrize("prefill,decode", SIZES)
def test_cover_every_engine_once_each_way(prefill, decode):
    pairs = probe_pairs(fleet(prefill, decode))
    cover = cover_pairs(pairs)
    engines = set(e for pair in pairs for e in pair)
    assert set(p for p, _c in cover) == engines and set(c for _p, c in cover) == engines
    assert all(pair in pairs for pair in cover) and cover == [pair for pair in pairs if pair in cover]
    # max(P, D) pairs per direction, each engine in as few as the sizes allow
    assert len(cover) == 2 * max(prefill, decode)
    assert degree(cover) == -(-2 * max(prefill, decode) // min(prefill, decode))
    rounds = probe_rounds(cover, 64)
    check_rounds(cover, rounds, 64)
    if prefill == decode:
        assert len(rounds) == 2


def test_cover_of_launch_pairs_keeps_every_engine():
    pairs = probe_pairs(fleet(4, 4), ["p0", "d3"])
    cover = cover_pairs(pairs)
    engines = set(e for pair in pairs for e in pair)
    assert set(p for p, _c in cover) == engines and set(c for _p, c in cover) == engines
    assert len(cover) < len(pairs)
    assert cover_pairs([]) == []


def test_the_filter_chooses_all_or_cover_and_refuses_other_words():
    from ansible.errors import AnsibleFilterError

    from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters

    assert filters.probe_pairs(fleet(2, 2)) == probe_pairs(fleet(2, 2))
    cover = [["p0", "d0"], ["p1", "d1"], ["d0", "p0"], ["d1", "p1"]]
    assert filters.probe_pairs(fleet(2, 2), pairs="cover") == cover
    with pytest.raises(AnsibleFilterError, match="narwhal_probe_pairs='some'"):
        filters.probe_pairs(fleet(2, 2), pairs="some")


def covers(pairs, chosen):
    """Every engine that produces (consumes) in `pairs` produces (consumes) in `chosen`."""
    return (set(p for p, _c in chosen) == set(p for p, _c in pairs)
            and set(c for _p, c in chosen) == set(c for _p, c in pairs))


def test_auto_without_a_launch_is_every_pair():
    pairs = probe_pairs(fleet(3, 5))
    assert changed_pairs(pairs, {}) == pairs
    assert changed_pairs(pairs, None) == pairs


def test_auto_after_an_unchanged_launch_is_the_cover():
    f = fleet(8, 8)
    pairs = probe_pairs(f)
    launched = dict((e["engine"], "unchanged") for e in f)
    assert changed_pairs(pairs, launched) == cover_pairs(pairs)
    assert len(changed_pairs(pairs, launched)) == 16


def test_auto_after_a_first_start_is_every_pair():
    f = fleet(4, 3)
    pairs = probe_pairs(f)
    launched = dict((e["engine"], "start") for e in f)
    plan = after_launch(f, dict((e, {"action": a}) for e, a in launched.items()), {})
    assert plan["pairs"] == []  # a fleet started from nothing is the probe stage's job
    assert changed_pairs(pairs, launched, plan["pairs"]) == pairs


def test_auto_after_a_replace_leaves_out_what_launch_probed_again():
    f = fleet(4, 4)
    pairs = probe_pairs(f)
    launched = dict((e["engine"], "unchanged") for e in f)
    launched["p2"] = "replace"
    plan = after_launch(f, dict((e, {"action": a}) for e, a in launched.items()), {})
    assert set(map(tuple, probe_pairs(f, ["p2"]))) <= set(map(tuple, plan["pairs"]))
    # the replaced engine's pairs were proven by launch after it: what is left is the cover
    assert changed_pairs(pairs, launched, plan["pairs"]) == cover_pairs(pairs)
    # had launch not probed them, every pair of the replaced engine
    again = changed_pairs(pairs, launched)
    assert [pair for pair in pairs if "p2" in pair] == [pair for pair in again if "p2" in pair]
    assert covers(pairs, again) and [pair for pair in again if pair in pairs] == again


def test_auto_probes_every_pair_of_an_engine_launch_did_not_look_at():
    f = fleet(3, 3)
    pairs = probe_pairs(f)
    launched = dict((e["engine"], "unchanged") for e in f if e["engine"] != "d1")  # d1 outside --limit
    chosen = changed_pairs(pairs, launched)
    assert [pair for pair in pairs if "d1" in pair] == [pair for pair in chosen if "d1" in pair]
    assert covers(pairs, chosen)
    assert chosen == [pair for pair in pairs if pair in chosen]  # the fleet's order


def test_the_filter_passes_auto_what_launch_did():
    from ansible_collections.narwhal.deploy.plugins.filter import narwhal as filters

    f = fleet(4, 4)
    unchanged = dict((e["engine"], "unchanged") for e in f)
    assert filters.probe_pairs(f, pairs="auto") == probe_pairs(f)
    assert filters.probe_pairs(f, pairs="auto", launched=unchanged, done=[]) == cover_pairs(probe_pairs(f))
