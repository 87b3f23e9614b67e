# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""engine_prereqs' check of an engine host's remote prerequisites for a launch record (the module file,
plugins/modules/engine_prereqs.py, holds the documentation, the argument spec and main(); the work is here, as
community.docker's plugins/modules/docker_container.py hands its module to
plugins/module_utils/_module_container/module.py). An I/O edge that ships to the engine host: it asks the Docker
daemon (_docker/engine_api.py), reads /proc, the model (its config and STAMP) and the device paths, runs `ip` and
GETs the attestation URL (_common/http.py::get_status). Read-only. Python 3.8 compatible."""

from __future__ import annotations

import os
import sys

from ansible_collections.narwhal.deploy.plugins.module_utils._common.endpoints import attestation_url, url_port
from ansible_collections.narwhal.deploy.plugins.module_utils._common.held import SRC_ON_CONTROLLER
from ansible_collections.narwhal.deploy.plugins.module_utils._common.http import get_status
from ansible_collections.narwhal.deploy.plugins.module_utils._common.ports import kv_events_range, port_set
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    CommandTimeoutError,
    HeldReadError,
    excerpt,
    host_id,
    host_name,
    read_held,
    run_bounded,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import Client, EngineAPIError
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import checkpoint_config_path, read_stamp
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu_reader import read_gpus
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.interface_reader import read_link_speed
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import ModelConfigError
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    interface_addresses,
    interface_facts,
    link_refusal,
    parse_ip_json,
)

__metaclass__ = type


def listening_sockets(ports):
    """{port: set(socket inodes)} of the ports of `ports` in LISTEN state, from /proc/net/tcp{,6}."""
    found = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as fh:
                next(fh)
                for line in fh:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A":
                        port = int(fields[1].rsplit(":", 1)[1], 16)
                        if port in ports:
                            found.setdefault(port, set()).add(fields[9])
        except (OSError, StopIteration, ValueError):
            continue
    return found


def socket_owners(inodes):
    """{inode: pid} for the given socket inodes (needs root to see every process)."""
    wanted = dict(("socket:[%s]" % i, i) for i in inodes)
    owners = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir("/proc/%s/fd" % pid):
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
                if target in wanted:
                    owners[wanted[target]] = pid
        except OSError:
            continue
    return owners


def in_container(pid, container_id):
    try:
        with open("/proc/%s/cgroup" % pid) as fh:
            return container_id in fh.read()
    except OSError:
        return False


def foreign_listeners(ports, container_id):
    """Ports something other than this engine's own container listens on."""
    sockets = listening_sockets(ports)
    if not sockets or not container_id:
        return sorted(sockets)
    owners = socket_owners(set(i for inodes in sockets.values() for i in inodes))
    return sorted(port for port, inodes in sockets.items()
                  if not all(i in owners and in_container(owners[i], container_id) for i in inodes))


def attestation_check(node, url, busy, get, timeout):
    """-> (attestation report, problem or None) for the attestation port. A listener there that answers the
    attestation URL (2xx) is the sidecar; one that does not, or a URL on another port, is a conflict."""
    port = node["attest_port"]
    report = {"url": url, "port": port, "listening": port in busy, "answered": None, "status": None, "error": None}
    if port not in busy:
        return report, None
    if url_port(url) != port:
        report.update(answered=False, error="the attestation URL is not on port %s" % port)
        return report, ("something already listens on port %s of host %s (the attestation port), and the attestation "
                        "URL %s is not on that port, so it cannot be the sidecar; set NARWHAL_NODE_<n>_ATTESTATION_URL "
                        "to the sidecar's URL on port %s, or stop the listener" % (port, host_name(), url, port))
    status, error = get(url, timeout)
    report.update(answered=error is None, status=status, error=error)
    if error is None:
        return report, None
    return report, ("something already listens on port %s of host %s (the attestation port) but does not answer the "
                    "attestation URL %s (%s), so it is not the attestation sidecar; stop it, fix the sidecar, or give "
                    "this engine another attestation port (NARWHAL_NODE_<n>_ATTEST_PORT)"
                    % (port, host_name(), url, error))


