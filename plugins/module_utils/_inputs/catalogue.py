# Copyright: narwhal.deploy contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one machine-readable description of every `.env` input (INPUTS, NODE_INPUTS).

`.env.example` and `docs/inputs.md` are generated from it (scripts/gen-inputs.py) and a unit test fails
when they drift; validation (_inputs/validate.py) reads the same description.
"""

from __future__ import annotations

import re

__metaclass__ = type

NODE_KEY = re.compile(r"^NARWHAL_NODE_([1-9][0-9]*)_([A-Z_]+)$")

IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")


# kind: str | int | bool (true/false) | port | choice | path | ip | bind (any IP address) | url | interface | role
# | args (shell words) | env (KEY=VALUE words) | rate_list (request rates) | number (a positive decimal)
# | seconds (whole seconds from "min" to "max") | whole (a whole number from "min" to "max")
# | fraction (a decimal above 0, at most 1) | duration (a Prometheus duration above zero: 30s, 2m, 1h30m)
INPUTS = [
    {"name": "NARWHAL_FABRIC_INTERFACE", "kind": "interface", "required": True, "example": "eth1",
     "doc": "Fabric (KV transfer) interface on every engine host. Discovery reads its global addresses; "
            "TCP transfers use it as UCX_NET_DEVICES."},
    {"name": "NARWHAL_ENGINE_PORT", "kind": "port", "default": 8000, "example": 8000,
     "doc": "HTTP port of every vLLM engine (per node: NARWHAL_NODE_<n>_ENGINE_PORT)."},
    {"name": "NARWHAL_ATTEST_PORT", "kind": "port", "default": 8010, "example": 8010,
     "doc": "Port of the attestation sidecar of every engine (per node: NARWHAL_NODE_<n>_ATTEST_PORT)."},
    {"name": "NARWHAL_BIND_FAMILY", "kind": "choice", "choices": ["ipv4", "ipv6"], "default": "ipv4",
     "example": "ipv4",
     "doc": "Address family the engines are reached and bound on; discovery considers only global "
            "addresses of this family."},
    {"name": "NARWHAL_FLEET", "kind": "path", "default": "config/fleet.json", "example": "config/fleet.json",
     "doc": "Fleet file written by discovery. Every later stage reads it from here, no --fleet argument: prepare "
            "checks it against the launch records; launch, router, probe, monitoring and benchmark read it through "
            "the narwhal.deploy.fleet lookup. To use another fleet, set this (in .env, or exported for one run). Keep "
            "site files at config/fleet.json or config/fleet.*.json."},
    {"name": "NARWHAL_LAUNCH_CONFIG", "kind": "path", "default": "config/engine-launch.local.json",
     "example": "config/engine-launch.local.json",
     "doc": "Private launch-record file written by discovery (mode 0600, git-ignored)."},
    {"name": "NARWHAL_IMAGE", "kind": "image", "required": True, "example": "vllm/vllm-openai:v0.33.0",
     "doc": "Engine image (reference or ID) on every engine host. Discovery pins its ID and package versions "
            "into the launch records. A reference follows Docker's grammar: [registry-host[:port]/]name (lowercase, "
            "at most 255 characters), an optional :tag (at most 128) and @sha256:<hex> digest."},
    {"name": "NARWHAL_MODEL_PATH", "kind": "abspath", "required": True, "example": "/srv/models/Llama-3.1-8B-Instruct",
     "doc": "Checkpoint directory (Hugging Face format) on every engine host, mounted read-only into the engine. "
            "A trailing '/' is dropped (the default served model name is the last component)."},
    {"name": "NARWHAL_MODEL_SOURCE", "kind": "path", "default": None, "example": None,
     "doc": "Controller directory holding the checkpoint (Hugging Face format). Set: the deliver stage (first in site) "
            "makes its manifest (sha256 of every file) once, in NARWHAL_CONFIG_DIR/model-manifest.json, and syncs it "
            "to NARWHAL_MODEL_PATH on every engine host that does not hold it verified: rsync into a directory beside "
            "(resumable), every file checked against the manifest, then moved into place. Unset: the checkpoint must "
            "already be on every engine host (docs/delivery.md)."},
    {"name": "NARWHAL_MODEL_VERIFY", "kind": "choice", "choices": ["fast", "full"], "default": "fast",
     "example": "fast",
     "doc": "How the deliver stage checks a checkpoint a host already holds against the manifest: fast (the size and "
            "mtime of every file against what the last full check recorded on the host), or full (the sha256 of every "
            "file again; for one run: NARWHAL_MODEL_VERIFY=full ansible-playbook narwhal.deploy.deliver)."},
    {"name": "NARWHAL_SERVED_MODEL_NAME", "kind": "model_name", "default": None, "example": "llama-3.1-8b",
     "doc": "Model name the engines serve; default: the last component of NARWHAL_MODEL_PATH. Letters, digits and "
            ". _ - + : @ /, starting with a letter or digit, no '.' or '..' component; the engines mount the "
            "checkpoint at /models/<name with / as _>."},
    {"name": "NARWHAL_MODEL_DTYPE", "kind": "choice", "choices": ["auto", "bfloat16", "float16"],
     "default": "auto", "example": "auto",
     "doc": "Model dtype (vLLM --dtype); auto takes the checkpoint's, which must then be bfloat16 or float16."},
    {"name": "NARWHAL_GPUS_PER_ENGINE", "kind": "count_or_all", "default": "all", "example": "all",
     "doc": "GPUs each engine gets on each of its hosts (the lowest free indices of the host), or all; per node "
            "NARWHAL_NODE_<n>_GPU_IDS picks explicit host indices. An engine's GPU count is TP x DP: with "
            "NARWHAL_TP_SIZE set, this times the engine's hosts must equal NARWHAL_TP_SIZE x its data-parallel "
            "size."},
    {"name": "NARWHAL_TP_SIZE", "kind": "int", "default": None, "example": None,
     "doc": "Tensor-parallel size; default: the number of GPUs of the engine divided by its data-parallel size. "
            "An engine's GPU count must equal TP x DP."},
    {"name": "NARWHAL_DATA_PARALLEL_SIZE", "kind": "int", "default": 1, "example": 1,
     "doc": "Data-parallel ranks of every engine (vllm serve --data-parallel-size): one engine container runs DP "
            "ranks of TP GPUs each behind one HTTP port, so it gets DP x TP GPUs, and NIXL listens on one "
            "side-channel port per rank (VLLM_NIXL_SIDE_CHANNEL_PORT + rank from vLLM 0.14). Per node: "
            "NARWHAL_NODE_<n>_DATA_PARALLEL_SIZE. 1 writes nothing."},
    {"name": "NARWHAL_ENABLE_EXPERT_PARALLEL", "kind": "bool", "default": False, "example": "false",
     "doc": "Expert parallelism for the MoE layers of every engine (vllm serve --enable-expert-parallel: experts "
            "sharded over the engine's DP x TP GPUs instead of tensor-parallel). Only for a MoE checkpoint (its "
            "config has n_routed_experts, num_local_experts, num_experts or moe_num_experts): a dense model is "
            "refused. true or false; per node: NARWHAL_NODE_<n>_ENABLE_EXPERT_PARALLEL."},
    {"name": "NARWHAL_DATA_PARALLEL_RPC_PORT", "kind": "port", "default": 29550, "example": 29550,
     "doc": "Port on the head host of an engine across hosts (NARWHAL_NODE_<n>_HOSTS > 1) where its headless "
            "workers' ranks meet the head (vllm serve --data-parallel-rpc-port; vLLM's own default 29550). Unused "
            "by an engine on one host."},
    {"name": "NARWHAL_TRANSPORT", "kind": "choice", "choices": ["ucx_tcp", "ucx_rdma"], "default": "ucx_tcp",
     "example": "ucx_tcp", "doc": "KV transfer transport of NixlConnector: UCX over TCP or over RDMA."},
    {"name": "NARWHAL_RDMA_DEVICES", "kind": "str", "default": "auto", "example": "auto",
     "doc": "ucx_rdma only: HCA:port list (mlx5_0:1,mlx5_1:1) or auto (for each of the engine's GPUs the "
            "nearest active port: behind the same PCIe switch, else on its NUMA node; every such rail is used); "
            "per node NARWHAL_NODE_<n>_RDMA_DEVICES."},
    {"name": "NARWHAL_KV_CACHE_DTYPE", "kind": "choice",
     "choices": ["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla"],
     "default": "auto", "example": "auto",
     "doc": "KV cache dtype (vLLM --kv-cache-dtype); fp8_ds_mla only for a model with MLA attention (DeepSeek-V2/V3, "
            "Kimi-K2), as vLLM offers it only to MLA attention backends."},
    {"name": "NARWHAL_BLOCK_SIZE", "kind": "int", "default": 16, "example": 16,
     "doc": "Requested KV block size in tokens (vLLM --block-size); the cache plan records the size vLLM will "
            "really use (hybrid models raise it)."},
    {"name": "NARWHAL_KV_LOAD_FAILURE_POLICY", "kind": "choice", "choices": ["fail", "recompute"], "default": "fail",
     "example": "fail",
     "doc": "What a decode engine does when loading transferred KV fails (vLLM >= 0.14 kv_load_failure_policy): "
            "fail the request with finish reason error, or recompute the prompt locally (slower, silent)."},
    {"name": "NARWHAL_KV_LEASE_SECONDS", "kind": "seconds", "min": 1, "max": 86400, "default": None,
     "example": None,
     "doc": "How long a prefill engine keeps the KV of a finished prefill for a decode engine that has not read it "
            "yet, in seconds, on every engine. The planner writes the name the image's vLLM reads: "
            "kv_connector_extra_config.kv_lease_duration of --kv-transfer-config from vLLM 0.22, the variable "
            "VLLM_NIXL_ABORT_REQUEST_TIMEOUT up to 0.21, and the image check confirms the image's vLLM reads that "
            "name. Unset: nothing is written and vLLM's default applies (30 s from 0.22, 480 s up to 0.21). Either "
            "name set by hand (NARWHAL_ENGINE_ENV, extra arguments) is refused. A decode that reads after the lease "
            "ran out still answers HTTP 200 (vLLM issue 25562): only the prefill's logs and counters show it."},
    {"name": "NARWHAL_SHUTDOWN_TIMEOUT", "kind": "seconds", "min": 0, "max": 3600, "default": None, "example": 30,
     "doc": "Seconds an engine gets on stop to finish its in-flight requests (vllm serve --shutdown-timeout, vLLM "
            ">= 0.18; 0 aborts them). Unset: 30 on vLLM >= 0.18 (a prefill's default KV lease from vLLM 0.22 is 30 s, "
            "so its drain covers the KV a decode still has to read), nothing on older images, for which a set value "
            "is refused. Stop and replace give the container this + 5 (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS) + 10 "
            "seconds after SIGTERM before it is killed. A prefill whose drain is shorter than its KV lease gets a "
            "warning at discovery."},
    {"name": "NARWHAL_LOG_DRIVER", "kind": "choice", "choices": ["json-file", "local"], "default": "json-file",
     "example": "json-file",
     "doc": "Docker log driver of every engine and router container (HostConfig.LogConfig.Type): json-file (the "
            "files log shippers read) or local (Docker's compressed format); both rotate by NARWHAL_LOG_MAX_SIZE and "
            "NARWHAL_LOG_MAX_FILE and both serve docker logs. Part of the container's plan: a change replaces the "
            "engines (without losing a request, docs/day-two.md) and the router."},
    {"name": "NARWHAL_LOG_MAX_SIZE", "kind": "log_size", "default": "100m", "example": "100m",
     "doc": "Size at which a container's log file is rotated (the log driver's max-size: a whole number and k, m or "
            "g). A container keeps at most NARWHAL_LOG_MAX_FILE such files, so its logs never exceed their product."},
    {"name": "NARWHAL_LOG_MAX_FILE", "kind": "int", "default": 5, "example": 5,
     "doc": "Log files a container keeps (the log driver's max-file), the current one included."},
    {"name": "NARWHAL_MAX_LOST_HOSTS", "kind": "count_or_percent", "default": "10%", "example": "10%",
     "doc": "How many hosts of a run (engine and router hosts) may not answer when it opens, and the run goes on "
            "without them: a count (0: every host must answer) or a percentage of the run's hosts, rounded up (10%: "
            "1 of 4, 3 of 30). A lost host's engines leave the routers and the run, are named in its closing table and "
            "in status, and the next run takes them back; discovery keeps their last record. More lost hosts, or a "
            "role left without an engine, stop the run before anything changes."},
    {"name": "NARWHAL_SIDE_CHANNEL_PORT", "kind": "port", "default": 5600, "example": 5600,
     "doc": "First NIXL side-channel port on each host (VLLM_NIXL_SIDE_CHANNEL_PORT); engines sharing a host "
            "get consecutive, non-overlapping ranges."},
    {"name": "NARWHAL_EXTRA_ARGS", "kind": "args", "default": "", "example": "--max-num-seqs 64",
     "doc": "Model-specific vLLM arguments recorded in every launch record (shell words); launcher-managed flags "
            "(port, host, TP, kv-transfer config, served name, API key ...) and their --no- forms are refused. Per "
            "engine: NARWHAL_NODE_<n>_EXTRA_ARGS, recorded after these."},
    {"name": "NARWHAL_ENGINE_ARGS", "kind": "args", "default": "", "example": "",
     "doc": "Additional vLLM arguments of every engine (shell words; the specification's name), recorded in every "
            "launch record's runtime.extra_args after NARWHAL_EXTRA_ARGS and before NARWHAL_NODE_<n>_EXTRA_ARGS; the "
            "derived --trust-remote-code is kept; launcher-managed flags are refused as in NARWHAL_EXTRA_ARGS. "
            "The role environment never carries it: it reaches the engine only through the record."},
    {"name": "NARWHAL_ENGINE_ENV", "kind": "env", "default": "", "example": "VLLM_LOGGING_LEVEL=INFO",
     "doc": "Extra environment of every engine container (space-separated KEY=VALUE shell words), recorded in every "
            "launch record's runtime.environment over the image's own; launcher-managed variables (GPU visibility, "
            "UCX_NET_DEVICES, UCX_TLS, VLLM_NIXL_SIDE_CHANNEL_*, VLLM_API_KEY ...) and secret-looking names "
            "(KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL) are refused. Per engine: NARWHAL_NODE_<n>_ENGINE_ENV, "
            "over these."},
    {"name": "NARWHAL_EXPECTED_PACKAGES", "kind": "dist_list", "default": "", "example": "torch",
     "doc": "Further image distributions whose exact versions the records pin (comma-separated), besides vllm "
            "and the NIXL distribution."},
    {"name": "NARWHAL_ENGINE_READY_TIMEOUT", "kind": "int", "default": 900, "example": 900,
     "doc": "Seconds launch waits for a started engine's /health before it fails (model load time: large "
            "checkpoints take minutes); a container that exits earlier fails at once with its last log lines."},
    {"name": "NARWHAL_ENGINE_CHECKOUT", "kind": "abspath", "default": "/opt/narwhal", "example": "/opt/narwhal",
     "doc": "Engine checkout on every engine host: install places the record and the role environment (config/), "
            "the API key (secrets/, which the engines mount read-only) and the launcher snapshot (bin/) there; the "
            "launcher keeps its runs under runs/."},
    {"name": "NARWHAL_API_KEY_FILE", "kind": "path", "default": "config/engine-api.key",
     "example": "config/engine-api.key",
     "doc": "Controller file holding the engines' API key (one line, mode 0600, git-ignored; during a rotation the "
            "previous key on a second line: docs/security.md, \"Rotating the key\"); install copies it to each engine "
            "host (secrets/, 0600), whose key guard reads it again when it changes (no restart), and the router stage "
            "to each router host. Never logged, never in a container's environment."},
    {"name": "NARWHAL_ENGINE_BIND", "kind": "bind", "default": "", "example": "",
     "doc": "Address every engine's HTTP server binds (vllm serve --host). Empty (the default): the address the fleet "
            "advertises for the engine (its fabric address, node.address of its launch record), so the engine "
            "answers on the fabric only. 0.0.0.0 or :: bind every interface of the engine host."},
    {"name": "NARWHAL_TLS", "kind": "choice", "choices": ["site", "operator", "off"], "default": "site",
     "example": "site",
     "doc": "TLS on every hop that carries prompts or the key (engines' HTTP, the router's ports and its connections "
            "to the engines, the probes, Prometheus scrapes). site: the collection makes a site CA and each host's "
            "certificate in NARWHAL_TLS_DIR; operator: the operator puts ca.crt and hosts/<host>.crt and .key there "
            "(checked: signed by ca.crt, valid, the host's addresses in its names); off: plain HTTP."},
    {"name": "NARWHAL_TLS_DIR", "kind": "path", "default": "config/tls", "example": "config/tls",
     "doc": "Controller directory of the TLS material: ca.crt, ca.key (site mode, 0600), hosts/<inventory host>.crt "
            "and hosts/<inventory host>.key (0600). Git-ignored under config/."},
    {"name": "NARWHAL_TLS_CERT_DAYS", "kind": "int", "default": 365, "example": 365,
     "doc": "Days a certificate the site CA issues is valid; it is issued again when fewer than 30 days are left, "
            "when the host's addresses change or when it is not signed by the site CA."},
    {"name": "NARWHAL_RUNS_DIR", "kind": "path", "default": "runs", "example": "runs",
     "doc": "Controller directory of prepared runs (runs/<run-id>/: manifest, role environments, records, launcher "
            "snapshot)."},
    {"name": "NARWHAL_REGISTRY_AUTH_FILE", "kind": "path", "default": None, "example": None,
     "doc": "Controller file with the registry credentials the deliver stage pulls images with: Docker's config.json "
            "format ({\"auths\": {\"registry.example:5000\": {\"auth\": \"<base64 user:password>\"}}}, what docker "
            "login writes), mode 0600. Sent to a host only for its pulls (0600, removed after); never in an argument, "
            "a log, docker inspect, a record or a run. Unset: pulls are anonymous."},
    {"name": "NARWHAL_REGISTRY_CA_FILE", "kind": "path", "default": None, "example": None,
     "doc": "Controller file with the PEM CA certificate of a registry whose TLS certificate a private CA signed; "
            "the deliver stage installs it as /etc/docker/certs.d/<registry>/ca.crt on the hosts that pull from it "
            "(Docker reads it at each pull, no restart)."},
    {"name": "NARWHAL_IMAGE_ARCHIVE_DIR", "kind": "path", "default": None, "example": None,
     "doc": "Controller directory of docker save archives (<name>.tar, optionally <name>.tar.sha256 as sha256sum "
            "writes it) for sites without a registry: an image a host lacks is copied from here (at most "
            "NARWHAL_DELIVER_PARALLEL hosts at a time), its sha256 checked on the host, and loaded; a host that holds "
            "the image gets nothing."},
    {"name": "NARWHAL_DELIVER_PARALLEL", "kind": "int", "default": 4, "example": 4,
     "doc": "How many hosts the deliver stage sends an archive or a checkpoint to, or pulls on, at a time (the "
            "controller's and the registry's links are shared by all of them)."},
    {"name": "NARWHAL_ROUTER_IMAGE", "kind": "image", "default": None, "example": "narwhal/vllm-router:0.1.17",
     "doc": "Image of vLLM's P/D router (reference or ID) on every host of the inventory group routers; the router "
            "stage runs only when that group exists. It needs python3 and the vllm-router distribution at the "
            "collection's pinned version (requirements/router.txt; docs/router.md builds one), already on the host: "
            "the router host needs no registry or internet."},
    {"name": "NARWHAL_ROUTER_PORT", "kind": "port", "default": 30000, "example": 30000,
     "doc": "Port the router serves clients on (OpenAI API: /v1/completions, /v1/chat/completions, /v1/models)."},
    {"name": "NARWHAL_ROUTER_METRICS_PORT", "kind": "port", "default": 29000, "example": 29000,
     "doc": "Port of the router's Prometheus /metrics (no key needed; bound like the router)."},
    {"name": "NARWHAL_ROUTER_BIND", "kind": "bind", "default": "", "example": "",
     "doc": "Address the router binds its two ports on. Empty (the default): the address clients reach the router "
            "host at (its router_address, an IP address). 0.0.0.0 or :: bind every interface (refused with "
            "NARWHAL_TLS on: the TLS front needs the router's loopback ports)."},
    {"name": "NARWHAL_ROUTER_POLICY", "kind": "choice",
     "choices": ["round_robin", "random", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                 "sticky_least_loaded"],
     "default": "round_robin", "example": "round_robin",
     "doc": "The router's policy for prefill and decode workers alike, unless NARWHAL_ROUTER_PREFILL_POLICY or "
            "NARWHAL_ROUTER_DECODE_POLICY sets a role's own (vllm_router/router_args.py lists them): round_robin "
            "spreads every request stream over all engines; cache_aware follows shared prefixes by the router's own "
            "tree of the prompts it sent; kv_aware (prefill only, with NARWHAL_KV_EVENTS) by the engines' own KV "
            "events (docs/router.md, \"Routing policies and KV events\"). Why round_robin is the default and when to "
            "choose cache_aware: docs/fleet-benchmark.md, \"The default prefill policy, from these figures\"."},
    {"name": "NARWHAL_ROUTER_PREFILL_POLICY", "kind": "choice",
     "choices": ["round_robin", "random", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                 "sticky_least_loaded"],
     "default": None, "example": None,
     "doc": "vllm-router --prefill-policy: how the router picks the prefill engine of a request. Unset: "
            "NARWHAL_ROUTER_POLICY. kv_aware needs the engines' KV events (NARWHAL_KV_EVENTS auto or on) and prefill "
            "engines of 16-token KV blocks (vllm-router 0.1.17 reads static event sources so: NARWHAL_BLOCK_SIZE=16; "
            "a CPU image takes only multiples of 32, so no CPU prefill engine serves kv_aware)."},
    {"name": "NARWHAL_ROUTER_DECODE_POLICY", "kind": "choice",
     "choices": ["round_robin", "random", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                 "sticky_least_loaded"],
     "default": None, "example": None,
     "doc": "vllm-router --decode-policy: how the router picks the decode engine of a request. Unset: "
            "NARWHAL_ROUTER_POLICY."},
    {"name": "NARWHAL_KV_EVENTS", "kind": "choice", "choices": ["auto", "on", "off"], "default": "auto",
     "example": "auto",
     "doc": "Whether every engine publishes its KV cache events (vllm serve --kv-events-config, ZMQ, bound on every "
            "IPv4 interface of its host at the port from NARWHAL_KV_EVENTS_PORT) for the router's kv_aware prefill "
            "policy: auto (on exactly when the prefill policy is kv_aware), on or off. A kv_aware prefill policy with "
            "off is refused, and so is on with NARWHAL_BIND_FAMILY=ipv6 (vLLM's publisher binds IPv4 only). The events "
            "carry prompt token IDs: firewall the port to the router hosts (docs/security.md)."},
    {"name": "NARWHAL_KV_EVENTS_PORT", "kind": "port", "default": 5557, "example": 5557,
     "doc": "First KV events port on each host (vLLM's own default 5557): an engine publishes data-parallel rank r "
            "on its port + r, and engines sharing a host get consecutive, non-overlapping ranges. The fleet file "
            "lists each engine's endpoints (kv_events), the router subscribes to them."},
    {"name": "NARWHAL_KV_HASH_SEED", "kind": "whole", "min": 0, "max": 4294967295, "default": 0, "example": 0,
     "doc": "PYTHONHASHSEED of every engine while KV events are on: vLLM seeds its block hashes with it, so the "
            "engines' events name one prompt prefix by one hash. An engine environment (NARWHAL_ENGINE_ENV, "
            "NARWHAL_NODE_<n>_ENGINE_ENV) with another PYTHONHASHSEED is refused, and so are engines that differ in "
            "--prefix-caching-hash-algo. 0 .. 4294967295 (what Python takes)."},
    {"name": "NARWHAL_ROUTER_READY_TIMEOUT", "kind": "int", "default": 300, "example": 300,
     "doc": "Seconds the router stage waits until the router reports every engine of the fleet as a healthy "
            "worker, then fails naming the ones it lacks (the router itself keeps waiting for them)."},
    {"name": "NARWHAL_ROUTER_DRAIN_TIMEOUT", "kind": "seconds", "min": 1, "max": 3600, "default": 120,
     "example": 120,
     "doc": "Seconds a router's previous worker set gets to finish the requests it holds when the router changes "
            "its workers or settings (a reload: the new vllm-router process takes every new connection at once, "
            "the previous one ends when its last request does, or after this) and when the router is stopped."},
    {"name": "NARWHAL_ROUTER_MAX_CONCURRENT", "kind": "whole", "min": 1, "max": 1000000, "default": None,
     "example": None,
     "doc": "Requests the router lets in at once (vllm-router --max-concurrent-requests, the size of its admission "
            "bucket; one token a request); beyond it a request is refused at once with 429 and Retry-After: 1 "
            "(docs/router.md, \"Flow control at the front door\"). Empty: 1024 per decode engine data-parallel "
            "rank, the most a vLLM engine batches by default; set it to what the decode engines run at once (the "
            "sum of their ranks x --max-num-seqs) to refuse instead of queueing in the engines. A streamed request "
            "counts only through its prefill (vllm-router 0.1.17 gives its token back when the stream starts)."},
    {"name": "NARWHAL_ROUTER_QUEUE_SIZE", "kind": "whole", "min": 0, "max": 100000, "default": 0, "example": 0,
     "doc": "vllm-router --queue-size: 0 (the default) refuses a request that finds the router full at once (429); "
            "more lets it wait up to NARWHAL_ROUTER_QUEUE_TIMEOUT seconds, and at most about 1 / "
            "NARWHAL_ROUTER_RATE_LIMIT seconds, for a finishing request's token, then answers 408 (vllm-router "
            "0.1.17 does not bound how many wait)."},
    {"name": "NARWHAL_ROUTER_QUEUE_TIMEOUT", "kind": "seconds", "min": 1, "max": 3600, "default": 1, "example": 1,
     "doc": "vllm-router --queue-timeout-secs: the longest a queued request waits for its turn before 408 (only "
            "with NARWHAL_ROUTER_QUEUE_SIZE above 0)."},
    {"name": "NARWHAL_ROUTER_RATE_LIMIT", "kind": "whole", "min": 1, "max": 1000000, "default": 1, "example": 1,
     "doc": "vllm-router --rate-limit-tokens-per-second: requests per second the admission bucket gains besides "
            "the one each finished request gives back, so under overload the requests in flight exceed "
            "NARWHAL_ROUTER_MAX_CONCURRENT by this many each second. 1 (the default) is the least: vllm-router 0.1.17 "
            "refills 1 per second with 0 or without the option too."},
    {"name": "NARWHAL_ROUTER_DIR", "kind": "abspath", "default": "/opt/narwhal-router",
     "example": "/opt/narwhal-router",
     "doc": "Directory on every router host for the router's start script, its configuration and the API key "
            "(mode 0600), mounted read-only into the router container."},
    {"name": "NARWHAL_BENCH_INPUT_LEN", "kind": "int", "default": 512, "example": 512,
     "doc": "Prompt length in tokens of every benchmark request (vllm bench serve --random-input-len; random "
            "tokens, fixed length). With NARWHAL_BENCH_OUTPUT_LEN it must fit the engines' --max-model-len."},
    {"name": "NARWHAL_BENCH_OUTPUT_LEN", "kind": "int", "default": 128, "example": 128,
     "doc": "Generated tokens of every benchmark request (--random-output-len, with --ignore-eos: exactly this "
            "many)."},
    {"name": "NARWHAL_BENCH_WORKLOAD", "kind": "choice", "choices": ["random", "prefix"], "default": "random",
     "example": "random",
     "doc": "The benchmark's requests: random (NARWHAL_BENCH_INPUT_LEN random tokens each, nothing shared) or "
            "prefix (vllm bench serve --dataset-name prefix_repetition: NARWHAL_BENCH_PREFIXES random prefixes of "
            "NARWHAL_BENCH_PREFIX_LEN tokens, each shared by NARWHAL_BENCH_PROMPTS / NARWHAL_BENCH_PREFIXES "
            "requests that add NARWHAL_BENCH_SUFFIX_LEN tokens of their own: system prompts, multi-turn history)."},
    {"name": "NARWHAL_BENCH_PREFIX_LEN", "kind": "int", "default": 512, "example": 512,
     "doc": "Tokens of each shared prefix of the prefix workload (--prefix-repetition-prefix-len)."},
    {"name": "NARWHAL_BENCH_SUFFIX_LEN", "kind": "int", "default": 64, "example": 64,
     "doc": "Tokens each request of the prefix workload adds after its prefix (--prefix-repetition-suffix-len). "
            "Prefix, suffix and NARWHAL_BENCH_OUTPUT_LEN together must fit every engine's --max-model-len."},
    {"name": "NARWHAL_BENCH_PREFIXES", "kind": "int", "default": 8, "example": 8,
     "doc": "Distinct prefixes of each step of the prefix workload (--prefix-repetition-num-prefixes); "
            "NARWHAL_BENCH_PROMPTS must be a multiple of it (each prefix is shared by as many requests)."},
    {"name": "NARWHAL_BENCH_PROMPTS", "kind": "int", "default": 64, "example": 64,
     "doc": "Requests of each benchmark step (--num-prompts): one step per request rate and target."},
    {"name": "NARWHAL_BENCH_RATES", "kind": "rate_list", "default": "1,2,4", "example": "1,2,4",
     "doc": "The request rates of the sweep in requests/s, comma-separated (--request-rate: Poisson arrivals; "
            "inf sends every request at once)."},
    {"name": "NARWHAL_BENCH_CONCURRENCY", "kind": "int", "default": 8, "example": 8,
     "doc": "The --max-concurrency of the benchmark's closed-loop step (every request sent at once, at most this "
            "many in flight)."},
    # kind choice_list: names of "choices", comma-separated, none twice (a list in the given order)
    {"name": "NARWHAL_BENCH_POLICIES", "kind": "choice_list",
     "choices": ["round_robin", "random", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                 "sticky_least_loaded"],
     "default": None, "example": "round_robin,cache_aware,kv_aware",
     "doc": "Router prefill policies to compare side by side in one benchmark run, comma-separated: for each, a "
            "router of its own in P/D mode over the whole fleet (target pd-<policy>, on NARWHAL_BENCH_ROUTER_PORT "
            "+ its index) while the benchmark runs. kv_aware needs engines that publish KV events "
            "(NARWHAL_KV_EVENTS). Unset: the fleet's router, one decode engine alone and that engine behind a "
            "second router (docs/fleet-benchmark.md)."},
    {"name": "NARWHAL_BENCH_SLO_TTFT_MS", "kind": "number", "default": None, "example": None,
     "doc": "Service-level objective for time to first token in ms: a request meeting every set SLO counts "
            "toward goodput (vllm bench serve --goodput ttft:<ms>). Unset: not part of goodput."},
    {"name": "NARWHAL_BENCH_SLO_TPOT_MS", "kind": "number", "default": None, "example": None,
     "doc": "Service-level objective for time per output token in ms (--goodput tpot:<ms>)."},
    {"name": "NARWHAL_BENCH_SLO_E2EL_MS", "kind": "number", "default": None, "example": None,
     "doc": "Service-level objective for end-to-end latency in ms (--goodput e2el:<ms>)."},
    {"name": "NARWHAL_BENCH_IMAGE", "kind": "image", "default": None, "example": None,
     "doc": "Image whose `vllm bench serve` generates the load, on the benchmark host (the first host of the "
            "inventory group benchmark, else of decode). Unset: that host's engine image from its launch record; "
            "vLLM's images carry the load generator, so nothing new is installed."},
    {"name": "NARWHAL_BENCH_ROUTER_PORT", "kind": "port", "default": 30001, "example": 30001,
     "doc": "Port of the benchmark's second router on the first router host: vLLM's router in its regular mode "
            "over one decode engine, for the router's own overhead against that engine asked directly. It runs "
            "only while the benchmark does."},
    {"name": "NARWHAL_BENCH_ROUTER_METRICS_PORT", "kind": "port", "default": 29001, "example": 29001,
     "doc": "Prometheus port of the benchmark's second router (bound to loopback)."},
    {"name": "NARWHAL_BENCH_TIMEOUT", "kind": "int", "default": 1800, "example": 1800,
     "doc": "Seconds one benchmark step may run before it is stopped and the benchmark fails naming the step."},
    {"name": "NARWHAL_ALERT_FOR", "kind": "duration", "default": "2m", "example": "2m",
     "doc": "How long a condition must hold before its alert fires (the `for` of every rule in "
            "config/prometheus/narwhal-rules.yml, which the monitoring stage writes from the fleet; "
            "docs/monitoring.md, Alert rules): a Prometheus duration above zero (30s, 2m, 1h30m). An alert fires "
            "within this plus one scrape and one evaluation interval of its cause."},
    {"name": "NARWHAL_ALERT_TTFT_P99_MS", "kind": "number", "default": 2000, "example": 2000,
     "doc": "The time-to-first-token objective in ms: the alert NarwhalTtftP99OverObjective fires when an engine "
            "role's p99 time to first token over the last 5 minutes (vllm:time_to_first_token_seconds) stays above "
            "it for NARWHAL_ALERT_FOR."},
    {"name": "NARWHAL_ALERT_KV_USAGE", "kind": "fraction", "default": 0.95, "example": 0.95,
     "doc": "KV cache usage (vllm:kv_cache_usage_perc, 1 is full) above which an engine's KV cache counts as "
            "nearly full: the alert NarwhalKvCacheNearlyFull fires when it stays above it for NARWHAL_ALERT_FOR."},
    {"name": "NARWHAL_CONFIG_DIR", "kind": "path", "default": "config", "example": "config",
     "doc": "Directory of the generated deployment.env and the launch-record extracts. Relative paths "
            "in this file are relative to the project directory (the one that holds .env)."},
]

NODE_INPUTS = [
    {"name": "ROLE", "kind": "role", "required": True, "example": ["prefill", "decode"],
     "doc": "Fleet role of engine-<n>: prefill or decode. Every engine-<n> in the inventory needs one."},
    {"name": "IP", "kind": "ip", "example": None,
     "doc": "Explicit fabric address of node <n>; required when its interface has several global addresses "
            "of the bind family. Must be on the interface and of NARWHAL_BIND_FAMILY."},
    {"name": "URL", "kind": "url", "example": None,
     "doc": "Full engine URL when the engine must be reached at another address (scheme, host, port; no path, "
            "query, fragment or user information); its port must equal the node's engine port."},
    {"name": "ATTESTATION_URL", "kind": "url_path", "example": None,
     "doc": "Full attestation URL override (a path is allowed; no query, fragment or user information); its "
            "port must equal the node's attestation port."},
    {"name": "ENGINE_PORT", "kind": "port", "example": None, "doc": "Engine HTTP port of node <n>."},
    {"name": "ATTEST_PORT", "kind": "port", "example": None, "doc": "Attestation port of node <n>."},
    {"name": "IMAGE", "kind": "image", "example": None,
     "doc": "Engine image of engine-<n> when it differs from NARWHAL_IMAGE (e.g. a ROCm image on an AMD host)."},
    {"name": "GPU_IDS", "kind": "int_list", "example": None,
     "doc": "Explicit host GPU indices of engine-<n> (comma-separated, distinct), instead of "
            "NARWHAL_GPUS_PER_ENGINE; with NARWHAL_TP_SIZE set, as many as TP x the engine's data-parallel size "
            "(on each of its NARWHAL_NODE_<n>_HOSTS hosts: that divided by the hosts)."},
    {"name": "DATA_PARALLEL_SIZE", "kind": "int", "example": None,
     "doc": "Data-parallel ranks of engine-<n>, instead of NARWHAL_DATA_PARALLEL_SIZE."},
    {"name": "HOSTS", "kind": "int", "example": None,
     "doc": "Inventory hosts engine-<n> spans (default 1): its data-parallel ranks are spread equally over them "
            "(vllm serve --data-parallel-size-local = the DP size / HOSTS; the head, narwhal_rank 0, serves the "
            "HTTP API, the others run --headless). Each host of the engine is an inventory host of group engines "
            "with narwhal_node: <n> and narwhal_rank: 0 .. HOSTS-1, and gets NARWHAL_GPUS_PER_ENGINE (or "
            "NARWHAL_NODE_<n>_GPU_IDS) GPUs: TP x DP = HOSTS x those GPUs."},
    {"name": "ENABLE_EXPERT_PARALLEL", "kind": "bool", "example": None,
     "doc": "Expert parallelism of engine-<n> (true or false), instead of NARWHAL_ENABLE_EXPERT_PARALLEL."},
    {"name": "RDMA_DEVICES", "kind": "str", "example": None,
     "doc": "HCA:port list of engine-<n> for ucx_rdma, instead of NARWHAL_RDMA_DEVICES."},
    {"name": "FABRIC_INTERFACE", "kind": "interface", "example": None,
     "doc": "Fabric interface of node <n> when it differs from NARWHAL_FABRIC_INTERFACE."},
    {"name": "EXTRA_ARGS", "kind": "args", "example": None,
     "doc": "vLLM arguments of engine-<n> only (shell words, e.g. a prefill engine's --max-num-batched-tokens), "
            "recorded in its runtime.extra_args after the derived flags, NARWHAL_EXTRA_ARGS and NARWHAL_ENGINE_ARGS: "
            "a flag given in both takes the node's value (vLLM's parser keeps the last). Launcher-managed flags are "
            "refused as in NARWHAL_EXTRA_ARGS."},
    {"name": "ENGINE_ENV", "kind": "env", "example": None,
     "doc": "Container environment of engine-<n> only (KEY=VALUE shell words), recorded in its "
            "runtime.environment over the image's and NARWHAL_ENGINE_ENV (the node's value wins). Launcher-managed "
            "and secret-looking names are refused as in NARWHAL_ENGINE_ENV."},
]


# Variables of the project's own scripts (Makefile, scripts/, the harness) that share the NARWHAL_ prefix and live
# in the controller environment: not site inputs, never read from .env.
TOOL_VARIABLES = ("NARWHAL_ENV_FILE", "NARWHAL_VENV", "NARWHAL_IMAGES", "NARWHAL_TORCH_WHEELS",
                  "NARWHAL_DEBIAN_MIRROR", "NARWHAL_SIM_PROFILE")
