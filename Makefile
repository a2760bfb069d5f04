# jaxcomp: set-up, main job, tests.  Everything installs into ./.venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup quickstart test test-fast bench clean

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

## The main job: LeNet on real offline data, 8 simulated workers, float vs TernGrad.
quickstart: $(STAMP)
	$(PY) -m experiments.quickstart --workdir workdirs/quickstart

## The whole test suite (what CI runs).
test: $(STAMP)
	$(PY) -m pytest tests

bench: $(STAMP)
	$(PY) -m benchmarks.compressors
	$(PY) -m benchmarks.codecs

clean:
	rm -rf $(VENV) workdirs .pytest_cache
