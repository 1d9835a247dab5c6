# `make help` lists the targets. Every target that runs Python first makes .venv when it is missing
# or older than requirements.lock, so `make train` and `make test` work on a fresh clone.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CONFIG ?= configs/digits.yaml
PORT ?= 6006
PYTEST_ARGS ?=

.PHONY: help install train doctor test test-full lint format tensorboard bench lock clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(STAMP): requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	@touch $(STAMP)

install: $(STAMP) ## make .venv with the exact versions in requirements.lock (only when needed)

train: $(STAMP) ## fit CONFIG (default configs/digits.yaml), then test the best checkpoint
	$(PY) -m src.cli fit --config $(CONFIG) --test_after_fit true

doctor: $(STAMP) ## check CONFIG's model, data and schedule for the silent training bugs (exit 1 on findings)
	$(PY) -m src.doctor --config $(CONFIG)

test: $(STAMP) ## run the test suite without the slow tests
	$(PY) -m pytest -m "not slow" --nbmake tests notebooks $(PYTEST_ARGS)

test-full: $(STAMP) ## run every test, the slow ones too
	$(PY) -m pytest --nbmake tests notebooks $(PYTEST_ARGS)

lint: $(STAMP) ## ruff lint and format check, mypy type check of src/ and benchmarks/
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy src benchmarks

format: $(STAMP) ## ruff fix and format in place
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

tensorboard: $(STAMP) ## serve logs/ on localhost (PORT=6006)
	@mkdir -p logs
	@echo "TensorBoard: http://127.0.0.1:$(PORT)/"
	$(VENV)/bin/tensorboard --logdir logs --host 127.0.0.1 --port $(PORT)

bench: $(STAMP) ## measure the dashboard's cost per step and predict's rows per second
	$(PY) -m benchmarks.dashboard_overhead
	$(PY) -m benchmarks.predict_throughput

lock: $(STAMP) ## rewrite requirements.lock from what .venv holds
	@{ sed -n '/^#/p' requirements.lock; $(PY) -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > requirements.lock.tmp
	@mv requirements.lock.tmp requirements.lock

clean: ## remove logs, caches and .venv
	rm -rf logs lightning_logs .pytest_cache .ruff_cache .mypy_cache $(VENV)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
