# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP to the router and the engines from the router host (an I/O edge), beside the one JSON request and key-file
reader of _common/http.py: Server-Sent-Event streams, Prometheus text, the router host's key file and CA certificate.
With TLS every request verifies the server's certificate against the router directory's CA (`cafile`, the only
trust anchor: _common/http.py::tls_context). Nothing here prints the key: errors carry the status and body, never
the request headers."""

from __future__ import annotations

import json
import os
import socket
import ssl
import time

from ansible.module_utils.urls import Request

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import split_url
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import call, read_key_file, tls_context
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import host_name

__metaclass__ = type


def read_key(path):
    """The engines' key the router stage installed on this host (_common/http.py::read_key_file)."""
    return read_key_file(path, "rerun the router stage, which installs it")


def check_ca(path):
    """`path` (the modules' ca_file) when it is a file on this host, None when unset; refuses a missing one by name
    (ssl would only say "No such file" for each request)."""
    if not path:
        return None
    if not os.path.isfile(path):
        raise PlanError("the CA certificate %s is not on router host %s (NARWHAL_TLS is on); rerun the router stage, "
                        "which installs it" % (path, host_name()), "NARWHAL_TLS")
    return path


def _headers(key, extra=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer %s" % key
    headers.update(extra or {})
    return headers


def _error(exc):
    status = getattr(exc, "code", None) or 0
    try:
        text = exc.read().decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - no body: the exception is the answer
        text = str(exc)
    return status, text


def stream(url, key, body, timeout=60, cafile=None):
    """POST a streaming request -> (status, [parsed event data], seconds to the first event, raw tail). The events
    are the JSON documents of the `data:` lines before `data: [DONE]`."""
    # the process's one TLS context (_common/http.py::tls_context), built before the clock starts: open_url would read
    # the CA certificates for every request, inside the time to the first event
    request = Request(context=tls_context(cafile))
    started = time.time()
    first = None
    try:
        resp = request.open("POST", url, headers=_headers(key, {"Accept": "text/event-stream"}), timeout=timeout,
                            data=json.dumps(body))
    except Exception as exc:  # noqa: BLE001
        status, text = _error(exc)
        return status, [], None, text[-400:]
    events, done, tail = [], False, ""
    for raw in resp:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if first is None:
            first = time.time() - started
        if data == "[DONE]":
            done = True
            break
        try:
            events.append(json.loads(data))
        except ValueError:
            tail = data[-400:]
    return resp.getcode(), events, first, ("" if done else "stream ended without data: [DONE] " + tail).strip()


def metrics(url, timeout=15, cafile=None):
    """The Prometheus text of url + /metrics, or None when it does not answer."""
    status, text = call(url.rstrip("/") + "/metrics", timeout=timeout, cafile=cafile)
    return text if status == 200 and isinstance(text, str) else None


def served_certificate(url, cafile, timeout=10):
    """The certificate an https `url` serves, verified against `cafile` with its host name checked: {"not_after":
    ISO UTC, "days_left": whole days}, or {"error": why} when the handshake fails (an expired certificate or one of
    another CA: "certificate verify failed: ..."); None for an http URL."""
    parsed = split_url(url)
    if parsed is None or parsed[0] != "https":
        return None
    host, port = parsed[1], parsed[2]
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            with tls_context(cafile).wrap_socket(raw, server_hostname=host) as conn:
                cert = conn.getpeercert()
    except (OSError, ssl.SSLError, ssl.CertificateError) as exc:
        return {"error": str(exc)}
    expires = ssl.cert_time_to_seconds(cert["notAfter"])
    return {"not_after": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)),
            "days_left": int((expires - time.time()) // 86400)}
