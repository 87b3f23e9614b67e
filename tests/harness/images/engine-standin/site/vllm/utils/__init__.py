"""Stand-in of vllm.utils (narwhal.deploy test harness): only the argparse_utils submodule is modelled."""
