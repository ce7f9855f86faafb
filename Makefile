# Every target works from a fresh clone: `make test` creates .venv and installs into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The main job needs only the pipelines extra; the tests add HF transformers + torch (the
# parity and side-by-side tests), pytest, hypothesis, selenium and ruff on top.
RUN_STAMP := $(VENV)/.installed-run

.PHONY: install run ui models-en models-debian models-device models-unpack test test-fast lint format bench clean

$(RUN_STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[pipelines]'
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[pipelines,hf,test]'
	touch $(STAMP)

install: $(STAMP)

## The main job (see README): offline En->De speculative translation of the shipped
## sample on the embedded pair, with the target alone on the same records for the
## speedup, logged to MLflow (runs/mlflow.db). Both models in the target's Ray actor,
## which runs each batch's loop compiled (--draft-placement target: on one host that
## beats crossing processes every iteration; BENCHMARKS.md "bfloat16 matmuls").
run: $(RUN_STAMP)
	$(BIN)/specdec translate --input assets/samples/en_de_debian_sample.tsv \
	    --target ende_target_debian --draft ende_draft_debian_seq2 --draft-placement target \
	    --output runs/translate/sample.jsonl --compare-baseline \
	    --summary-json runs/translate/sample.summary.json

## Browse the runs: the MLflow UI on 127.0.0.1.
ui: $(RUN_STAMP)
	$(BIN)/specdec ui

## Train the English decoder-only pairs of the acceptance study (GPT-like, LaMDA-style;
## configs/studies/table3_small.yaml); resumable: rerun to continue from runs/train/.
models-en: $(RUN_STAMP)
	for name in gpt_en_draft lamda_en_draft gpt_en_draft_large lamda_en_draft_large \
	    gpt_en_target lamda_en_target; do \
	  $(BIN)/specdec train --config configs/models/$$name.yaml --resume || exit 1; \
	done

## The Debian-corpus target: the committed corpus and vocabulary (rebuilt only
## when absent: `specdec prepare --corpus debian` fetches the packages with apt-get
## download), then the target; resumable from runs/train/ende_target_debian (rerun to
## continue), exports to runs/export/ende_target_debian.
models-debian: $(RUN_STAMP)
	test -f assets/data/debian/counts.json || $(BIN)/specdec prepare --corpus debian
	test -f assets/spm/ende_debian.model || $(BIN)/specdec vocab --corpus debian
	$(BIN)/specdec train --config configs/models/ende_target_debian.yaml --resume

## The Debian pair (ende_target_debian and its two distilled drafts) on a lent
## accelerator: every stage of configs/recipes/debian_pair.yaml under
## its time budget, all ended DEADLINE seconds after the start (a call's limit less the
## packing and the transfer back), the exports packed into parts
## of at most 16 MiB under runs/recipe/debian_pair/parts (RETURN=DIR copies the manifest
## and the first 4 there). Needs only JAX, flax, optax, sentencepiece, tensorstore, PyYAML
## and sacrebleu: on a machine without the venv (or Beam), set RECIPE to the recipe
## module run by that machine's python3 (README, "Debian"); runs on a CPU too (SCALE=0.1
## shortens every budget). `make models-unpack PARTS="DIR ..."` joins the returned
## parts (SHA-256 checked) into assets/checkpoints. PAIR=summ_pair trains the larger summarizer
## pair (configs/recipes/summ_pair.yaml) the same way.
RECIPE ?= $(BIN)/specdec train-recipe
SCALE ?= 1
DEADLINE ?= 510
PAIR ?= debian_pair
models-device:
	$(RECIPE) run configs/recipes/$(PAIR).yaml --scale $(SCALE) --deadline $(DEADLINE) \
		$(if $(RETURN),--return-dir $(RETURN) --return-parts 4)

models-unpack: $(STAMP)
	$(BIN)/specdec train-recipe unpack $(PARTS)

## The whole test suite, statistical and end-to-end tests included, in two worker
## processes (pytest-xdist; a test file stays in one process, so its compiled models are
## shared by its tests; a worker that dies fails the run at once, naming its test, instead
## of being replaced: pytest-xdist can hang after replacing one under --dist loadfile).
## PYTEST_WORKERS=0 runs it in this process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile --max-worker-restart 0)
test: $(STAMP)
	$(BIN)/python -m tests.machine
	$(BIN)/ruff check .
	$(BIN)/pytest -q $(XDIST) --durations=15

## Everything but the tests marked slow.
test-fast: $(STAMP)
	$(BIN)/python -m tests.machine
	$(BIN)/pytest -q $(XDIST) -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check specdec_core workers pipelines tests benchmarks

format: $(STAMP)
	$(BIN)/ruff format specdec_core workers pipelines tests benchmarks
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_loop_overhead.py
	$(BIN)/python benchmarks/bench_ray_vs_inprocess.py
	$(BIN)/python benchmarks/bench_t5_forward.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
