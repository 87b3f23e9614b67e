#!/usr/bin/python
# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_prereqs
short_description: Check an engine host's remote prerequisites for a launch record, without changing it
version_added: 0.1.0
description:
  - Runs on the engine host during prepare, read-only. Checks that the Docker daemon answers (over its Engine
    API, with the Python standard library; neither this module nor the launcher needs the Docker SDK), that the
    image with the recorded ID is present, that the model path exists and is readable, that every recorded device path
    exists, that the fabric interface exists, can carry traffic (operstate UP or UNKNOWN, administratively up, no
    C(NO-CARRIER) flag) and still carries the recorded address, and that nothing else
    listens on the engine's HTTP, attestation or side-channel ports. Sockets held by processes of this engine's
    own running container, C(narwhal-<engine>), are allowed, so a prepare of the running engine is not refused.
  - A listener on the attestation port that answers a GET of the engine's attestation URL (O(attestation_url), by
    default the one discovery derives from the record, C(http://<node.address>:<node.attest_port>/v1/attestation))
    with a 2xx status is the attestation sidecar, not a conflict; whether it answered is returned in
    RV(attestation). Anything else listening on the engine's ports is refused.
  - Fails with every problem found, each naming what is missing and how to fix it. Its one host tool,
    C(ip -j addr show), runs with the deadline O(command_timeout); when it times out, fails or prints output that
    is not the JSON of C(ip -j), that is one of those problems.
  - Reads the fabric interface once and returns it as the fact C(narwhal_interface), in the shape
    M(narwhal.deploy.interface_facts) returns (its speed read below C(/sys)), so prepare reads the interface once (M(narwhal.deploy.prepare_run)'s
    write stage compares the same facts with the record).
  - With O(read_gpus), also reads the GPUs as M(narwhal.deploy.gpu_facts) does (below O(sysfs_root) and O(dev_root),
    the same facts and the same errors) and returns them as the fact C(narwhal_gpus), after every prerequisite
    passed, so that prepare's host checks are one module run per host.
  - With O(held), also reads what the host holds of those paths, as M(narwhal.deploy.held_files) does, and returns
    the paths that differ as RV(held_differ) - prepare reads what install would write, and install writes only those
    paths without a read of its own. Its action plugin turns each O(held[].src) (a controller file) into the
    sha256 of its content on the controller; no digest is returned.
options:
  record:
    description: The engine's launch record (one entry of the launch config).
    type: dict
    required: true
  attestation_url:
    description:
      - The engine's attestation URL (the fleet's C(attestation_url), e.g. a C(NARWHAL_NODE_<n>_ATTESTATION_URL)
        override). Its port must be the record's C(node.attest_port). Default from the record.
    type: str
  attestation_timeout:
    description: Seconds the GET of the attestation URL may take.
    type: int
    default: 5
  read_gpus:
    description: Also read the GPUs (the fact C(narwhal_gpus)), once every prerequisite passed.
    type: bool
    default: false
  held:
    description:
      - What the host should hold, as M(narwhal.deploy.held_files)' O(narwhal.deploy.held_files#module:files) (the same
        suboptions and comparison); read once every prerequisite passed. Not read when omitted.
    type: list
    elements: dict
    suboptions:
      path:
        description: Absolute path on the host.
        type: path
        required: true
      state:
        description: A regular file or a directory.
        type: str
        choices: [file, directory]
        default: file
      sha256:
        description: The sha256 (hex) the file's content should have; an empty string matches no file.
        type: str
      src:
        description: A controller file whose content the host's file should have (read by the action plugin).
        type: path
      mode:
        description: The permission bits it should have, in octal.
        type: str
      owner:
        description: The user that should own it (name or uid).
        type: str
      group:
        description: The group that should own it (name or gid).
        type: str
attributes:
  idempotent:
    description: Never changes anything.
requirements:
  - A Docker daemon on the engine host
  - iproute2 (C(ip))
extends_documentation_fragment:
  - narwhal.deploy.attributes
  - narwhal.deploy.attributes.read_only
  - narwhal.deploy.attributes.engine_host
  - narwhal.deploy.docker_access
  - narwhal.deploy.host_roots
  - narwhal.deploy.command_timeout
author:
  - narwhal.deploy contributors (@narwhal-deploy)
"""

EXAMPLES = r"""
- name: Check the engine host
  narwhal.deploy.engine_prereqs:
    record: "{{ narwhal_prepare.records[inventory_hostname] }}"
  become: true

