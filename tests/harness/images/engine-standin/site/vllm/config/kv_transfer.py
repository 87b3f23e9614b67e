"""Stand-in of vllm.config.kv_transfer.KVTransferConfig, replaying the real validation rules by version
(docs/vllm-requirements.md, "The kv-transfer config"): unknown keys rejected from 0.19.1 (pydantic extra="forbid"),
ignored before; kv_load_failure_policy absent <= 0.11; a connector needs kv_role."""
from vllm.version import __version_tuple__ as _v

_FIELDS = {"kv_connector", "engine_id", "kv_buffer_device", "kv_role", "kv_port",
           "kv_connector_extra_config", "kv_connector_module_path", "enable_permute_local_kv"}
if _v >= (0, 14, 0):
    _FIELDS.add("kv_load_failure_policy")
if _v < (0, 19, 1):
    _FIELDS |= {"kv_ip", "kv_rank", "kv_parallel_size", "kv_buffer_size"}
_ROLES = ("kv_producer", "kv_consumer", "kv_both")


class ValidationError(ValueError):
    pass


class KVTransferConfig:
    def __init__(self, **kwargs):
        unknown = sorted(set(kwargs) - _FIELDS)
        if unknown and _v >= (0, 19, 1):
            raise ValidationError(
                f"1 validation error for KVTransferConfig\n{unknown[0]}\n"
                "  Extra inputs are not permitted [type=extra_forbidden]")
        self.kv_connector = kwargs.get("kv_connector")
        self.engine_id = kwargs.get("engine_id")
        self.kv_buffer_device = kwargs.get("kv_buffer_device", "cuda")
        self.kv_role = kwargs.get("kv_role")
        self.kv_port = kwargs.get("kv_port", 14579)
        self.kv_connector_extra_config = kwargs.get("kv_connector_extra_config", {})
        self.kv_load_failure_policy = kwargs.get("kv_load_failure_policy",
                                                 "fail" if _v >= (0, 19, 1) else "recompute")
        if self.kv_connector is not None and self.kv_role is None:
            raise ValueError("Please specify kv_role when kv_connector "
                             f"is set, supported roles are {list(_ROLES)}")
        if self.kv_role is not None and self.kv_role not in _ROLES:
            raise ValueError(f"Unsupported kv_role: {self.kv_role}. Supported roles are {list(_ROLES)}")
        if self.kv_load_failure_policy not in ("fail", "recompute"):
            raise ValueError(f"Unsupported kv_load_failure_policy: {self.kv_load_failure_policy}")
        if self.kv_buffer_device not in ("cuda", "cpu", "xpu"):
            raise ValueError(f"Unsupported kv_buffer_device: {self.kv_buffer_device}")
