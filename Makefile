# Every target works from a fresh clone: `make test` creates .venv and installs into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test test-fast lint format bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[pipelines,hf,test]'
	touch $(STAMP)

install: $(STAMP)

## The main job (see README).
run: $(STAMP)
	$(BIN)/specdec demo

## The whole test suite, statistical and end-to-end tests included.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest -q

## Everything but the tests marked slow.
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check specdec_core workers pipelines tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format specdec_core workers pipelines tests benchmarks
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_loop_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
