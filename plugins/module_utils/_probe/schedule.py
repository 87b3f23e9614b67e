# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The transfer probe's schedule (pure): which [producer, consumer] pairs are probed at the same time
(docs/vllm-requirements.md, "The transfer probe"), and the `cover` choice of pairs.

A round is a matching over all engines: no engine is in two probes of one round, in either role. That is what
keeps a probe's evidence its own while other probes run: the consumer's NIXL counters and the producer's lease
counters move only for this pair's request (outside traffic aside, which the verdict already reports), so the
"counters" evidence stays as attributable as in a serial run.

Every pair of a fleet (_probe/pairs.py::probe_pairs) joins a prefill and a decode, so the pairs form a bipartite
multigraph (prefills on one side, decodes on the other; both directions are edges between the same two sides). By
König's theorem its edges can be coloured with as many colours as the largest number of pairs one engine is in
(2 * max(P, D) for the whole fleet: max(P, D) rounds per direction), and with a bound of k probes at a time,
max(degree, ceil(pairs / k)) rounds of at most k pairs each suffice (an equitable colouring, de Werra). probe_rounds
builds that colouring: each pair goes in with a colour free at both engines, after swapping two colours along an
alternating path where needed (the constructive proof of König's theorem), then colour classes are balanced by
swapping colours along alternating paths. A list that is not bipartite (an engine probed against engines of its own
side; nothing the collection builds) is coloured greedily instead, with the same rule for each round.
Python 3.8 compatible (runs on engine hosts).
"""

from __future__ import annotations

__metaclass__ = type


def _sides(pairs):
    """{engine: 0 or 1} splitting the engines so that every pair joins the two sides, or None when none exists."""
    adjacent = {}
    for producer, consumer in pairs:
        adjacent.setdefault(producer, []).append(consumer)
        adjacent.setdefault(consumer, []).append(producer)
    side = {}
    for start in adjacent:
        if start in side:
            continue
        side[start] = 0
        stack = [start]
        while stack:
            engine = stack.pop()
            for other in adjacent[engine]:
                if other not in side:
                    side[other] = 1 - side[engine]
                    stack.append(other)
                elif side[other] == side[engine]:
                    return None
    return side


def _other(pair, engine):
    return pair[1] if pair[0] == engine else pair[0]


def _path(pairs, at, start, first, second):
    """The indices of the pairs on the path from `start` whose colours alternate first, second, first, ..."""
    path, engine, want = [], start, first
    while want in at.get(engine, {}):
        index = at[engine][want]
        path.append(index)
        engine = _other(pairs[index], engine)
        want = second if want == first else first
    return path


def _swap(pairs, at, colour, size, path, one, two):
    """Swap colours `one` and `two` on the pairs of `path` (a whole alternating path, so the colouring stays proper)."""
    for index in path:
        for engine in pairs[index]:
            del at[engine][colour[index]]
    for index in path:
        size[colour[index]] -= 1
        colour[index] = two if colour[index] == one else one
        size[colour[index]] += 1
        for engine in pairs[index]:
            at[engine][colour[index]] = index


def _colour_bipartite(pairs, colours):
    """A proper edge colouring of the bipartite multigraph `pairs` with `colours` >= its largest degree colours,
    as equitable as the bound asks (every class within one pair of the others) -> a colour per pair."""
    at = dict((engine, {}) for pair in pairs for engine in pair)  # engine -> {colour: pair index}
    colour = [None] * len(pairs)
    size = [0] * colours
    for index, (producer, consumer) in enumerate(pairs):
        free = [c for c in range(colours) if c not in at[producer]]
        both = [c for c in free if c not in at[consumer]]
        if both:
            chosen = min(both, key=lambda c: (size[c], c))
        else:
            # `first` is free at the producer, `second` at the consumer: swap them along the consumer's alternating
            # path, which cannot reach the producer in a bipartite graph; then `first` is free at both
            first = free[0]
            second = [c for c in range(colours) if c not in at[consumer]][0]
            _swap(pairs, at, colour, size, _path(pairs, at, consumer, first, second), first, second)
            chosen = first
        colour[index] = chosen
        size[chosen] += 1
        at[producer][chosen] = at[consumer][chosen] = index
    _balance(pairs, at, colour, size)
    return colour


def _balance(pairs, at, colour, size):
    """Even out the colour classes (de Werra): while one class has two pairs more than another, the pairs of the two
    colours form alternating paths and even cycles, one path holds one more of the larger; swap its colours."""
    while size and max(size) - min(size) > 1:
        big = size.index(max(size))
        small = size.index(min(size))
        for index in [i for i, c in enumerate(colour) if c == big]:
            ends = [e for e in pairs[index] if small not in at[e]]
            if not ends:
                continue
            # a path end: follow the path from it; it starts and ends with `big` when it holds one more of them
            path = _path(pairs, at, ends[0], big, small)
            if len(path) % 2 == 1:
                _swap(pairs, at, colour, size, path, big, small)
                break
        else:  # cannot happen in a proper colouring; stop rather than loop
            return


def _colour_greedy(pairs, parallel):
    """First fit: each pair in the first round where neither engine is busy and fewer than `parallel` pairs run."""
    busy, count, colour = [], [], []
    for pair in pairs:
        for c, engines in enumerate(busy):
            if not set(pair) & engines and (parallel is None or count[c] < parallel):
                break
        else:
            c = len(busy)
            busy.append(set())
            count.append(0)
        busy[c].update(pair)
        count[c] += 1
        colour.append(c)
    return colour


def probe_rounds(pairs, parallel=None):
    """The rounds in which to probe `pairs` ([producer, consumer] lists): a list of rounds, each the indices into
    `pairs` of the probes that run together. No engine is in two probes of a round (in either role), no round has
    more than `parallel` probes (None: no bound; 1: one probe at a time, in the order given), and every pair is in
    exactly one round. For a bipartite list (every list of prefill/decode pairs) the number of rounds is the least
    possible, max(largest degree, ceil(len(pairs) / parallel)); within a round, indices are in the order given."""
    pairs = [tuple(pair) for pair in pairs]
    if not pairs:
        return []
    if parallel is not None and parallel < 1:
        raise ValueError("parallel must be at least 1, got %r" % parallel)
    if parallel == 1:
        return [[index] for index in range(len(pairs))]
    if any(producer == consumer for producer, consumer in pairs) or _sides(pairs) is None:
        colour = _colour_greedy(pairs, parallel)
    else:
        degree = {}
        for pair in pairs:
            for engine in pair:
                degree[engine] = degree.get(engine, 0) + 1
        colours = max(degree.values())
        if parallel is not None:
            colours = max(colours, -(-len(pairs) // parallel))
        colour = _colour_bipartite(pairs, colours)
    rounds = {}
    for index, c in enumerate(colour):
        rounds.setdefault(c, []).append(index)
    # rounds in the order of their first pair, so the first pairs given run first
    return sorted(rounds.values(), key=lambda members: members[0])


def cover_pairs(pairs):
    """The `cover` choice: a few of `pairs` in which every engine that produces in `pairs` produces at least once and
    every engine that consumes consumes at least once, spread so that no engine is in many more than the others: a
    matching first, then each engine still uncovered with its least-used partner. For a whole fleet that is max(P, D)
    pairs per direction, no engine in more than ceil(2 * max(P, D) / min(P, D)) of them, so as many rounds (two when
    P = D). Pairs keep their order."""
    pairs = [list(pair) for pair in pairs]
    chosen, use, produced, consumed = set(), {}, set(), set()

    def take(index):
        chosen.add(index)
        produced.add(pairs[index][0])
        consumed.add(pairs[index][1])
        for engine in pairs[index]:
            use[engine] = use.get(engine, 0) + 1

    def least_used(side, engine):
        """The unchosen pair with `engine` on `side` (0 producer, 1 consumer) whose other engine is least used."""
        candidates = [i for i, pair in enumerate(pairs) if i not in chosen and pair[side] == engine]
        return min(candidates, key=lambda i: (use.get(pairs[i][1 - side], 0), i))

    for index, (producer, consumer) in enumerate(pairs):
        if producer not in produced and consumer not in consumed:
            take(index)
    for producer, consumer in pairs:
        if producer not in produced:
            take(least_used(0, producer))
        if consumer not in consumed:
            take(least_used(1, consumer))
    return [pairs[index] for index in sorted(chosen)]


def changed_pairs(pairs, launched, done=()):
    """The `auto` choice of a run that also launched (site.yml): the pairs this run's launch did not prove already.

    `launched`: {engine: launch action (start, replace, unchanged)} of the engines this run's launch looked at;
    `done`: the pairs launch probed again after it replaced or restarted engines (_launch/peers.py::after_launch).
    -> every pair with an engine that launch started or replaced, or did not look at (outside --limit: not known to
    be unchanged), less those in `done`, and a cover of all `pairs` (cover_pairs): an unchanged engine was proven with
    every peer when it was launched, and the cover shows it still produces and consumes. With no engine launched (a
    probe run on its own) every pair. Pairs keep their order."""
    if not launched:
        return [list(pair) for pair in pairs]
    done = set(tuple(pair) for pair in done)
    unchanged = set(engine for engine, action in launched.items() if action == "unchanged")
    keep = set(tuple(pair) for pair in pairs if not set(pair) <= unchanged and tuple(pair) not in done)
    keep |= set(tuple(pair) for pair in cover_pairs(pairs))
    return [list(pair) for pair in pairs if tuple(pair) in keep]
