# jaxcomp: set-up, main job, tests, notebooks.  Everything installs into ./.venv.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Debian packages the suite uses: real Fashion-MNIST (the data tests and the Fashion-MNIST
# runs), the GCIDE dictionary (the language model's English text) and iproute2 (`ip`/`tc`, for
# the launcher's emulated-link test).
DEBIAN_PACKAGES := dataset-fashion-mnist dict-gcide iproute2
FASHION_DIR     ?= $(or $(JAXCOMP_FASHION_MNIST_DIR),/usr/share/datasets/fashion-mnist)
GCIDE_FILE      ?= $(or $(JAXCOMP_GCIDE_PATH),/usr/share/dictd/gcide.dict.dz)

.PHONY: setup debian-packages quickstart lm test test-fast notebooks bench accelerator clean

## The virtual environment: the pinned library, experiment stack and test tools.
$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

## As root (CI, a fresh container): apt-get install what is missing. Otherwise say once
## which tests will skip and why.
debian-packages:
	@missing=""; \
	[ -f "$(FASHION_DIR)/train-images-idx3-ubyte.gz" ] || missing="$$missing dataset-fashion-mnist"; \
	[ -f "$(GCIDE_FILE)" ] || missing="$$missing dict-gcide"; \
	{ command -v tc || [ -x /usr/sbin/tc ] || [ -x /sbin/tc ]; } >/dev/null 2>&1 || missing="$$missing iproute2"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "Installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else \
	  echo "NOTE: Debian packages missing:$$missing (not root, so not installed)."; \
	  case "$$missing" in *dataset-fashion-mnist*) echo "  The Fashion-MNIST tests of tests/test_data.py and tests/test_data_tfds.py will skip."; esac; \
	  case "$$missing" in *dict-gcide*) echo "  The GCIDE text tests of tests/test_data_text.py and the language-model runs will skip."; esac; \
	  case "$$missing" in *iproute2*) echo "  The launcher's emulated-link test (needs ip/tc) will skip."; esac; \
	  echo "  To run them: sudo apt-get install$$missing"; \
	fi

## The main job: LeNet on real offline data, 8 simulated workers, float vs TernGrad.
quickstart: $(STAMP)
	$(PY) -m experiments.quickstart --workdir workdirs/quickstart

## The whole test suite (what CI runs). Two pytest workers, whole files each (module
## fixtures stay in one process; the launcher's link tests never overlap): compiling,
## the suite's main cost, is mostly single-threaded, so a second worker uses the second core.
## A worker that dies (a crash, or a test over its time limit) fails the run: xdist would
## otherwise start a new worker that runs the rest of the file from the same test, up to
## 8 times over.
test: debian-packages $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile --max-worker-restart=0 --durations=25 tests

## The language model: a GPT on the GCIDE dictionary's English text, 4 workers, under 5 minutes
## on 2 cores (configs/gpt_text.py).
lm: debian-packages $(STAMP)
	$(PY) -m experiments.train --config configs/gpt_text.py:runlocal --workdir workdirs/gpt_text

## A development subset: codecs, compressors, transforms, README and repository checks (the
## layout-equivalence, dtype/shape and non-finite sweeps and the notebook runs are left to
## `make test`).
test-fast: $(STAMP)
	$(PY) -m pytest tests/test_codecs_*.py tests/test_quantizers.py tests/test_transforms.py \
	  tests/test_readme.py tests/test_repo_references.py tests/test_notebooks.py tests/test_first_day.py \
	  tests/test_data_parallel.py tests/test_train_cli.py \
	  -k "not layouts_agree and not dtypes_shapes and not nonfinite_policies and not tiny_scale and not blocks_run"

## Execute the notebooks at their default scale and commit them with their outputs.
notebooks: debian-packages $(STAMP)
	$(PY) notebooks/execute.py

bench: $(STAMP)
	$(PY) -m benchmarks.compressors
	$(PY) -m benchmarks.codecs

## Test and measure on whatever accelerator JAX sees (docs/benchmarks.md, "On an accelerator"):
## installs nothing, with .venv's Python where there is one, else $(PYTHON) and the JAX it finds.
ACCELERATOR_OUT ?= workdirs/accelerator
accelerator:
	$(if $(wildcard $(PY)),$(PY),$(PYTHON)) -m benchmarks.accelerator --out $(ACCELERATOR_OUT)

clean:
	rm -rf $(VENV) workdirs .pytest_cache
