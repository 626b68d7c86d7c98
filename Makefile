# modelswap — developer entry points. `make help` lists them.
# Every target that runs our code depends on `setup`, so a fresh clone needs nothing else.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST := $(BIN)/python -m pytest
PACKAGES := api/modelswap_api operator/modelswap_operator sidecar/modelswap_sidecar client/modelswap_client

.DEFAULT_GOAL := help
.PHONY: help setup test test-fast lint format clean demo

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  %-12s %s\n", $$1, $$2}'

setup: $(STAMP) ## create .venv (and .venv-triton, kubectl, helm) with everything the tests need; quick when nothing changed
	@# The stamp cannot see tools installed outside .venv being removed: check them too.
	@test -x .venv-triton/bin/tritonserver -a -x $(BIN)/kubectl -a -x $(BIN)/helm || \
		{ rm -f $(STAMP); $(MAKE) --no-print-directory $(STAMP); }
	@# An editable install made from another checkout (a git worktree) imports that one's code.
	@$(BIN)/python -c 'import sys, modelswap_sidecar as m; sys.exit(not m.__file__.startswith("$(CURDIR)/"))' 2>/dev/null || \
		{ rm -f $(STAMP); $(MAKE) --no-print-directory $(STAMP); }

$(STAMP): pyproject.toml constraints.txt constraints-triton.txt tools/setup.sh tools/install_kube_tools.py tools/install_triton.py
	bash tools/setup.sh "$(PYTHON)" "$(VENV)"
	@touch $@

.PHONY: constraints
constraints: ## re-resolve every dependency (torch aside) to its newest release into constraints.txt and constraints-triton.txt (then run the tests, and commit both)
	bash tools/update_constraints.sh "$(PYTHON)"

demo: setup ## local mode with the example models: swaps, a cold burst, checked answers (< 3 min)
	$(BIN)/python tools/demo.py

test: setup ## run every test this machine can run, slow ones included
	$(PYTEST) --durations=15 tests

test-fast: setup ## run the tests, skipping the slow ones
	$(PYTEST) -m "not slow" tests

lint: setup ## ruff, mypy --strict, import contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(PACKAGES)
	$(BIN)/lint-imports

format: setup ## apply ruff's formatting and safe fixes
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

.PHONY: bench-swap
# the paced run's emulated link (GB/s): below this machine's ~7-17 GB/s copy ceiling
BENCH_PACE_GBPS ?= 2
bench-swap: setup ## swap-in/out vs the same-run copy ceiling (sim), a run paced to BENCH_PACE_GBPS=2 (scaled), and bench.compare (vs Triton unload+load); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.swap
	$(BIN)/python -m bench.swap --pace-gbps $(BENCH_PACE_GBPS)
	$(BIN)/python -m bench.compare
	$(BIN)/python -m bench.render

.PHONY: bench-planner
bench-planner: setup ## the operator's planner: 2,000 models over 100 nodes, cold/warm/node loss; writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.planner
	$(BIN)/python -m bench.render

.PHONY: sync-crds
sync-crds: setup ## copy crds/ into the Helm chart as templates (charts/modelswap/templates/crd-*.yaml)
	$(BIN)/python tools/sync_crds.py

.PHONY: bench-sim
bench-sim: setup ## modelswap simulate on bench/scenarios/ref-h100.yaml: fewest GPUs per policy for p99 added <= 1 s (a few minutes); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.sim
	$(BIN)/python -m bench.render

.PHONY: bench-grid
bench-grid: setup ## the simulator's sensitivity grid: zipf alpha x link x rate around ref-h100 (two processes, ~30 min); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.sim --grid
	$(BIN)/python -m bench.render

.PHONY: bench-compare bench-gateway bench-operator bench
bench-compare: setup ## (also part of bench-swap) swap-in to first correct answer vs Triton unload+load vs one-at-a-time restore (embed, tinyllama, mlp, tinylm, a generated 1 GiB model), and the real models' restore after a kill vs a fresh load (7-10 min on 2 cores); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.compare
	$(BIN)/python -m bench.render

bench-gateway: setup ## gateway vs straight to Triton: added p50/p99 at half saturation, 100-concurrent throughput, swap-in control overhead (~3 min); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.gateway
	$(BIN)/python -m bench.render

bench-operator: setup ## the real operator, 2,000 ModelDeployments over 100 fake agents on the API emulator (~5 min); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.operator_scale
	$(BIN)/python -m bench.render

.PHONY: bench-kv
bench-kv: setup ## a Llama's KV in the tiered pool: HBM KV bytes vs sequence length with/without offloadAfterTokens, continuing a 2,000-token conversation after a preserve/discard swap vs none (~3 min; BENCH_KV_ARGS="--backend cuda-vmm" on a GPU); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.kv $(BENCH_KV_ARGS)
	$(BIN)/python -m bench.render

.PHONY: bench-shaping
bench-shaping: setup ## batch shaping by prompt length: tinyllama batched, padded tokens per useful token and throughput with spec.gateway.batchShaping off and on side by side (~3 min); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.shaping $(BENCH_SHAPING_ARGS)
	$(BIN)/python -m bench.render

.PHONY: bench-operator-profile
bench-operator-profile: setup ## the same run with the operator and the emulator under cProfile: where the time to Ready goes (~10 min; not in make bench)
	$(BIN)/python -m bench.operator_scale --profile
	$(BIN)/python -m bench.render

.PHONY: bench-twin
bench-twin: setup ## the twin check: a seeded scenario run for real in local mode (paced sim GPU) and replayed through the simulator, swap counts and swap-in latency compared (~4 min); writes bench/results, docs/BENCHMARKS.md
	$(BIN)/python -m bench.twin
	$(BIN)/python -m bench.render

# every bench but the simulator's 30-minute grid (make bench-grid), under 30 minutes here
bench: bench-swap bench-gateway bench-operator bench-planner bench-sim bench-twin bench-kv ## run every bench (not bench-grid) and render docs/BENCHMARKS.md

.PHONY: reliability
RELIABILITY_TESTS = $(wildcard tests/*/test_reliability_*.py)
reliability: setup ## the reliability suite (faults, load, inputs, access) with its figures recorded; writes bench/results/<machine>/reliability, docs/RELIABILITY.md
	$(BIN)/python -m bench.render_reliability start
	MODELSWAP_RELIABILITY_OUT=$$($(BIN)/python -m bench.render_reliability folder) \
		$(PYTEST) --durations=10 --continue-on-collection-errors $(RELIABILITY_TESTS); status=$$?; \
		$(BIN)/python -m bench.render_reliability finish $$status; \
		$(BIN)/python -m bench.render_reliability render; exit $$status