- name: Check the engine host and read its GPUs in the same run
  narwhal.deploy.engine_prereqs:
    record: "{{ narwhal_prepare.records[inventory_hostname] }}"
    read_gpus: true
  become: true
"""

RETURN = r"""
image_id:
  description: ID of the recorded image on this host.
  returned: success
  type: str
  sample: sha256:c261354381582881da50c70a35a35bbe65b52c1b48cb2591b0c97e7291c60d18
attestation:
  description:
    - The attestation port as found. C(url) asked, C(port), C(listening) (something listens on the port),
      C(answered) (null when nothing listens; true when the listener answered the URL with 2xx, so it is the
      sidecar and accepted), C(status) (the HTTP status, null without an answer) and C(error) (why it did not
      answer, else null).
  returned: always
  type: dict
  sample: {"url": "http://172.31.241.11:8010/v1/attestation", "port": 8010, "listening": true, "answered": true,
           "status": 200, "error": null}
ansible_facts:
  description: Facts of the engine host.
  returned: success
  type: complex
  contains:
    narwhal_interface:
      description:
        - The recorded fabric interface as found (C(name), C(operstate), C(mtu), C(host_id), C(global_addresses) of
          any family, C(addresses) with their classification), as M(narwhal.deploy.interface_facts) returns it.
      type: dict
      returned: success
      sample: {"name": "eth1", "operstate": "UP", "mtu": 1500, "host_id": "5f2c0e9a1b7d4c3e",
               "global_addresses": ["172.31.241.11"], "addresses": []}
    narwhal_gpus:
      description:
        - With O(read_gpus), the GPU inventory as M(narwhal.deploy.gpu_facts) returns it (C(vendor), C(gpus),
          C(devices), C(driver_version), C(source)).
      type: dict
      returned: success and O(read_gpus)
      sample: {"vendor": "none", "gpus": [], "devices": [], "driver_version": null, "source": null}
held_differ:
  description: With O(held), its paths that the host does not hold as wanted, in the order of O(held).
  returned: success and O(held)
  type: list
  elements: str
  sample: [/opt/narwhal/config/engine-2.env]
python:
  description: The Python that ran the check (and will run the launcher).
  returned: always
  type: str
  sample: /usr/bin/python3
"""

import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.parse import urlsplit
from ansible.module_utils.urls import open_url

from ansible_collections.narwhal.deploy.plugins.module_utils._common.held import HELD_FILE_SPEC, SRC_ON_CONTROLLER
from ansible_collections.narwhal.deploy.plugins.module_utils._common.ports import rpc_port, side_channel_range
from ansible_collections.narwhal.deploy.plugins.module_utils._common.specs import (
    COMMAND_TIMEOUT_SPEC,
    DOCKER_ACCESS_SPEC,
    HOST_ROOTS_SPEC,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.tools import (
    CommandTimeoutError,
    HeldReadError,
    excerpt,
    host_id,
    host_name,
    read_held,
    run_bounded,
)
from ansible_collections.narwhal.deploy.plugins.module_utils._common.urls import attestation_url
from ansible_collections.narwhal.deploy.plugins.module_utils._docker.engine_api import Client, EngineAPIError
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.checkpoint import checkpoint_config_path
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.gpu_reader import read_gpus
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.interface_reader import read_link_speed
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.model import ModelConfigError
from ansible_collections.narwhal.deploy.plugins.module_utils._facts.netaddr import (
    interface_addresses,
    interface_facts,
    link_refusal,
    parse_ip_json,
)


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


def engine_ports(record):
    """The ports this host's part of the engine binds: HTTP, attestation, every side-channel port and, on the head of
    an engine across hosts, vLLM's DP handshake socket (--data-parallel-rpc-port, _common/ports.py::rpc_port).
    `record` is the host's view of the record (_plan/container.py::member_view: `member.rank` 0 on the head)."""
    node = record["node"]
    side = side_channel_range(node)
    ports = set([node["engine_port"], node["attest_port"]] + list(range(side[0], side[1] + 1)))
    if rpc_port(record):
        ports.add(rpc_port(record))
    return ports


def foreign_listeners(ports, container_id):
    """Ports something other than this engine's own container listens on."""
    sockets = listening_sockets(ports)
    if not sockets or not container_id:
        return sorted(sockets)
    owners = socket_owners(set(i for inodes in sockets.values() for i in inodes))
    return sorted(port for port, inodes in sockets.items()
                  if not all(i in owners and in_container(owners[i], container_id) for i in inodes))


