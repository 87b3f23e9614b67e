"""STAND-IN for NIXL's meta package (narwhal.deploy test harness)."""
