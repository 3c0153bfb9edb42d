# The two set-up commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
OUT ?= out

# The policy comparison on a bundled Azure trace sample: two A100 and two Ascend 910B instances
# behind GoRouting, below, near and past capacity (`make sim`).
SIM_ARGS ?= --trace azure_conv_20min --profile a100-qwen2-7b,910b-qwen2-7b --instances 4 \
	--router goroute --policy vllm-v1,vllm-v1-priority,vllm-v0-fcfs,sarathi-priority,fairbatching,wvtc,slide \
	--rate-scale 2,4,5 --duration 300 --seed 0 --json $(OUT)/sim.json --plot $(OUT)/sim.png

.PHONY: run sim test test-fast lint install install-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Installs run once, then again only when pyproject.toml is newer than the last one (a stamp in
# the venv): `make run` starts at once. `rm $(VENV)/.installed*` forces a new install.
INSTALLED := $(VENV)/.installed
INSTALLED_DEV := $(VENV)/.installed-dev

install: $(INSTALLED)

install-dev: $(INSTALLED_DEV)

$(INSTALLED): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(INSTALLED_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	# CPU torch for the profiling script's tests (a local wheel on these machines).
	$(BIN)/pip install -q torch==2.13.0 || echo "torch unavailable: profiling tests will skip"
	touch $@ $(INSTALLED)

# The main job: the gateway on the embedded default (SQLite, four emulated engines) on port 8000.
run: install
	$(BIN)/tiergate serve $(SERVE_ARGS)

sim: install
	mkdir -p $(OUT)
	$(BIN)/tiergate sim $(SIM_ARGS)

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The full suite (what CI runs).
test: install-dev
	$(BIN)/python -m pytest

# Local work: everything but the tests marked slow.
test-fast: install-dev
	$(BIN)/python -m pytest -m "not slow"
