# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP to the engines and the routers (an I/O edge), shared by the transfer probe (_probe/transfer.py) and the
router host's modules (_router/client.py): one JSON request with the engines' Bearer key, and the key file read by
the launcher's rule (_common/api_key.py::api_key_from). Errors carry the status and body, never the request headers,
so nothing here prints the key. Python 3.8 compatible (runs on engine and router hosts).

An https URL is verified: against the site CA when the caller names its file (`cafile`: the controller's
<NARWHAL_TLS_DIR>/ca.crt, an engine host's <checkout>/tls/ca.crt), that CA alone and the hostname checked; else
against the system's CAs. A certificate that fails (another CA, expired, not naming the URL's host) answers status 0
with the TLS reason, "certificate verify failed: <why>" (tls_failure tells it from other failures)."""

from __future__ import annotations

import json
import os
import re
import ssl

from ansible.module_utils.urls import Request, make_context, open_url

from ansible_collections.narwhal.deploy.plugins.module_utils._common.api_key import API_KEY_MAX_BYTES, api_key_from
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import host_name, read_regular

__metaclass__ = type


_CONTEXTS = {}


def tls_context(cafile=None):
    """One verifying TLS context per CA file per process (None: the system's CAs). Ansible's open_url builds a new one
    for every request, plain HTTP included (ansible/module_utils/urls.py, Request.open: make_context reads the CA
    certificates), which cost ~20 ms of CPU per request on the controller: most of the transfer probe's controller cost
    per pair (docs/benchmarks.md). With `cafile`, make_context trusts that file alone (ssl.create_default_context(
    cafile=...): no system CA is added) and checks the hostname. Threads may race to build it; each context is the
    same and one of them is kept. Raises OSError or ssl.SSLError when `cafile` cannot be read as certificates."""
    context = _CONTEXTS.get(cafile)
    if context is None:
        built = make_context(validate_certs=True) if cafile is None else make_context(cafile=cafile,
                                                                                      validate_certs=True)
        context = _CONTEXTS.setdefault(cafile, built)
    return context


# the text of an answer that failed in TLS (tls_reason): a certificate that does not verify, or no TLS handshake
CERT_FAILED = "certificate verify failed"
HANDSHAKE_FAILED = "TLS handshake failed"
_SSL_SOURCE = re.compile(r"\s*\(_ssl\.c:[0-9]+\)$")


def tls_reason(exc):
    """Why a request failed in TLS, or None: "certificate verify failed: <OpenSSL's reason>" (another CA: unable to
    get local issuer certificate; certificate has expired; IP address mismatch / Hostname mismatch) or "TLS handshake
    failed: <the SSL error>" (e.g. a plain HTTP server at an https URL). urllib wraps it in URLError.reason."""
    reason = getattr(exc, "reason", None)
    reason = reason if isinstance(reason, ssl.SSLError) else exc
    if isinstance(reason, ssl.SSLCertVerificationError):
        return "%s: %s" % (CERT_FAILED, reason.verify_message or _SSL_SOURCE.sub("", str(reason)))
    if isinstance(reason, ssl.SSLError):
        return "%s: %s" % (HANDSHAKE_FAILED, _SSL_SOURCE.sub("", str(reason)))
    return None


def tls_failure(answer):
    """The TLS reason of a call() answer that failed in TLS (status 0, tls_reason's text), else None."""
    status, text = answer
    if status == 0 and isinstance(text, str) and text.startswith((CERT_FAILED + ":", HANDSHAKE_FAILED + ":")):
        return text
    return None


def call(url, key=None, body=None, request_id=None, timeout=120, extra_headers=None, cafile=None):
    """GET (or POST `body` as JSON) -> (status, parsed JSON or text); status 0 when nothing answered (the text says
    why: tls_reason's for a TLS failure). `extra_headers` are sent as well (the transfer probe's X-data-parallel-rank);
    `cafile`: the CA an https URL's certificate must be signed by (tls_context)."""
    headers = dict(extra_headers or {})
    headers["Content-Type"] = "application/json"
    if key:
        headers["Authorization"] = "Bearer %s" % key
    if request_id:
        headers["X-Request-Id"] = request_id
    try:
        request = Request(context=tls_context(cafile))
        resp = request.open("POST" if body is not None else "GET", url, headers=headers, timeout=timeout,
                            validate_certs=True, data=json.dumps(body) if body is not None else None)
        text = resp.read().decode("utf-8", "replace")
        status = resp.getcode()
    except Exception as exc:  # noqa: BLE001 - HTTP errors carry a status; anything else did not answer
        status = getattr(exc, "code", None) or 0
        try:
            text = exc.read().decode("utf-8", "replace")
        except Exception:  # noqa: BLE001
            text = (tls_reason(exc) if not status else None) or str(exc)
    try:
        return status, json.loads(text)
    except (ValueError, RecursionError):
        return status, text


def get_status(url, timeout):
    """(HTTP status, None) of a GET of `url` that answered 2xx, else (status or None, why it did not: "HTTP <status>",
    or the reason nothing answered, e.g. "timed out"). engine_prereqs' question to a listener on the attestation port
    (_facts/prereqs.py): does it answer the attestation URL, i.e. is it the sidecar. So unlike call(): no redirect is
    followed (a 3xx is an answer, not the sidecar's), no certificate is verified (whose listener it is, not whether
    to trust it) and the body is not read."""
    try:
        resp = open_url(url, method="GET", timeout=timeout, validate_certs=False, follow_redirects="none")
        status = resp.getcode()
    except Exception as exc:  # noqa: BLE001 - an HTTP error carries its status; anything else did not answer
        status = getattr(exc, "code", None)
        return status, ("HTTP %s" % status) if status else str(getattr(exc, "reason", None) or exc)
    return status, None if 200 <= status < 300 else "HTTP %s" % status


def read_key_file(path, fix):
    """The key in `path` by the launcher's rule (_common/api_key.py::api_key_from); raises PlanError naming the file
    and ending with `fix` (how the caller's stage puts the file there)."""
    try:
        st = os.stat(path)
        raw = read_regular(path, API_KEY_MAX_BYTES)  # a FIFO is refused by name, never waited on
    except OSError as exc:
        raise PlanError("cannot read the engine API key file %s on host %s (%s); %s"
                        % (path, host_name(), exc.strerror or exc, fix), "NARWHAL_API_KEY_FILE")
    return api_key_from(raw, st.st_mode, path)
