# rtcnorm: the two user-facing commands are `make test` and `make demo`.
# Each does its own set-up: torch from PyPI when it is missing (nothing is
# installed when torch is already there, so offline GPU machines work), the
# test tools, then the extension build (plain C++, no nvcc).
PYTHON ?= python3
TORCH_VERSION ?= 2.11.0
PIP := $(PYTHON) -m pip --disable-pip-version-check
CPP_SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cuh')
PY_SOURCES := python tests benchmarks setup.py

.PHONY: setup test test-gpu demo bench lint format clean

setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "torch==$(TORCH_VERSION)"
	@$(PYTHON) -c "import pytest, hypothesis" 2>/dev/null || $(PIP) install pytest hypothesis
	@$(PYTHON) -c "import wheel" 2>/dev/null || $(PIP) install wheel
	$(PIP) install --no-build-isolation --no-deps -e . -q

test: setup
	$(PYTHON) -m pytest -q tests

test-gpu: setup
	$(PYTHON) -m pytest -q -m gpu tests

demo: setup
	$(PYTHON) benchmarks/demo.py

bench: setup
	$(PYTHON) benchmarks/bench_rms_norm.py

lint:
	@command -v ruff >/dev/null 2>&1 || $(PIP) install ruff
	clang-format --dry-run --Werror $(CPP_SOURCES)
	ruff check $(PY_SOURCES)
	ruff format --check $(PY_SOURCES)

format:
	clang-format -i $(CPP_SOURCES)
	ruff check --fix $(PY_SOURCES)
	ruff format $(PY_SOURCES)

clean:
	rm -rf build python/rtcnorm/*.so python/*.egg-info