def port_problems(record, busy, url, get, timeout):
    """Problems of the engine's ports given `busy` (ports something other than its container listens on)."""
    engine, node = record.get("engine", "?"), record["node"]
    report, problem = attestation_check(node, url, busy, get, timeout)
    problems = [problem] if problem else []
    others = [p for p in busy if p != node["attest_port"]]
    kv = kv_events_range(record)
    if others:
        problems.append("something already listens on port %s of this host; stop it or give %s other ports "
                        "(NARWHAL_NODE_<n>_ENGINE_PORT / _ATTEST_PORT, NARWHAL_SIDE_CHANNEL_PORT%s%s)"
                        % (",".join(map(str, others)), engine,
                           ", NARWHAL_DATA_PARALLEL_RPC_PORT" if record.get("data_parallel_rpc_port") in others
                           else "",
                           ", NARWHAL_KV_EVENTS_PORT" if kv and any(kv[0] <= p <= kv[1] for p in others) else ""))
    return report, problems


def read_links(module):
    """`ip -j addr show` as a list of interfaces, or the problem (a str naming the tool and the host): not
    installed, timed out, failed, or output that is not ip's JSON -- never read as "no interfaces"."""
    host = "host %s" % host_name()
    ip = module.get_bin_path("ip")
    if not ip:
        return "'ip' (iproute2) is not installed on %s; install iproute2" % host
    timeout = module.params["command_timeout"]
    try:
        rc, out, err = run_bounded([ip, "-j", "addr", "show"], timeout, {"LC_ALL": "C"})
    except CommandTimeoutError:
        return ("'ip -j addr show' on %s did not answer within %s s (timed out, killed); ip hangs when the kernel's "
                "netlink socket does not answer (a stuck network driver: check 'dmesg')" % (host, timeout))
    except OSError as exc:
        return "'ip -j addr show' could not be started on %s: %s" % (host, exc.strerror or exc)
    if rc != 0:
        first = (err or out or "").strip().splitlines()
        return ("'ip -j addr show' failed on %s (rc=%d): %s; install a current iproute2"
                % (host, rc, first[0] if first else "no output"))
    try:
        return parse_ip_json(out)
    except (ValueError, RecursionError) as exc:
        return ("'ip -j addr show' output on %s is not the JSON 'ip -j' writes (%s): %s; run it by hand on the host"
                % (host, excerpt(out), exc if isinstance(exc, ValueError) else "nested too deeply to read"))


def docker_problems(module, record):
    """The daemon and the recorded image -> (problems, the image's ID or None, the ID of this engine's own running
    container, narwhal-<engine>, or None: its sockets are not a conflict)."""
    problems = []
    image_id = None
    own_container = None
    wanted = record["runtime"]["image_id"]
    client, answered = None, False
    try:
        client = Client(module.params["docker_host"], timeout=30)
        image_id = client.image(wanted)["Id"]
        answered = True
    except EngineAPIError as exc:
        if exc.status is None:  # nothing answers (DaemonUnreachable), or a docker_host it cannot use
            problems.append("the Docker daemon at %s does not answer (%s); start it (systemctl start docker)"
                            % (module.params["docker_host"], exc))
        else:
            answered = True
            problems.append("image %s (%s) is not present in this host's Docker daemon; load or pull exactly that "
                            "image, or rerun discovery if the image was meant to change"
                            % (record["runtime"]["image"], wanted))
    if answered:
        try:
            container = client.container("narwhal-%s" % record.get("engine", "?"))
            own_container = container["Id"] if container["State"]["Status"] == "running" else None
        except Exception:  # noqa: BLE001
            own_container = None
    return problems, image_id, own_container


