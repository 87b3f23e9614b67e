# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one owner of endpoint text (plugins/module_utils/_common/endpoints.py): host and port -> URL, attestation URL,
Prometheus target, and back, IPv6 in brackets; the texts are those discovery, the router, monitoring, the benchmark
and the launcher wrote before they shared it (issue 34)."""

from __future__ import annotations

import pytest

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import (
    attestation_url,
    engine_url,
    http_url,
    split_url,
    target,
    url_host,
    url_port,
    with_port,
)


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
