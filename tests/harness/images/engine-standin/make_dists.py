"""Write the stand-in's distribution metadata and version-dependent module layout.

Real vLLM moved its NIXL connector from ``...kv_connector.v1.nixl_connector`` (<= 0.19) to the package
``...kv_connector.v1.nixl`` (from 0.20); NIXL's meta package ``nixl`` loads ``nixl_cu12``. The stand-in lays
its modules out the way the chosen vLLM version does, so the image check imports the real paths.
"""
import os
import sys

SITE = "/usr/local/lib/python3.11/dist-packages"
vllm_version, nixl_version = sys.argv[1], sys.argv[2]
platform = sys.argv[3] if len(sys.argv) > 3 else "cuda"


def dist(name, version, top_level):
    path = os.path.join(SITE, f"{name.replace('-', '_')}-{version}.dist-info")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "METADATA"), "w", encoding="utf-8") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                 "Summary: narwhal.deploy stand-in distribution metadata\n")
    with open(os.path.join(path, "INSTALLER"), "w", encoding="utf-8") as fh:
        fh.write("pip\n")
    with open(os.path.join(path, "top_level.txt"), "w", encoding="utf-8") as fh:
        fh.write(top_level + "\n")


def release(version):
    return tuple(int(p) for p in version.split("+")[0].split(".")[:3])


dist("vllm", vllm_version, "vllm")
if platform == "rocm":
    # ROCm images build NIXL from source as the distribution nixl-rocm (module nixl_rocm): there is no nixl-rocm
    # on PyPI (docs/vllm-requirements.md, "Connector and NIXL modules").
    dist("nixl-rocm", nixl_version, "nixl_rocm")
    os.makedirs(os.path.join(SITE, "nixl_rocm"), exist_ok=True)
    with open(os.path.join(SITE, "nixl_rocm", "__init__.py"), "w", encoding="utf-8") as fh:
        fh.write('"""STAND-IN for nixl_rocm (narwhal.deploy test harness)."""\n')
    with open(os.path.join(SITE, "nixl_rocm", "_api.py"), "w", encoding="utf-8") as fh:
        fh.write("class nixl_agent:  # noqa: N801\n"
                 "    def __init__(self, name, config=None):\n        self.name = name\n")
    with open(os.path.join(SITE, "vllm", "standin", "nixl_module.py"), "w", encoding="utf-8") as fh:
        fh.write("NIXL_API = 'nixl_rocm._api'\n")
else:
    dist("nixl", nixl_version, "nixl")
    dist("nixl-cu12", nixl_version, "nixl_cu12")
    with open(os.path.join(SITE, "vllm", "standin", "nixl_module.py"), "w", encoding="utf-8") as fh:
        fh.write("NIXL_API = 'nixl._api'\n")
with open(os.path.join(SITE, "vllm", "version.py"), "w", encoding="utf-8") as fh:
    fh.write(f'__version__ = "{vllm_version.split("+")[0]}"\n__version_tuple__ = {release(vllm_version)!r}\n')

v1 = os.path.join(SITE, "vllm", "distributed", "kv_transfer", "kv_connector", "v1")
os.makedirs(v1, exist_ok=True)
for d in ("distributed", "distributed/kv_transfer", "distributed/kv_transfer/kv_connector",
          "distributed/kv_transfer/kv_connector/v1"):
    open(os.path.join(SITE, "vllm", d, "__init__.py"), "a").close()
connector = "from vllm.standin.nixl_connector import NixlConnector  # noqa: F401\n"
if release(vllm_version) >= (0, 22, 0):
    # vLLM >= 0.22 reads the KV lease from the connector's extra config, in its own source (0.22.0
    # nixl/scheduler.py:72-76 get_from_extra_config("kv_lease_duration", 30); 0.32.0 nixl/base_scheduler.py:82-88);
    # the launcher's image check looks for that name there (in_image.py::kv_lease_read)
    connector += ("from vllm.standin.nixl_connector import lease_seconds\n\n\n"
                  "def kv_lease_duration(kv_transfer_config):\n"
                  "    return lease_seconds(kv_transfer_config, \"kv_lease_duration\", 30)\n")
if release(vllm_version) >= (0, 20, 0):  # the package from 0.20.0 (released wheels; 0.19.1 has nixl_connector.py)
    os.makedirs(os.path.join(v1, "nixl"), exist_ok=True)
    with open(os.path.join(v1, "nixl", "__init__.py"), "w", encoding="utf-8") as fh:
        fh.write(connector)
else:
    with open(os.path.join(v1, "nixl_connector.py"), "w", encoding="utf-8") as fh:
        fh.write(connector)
