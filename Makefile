# geodbk — two commands: `make demo` (install, build the demo run, open the dashboard)
# and `make test` (install with dev extras, lint, type-check, run the default test suite).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# Torch build installed when the venv has none. On a CPU machine this is the CPU wheel;
# a GPU user installs their CUDA torch into $(VENV) first and it is kept.
TORCH_SPEC ?= torch==2.13.0
# Threads per torch process: the reference machine has 2 cores.
export OMP_NUM_THREADS ?= 2

.PHONY: demo test install install-dev lint typecheck pytest clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip setuptools wheel

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: install
	$(BIN)/geodbk demo --run runs/demo
	$(BIN)/streamlit run app

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install-dev
	$(BIN)/mypy geodbk pipelines app

pytest: install-dev
	$(BIN)/python -m pytest -m "not slow" -q

test: lint typecheck pytest

clean-venv:
	rm -rf $(VENV)
