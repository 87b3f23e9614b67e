"""Stand-in of vllm.entrypoints.cli (narwhal.deploy test harness): main.main is the `vllm` command."""
