# Two front doors: `make run` (install + the default pipeline as a Prefect flow) and `make test`.
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

# The default pipeline as a Prefect flow (embedded server), tracked in MLflow, agent registered.
run: install
	$(BIN)/python -m flows.training $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

.PHONY: install run test
