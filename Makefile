# elastream developer entry points. `make help` lists them.
SHELL := /bin/bash
VENV  ?= .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
STAMP := .stamps

.PHONY: help setup system-deps test test-unit test-e2e soak lint bench bench-paper bench-autoscale demo images release clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

system-deps: ## install system packages (redis-server, Java) when missing; needs root or sudo
	@bash scripts/system-deps.sh

$(STAMP)/venv: operator/pyproject.toml
	@mkdir -p $(STAMP)
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e 'operator[dev]'
	@touch $@

setup: system-deps $(STAMP)/venv ## install everything: system packages, virtualenv, elastream in editable mode

test: setup ## run every test tier: unit, integration (real Redis, local Spark), e2e (a real Kubernetes API server) beside them
	bash scripts/test-lanes.sh

test-unit: setup ## unit tests only (no services)
	$(VENV)/bin/pytest tests/unit

lint: setup ## ruff, mypy (strict on core, sim, control, handlers) and import-linter contracts
	$(VENV)/bin/ruff check operator/src tests bench
	$(VENV)/bin/ruff format --check operator/src tests bench
	cd operator && ../$(VENV)/bin/mypy
	cd operator && ../$(VENV)/bin/lint-imports

bench: setup ## run the benchmarks; tables and plots land in docs/benchmarks/
	$(PY) bench/planners.py
	$(PY) bench/runtime.py
	$(PY) bench/analysis.py
	$(PY) bench/migration.py
	$(PY) bench/autoscale.py
	$(PY) bench/operator_scale.py
	$(PY) bench/kafka.py

bench-paper: setup ## the Stela paper's experiments on worker processes (~27 min): docs/benchmarks/stela.md and plots
	$(PY) bench/stela.py

bench-autoscale: setup ## AUTOSCALE's streams on worker processes (~25 min) and in the simulator: docs/benchmarks/autoscale.md
	$(PY) bench/autoscale_processes.py
	$(PY) bench/autoscale.py

images: ## build the elastream-operator:dev and elastream-worker:dev images (needs a Docker engine)
	@bash scripts/images.sh

release: ## dist/: the chart, both images tagged with the version (docker save, gzip) and SHA256SUMS; a clean tree only
	@bash scripts/release.sh

test-e2e: setup ## the e2e tier only: a real API server, the chart, the images (builds the tools the first time)
	$(VENV)/bin/pytest tests/e2e

soak: setup ## every tier three times in a row beside a CPU-heavy process (about 2 h on 2 cores); stops at the first red run
	bash scripts/soak.sh 3

demo: setup ## the main job: run examples/demo.yaml on local worker processes, scale it out and in, print throughput
	$(PY) -m elastream demo examples/demo.yaml

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) $(STAMP) .pytest_cache .mypy_cache .ruff_cache .hypothesis
