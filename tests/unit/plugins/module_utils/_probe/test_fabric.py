"""The transfer probe's fabric figures (plugins/module_utils/_probe/fabric.py): each engine's link from a real launch
record and the inspection discovery extracts (the real H100 sysfs dump's HCA ports, an interface speed as the kernel
reports it), each pair's nominal bound and utilisation, the slowest pair and rail, the long prompt and its bound."""

from test_support.records import build, nv_pair, rdma_pair

from ansible_collections.narwhal.deploy.plugins.module_utils._probe import fabric

NIC = {"mbps": 100000, "virtual": False, "why": None}
VETH = {"mbps": 10000, "virtual": True, "why": "a virtual interface (listed under devices/virtual): ..."}


def _host(hosts, engine, speed=None):
    """The /host part of the engine's inspection extract, as discovery_outputs writes it."""
    return {"interface": "eth1", "interface_speed": speed, "rdma": hosts[engine]["rdma"],
            "gpus": hosts[engine]["gpus"]}


def test_tcp_link_is_the_fabric_interface_at_its_speed(tmp_path, dev):
    hosts = nv_pair(tmp_path)
    record = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, hosts)["engine-1"]
    assert record["transfer"]["transport"] == "ucx_tcp"
    link = fabric.engine_link("engine-1", record, _host(hosts, "engine-1", NIC))
    assert link == {"transport": "ucx_tcp", "nominal_bits_s": 100000000000, "why": None,
                    "rails": [{"rail": "eth1", "nominal_bits_s": 100000000000, "rate": "100000 Mb/s",
                               "virtual": False, "why": None}]}
    veth = fabric.engine_link("engine-1", record, _host(hosts, "engine-1", VETH))
    assert veth["nominal_bits_s"] == 10000000000 and veth["rails"][0]["virtual"] is True
    assert "virtual" in veth["rails"][0]["why"]


def test_rdma_link_is_the_recorded_rails_at_the_real_port_rates(tmp_path, dev):
    """Eight GPUs take all eight NDR rails of the real H100 dump (400 Gb/sec (4X NDR) each): 3.2 Tb/s in all."""
    hosts = rdma_pair(tmp_path)
    record = build({"NARWHAL_TRANSPORT": "ucx_rdma"}, hosts, shared=False)["engine-1"]
    rails = record["transfer"]["net_devices"]
    assert len(rails) == 8
    link = fabric.engine_link("engine-1", record, _host(hosts, "engine-1"))
    assert [r["rail"] for r in link["rails"]] == rails
    assert {(r["rate"], r["nominal_bits_s"]) for r in link["rails"]} == {("400 Gb/sec (4X NDR)", 400000000000)}
    assert link["nominal_bits_s"] == 8 * 400000000000 and link["why"] is None


def test_unknown_rates_say_why(tmp_path, dev):
    hosts = rdma_pair(tmp_path)
    record = build({"NARWHAL_TRANSPORT": "ucx_rdma"}, hosts, shared=False)["engine-1"]
    old = _host(hosts, "engine-1")
    for hca in old["rdma"]["hcas"]:  # an extract of a discovery before rate_bits_s
        for port in hca["ports"]:
            del port["rate_bits_s"]
    link = fabric.engine_link("engine-1", record, old)
    assert link["nominal_bits_s"] is None and "rerun discovery" in link["why"]
    assert all(r["rate"] == "400 Gb/sec (4X NDR)" and r["nominal_bits_s"] is None for r in link["rails"])
    (tmp_path / "tcp").mkdir()
    tcp_hosts = nv_pair(tmp_path / "tcp")
    tcp = build({"NARWHAL_GPUS_PER_ENGINE": "4"}, tcp_hosts)["engine-1"]
    down = fabric.engine_link("engine-1", tcp, _host(tcp_hosts, "engine-1", {
        "mbps": None, "virtual": False, "why": "/sys/class/net/eth1/speed reports -1: ..."}))
    assert down["nominal_bits_s"] is None and down["why"] == "eth1: /sys/class/net/eth1/speed reports -1: ..."
    no_speed = dict(_host(tcp_hosts, "engine-1"))
    del no_speed["interface_speed"]
    assert "earlier release" in fabric.engine_link("engine-1", tcp, no_speed)["why"]
    assert "no inspection extract" in fabric.engine_link("engine-1", tcp, None)["why"]
    assert "no launch record" in fabric.engine_link("engine-1", None, no_speed)["why"]
    record["transfer"]["net_devices"] = ["mlx5_42:1"]
    assert "not among the HCA ports" in fabric.engine_link("engine-1", record, _host(hosts, "engine-1"))["why"]


def _link(bits, rail="eth1", virtual=False):
    return {"transport": "ucx_tcp", "nominal_bits_s": bits, "why": None if bits else "unknown",
            "rails": [{"rail": rail, "nominal_bits_s": bits, "rate": None, "virtual": virtual, "why": None}]}


