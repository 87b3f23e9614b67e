# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""HTTP to the engines and the routers (an I/O edge), shared by the transfer probe (_probe/transfer.py) and the
router host's modules (_router/client.py): one JSON request with the engines' Bearer key, and the key file read by
the launcher's rule (_common/api_key.py::api_key_from). Errors carry the status and body, never the request headers,
so nothing here prints the key. Python 3.8 compatible (runs on engine and router hosts)."""

from __future__ import annotations

import json
import os

from ansible.module_utils.urls import Request, make_context, open_url

from ansible_collections.narwhal.deploy.plugins.module_utils._common.api_key import API_KEY_MAX_BYTES, api_key_from
from ansible_collections.narwhal.deploy.plugins.module_utils._common.errors import PlanError
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import host_name, read_regular

__metaclass__ = type


_CONTEXT = []
_CA_CONTEXTS = {}


def tls_context(cafile=None):
    """One verifying TLS context per process (per CA file: `cafile`, when given, is the only trust anchor, as
    ssl.create_default_context(cafile=...) makes it). Ansible's open_url builds a new one for every request, plain HTTP
    included (ansible/module_utils/urls.py, Request.open: make_context reads the CA certificates), which cost ~20 ms of
    CPU per request on the controller: most of the transfer probe's controller cost per pair (docs/benchmarks.md).
    Threads may race to build it; each context is the same and one of them is kept."""
    if cafile:
        if cafile not in _CA_CONTEXTS:
            _CA_CONTEXTS[cafile] = make_context(cafile=cafile, validate_certs=True)
        return _CA_CONTEXTS[cafile]
    if not _CONTEXT:
        _CONTEXT.append(make_context(validate_certs=True))
    return _CONTEXT[0]


def call(url, key=None, body=None, request_id=None, timeout=120, extra_headers=None, cafile=None):
    """GET (or POST `body` as JSON) -> (status, parsed JSON or text); status 0 when nothing answered.
    `extra_headers` are sent as well (the transfer probe's X-data-parallel-rank); `cafile`: an https URL's
    certificate is verified against that CA only (tls_context)."""
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
            text = str(exc)
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
