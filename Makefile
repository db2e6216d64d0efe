# rtcnorm: the two user-facing commands are `make test` and `make demo`.
# Each does its own set-up: torch from PyPI when it is missing (nothing is
# installed when torch is already there, so offline GPU machines work), the
# test tools, then the extension build (plain C++, no nvcc) in place under
# python/rtcnorm/, which every target puts first on PYTHONPATH.
#
# The build is incremental: the library is rebuilt only when a C++ or kernel
# source, setup.py or the installed torch is newer than it, and then ninja
# recompiles only the translation units that changed.
PYTHON ?= python3
TORCH_VERSION ?= 2.11.0
PIP := $(PYTHON) -m pip --disable-pip-version-check
CPP_SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cuh')
PY_SOURCES := python tests benchmarks setup.py
EXT_SUFFIX := $(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
LIBRARY := python/rtcnorm/_C$(EXT_SUFFIX)
# torch's version.py changes whenever torch is reinstalled (found without importing torch).
TORCH_STAMP := $(shell $(PYTHON) -c "import importlib.util as u; s = u.find_spec('torch'); \
	print(s.submodule_search_locations[0] + '/version.py' if s else '')" 2>/dev/null)
# What the package and its tests need; numpy so that torch imports without a warning.
TEST_DEPS := pytest hypothesis numpy tqdm transformers matplotlib wheel
export PYTHONPATH := $(CURDIR)/python$(if $(PYTHONPATH),:$(PYTHONPATH))

.PHONY: setup deps build test test-slow test-gpu test-gpu-shards demo bench plots info wheel lint format clean

setup: deps build

deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "torch==$(TORCH_VERSION)"
	@$(PYTHON) -c "import importlib.util as u, sys; \
		sys.exit(any(u.find_spec(m) is None for m in '$(TEST_DEPS)'.split()))" || $(PIP) install $(TEST_DEPS)
	@command -v ninja >/dev/null 2>&1 || $(PIP) install ninja

build: $(LIBRARY)

$(LIBRARY): $(CPP_SOURCES) setup.py $(TORCH_STAMP)
	@$(PYTHON) -c "import torch" 2>/dev/null || $(MAKE) --no-print-directory deps
	$(PYTHON) setup.py -q build_ext --inplace
	@touch $@

test: setup
	$(PYTHON) -m pytest -q tests

test-slow: setup
	$(PYTHON) -m pytest -q --run-slow tests

test-gpu: setup
	$(PYTHON) -m pytest -q -m gpu tests

# The GPU tests in parallel pytest processes sharing one kernel cache (tests/run_gpu_shards.py).
test-gpu-shards: setup
	$(PYTHON) tests/run_gpu_shards.py

demo: setup
	$(PYTHON) benchmarks/demo.py

bench: setup
	$(PYTHON) benchmarks/bench_rms_norm.py

plots: deps
	$(PYTHON) benchmarks/plot.py

info: setup
	$(PYTHON) -m rtcnorm info

# A wheel built against the installed torch (its metadata pins that torch's minor release).
wheel: deps
	@$(PYTHON) -c "import build.__main__" 2>/dev/null || $(PIP) install build
	$(PYTHON) -m build --wheel --no-isolation

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
	rm -rf build dist python/rtcnorm/*.so python/rtcnorm/_build_info.py python/*.egg-info
