# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.diagtools-installed

.PHONY: demo lab test lint setup clean

setup: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's metadata changed (or the venv is new).
$(STAMP): pyproject.toml $(BIN)/python scripts/system-deps
	sh scripts/system-deps
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[all]'
	$(BIN)/python -c "import diagtools.driver as d; d.build_simulated_driver(); d.build_probe_extension()"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/diagtools demo --out build/report

# JupyterLab from the venv on the notebooks; widget state is saved with them, so a reopened panel shows no error.
lab: $(STAMP)
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp scripts/lab-overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks

lint: $(STAMP)
	$(BIN)/ruff check diagtools tests benchmarks
	$(BIN)/ruff format --check diagtools tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy

test: $(STAMP) lint
	sh scripts/system-deps browser
	$(BIN)/python -m pytest

clean:
	rm -rf build .pytest_cache .ruff_cache .mypy_cache
