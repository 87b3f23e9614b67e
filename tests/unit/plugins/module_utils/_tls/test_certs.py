"""The TLS material's rules (plugins/module_utils/_tls/certs.py): the names a host's certificate must cover (IPv6
written any way), days left, when a site certificate is issued again, what an operator's certificate or CA may not
be, and the names of each engine host of a play."""
import datetime

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._tls.certs import (
    RENEW_DAYS,
    ca_problem,
    covers,
    days_left,
    engine_host_names,
    leaf_problem,
    missing_names,
    normal_name,
    normal_names,
    renew_reason,
)

NOW = datetime.datetime(2026, 12, 6, 10, 0, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def facts(ips=("10.0.0.1",), dns=(), left=200, is_ca=False, server_auth=True, age=10):
    return {"not_before": NOW - age * DAY, "not_after": NOW + left * DAY, "ips": list(ips), "dns": list(dns),
            "is_ca": is_ca, "server_auth": server_auth}


@pytest.mark.parametrize("name, expected", [
    ("10.0.0.1", ("ip", "10.0.0.1")),
    ("FE80:0:0::1", ("ip", "fe80::1")),
    ("[2001:DB8:0::12]", ("ip", "2001:db8::12")),
    ("fe80::1%eth0", ("ip", "fe80::1")),
    ("::ffff:10.0.0.1", ("ip", "::ffff:a00:1")),
    ("Engine-1.Fabric.Example.", ("dns", "engine-1.fabric.example")),
    ("localhost", ("dns", "localhost")),
])
def test_a_name_is_written_one_way(name, expected):
    assert normal_name(name) == expected


@pytest.mark.parametrize("name", ["", "http://10.0.0.1:8000", "a b", "10.0.0", "a..example", "ünïcode.example",
                                  "x" * 254, "[10.0.0.1", "-lead.example"])
def test_what_is_neither_an_address_nor_a_dns_name_is_refused(name):
    with pytest.raises(ValueError, match="is neither an IP address nor a DNS name"):
        normal_name(name)


def test_names_are_kept_once_in_their_order():
    assert normal_names(["fd00::2", "[FD00:0::2]", "b.example", "B.EXAMPLE.", "10.0.0.1"]) == [
        "fd00::2", "b.example", "10.0.0.1"]


def test_the_san_covers_addresses_by_ip_entries_and_names_by_dns_entries():
    cert = facts(ips=["fd00::2"], dns=["*.fabric.example", "router.example"])
    assert covers(cert, "[FD00::2]") and covers(cert, "engine-1.fabric.example") and covers(cert, "Router.Example")
    # a wildcard covers one label only, and a DNS name never an address written as text
    assert not covers(cert, "a.b.fabric.example") and not covers(cert, "fabric.example")
    assert not covers(facts(ips=[], dns=["10.0.0.1"]), "10.0.0.1")
    assert missing_names(cert, ["fd00::2", "10.0.0.9", "other.example"]) == ["10.0.0.9", "other.example"]


def test_days_left_are_whole_days_and_negative_once_expired():
    assert days_left(NOW + 30 * DAY, NOW) == 30
    assert days_left(NOW + 30 * DAY - datetime.timedelta(seconds=1), NOW) == 29
    assert days_left(NOW - datetime.timedelta(seconds=1), NOW) == -1


@pytest.mark.parametrize("cert, names, issued, matches, reason", [
    (None, ["10.0.0.1"], False, False, "missing or unreadable"),
    (facts(), ["10.0.0.1"], True, False, "its key does not match it"),
    (facts(), ["10.0.0.1"], False, True, "not signed by the site CA"),
    (facts(), ["10.0.0.2"], True, True, "its names changed (10.0.0.1 -> 10.0.0.2)"),
    (facts(), ["10.0.0.1", "e1.example"], True, True, "its names changed (10.0.0.1 -> 10.0.0.1, e1.example)"),
    (facts(ips=["10.0.0.1", "fd00::1"]), ["10.0.0.1"], True, True, "its names changed"),
    (facts(left=RENEW_DAYS - 1), ["10.0.0.1"], True, True, "29 days left (fewer than 30)"),
    (facts(left=-1), ["10.0.0.1"], True, True, "expired on 2026-12-05T10:00:00Z"),
    (facts(age=-1), ["10.0.0.1"], True, True, "is not valid before 2026-12-07T10:00:00Z"),
])
def test_a_site_certificate_is_issued_again_and_says_why(cert, names, issued, matches, reason):
    assert reason in renew_reason(cert, names, NOW, issued, matches)


def test_a_site_certificate_is_kept_with_its_names_in_any_order_and_30_days_left():
    cert = facts(ips=["10.0.0.1", "fd00::1"], dns=["e1.example"], left=RENEW_DAYS)
    assert renew_reason(cert, ["e1.example", "[FD00::1]", "10.0.0.1"], NOW, True, True) is None


@pytest.mark.parametrize("cert, names, problem", [
    (facts(left=-3), ["10.0.0.1"], "expired on 2026-12-03T10:00:00Z"),
    (facts(age=-2), ["10.0.0.1"], "is not valid before 2026-12-08T10:00:00Z (check this controller's clock)"),
    (facts(is_ca=True), ["10.0.0.1"], "is a CA certificate"),
    (facts(server_auth=False), ["10.0.0.1"], "extendedKeyUsage without serverAuth"),
    (facts(dns=["e1.example"]), ["10.0.0.1", "fd00::1"],
     "does not hold fd00::1 in its subjectAltName (it holds 10.0.0.1, e1.example)"),
    (facts(ips=[]), ["10.0.0.1"], "does not hold 10.0.0.1 in its subjectAltName (it holds none)"),
])
def test_what_an_operators_host_certificate_may_not_be(cert, names, problem):
    assert problem in leaf_problem(cert, names, NOW)


def test_an_operators_host_certificate_may_have_more_names_and_no_extended_key_usage():
    assert leaf_problem(facts(ips=["10.0.0.1", "10.0.0.2"], server_auth=None), ["10.0.0.1"], NOW) is None


def test_a_ca_must_be_a_ca_valid_now_and_a_site_ca_last_30_days():
    assert ca_problem(facts(is_ca=False), NOW, site=True) == "is not a CA certificate (basicConstraints CA:TRUE)"
    assert ca_problem(facts(is_ca=True, left=-1), NOW, site=False) == "expired on 2026-12-05T10:00:00Z"
    assert ca_problem(facts(is_ca=True, left=10), NOW, site=True) == "has 10 days left (fewer than 30)"
    assert ca_problem(facts(is_ca=True, left=10), NOW, site=False) is None


RECORDS = {"engines": {
    "engine-1": {"engine": "engine-1", "node": {"address": "10.0.0.11"}},
    "engine-2": {"engine": "engine-2", "node": {"address": "fd00::12"},
                 "members": [{"member": 1, "data_parallel_start_rank": 2, "gpu_ids": [], "gpu_host_indices": [],
                              "accelerator_devices": [], "transfer": {},
                              "node": {"address": "fd00::13", "fabric_interface": "eth1", "side_channel_ports": [1, 2],
                                       "host_id": "h13"}}]}}}
FLEET = [{"engine": "engine-1", "url": "https://e1.fabric.example:8000"},
         {"engine": "engine-2", "url": "https://[fd00::12]:8000"}]
ENGINES = {"gpu-a": "engine-1", "gpu-b": "engine-2", "gpu-c": "engine-2"}
MEMBERS = {"engine-1": ["gpu-a"], "engine-2": ["gpu-b", "gpu-c"]}


def test_each_engine_host_gets_its_fleet_url_host_and_its_own_address():
    """The head serves the engine's URL; a host after the head gets that name and its own fabric address; a URL host
    in brackets is named without them; a router of the play is left out."""
    assert engine_host_names(["gpu-a", "gpu-b", "gpu-c", "router-1"], ENGINES, MEMBERS, FLEET, RECORDS) == [
        {"host": "gpu-a", "names": ["e1.fabric.example", "10.0.0.11"]},
        {"host": "gpu-b", "names": ["fd00::12"]},
        {"host": "gpu-c", "names": ["fd00::12", "fd00::13"]},
    ]


def test_without_records_or_a_fleet_entry_a_host_keeps_what_is_known():
    assert engine_host_names(["gpu-a"], ENGINES, MEMBERS, FLEET) == [{"host": "gpu-a", "names": ["e1.fabric.example"]}]
    assert engine_host_names(["gpu-b", "gpu-c"], ENGINES, MEMBERS, [], {"engines": {}}) == [
        {"host": "gpu-b", "names": []}, {"host": "gpu-c", "names": []}]
    # a URL the endpoints grammar refuses (user information) names nothing
    fleet = [{"engine": "engine-1", "url": "https://user:key@10.0.0.11:8000"}]
    assert engine_host_names(["gpu-a"], ENGINES, MEMBERS, fleet, RECORDS) == [{"host": "gpu-a", "names": ["10.0.0.11"]}]
