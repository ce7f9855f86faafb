"""The shipped pair as ``make run`` runs it: the committed bfloat16 target and default
draft, the draft in the target's Ray actor, ``--gamma auto``, the target alone beside
it, in a fresh ``specdec`` process whose XLA compiles with its default optimisation (the
rest of the suite compiles with it off, ``tests/conftest.py``). Five sentences of the
sample, chosen for wide greedy margins (``tests/data/shipped_pair_sample.json``), must
come out as the committed target's own translations, identical to the target alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipelines import record_io
from pipelines.cli import REPO_ROOT
from tests.conftest import TEST_XLA_FLAGS

SAMPLE = REPO_ROOT / "tests" / "data" / "shipped_pair_sample.json"
MAKE_RUN = ("--target", "ende_target_debian", "--draft", "ende_draft_debian_seq2")


def _make_run_flags() -> tuple[str, ...]:
    """The model and placement flags of the Makefile's ``run`` target."""
    recipe = (REPO_ROOT / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    flags = " ".join(line.strip(" \\\t") for line in recipe.splitlines()[1:]).split()
    return tuple(flags[flags.index("--target") : flags.index("--draft-placement") + 2])


def test_the_test_runs_the_makefiles_models_and_placement():
    assert _make_run_flags() == (*MAKE_RUN, "--draft-placement", "target")


@pytest.mark.slow
def test_the_shipped_pair_as_make_run_runs_it_gives_the_targets_translations(tmp_path):
    records = json.loads(SAMPLE.read_text())["records"]
    source = tmp_path / "five.tsv"
    source.write_text("".join(f"{r['source']}\t{r['reference']}\n" for r in records))
    output, summary_path = tmp_path / "out.jsonl", tmp_path / "summary.json"
    command = [
        sys.executable, "-m", "pipelines.launch", "translate",
        "--input", str(source), "--output", str(output), *_make_run_flags(),
        "--compare-baseline", "--summary-json", str(summary_path),
        "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--quiet",
    ]  # fmt: skip
    flags = os.environ.get("XLA_FLAGS", "").replace(TEST_XLA_FLAGS, "").strip()
    env = {**os.environ, "XLA_FLAGS": flags, "SPECDEC_COMPILE_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(summary_path.read_text())
    assert summary["identical_to_baseline"] is True
    assert summary["gamma_histogram"] and summary["records_out"] == len(records)
    # the target's actor compiled the job's programs ahead: each width's target alone's
    # (and a loop --gamma auto bought)
    assert summary["warmup_programs"] >= 1 and summary["warmup_compile_s"] > 0
    assert summary["records_resumed"] == 0  # a fresh job resumes nothing
    rows = {row["id"]: row for row in record_io.read_jsonl(str(output))}
    got = [rows[str(i)]["output"] for i in range(1, len(records) + 1)]
    assert got == [r["output"] for r in records]
