# narwhal.deploy — every target bootstraps what it needs first (skipped when already done).
SHELL := /bin/bash
VENV ?= .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: bootstrap demo demo-down real test lint unit sanity molecule bench bench-down overload day-two day-two-down delivery delivery-down docs clean-sim

bootstrap:            ## venv, collections, Docker engine, harness images
	scripts/bootstrap.sh

demo: bootstrap       ## the pipeline on the built-in simulated two-host site
	scripts/demo.sh

demo-down:            ## remove the demo site
	scripts/demo.sh down

real: export NARWHAL_IMAGES = sim real
real: bootstrap       ## the pipeline against the real CPU vLLM engine (molecule scenario real, ~15 min)
	MOLECULE_SCENARIOS=real scripts/test.sh molecule

test: export NARWHAL_IMAGES = sim real
test: bootstrap       ## every gate: lint, unit tests, sanity, molecule scenarios
	scripts/test.sh

lint:
	scripts/test.sh lint

unit:
	scripts/test.sh unit

sanity:
	scripts/test.sh sanity

molecule:
	scripts/test.sh molecule

bench: bootstrap      ## discovery/launch cost vs N on simulated hosts -> bench/results/<stamp>/ (docs/benchmarks.md)
	bench/bench.py $(BENCH_ARGS)

bench-down:           ## remove the benchmark's simulated site (after an interrupted run or --keep)
	bench/bench.py --down

overload:             ## the router at twice the saturation of 2P2D stand-in engines (processes): refusals and latency, vllm-router's defaults vs the plan's -> bench/results/router-overload-<stamp>/ (docs/router.md)
	scripts/bootstrap.sh --no-harness
	$(VENV)/bin/python bench/router_overload.py $(OVERLOAD_ARGS)

day-two: bootstrap    ## day-two operations under client traffic on a 2P2D simulated site -> runs/day-two-<stamp>/ (docs/day-two.md)
	bench/day_two.py $(DAY_TWO_ARGS)

day-two-down:         ## remove the day-two benchmark's simulated site (after an interrupted run or --keep)
	bench/day_two.py --down

delivery: bootstrap   ## deliver-stage figures: a checkpoint to 1/4/16 and an image pull on 1/16 bare simulated hosts vs the link (docs/delivery.md)
	bench/delivery.py $(DELIVERY_ARGS)

delivery-down:        ## remove the delivery benchmark's simulated site and stop its registry (after an interrupted run or --keep)
	bench/delivery.py --down

.PHONY: prefix-bench prefix-bench-down
prefix-bench: bootstrap  ## the prefix workload against each router prefill policy on a 2P2D simulated site -> bench/results/prefix-routing-<stamp>/ (docs/fleet-benchmark.md)
	bench/prefix_routing.py $(PREFIX_BENCH_ARGS)

prefix-bench-down:    ## remove the prefix-routing benchmark's simulated site (after an interrupted run or --keep)
	bench/prefix_routing.py --down

docs:                 ## regenerate .env.example, docs/inputs.md, the example launch config, the shapes and the roles' option tables
	$(VENV)/bin/python scripts/gen-inputs.py
	$(VENV)/bin/python scripts/gen-example-record.py
	$(VENV)/bin/python scripts/gen-shapes.py
	$(VENV)/bin/python scripts/gen-role-docs.py