def get_status(url, timeout):
    """(HTTP status, None) of a GET of `url`, or (status or None, why) when it did not answer 2xx."""
    try:
        resp = open_url(url, method="GET", timeout=timeout, validate_certs=False, follow_redirects="none")
        status = resp.getcode()
    except Exception as exc:  # noqa: BLE001 - an HTTP error carries its status; anything else did not answer
        status = getattr(exc, "code", None)
        return status, ("HTTP %s" % status) if status else str(getattr(exc, "reason", None) or exc)
    return status, None if 200 <= status < 300 else "HTTP %s" % status


def attestation_check(node, url, busy, get, timeout):
    """-> (attestation report, problem or None) for the attestation port. A listener there that answers the
    attestation URL (2xx) is the sidecar; one that does not, or a URL on another port, is a conflict."""
    port = node["attest_port"]
    report = {"url": url, "port": port, "listening": port in busy, "answered": None, "status": None, "error": None}
    if port not in busy:
        return report, None
    try:
        url_port = urlsplit(url).port
    except ValueError:
        url_port = None
    if url_port != port:
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
    if others:
        problems.append("something already listens on port %s of this host; stop it or give %s other ports "
                        "(NARWHAL_NODE_<n>_ENGINE_PORT / _ATTEST_PORT, NARWHAL_SIDE_CHANNEL_PORT%s)"
                        % (",".join(map(str, others)), engine,
                           ", NARWHAL_DATA_PARALLEL_RPC_PORT" if record.get("data_parallel_rpc_port") in others
                           else ""))
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


def main():
    module = AnsibleModule(
        argument_spec=dict(record=dict(type="dict", required=True),
                           **DOCKER_ACCESS_SPEC,
                           attestation_url=dict(type="str"),
                           attestation_timeout=dict(type="int", default=5),
                           read_gpus=dict(type="bool", default=False),
                           held=dict(type="list", elements="dict", options=HELD_FILE_SPEC),
                           **HOST_ROOTS_SPEC,
                           **COMMAND_TIMEOUT_SPEC),
        supports_check_mode=True,
    )
    record = module.params["record"]
    engine = record.get("engine", "?")
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
            container = client.container("narwhal-%s" % engine)
            own_container = container["Id"] if container["State"]["Status"] == "running" else None
        except Exception:  # noqa: BLE001
            own_container = None
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
    node = record["node"]
    # prepare's one read of the fabric interface, also returned as narwhal_interface (the current inspection
    # prepare_run's write stage compares with the record). The address is checked here, where the host's truth is:
    # the attestation check below asks a URL built from the recorded address, so a moved address must be named
    # as the cause first.
    links = read_links(module)
    interface = None
    if isinstance(links, str):
        problems.append(links)
    else:
        link, addresses = interface_addresses(links, node["fabric_interface"])
        if link is None:
            problems.append("the fabric interface %s does not exist (NARWHAL_FABRIC_INTERFACE)"
                            % node["fabric_interface"])
        else:
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
    ports = engine_ports(record)
    url = module.params["attestation_url"] or attestation_url(node["address"], node["attest_port"])
    attestation, busy_problems = port_problems(record, foreign_listeners(ports, own_container), url, get_status,
                                               module.params["attestation_timeout"])
    problems.extend(busy_problems)
    if problems:
        module.fail_json(msg="%s is missing remote prerequisites: %s. Correct them, then prepare a new run."
                             % (engine, " | ".join(problems)), problems=problems, python=sys.executable,
                         attestation=attestation)
    facts = {"narwhal_interface": interface}
    if module.params["read_gpus"]:  # gpu_facts' read, in this run (its failures end the module as they end gpu_facts)
        p = module.params
        facts["narwhal_gpus"] = read_gpus(module, p["sysfs_root"], p["dev_root"], p["command_timeout"])
    held = {}
    if module.params["held"] is not None:  # held_files' read, for install (roles/prepare passes install's paths)
        if any(want.get("src") is not None for want in module.params["held"]):
            module.fail_json(msg="held: " + SRC_ON_CONTROLLER % "engine_prereqs")
        try:
            held["held_differ"] = list(read_held(module.params["held"]))
        except HeldReadError as exc:
            module.fail_json(msg="held: %s" % exc)
    module.exit_json(changed=False, image_id=image_id, python=sys.executable, attestation=attestation,
                     ansible_facts=facts, **held)


if __name__ == "__main__":
    main()
