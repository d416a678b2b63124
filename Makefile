# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.diagtools-installed
# The tools CI runs, pinned; every pip install below honours it.  Given with -c, not PIP_CONSTRAINT,
# which would replace a machine's own pip constraint file instead of adding to it.
CONSTRAINTS := constraints.txt
PIP := PIP_DISABLE_PIP_VERSION_CHECK=1 $(BIN)/python -m pip
# Every supported CPython runs the core suite in its own venv (.venv-pyX.Y) with only the core's
# dependencies; a missing one fails under CI.
PYTHONS ?= 3.10 3.11 3.12 3.13
CORE_TESTS := tests/test_packaging.py tests/unit \
	tests/functional/test_agents.py tests/functional/test_scan_attribution.py \
	tests/functional/test_scan_failures.py tests/functional/test_replay.py tests/functional/test_run.py \
	tests/functional/test_sweep.py tests/functional/test_sweep_zygote.py tests/functional/test_pytest_plugin.py \
	tests/functional/test_sweep_packages.py tests/functional/test_late_init.py tests/functional/test_driver_threads.py \
	tests/functional/test_cuts.py tests/functional/test_vendor_driver.py
# The main venv has every extra; a module of one of them missing under CI fails the run (tests/conftest.py).
ALL_EXTRAS := notebook,cuda,kernels,dev

.PHONY: demo lab test test-pythons test-under-load lint setup clean

setup: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the project's metadata changed (or the venv is new).
$(STAMP): pyproject.toml $(CONSTRAINTS) $(BIN)/python scripts/system-deps
	sh scripts/system-deps
	$(PIP) install --quiet -c $(CONSTRAINTS) --upgrade pip setuptools wheel
	$(PIP) install --quiet -c $(CONSTRAINTS) -e '.[all]'
	$(BIN)/python -c "import diagtools.driver as d; d.build_simulated_driver(); d.build_probe_extension()"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/diagtools demo --out build/report

# JupyterLab from the venv on the notebooks; widget state is saved with them, so a reopened panel shows no error.
lab: $(STAMP)
	mkdir -p $(VENV)/share/jupyter/lab/settings
	cp scripts/lab-overrides.json $(VENV)/share/jupyter/lab/settings/overrides.json
	mkdir -p $(VENV)/etc/jupyter/jupyter_server_config.d
	cp scripts/jupyter_server_config.json $(VENV)/etc/jupyter/jupyter_server_config.d/diagtools.json
	$(BIN)/jupyter lab --ServerApp.root_dir=notebooks

lint: $(STAMP)
	$(BIN)/ruff check diagtools tests benchmarks
	$(BIN)/ruff format --check diagtools tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy

test: $(STAMP) lint
	sh scripts/system-deps browser
	DIAGTOOLS_TEST_EXTRAS=$(ALL_EXTRAS) $(BIN)/python -m pytest
	$(MAKE) --no-print-directory test-pythons

test-pythons: $(STAMP)
	$(BIN)/python scripts/test_pythons.py --versions $(PYTHONS) -- $(CORE_TESTS)

# Not part of `test`: `make test` three times in a clean clone with two CPU-bound loops per core beside it
# (about an hour on two cores); results in benchmarks/suite_under_load.{json,md}.
test-under-load:
	python3 benchmarks/suite_under_load.py --runs 3 --hogs-per-core 2

clean:
	rm -rf build .pytest_cache .ruff_cache .mypy_cache
