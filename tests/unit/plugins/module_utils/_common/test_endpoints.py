# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of endpoint text (plugins/module_utils/_common/endpoints.py): host and port -> URL, attestation URL,
Prometheus target, and back, IPv6 in brackets; the texts are those discovery, the router, monitoring, the benchmark
and the launcher wrote before they shared it (issue 34)."""

from __future__ import annotations

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import (
    attestation_url,
    engine_scheme,
    engine_url,
    has_userinfo,
    http_url,
    redact_userinfo,
    refuse_fleet_userinfo,
    refuse_userinfo,
    split_url,
    target,
    url_host,
    url_port,
    with_port,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError


@pytest.mark.parametrize("host, written", [("10.0.0.11", "10.0.0.11"), ("fd00:6e77:f1::1a", "[fd00:6e77:f1::1a]"),
                                           ("::1", "[::1]"), ("gpu-1.example", "gpu-1.example")])
def test_an_ipv6_host_is_written_in_brackets(host, written):
    assert url_host(host) == written
    assert engine_url(host, 8000) == "http://%s:8000" % written
    assert attestation_url(host, 8010) == "http://%s:8010/v1/attestation" % written
    assert http_url(host, "29000", "/metrics") == "http://%s:29000/metrics" % written  # a port as text (.env) too
    assert target(host, 8000) == "%s:8000" % written


@pytest.mark.parametrize("url, parts", [
    ("http://10.0.0.11:8000", ("http", "10.0.0.11", 8000, "")),
    ("http://10.0.0.11:8000/", ("http", "10.0.0.11", 8000, "")),
    ("https://gpu-1.example:8443/vllm/", ("https", "gpu-1.example", 8443, "/vllm")),
    ("http://[fd00::22]:29000/metrics", ("http", "fd00::22", 29000, "/metrics")),
    ("http://172.31.241.12:8010/v1/attestation", ("http", "172.31.241.12", 8010, "/v1/attestation")),
])
def test_a_url_splits_into_scheme_host_port_and_path(url, parts):
    assert split_url(url) == parts
    assert url_port(url) == parts[2]
    scheme, host, port, path = parts
    if scheme == "http":  # and back: the same text, less a trailing /
        assert http_url(host, port, path) == url.rstrip("/")


@pytest.mark.parametrize("url", ["ftp://10.0.0.1:21", "http://10.0.0.1", "http://:8000", "10.0.0.1:8000",
                                 "http://10.0.0.1:0", "http://10.0.0.1:70000", "http://fd00::1:8000",
                                 "http://[10.0.0.1]:8000", "http://[fd00::zz]:8000", "http://user@10.0.0.1:8000",
                                 "http://10.0.0.1:8000?x=1", "http://10.0.0.1:8000#x", "${NARWHAL_NODE_2_URL}", "",
                                 None, 8000])
def test_what_is_no_endpoint_does_not_split(url):
    assert split_url(url) is None and url_port(url) is None and with_port(url, 30001) is None


@pytest.mark.parametrize("url, moved", [
    ("http://10.0.0.21:30000", "http://10.0.0.21:30001"),
    ("http://[fd00::21]:30000", "http://[fd00::21]:30001"),
    ("https://router.example:30000/", "https://router.example:30001"),
    ("http://10.0.0.21:30000/v1", "http://10.0.0.21:30001"),  # the path goes: the host's root on the other port
])
def test_a_url_on_another_port_keeps_its_scheme_and_host(url, moved):
    assert with_port(url, 30001) == moved
    assert with_port(url, "30001") == moved


@pytest.mark.parametrize("tls, scheme", [("site", "https"), ("operator", "https"), ("off", "http")])
def test_the_engines_scheme_follows_narwhal_tls_and_the_builders_write_it(tls, scheme):
    assert engine_scheme(tls) == scheme
    assert engine_url("fd00::11", 8000, engine_scheme(tls)) == "%s://[fd00::11]:8000" % scheme
    assert http_url("10.0.0.21", 29000, "/metrics", scheme=scheme) == "%s://10.0.0.21:29000/metrics" % scheme
    assert split_url(engine_url("10.0.0.11", 8000, scheme)) == (scheme, "10.0.0.11", 8000, "")
    assert attestation_url("10.0.0.11", 8010) == "http://10.0.0.11:8010/v1/attestation"  # the sidecar's own


def test_a_builder_refuses_another_scheme():
    with pytest.raises(ValueError):
        http_url("10.0.0.11", 8000, scheme="ftp")


SECRET = "Zq7yK3pW9mXv2LtR"  # shaped like no token redact_text knows


@pytest.mark.parametrize("url", [
    "http://user:%s@10.0.0.11:8000" % SECRET, "https://%s@10.0.0.11:8000" % SECRET,
    "https://%s:@[fd00::11]:8000/v1" % SECRET, "http://user:%s/x@10.0.0.11:8000" % SECRET,
    " http://u:%s@gpu-1.example:8000" % SECRET, "HTTPS://u:%s@h:1" % SECRET])
def test_a_url_with_user_information_is_refused_naming_where_and_never_showing_it(url):
    assert has_userinfo(url)
    with pytest.raises(PlanError) as err:
        refuse_userinfo(url, "NARWHAL_FLEET config/fleet.json: engine-2, field url")
    text = str(err.value)
    assert SECRET not in text and "user" not in text.split("carries", maxsplit=1)[0]
    assert text.startswith("NARWHAL_FLEET config/fleet.json: engine-2, field url: the URL ")
    assert "<redacted>@" in text and "carries user information" in text and "NARWHAL_API_KEY_FILE" in text
    assert err.value.key == "NARWHAL_FLEET"
    with pytest.raises(PlanError) as err:
        refuse_userinfo(url, "runs/routers/router-1.json: url", key="runs/routers", fix="rerun the router stage")
    assert err.value.key == "runs/routers" and str(err.value).endswith("; rerun the router stage")


@pytest.mark.parametrize("url", ["http://10.0.0.11:8000", "https://[fd00::11]:8000/", "${NARWHAL_NODE_1_URL}",
                                 "http://10.0.0.11:8010/v1/at@tion", "http://[::1]:8000/a@b", "", None, 8000,
                                 "10.0.0.11:8000"])
def test_a_url_without_user_information_passes(url):
    assert not has_userinfo(url)
    assert refuse_userinfo(url, "where") == url


def test_redaction_hides_everything_up_to_the_last_at_of_each_url():
    text = "a http://u:%s@h:1 and https://%s@[::1]:2/p plain@mail" % (SECRET, SECRET)
    assert redact_userinfo(text) == "a http://<redacted>@h:1 and https://<redacted>@[::1]:2/p plain@mail"
    assert redact_userinfo(None) is None


def test_every_url_field_of_every_fleet_entry_is_checked():
    fleet = [{"engine": "engine-1", "url": "https://10.0.0.11:8000", "attestation_url": "http://10.0.0.11:8010"},
             {"url": "https://10.0.0.12:8000", "attestation_url": "http://u:%s@10.0.0.12:8010" % SECRET}]
    with pytest.raises(PlanError) as err:
        refuse_fleet_userinfo(fleet, "NARWHAL_FLEET")
    assert str(err.value).startswith("NARWHAL_FLEET: entry 1, field attestation_url: ") and SECRET not in str(err.value)
    assert refuse_fleet_userinfo(fleet[:1]) == fleet[:1]
    assert refuse_fleet_userinfo("not a list") == "not a list"  # the readers' own checks name that


def _readers():
    """Every reader of the resolved fleet after the lookup, each as a call of that fleet (the router's and the
    benchmark's plans, their filters, the monitoring targets)."""
    from ansible_collections.narwhal.deploy.plugins.filter import narwhal
    from ansible_collections.narwhal.deploy.plugins.module_utils._monitor.targets import file_sd
    from ansible_collections.narwhal.deploy.plugins.module_utils._router.plan import fleet_workers

    return {"fleet_workers": fleet_workers, "file_sd": lambda f: file_sd(f, [], "fleet"),
            "router_plan": lambda f: narwhal.router_plan({"site": {}}, f, "sha256:x", "0.1.17", "x"),
            "bench_plan": lambda f: narwhal.bench_plan({"site": {}}, f, "https://10.0.0.21:30000",
                                                       "https://10.0.0.21:30001", "20261202T201500Z"),
            "bench_router_plan": lambda f: narwhal.bench_router_plan({"url": "https://10.0.0.21:30000"}, {}, f),
            "bench_routers": lambda f: narwhal.bench_routers({"url": "https://10.0.0.21:30000"}, {}, f),
            "prometheus_targets": lambda f: narwhal.prometheus_targets(f, [], "config/fleet.json")}


@pytest.mark.parametrize("reader", sorted(_readers()))
@pytest.mark.parametrize("field, url", [("url", "https://narwhal:%s@10.0.0.12:8000" % SECRET),
                                        ("url", "https://%s@10.0.0.12:8000" % SECRET),
                                        ("attestation_url", "http://op:%s@10.0.0.12:8010/v1/attestation" % SECRET)])
def test_every_reader_of_the_fleet_refuses_a_url_with_credentials_by_the_one_rule(reader, field, url):
    fleet = [{"engine": "engine-1", "role": "prefill", "url": "https://10.0.0.11:8000",
              "attestation_url": "http://10.0.0.11:8010/v1/attestation"},
             {"engine": "engine-2", "role": "decode", "url": "https://10.0.0.12:8000",
              "attestation_url": "http://10.0.0.12:8010/v1/attestation"}]
    fleet[1][field] = url
    with pytest.raises(Exception) as err:  # noqa: B017 - PlanError, or the filters' AnsibleFilterError of it
        _readers()[reader](fleet)
    text = str(err.value)
    assert "NARWHAL_FLEET: engine-2, field %s: the URL http" % field in text and "carries user information" in text
    assert SECRET not in text and "<redacted>@10.0.0.12" in text