def path_problems(record):
    """The model's config file (readable) and every recorded device path (present)."""
    problems = []
    model = record["runtime"]["model_path"]
    try:
        config = checkpoint_config_path(model)
    except ModelConfigError as exc:
        problems.append("%s (NARWHAL_MODEL_PATH)" % exc)
    else:
        if not os.access(config, os.R_OK):
            problems.append("the model's %s is not readable; make it readable to the launcher (NARWHAL_MODEL_PATH)"
                            % config)
    missing = [p for p in record.get("accelerator_devices", []) + record["transfer"].get("devices", [])
               if not os.path.exists(p)]
    if missing:
        problems.append("recorded device paths are missing: %s; check the drivers, or rerun discovery if the "
                        "hardware changed" % ", ".join(missing))
    return problems


def model_manifest(record):
    """(the digest of the checkpoint's STAMP now, or None without one; problems): prepare_run's stale check compares
    it with the record's runtime.model_manifest. One small read (the digest is recomputed from the STAMP's files
    map, no file of the checkpoint is hashed); a checkpoint directory that is missing is path_problems'."""
    path = record["runtime"]["model_path"]
    if not os.path.isdir(path):
        return None, []
    try:
        found = read_stamp(path)
    except ModelConfigError as exc:
        return None, ["%s (NARWHAL_MODEL_PATH)" % exc]
    return (found or {}).get("digest"), []


def interface_problems(module, node):
    """prepare's one read of the fabric interface -> (problems, the interface as the fact narwhal_interface, or None).
    The fact is the current inspection prepare_run's write stage compares with the record. The address is checked
    here, where the host's truth is: the attestation check asks a URL built from the recorded address, so a moved
    address must be named as the cause first."""
    links = read_links(module)
    if isinstance(links, str):
        return [links], None
    problems = []
    link, addresses = interface_addresses(links, node["fabric_interface"])
    if link is None:
        return ["the fabric interface %s does not exist (NARWHAL_FABRIC_INTERFACE)" % node["fabric_interface"]], None
    # its speed from the kernel's own tree, as ip reads the kernel's interfaces (sysfs_root is the GPUs')
    interface = interface_facts(node["fabric_interface"], link, addresses, "any", host_id(),
                                read_link_speed("/sys", node["fabric_interface"]))
    refusal = link_refusal(node["fabric_interface"], link, "host %s" % host_name(),
                           "prepare a new run (rerun discovery first for another interface)")
    if refusal:
        problems.append(refusal)
    if node["address"] not in [a["address"] for a in addresses]:
        problems.append("%s no longer carries the recorded address %s; rerun discovery"
                        % (node["fabric_interface"], node["address"]))
    return problems, interface


def run_module(module):
    """engine_prereqs: every problem found, or the facts (and, with `held`, the paths that differ)."""
    p = module.params
    record = p["record"]
    node = record["node"]
    problems, image_id, own_container = docker_problems(module, record)
    problems += path_problems(record)
    manifest, found = model_manifest(record)
    problems += found
    found, interface = interface_problems(module, node)
    problems += found
    url = p["attestation_url"] or attestation_url(node["address"], node["attest_port"])
    attestation, busy_problems = port_problems(record, foreign_listeners(port_set(record), own_container), url,
                                               get_status, p["attestation_timeout"])
    problems.extend(busy_problems)
    if problems:
        module.fail_json(msg="%s is missing remote prerequisites: %s. Correct them, then prepare a new run."
                             % (record.get("engine", "?"), " | ".join(problems)), problems=problems,
                         python=sys.executable, attestation=attestation)
    facts = {"narwhal_interface": interface}
    if p["read_gpus"]:  # gpu_facts' read, in this run (its failures end the module as they end gpu_facts)
        facts["narwhal_gpus"] = read_gpus(module, p["sysfs_root"], p["dev_root"], p["command_timeout"])
    held = {}
    if p["held"] is not None:  # held_files' read, for install (roles/prepare passes install's paths)
        if any(want.get("src") is not None for want in p["held"]):
            module.fail_json(msg="held: " + SRC_ON_CONTROLLER % "engine_prereqs")
        try:
            held["held_differ"] = list(read_held(p["held"]))
        except HeldReadError as exc:
            module.fail_json(msg="held: %s" % exc)
    module.exit_json(changed=False, image_id=image_id, model_manifest=manifest, python=sys.executable,
                     attestation=attestation, ansible_facts=facts, **held)
