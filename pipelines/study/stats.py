"""A cell's statistics: α with its bootstrap interval, each γ's empirical acceptance
against the theory's predictions, the cost coefficient and the optimal γ."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pipelines.study.config import TheoryConfig


@dataclasses.dataclass(kw_only=True)
class CellStats:
    """Per-row measurements of one (target, draft, temperature) cell; rows concatenate."""

    ids: list[int]  # prompt ids, one per row
    beta_sum: list[float]  # per row: Σ β over its generated positions
    beta_count: list[int]  # per row: generated positions
    position_sum: np.ndarray  # [N] float64: Σ over rows of β at generated position j
    position_count: np.ndarray  # [N] int64: rows with a position j
    spec: dict[int, dict[str, list[int]]]  # γ -> {accepted, tests, iterations, drafted} per row
    target_step_s: list[float]  # timed k=1 steps (c = "measured" only)
    draft_step_s: list[float]


def merge_stats(parts: Iterable[CellStats]) -> CellStats:
    """Concatenates the rows of several batches of one cell."""
    parts = list(parts)
    first = parts[0]
    gammas = sorted(first.spec)
    return CellStats(
        ids=[i for p in parts for i in p.ids],
        beta_sum=[x for p in parts for x in p.beta_sum],
        beta_count=[x for p in parts for x in p.beta_count],
        position_sum=np.sum([p.position_sum for p in parts], 0),
        position_count=np.sum([p.position_count for p in parts], 0),
        spec={
            g: {k: [x for p in parts for x in p.spec[g][k]] for k in first.spec[g]} for g in gammas
        },
        target_step_s=[x for p in parts for x in p.target_step_s],
        draft_step_s=[x for p in parts for x in p.draft_step_s],
    )


def ratio_with_ci(
    numerators, denominators, *, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float]:
    """(Σnum / Σden, low, high): percentile bootstrap over rows (sequences) of the ratio.

    numerators, denominators: [S] per sequence. One sequence gives a zero-width interval.
    """
    num = np.asarray(numerators, np.float64)
    den = np.asarray(denominators, np.float64)
    estimate = float(num.sum() / den.sum())
    if len(num) < 2:
        return estimate, estimate, estimate
    rows = np.random.default_rng(seed).integers(0, len(num), (resamples, len(num)))  # [R, S]
    ratios = num[rows].sum(1) / np.maximum(den[rows].sum(1), 1e-300)
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return estimate, float(min(low, estimate)), float(max(high, estimate))


def _half_width(estimate: float, low: float, high: float) -> float:
    return max(estimate - low, high - estimate)


def _clip_alpha(alpha: float) -> float:
    """α for the theory's formulas: float sums of min(p, q) can exceed 1 by ~1e-7."""
    return float(min(max(alpha, 0.0), 1.0))


def gamma_summary(
    alpha_ci: tuple[float, float, float],
    counts: Mapping[str, Sequence[int]],
    gamma: int,
    *,
    theory_config: TheoryConfig,
    seed: int,
) -> dict[str, Any]:
    """Empirical acceptance of one γ with its CI, against the theory's predictions from α."""
    from specdec_core import theory

    alpha = _clip_alpha(alpha_ci[0])
    acceptance, low, high = ratio_with_ci(
        counts["accepted"],
        counts["tests"],
        confidence=theory_config.confidence,
        resamples=theory_config.bootstrap_resamples,
        seed=seed,
    )
    accepted, iterations = int(np.sum(counts["accepted"])), int(np.sum(counts["iterations"]))
    tests, drafted = int(np.sum(counts["tests"])), int(np.sum(counts["drafted"]))
    predicted_tokens = theory.expected_tokens(alpha, gamma)
    tolerance = math.hypot(_half_width(*alpha_ci), _half_width(acceptance, low, high))
    return {
        "gamma": gamma,
        "empirical_acceptance": acceptance,
        "empirical_acceptance_ci_low": low,
        "empirical_acceptance_ci_high": high,
        "agrees_with_alpha": bool(abs(acceptance - alpha_ci[0]) <= tolerance),
        "accepted": accepted,
        "tests": tests,
        "drafted": drafted,
        "iterations": iterations,
        "accepted_per_drafted": accepted / max(drafted, 1),
        "predicted_accepted_per_drafted": (predicted_tokens - 1.0) / gamma,
        "tokens_per_iteration": (accepted + iterations) / max(iterations, 1),
        "predicted_tokens_per_iteration": predicted_tokens,
    }


def cost_coefficient(stats: CellStats, theory_config: TheoryConfig) -> tuple[float, str]:
    """(c, where it came from): the configured number, or the timed step ratio."""
    if theory_config.cost_coefficient != "measured":
        return float(theory_config.cost_coefficient), "config"
    return float(np.median(stats.draft_step_s) / np.median(stats.target_step_s)), "measured"


def summarize_cell(stats: CellStats, *, theory_config: TheoryConfig, seed: int) -> dict[str, Any]:
    """α with its CI, β by position, each γ's empirical acceptance, c, optimal γ."""
    from specdec_core import theory

    order = np.argsort(stats.ids, kind="stable")  # bootstrap rows in a fixed order
    pick = lambda values: np.asarray(values)[order]
    alpha_ci = ratio_with_ci(
        pick(stats.beta_sum),
        pick(stats.beta_count),
        confidence=theory_config.confidence,
        resamples=theory_config.bootstrap_resamples,
        seed=seed,
    )
    by_gamma = [
        gamma_summary(
            alpha_ci,
            {k: pick(v) for k, v in stats.spec[g].items()},
            g,
            theory_config=theory_config,
            seed=seed + g,
        )
        for g in sorted(stats.spec)
    ]
    pooled = {k: sum(sum(row[k]) for row in stats.spec.values()) for k in ("accepted", "tests")}
    c, c_source = cost_coefficient(stats, theory_config)
    alpha = _clip_alpha(alpha_ci[0])
    gammas = range(1, theory_config.max_gamma + 1)
    optimal = theory.optimal_gamma(alpha, c, max_gamma=theory_config.max_gamma)
    position_mean = stats.position_sum / np.maximum(stats.position_count, 1)
    return {
        "alpha": alpha_ci[0],
        "alpha_ci_low": alpha_ci[1],
        "alpha_ci_high": alpha_ci[2],
        "sequences": len(stats.ids),
        "positions": int(sum(stats.beta_count)),
        "beta_by_position": [
            float(b) if n else None
            for b, n in zip(position_mean, stats.position_count, strict=True)
        ],
        "empirical_acceptance": pooled["accepted"] / max(pooled["tests"], 1),
        "by_gamma": by_gamma,
        "agrees_with_alpha": all(g["agrees_with_alpha"] for g in by_gamma),
        "c": c,
        "c_source": c_source,
        "optimal_gamma": optimal,
        "predicted_improvement": theory.walltime_improvement(alpha, optimal, c),
        "improvement_by_gamma": [theory.walltime_improvement(alpha, g, c) for g in gammas],
    }
