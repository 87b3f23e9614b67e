"""TEST-IMAGE-ONLY tuning of NIXL for 2-core CPU machines (narwhal.deploy real-engine scenario).

NIXL's Python API creates every agent with the UCX progress thread's delay ``pthrDelay = 0``: the thread
busy-polls a whole core, and vLLM keeps it on. With two engines on a 2-core machine each starves the other
(decode 23-32 s, once a producer's KV lease expired mid-transfer); switching the thread off hangs the
transfer. A delay of 1000 us makes an idle engine cost 2-5 % of a core and a transfer 10-25 ms (measured on
the 2-core proving-ground machines; docs/real-engine.md, "The image"). This module wraps the binding's
``nixlAgent`` constructor that ``nixl_cu12._api`` / ``nixl_cu13._api`` call, so the agent is created with that
delay. GPU images are untouched: this file exists only in tests/harness/images/vllm-cpu.
NARWHAL_TEST_NIXL_PTHR_DELAY_US overrides the value.

Loaded at interpreter start by narwhal_nixl_tuning.pth in the environment's site-packages (not as
sitecustomize: Debian's python3 ships /usr/lib/python3.11/sitecustomize.py, which would shadow it).
"""
import importlib.abc
import importlib.util
import os
import sys

_DELAY_US = int(os.environ.get("NARWHAL_TEST_NIXL_PTHR_DELAY_US", "1000"))
_TARGETS = ("nixl_cu12._api", "nixl_cu13._api")


class _Bindings:
    """The NIXL binding module with a nixlAgent constructor that sets the progress thread's delay."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def nixlAgent(self, name, config):  # noqa: N802 - the binding's own name
        if getattr(config, "useProgThread", False) and not getattr(config, "pthrDelay", 0):
            config.pthrDelay = _DELAY_US
        return self._real.nixlAgent(name, config)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.nixlBind = _Bindings(module.nixlBind)

        spec.loader.exec_module = exec_module
        return spec


if _DELAY_US > 0:
    sys.meta_path.insert(0, _Finder())
