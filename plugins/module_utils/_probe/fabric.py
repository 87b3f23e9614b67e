# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The transfer probe's fabric figures: each engine's link with its nominal rate, and the measured KV rate of each
pair against it (docs/vllm-requirements.md, "The transfer probe").

An engine's link is what its launch record says it moves KV over (`transfer.transport`, `transfer.net_devices`: the
fabric interface with ucx_tcp, the HCA:port rails with ucx_rdma) and what discovery read of those on its host
(`config/engine-launch.<engine>.inspection.json`, `/host`): the interface's speed (`interface_speed`, from
`/sys/class/net/<if>/speed`) or each port's rate (`rdma.hcas[].ports[].rate_bits_s`, from
`/sys/class/infiniband/<hca>/ports/<port>/rate`). Nothing here reads a file: the lookup `probe_engines` reads them
on the controller, the transfer_probe step gets the links as an argument. Pure; Python 3.8 (runs on engine hosts).
"""

from __future__ import annotations

from ansible_collections.narwhal.deploy.plugins.module_utils._common.words import natural_key

__metaclass__ = type

# The consumer's and the recomputation's max_tokens (_probe/verdict.py::consumer_request, reference_request): a long
# prompt must leave them room within the engine's max_model_len.
ANSWER_TOKENS = 8

# A word of filler that the usual BPE and SentencePiece vocabularies hold as one token after a space; the stand-in
# engine counts whitespace-separated words as tokens.
FILLER = "the"


def unknown_link(why, transport=None):
    return {"transport": transport, "rails": [], "nominal_bits_s": None, "why": why}


def _rail(name, bits, rate, virtual=False, why=None):
    return {"rail": name, "nominal_bits_s": bits, "rate": rate, "virtual": virtual, "why": why}


def engine_link(engine, record, inspection):
    """The link `engine` moves KV over -> {"transport", "rails": [{"rail", "nominal_bits_s", "rate", "virtual",
    "why"}], "nominal_bits_s", "why"}. `record` is its launch record, `inspection` the `/host` part of its inspection
    extract (None when either is missing). The engine's nominal rate is the sum of its rails' (what all of them carry
    at once), None with `why` when a rail's is unknown."""
    if not record:
        return unknown_link("no launch record of %s (run discovery)" % engine)
    transfer = record.get("transfer") or {}
    transport = transfer.get("transport")
    if not inspection:
        return unknown_link("no inspection extract of %s (config/engine-launch.%s.inspection.json; rerun discovery)"
                            % (engine, engine), transport)
    if transport == "ucx_rdma":
        rails = rdma_rails(transfer.get("net_devices") or [], inspection.get("rdma") or {})
    elif transport == "ucx_tcp":
        rails = [tcp_rail((record.get("node") or {}).get("fabric_interface") or inspection.get("interface"),
                          inspection)]
    else:
        return unknown_link("transport %s has no nominal rate the probe knows" % transport, transport)
    unknown = [r for r in rails if r["nominal_bits_s"] is None]
    link = {"transport": transport, "rails": rails, "nominal_bits_s": None, "why": None}
    if not rails:
        link["why"] = "the record of %s names no rail" % engine
    elif unknown:
        link["why"] = "; ".join("%s: %s" % (r["rail"], r["why"]) for r in unknown)
    else:
        link["nominal_bits_s"] = sum(r["nominal_bits_s"] for r in rails)
    return link


def tcp_rail(name, inspection):
    """The fabric interface as a rail: its speed from the extract's `interface_speed` (Mb/s)."""
    if "interface_speed" not in inspection:
        return _rail(name, None, None,
                     why="the inspection extract has no interface speed (discovered by an earlier release; rerun "
                         "discovery)")
    speed = inspection.get("interface_speed") or {}
    mbps = speed.get("mbps")
    if not mbps:
        return _rail(name, None, None, bool(speed.get("virtual")), speed.get("why") or "speed unknown")
    return _rail(name, int(mbps) * 1000000, "%d Mb/s" % mbps, bool(speed.get("virtual")), speed.get("why"))


