"""STAND-IN for nixl_cu12 (narwhal.deploy test harness)."""
