"""The draft frontier bench's own pieces (benchmarks/bench_draft_frontier.py): its input
file's errors, the line fit, and the best predicted speedup over γ."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

from specdec_core import theory

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))  # it imports bench_ende_speedup's helpers
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_draft_frontier", BENCHMARKS / "bench_draft_frontier.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_read_sentences_skips_blank_lines_and_names_a_bad_one(bench, tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "REPO", tmp_path)
    (tmp_path / "ok.tsv").write_text("One.\tEins.\n\nTwo.\tZwei.\n")
    assert bench.read_sentences("ok.tsv") == [("One.", "Eins."), ("Two.", "Zwei.")]
    (tmp_path / "bad.tsv").write_text("One.\tEins.\nno tab here\n")
    with pytest.raises(SystemExit, match=r"bad.tsv:2: expected 'english<TAB>german'"):
        bench.read_sentences("bad.tsv")
    (tmp_path / "empty.tsv").write_text("\n\n")
    with pytest.raises(SystemExit, match="no sentence pairs"):
        bench.read_sentences("empty.tsv")


def test_line_fit_recovers_a_line(bench):
    intercept, slope = bench.line_fit([1, 2, 3, 4], [0.5, 0.75, 1.0, 1.25])
    assert intercept == pytest.approx(0.25)
    assert slope == pytest.approx(0.25)


def test_best_over_gammas_picks_the_best_gamma_and_clamps_alpha(bench):
    costs = theory.StepCosts(
        target_s={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.2}, draft_step_s=0.05, target_fixed_s=2.0
    )
    speedup, gamma = bench.best_over_gammas(0.6, costs, 30.0)
    assert speedup == max(theory.predicted_speedup(0.6, g, costs, 30.0) for g in (1, 2, 3))
    assert speedup == theory.predicted_speedup(0.6, gamma, costs, 30.0)
    assert bench.best_over_gammas(1.7, costs, 30.0) == bench.best_over_gammas(1.0, costs, 30.0)
    assert bench.best_over_gammas(-0.2, costs, 30.0)[0] < 1.0  # nothing accepted: slower