def rdma_rails(net_devices, rdma):
    """The record's HCA:port rails, each with its port's rate from the extract's RDMA facts."""
    ports = {}
    for hca in rdma.get("hcas") or []:
        for port in hca.get("ports") or []:
            ports["%s:%s" % (hca.get("name"), port.get("port"))] = port
    rails = []
    for name in net_devices:
        port = ports.get(name)
        if port is None:
            rails.append(_rail(name, None, None, why="not among the HCA ports discovery found"))
        elif "rate_bits_s" not in port:
            rails.append(_rail(name, None, port.get("rate"), why="the inspection extract has no port rate in bits "
                                                                 "(discovered by an earlier release; rerun discovery)"))
        elif not port["rate_bits_s"]:
            rails.append(_rail(name, None, port.get("rate"), why="the port's rate %r is not the kernel's "
                                                                 "'<n> Gb/sec (<width>X <speed>)'" % port.get("rate")))
        else:
            rails.append(_rail(name, int(port["rate_bits_s"]), port.get("rate")))
    return rails


def max_model_len(record_limit, model):
    """-> (the longest sequence the engine serves, where that was read), (None, why) when unknown: the record's
    --max-model-len (`record_limit`, _bench/plan.py::from_record) wins, else the checkpoint's own bound as discovery
    read it (`model`: the inspection extract's /model, _facts/model.py::config_max_len)."""
    if record_limit:
        return int(record_limit), "--max-model-len in the record"
    limit = (model or {}).get("max_model_len")
    if limit:
        return int(limit), "the checkpoint's config (no --max-model-len in the record)"
    return None, ("no --max-model-len in the record and no length in the checkpoint's config"
                  if model else "no inspection extract of the model (rerun discovery)")


def prompt_refusals(prompt_tokens, engines, limits):
    """Why `prompt_tokens` cannot be sent to `engines` ([] when it can): each engine's max_model_len (`limits`:
    {engine: int or None}) must hold the prompt and the ANSWER_TOKENS the consumer generates."""
    refusals = []
    for engine in engines:
        limit = limits.get(engine)
        if not limit:
            refusals.append("the max_model_len of %s is not known (set --max-model-len in its NARWHAL_EXTRA_ARGS or "
                            "NARWHAL_NODE_<n>_EXTRA_ARGS and rerun discovery)" % engine)
        elif prompt_tokens + ANSWER_TOKENS > int(limit):
            refusals.append("%s serves at most %d tokens, and %d prompt tokens + %d answer tokens are %d"
                            % (engine, int(limit), prompt_tokens, ANSWER_TOKENS, prompt_tokens + ANSWER_TOKENS))
    return refusals


def long_prompt(prompt, prompt_tokens):
    """`prompt` ("<fresh ID> <text>", _probe/verdict.py::probe_prompt) padded with FILLER words to `prompt_tokens`
    words; unchanged when it is that long already or prompt_tokens is 0."""
    missing = prompt_tokens - len(prompt.split())
    return prompt if missing <= 0 else prompt + (" " + FILLER) * missing


def utilisation(rate_bytes_s, nominal_bits_s):
    """The measured rate as a fraction of the nominal one (4 decimals), None without both."""
    if not rate_bytes_s or not nominal_bits_s:
        return None
    return round(rate_bytes_s * 8.0 / nominal_bits_s, 4)


def pair_link(producer_link, consumer_link):
    """A pair's link: both sides' and the pair's nominal bound, the lower of the two (None, with `why`, when either
    is unknown)."""
    result = {"producer": producer_link, "consumer": consumer_link, "nominal_bits_s": None, "bound": None,
              "why": None}
    missing = [side for side, link in (("producer", producer_link), ("consumer", consumer_link))
               if not link.get("nominal_bits_s")]
    if missing:
        result["why"] = "; ".join("%s: %s" % (side, (producer_link if side == "producer" else consumer_link)["why"])
                                  for side in missing)
        return result
    low, high = producer_link["nominal_bits_s"], consumer_link["nominal_bits_s"]
    result["nominal_bits_s"] = min(low, high)
    result["bound"] = "both" if low == high else "producer" if low < high else "consumer"
    return result


def with_link(result, links):
    """A pair's probe result with its `link` (pair_link of the two engines' links; an engine missing from `links`
    is unknown) and `utilisation` (its rate against the pair's nominal bound)."""
    given = "no link given for %s (the probe role reads it from discovery's files)"
    link = pair_link(links.get(result["producer"]) or unknown_link(given % result["producer"]),
                     links.get(result["consumer"]) or unknown_link(given % result["consumer"]))
    return dict(result, link=link, utilisation=utilisation(result.get("rate_bytes_s"), link["nominal_bits_s"]))


