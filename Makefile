# Two front doors: `make run` (install + the default pipeline) and `make test` (install + tests).
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
export PIP_DISABLE_PIP_VERSION_CHECK := 1

$(BIN)/.installed: pyproject.toml constraints-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints-cpu.txt torch
	$(BIN)/pip install -q -c constraints-cpu.txt -e ".[dev]"
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/agent-r1 train $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

.PHONY: install run test