def test_pair_bound_is_the_lower_side_and_utilisation_the_rate_against_it():
    link = fabric.pair_link(_link(100 * 10 ** 9), _link(25 * 10 ** 9))
    assert (link["nominal_bits_s"], link["bound"]) == (25 * 10 ** 9, "consumer")
    assert fabric.pair_link(_link(10 ** 10), _link(10 ** 10))["bound"] == "both"
    unknown = fabric.pair_link(_link(None), _link(10 ** 10))
    assert unknown["nominal_bits_s"] is None and unknown["why"] == "producer: unknown"
    result = fabric.with_link({"producer": "p", "consumer": "d", "rate_bytes_s": 1250000000},
                              {"p": _link(100 * 10 ** 9), "d": _link(25 * 10 ** 9)})
    assert result["utilisation"] == 0.4 and result["link"]["bound"] == "consumer"
    missing = fabric.with_link({"producer": "p", "consumer": "d", "rate_bytes_s": 1}, {})
    assert missing["utilisation"] is None and "no link given for p" in missing["link"]["why"]
    assert fabric.utilisation(None, 10) is None and fabric.utilisation(10, None) is None


def _result(producer, consumer, rate, links):
    return fabric.with_link({"producer": producer, "consumer": consumer, "rate_bytes_s": rate, "bytes": 1.0,
                             "transfer_s": 1.0}, links)


def test_the_slowest_rail_is_the_engine_slow_in_all_its_pairs():
    """d1's rail is slow in every pair of d1 (its fastest pair is slow); p0 -> d0 is the slowest pair alone (one
    slow transfer), and p0 is fast with d0 the other way."""
    links = dict((e, _link(10 ** 10, "eth1")) for e in ("p0", "p1", "d0"))
    links["d1"] = _link(10 ** 10, "ens3")
    results = [_result("p0", "d0", 1e6, links), _result("p0", "d1", 2e6, links), _result("p1", "d0", 9e6, links),
               _result("p1", "d1", 2e6, links), _result("d0", "p0", 9e6, links), _result("d0", "p1", 9e6, links),
               _result("d1", "p0", 2e6, links), _result("d1", "p1", 2e6, links)]
    assert fabric.slowest(results)["producer"] == "p0" and fabric.slowest(results)["consumer"] == "d0"
    rail = fabric.slowest_rail(results)
    assert (rail["engine"], rail["rail"], rail["rate_bytes_s"], rail["pairs"]) == ("d1", "ens3", 2e6, 4)
    assert rail["utilisation"] == 0.0016 and rail["tied"] == [] and rail["virtual"] is False


def test_one_pair_ties_its_two_engines_and_several_rails_name_the_lowest():
    links = {"p": {"transport": "ucx_rdma", "nominal_bits_s": 6 * 10 ** 11, "why": None,
                   "rails": [{"rail": "mlx5_0:1", "nominal_bits_s": 4 * 10 ** 11, "virtual": False},
                             {"rail": "mlx5_1:1", "nominal_bits_s": 2 * 10 ** 11, "virtual": False}]},
             "d": _link(10 ** 10, virtual=True)}
    results = [_result("p", "d", 5e8, links), _result("d", "p", 4e8, links)]
    rail = fabric.slowest_rail(results)
    assert rail["engine"] == "d" and rail["tied"] == ["p"] and rail["virtual"] is True  # the same pairs: d by name
    assert rail["rate_bytes_s"] == 5e8
    to_x = dict(results[0], consumer="x", link=dict(results[0]["link"], consumer=_link(10 ** 12)))
    only_p = fabric.slowest_rail([to_x])  # p and x tie, p first by name: its two rails, the 200 Gb/s one named
    assert only_p["engine"] == "p" and only_p["rail"] == "mlx5_1:1" and only_p["rails"] == ["mlx5_0:1", "mlx5_1:1"]
    assert fabric.slowest_rail([{"producer": "p", "consumer": "d", "rate_bytes_s": None}]) is None
    line = fabric.figures_line(results)
    assert line.startswith("slowest pair d -> p: 400 MB/s") and "slowest rail eth1 of d" in line
    assert "(virtual interface: its driver's figure)" in line and "(tied with p)" in line
    assert fabric.figures_line([]).startswith("fabric figures: no pair has a KV transfer rate")


def test_max_model_len_from_the_record_else_the_checkpoint():
    assert fabric.max_model_len(256, {"max_model_len": 4096}) == (256, "--max-model-len in the record")
    assert fabric.max_model_len(None, {"max_model_len": 4096})[0] == 4096
    assert fabric.max_model_len(None, {"max_model_len": None})[0] is None
    assert "rerun discovery" in fabric.max_model_len(None, None)[1]


def test_the_long_prompt_and_its_bound():
    prompt = fabric.long_prompt("0123abcd narwhal transfer probe", 100)
    assert len(prompt.split()) == 100 and prompt.startswith("0123abcd narwhal transfer probe the the")
    assert fabric.long_prompt("a b c", 0) == "a b c" and fabric.long_prompt("a b c", 2) == "a b c"
    refused = fabric.prompt_refusals(250, ["engine-1", "engine-2", "engine-3"],
                                     {"engine-1": 256, "engine-2": 258, "engine-3": None})
    assert refused == ["engine-1 serves at most 256 tokens, and 250 prompt tokens + 8 answer tokens are 258",
                       "the max_model_len of engine-3 is not known (set --max-model-len in its NARWHAL_EXTRA_ARGS or "
                       "NARWHAL_NODE_<n>_EXTRA_ARGS and rerun discovery)"]