def slowest(results):
    """The pair with the lowest KV transfer rate ({producer, consumer, rate_bytes_s, bytes, transfer_s,
    nominal_bits_s, utilisation}), or None when no pair has one."""
    rated = [r for r in results if r.get("rate_bytes_s")]
    if not rated:
        return None
    low = min(rated, key=lambda r: r["rate_bytes_s"])
    found = dict((k, low.get(k)) for k in ("producer", "consumer", "rate_bytes_s", "bytes", "transfer_s"))
    found["nominal_bits_s"] = (low.get("link") or {}).get("nominal_bits_s")
    found["utilisation"] = low.get("utilisation")
    return found


def slowest_rail(results):
    """The rail that moved KV slowest, or None when no pair has a rate.

    The probe measures pairs, not rails, and a pair is no faster than the slower of its two engines' rails: so an
    engine's fastest pair (as producer or consumer) is bounded by its own rail, while a slow peer slows only the pairs
    it is in. The engine whose fastest pair is the slowest is named with its rail (ucx_tcp: the fabric interface;
    ucx_rdma: the HCA:port; an engine with several rails cannot tell which carried a transfer, so the one with the
    lowest nominal rate is named and all are listed). -> {engine, rail, rails, rate_bytes_s (its fastest pair's),
    pairs, nominal_bits_s (the rail's), engine_nominal_bits_s, utilisation (that rate against the engine's nominal
    rate), virtual, tied (other engines whose fastest pair is as slow: both engines of a single pair are)}."""
    rates, links = {}, {}
    for result in results:
        if not result.get("rate_bytes_s"):
            continue
        for side in ("producer", "consumer"):
            engine = result[side]
            rates.setdefault(engine, []).append(result["rate_bytes_s"])
            links.setdefault(engine, ((result.get("link") or {}).get(side)) or unknown_link("not given"))
    if not rates:
        return None
    best = dict((engine, max(values)) for engine, values in rates.items())
    engine = min(best, key=lambda e: (best[e], natural_key(e)))
    link = links[engine]
    rails = link.get("rails") or []
    rail = min(rails, key=lambda r: (r["nominal_bits_s"] is None, r["nominal_bits_s"] or 0)) if rails else None
    return {"engine": engine, "rail": rail["rail"] if rail else None, "rails": [r["rail"] for r in rails],
            "rate_bytes_s": best[engine], "pairs": len(rates[engine]),
            "nominal_bits_s": rail["nominal_bits_s"] if rail else None,
            "engine_nominal_bits_s": link.get("nominal_bits_s"),
            "utilisation": utilisation(best[engine], link.get("nominal_bits_s")),
            "virtual": bool(rail and rail.get("virtual")),
            "tied": sorted((e for e in best if e != engine and best[e] == best[engine]), key=natural_key)}


def rate_text(bytes_s):
    """A rate in bytes per second as people read it: B/s, kB/s, MB/s or GB/s (decimal units)."""
    if bytes_s is None:
        return "-"
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_s >= scale:
            return "%.3g %s" % (bytes_s / scale, unit)
    return "%d B/s" % bytes_s


def bits_text(bits_s):
    """A nominal rate in bits per second: Gb/s or Mb/s."""
    if not bits_s:
        return "unknown"
    return "%g Gb/s" % (bits_s / 1e9) if bits_s >= 1e9 else "%g Mb/s" % (bits_s / 1e6)


def share_text(value):
    return "-" if value is None else "%.3g%%" % (value * 100)


def figures_line(results):
    """The probe's one-line summary of its figures: the slowest pair and the slowest rail, each with its rate
    against the nominal one (the probe role prints it; the module returns the same as `slowest`, `slowest_rail`)."""
    pair, rail = slowest(results), slowest_rail(results)
    if not pair:
        return "fabric figures: no pair has a KV transfer rate (no vllm:nixl_xfer_time_seconds, or no bytes moved)"
    virtual = " (virtual interface: its driver's figure)" if rail and rail["virtual"] else ""
    line = "slowest pair %s -> %s: %s (%d bytes in %ss), %s of its nominal %s" % (
        pair["producer"], pair["consumer"], rate_text(pair["rate_bytes_s"]), pair["bytes"] or 0, pair["transfer_s"],
        share_text(pair["utilisation"]), bits_text(pair["nominal_bits_s"]))
    line += "; slowest rail %s of %s: its fastest of %d pair(s) %s, %s of %s%s%s" % (
        rail["rail"], rail["engine"], rail["pairs"], rate_text(rail["rate_bytes_s"]),
        share_text(rail["utilisation"]), bits_text(rail["engine_nominal_bits_s"]), virtual,
        " (tied with %s)" % ", ".join(rail["tied"]) if rail["tied"] else "")
    return line
