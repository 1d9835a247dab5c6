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
# test processes: one per core (WORKERS=0 runs the tests in this process)
WORKERS ?= auto
PYTEST_ARGS ?=
# more words for the command a target runs: make train ARGS="--trainer.max_epochs=5 --seed_everything=1"
ARGS ?=
# the extras and apps make slim keeps, with what they need: make slim KEEP="dashboard images"
KEEP ?=

.PHONY: help install train test gpu-check test-full lint format tensorboard bench lock slim clean clean-all

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(STAMP): requirements.lock
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	@touch $(STAMP)

install: $(STAMP) ## make .venv with the exact versions in requirements.lock (only when needed)

train: $(STAMP) ## fit CONFIG (default configs/digits.yaml), then test the best checkpoint; ARGS="--data.folder=..." adds CLI words
	$(PY) -m src.cli fit --config $(CONFIG) --test_after_fit true $(ARGS)

test: $(STAMP) ## run every proof that takes seconds (the slow tests and the notebook: make test-full)
	$(PY) -m pytest -m "not slow" -n $(WORKERS) --dist loadfile tests examples scripts src/extras src/apps $(PYTEST_ARGS)

gpu-check: $(STAMP) ## on a machine with a GPU: the CUDA tests, then a timed fit on the GPU beside the CPU
	$(PY) -m pytest -m cuda tests examples scripts src/extras src/apps -rs $(PYTEST_ARGS)
	$(PY) -m benchmarks.gpu_fit

test-full: $(STAMP) ## run every test, the slow ones too
	$(PY) -m pytest --nbmake tests examples scripts src/extras src/apps notebooks $(PYTEST_ARGS)

lint: $(STAMP) ## ruff lint and format check, mypy type check of src/, examples/, benchmarks/ and scripts/
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy src examples benchmarks scripts

format: $(STAMP) ## ruff fix and format in place
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

tensorboard: $(STAMP) ## serve logs/ on localhost (PORT=6006)
	@mkdir -p logs
	@echo "TensorBoard: http://127.0.0.1:$(PORT)/"
	$(VENV)/bin/tensorboard --logdir logs --host 127.0.0.1 --port $(PORT)

bench: $(STAMP) ## training speed side by side, make train's time, epoch time and memory by rows, predict, and each extra's and app's benchmark (benchmarks/results/)
	$(PY) -m benchmarks.train_speed --rounds 7 --write
	$(PY) -m benchmarks.fit_overhead --rounds 3 --write   # make train's whole fit, its cost split by callback
	$(PY) -m benchmarks.experiments --rounds 3 --write   # images and text against a stock Trainer, quiet and busy
	$(PY) -m benchmarks.make_train --write
	$(PY) -m benchmarks.scaling --write
	$(PY) -m benchmarks.predict_throughput
	$(foreach bench,$(APP_BENCHMARKS),$(PY) -m $(bench) && ) true   # each app's src/apps/<app>/bench.py
	$(foreach bench,$(subst /,.,$(basename $(wildcard src/extras/*/bench.py))),$(PY) -m $(bench) && ) true   # each extra's bench.py
	$(PY) -m benchmarks.tables --write   # public tables against CatBoost, LightGBM, XGBoost (needs: pip install -e '.[bench]')

lock: $(STAMP) ## rewrite requirements.lock from what .venv holds
	@{ sed -n '/^#/p' requirements.lock; $(PY) -m pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; } > requirements.lock.tmp
	@mv requirements.lock.tmp requirements.lock

slim: $(STAMP) ## strip the starter to its core: every extra, app and data kind goes but KEEP="..." and what they need (undo: git checkout -- .)
	$(PY) -m scripts.slim $(KEEP)

clean: ## remove caches and .venv; keeps logs/ (your runs and checkpoints)
	rm -rf lightning_logs .pytest_cache .ruff_cache .mypy_cache $(VENV)
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-all: clean ## clean, and delete logs/: every run, checkpoint and prediction in it
	rm -rf logs

# each app's targets (make help lists them with the rest): delete an app's folder and they go with it
include $(wildcard src/apps/*/app.mk)
