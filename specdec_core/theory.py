"""The paper's analysis (Leviathan et al., 2023, Section 3) and a measured cost model.

Notation as in the paper: β = Σ_x min(p(x), q(x)) is the acceptance probability at
one position (Definition 3.1), α = E[β] (Definition 3.2), γ the draft length, c the
ratio of one draft step's time to one target step's time, ĉ the same ratio for
arithmetic operations.

The paper assumes verifying γ+1 tokens costs one target step. On CPUs (and on
accelerators at large batch) it does not, so :func:`predicted_speedup` replaces c by
measured per-call times: target at k tokens, draft per step, and loop overhead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import jax.numpy as jnp
import numpy as np


def beta(target_probs, draft_probs):
    """β per position: Σ_x min(p(x), q(x)) over the last axis ([..., V] -> [...])."""
    return jnp.minimum(jnp.asarray(target_probs), jnp.asarray(draft_probs)).sum(-1)


def alpha(target_probs, draft_probs) -> float:
    """α = E[β], the mean of β over every position given."""
    return float(jnp.mean(beta(target_probs, draft_probs)))


def acceptance_tests(accepted, iterations, fully_accepted):
    """Acceptance tests run by speculative iterations: accepted + rejections.

    Algorithm 1 tests drafted positions in order until the first rejection, so an
    iteration rejects exactly once unless it accepted all γ (``fully_accepted``: the
    count at the last draft position). Works on counts or arrays of counts.
    """
    return accepted + iterations - fully_accepted


def empirical_alpha(accepted: int, iterations: int, fully_accepted: int) -> float | None:
    """α̂ = accepted / tests, the maximum-likelihood α of the paper's model (each test
    accepts with the same probability α) from speculative runs' counts; None without
    tests. Not ``accepted / drafted``: positions after a rejection are never tested,
    so that ratio is below α for γ > 1 (it is (τ − 1)/γ)."""
    tests = acceptance_tests(accepted, iterations, fully_accepted)
    return float(accepted / tests) if tests else None


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per iteration, (1 − α^(γ+1)) / (1 − α) (Equation 1); γ+1 at α = 1."""
    _check(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float) -> float:
    """Expected wall-time improvement, (1 − α^(γ+1)) / ((1 − α)(γc + 1)) (Theorem 3.8)."""
    if c < 0:
        raise ValueError(f"cost coefficient c must be >= 0, got {c}")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def arithmetic_ops_increase(alpha: float, gamma: int, c_hat: float) -> float:
    """Expected factor of increase in arithmetic operations (Theorem 3.11):
    (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1))."""
    return (gamma * c_hat + gamma + 1.0) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha: float, c: float, *, max_gamma: int = 64) -> int:
    """The integer γ ≥ 1 maximising :func:`walltime_improvement` (Section 3.4)."""
    gammas = range(1, max_gamma + 1)
    return max(gammas, key=lambda g: walltime_improvement(alpha, g, c))


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepCosts:
    """Measured per-call wall times, seconds."""

    target_s: Mapping[int, float]  # target call time by number of tokens k (k=1..γ+1)
    draft_step_s: float  # one draft decode step
    # Per speculative iteration, outside model calls (sampling the distributions, the
    # acceptance rule, commit, the loop): one figure, or one per γ when measured per γ.
    overhead_s: float | Mapping[int, float] = 0.0
    baseline_overhead_s: float = 0.0  # per target-only token, outside the target call
    # Per request, paid once: the encoder and prompt prefill of each model.
    target_fixed_s: float = 0.0
    draft_fixed_s: float = 0.0

    def iteration_overhead_s(self, gamma: int) -> float:
        if isinstance(self.overhead_s, Mapping):
            if gamma not in self.overhead_s:
                raise ValueError(
                    f"no measured loop overhead for gamma={gamma}; have {sorted(self.overhead_s)}"
                )
            return self.overhead_s[gamma]
        return self.overhead_s

    @property
    def c(self) -> float:
        """The paper's cost coefficient: draft step over target step at k=1."""
        return self.draft_step_s / self.target_s[1]


def predicted_speedup(
    alpha: float, gamma: int, costs: StepCosts, tokens_per_request: float | None = None
) -> float:
    """Speedup over target-only decoding predicted from measured costs.

    One iteration costs γ draft steps + one target call on γ+1 tokens + the loop's own
    work and yields :func:`expected_tokens` tokens; target-only decoding costs
    target_s[1] + baseline_overhead_s per token. With ``tokens_per_request`` the
    per-request costs count too (both models' encoder and prefill against the target's
    alone). With target_s[γ+1] = target_s[1] and no overheads this is Theorem 3.8.
    """
    if gamma + 1 not in costs.target_s:
        raise ValueError(
            f"no measured target time for k={gamma + 1} tokens; have k in {sorted(costs.target_s)}"
        )
    iteration_s = (
        gamma * costs.draft_step_s + costs.target_s[gamma + 1] + costs.iteration_overhead_s(gamma)
    )
    per_token_s = iteration_s / expected_tokens(alpha, gamma)
    baseline_token_s = costs.target_s[1] + costs.baseline_overhead_s
    if tokens_per_request is None:
        return baseline_token_s / per_token_s
    if tokens_per_request <= 0:
        raise ValueError(f"tokens_per_request must be > 0, got {tokens_per_request}")
    n = tokens_per_request
    return (costs.target_fixed_s + n * baseline_token_s) / (
        costs.target_fixed_s + costs.draft_fixed_s + n * per_token_s
    )


def best_gamma(alpha: float, costs: StepCosts, tokens_per_request: float | None = None) -> int:
    """The γ with the highest :func:`predicted_speedup` among the measured k = γ+1 (and
    the γ with a measured loop overhead, when it is measured per γ)."""
    gammas = [k - 1 for k in costs.target_s if k >= 2]
    if isinstance(costs.overhead_s, Mapping):
        gammas = [g for g in gammas if g in costs.overhead_s]
    if not gammas:
        raise ValueError(
            "need target times for at least one k >= 2 (and, when loop overheads are "
            "given per γ, an overhead for that γ = k - 1)"
        )
    return max(gammas, key=lambda g: predicted_speedup(alpha, g, costs, tokens_per_request))


def _check(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0 or np.isnan(alpha):
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if gamma < 1:
        raise ValueError(f"gamma must be >= 1, got {gamma}")


# ---------------------------------------------------------------- choosing γ from measurement


def position_tests(accepted_by_position, iterations) -> tuple[np.ndarray, np.ndarray]:
    """(tests, passes) at draft positions 1..γ from one decode's counts.

    Algorithm 1 tests position i only when positions 1..i−1 were accepted, so position
    1 is tested once per iteration and position i+1 as often as position i passed.
    ``accepted_by_position``: accepted count at each position (summed over rows, or
    [rows, γ]); ``iterations``: iterations (summed, or per row).
    """
    passes = np.asarray(accepted_by_position, np.float64)
    if passes.ndim == 2:
        passes = passes.sum(0)
    total = float(np.sum(iterations))
    tests = np.concatenate([[total], passes[:-1]]) if passes.size else passes
    return tests, passes


def position_acceptance(
    tests, passes, *, prior_alpha: float, prior_strength: float, positions: int
) -> list[float]:
    """β̂_i, the probability that draft position i is accepted given 1..i−1 were, for
    i = 1..positions (acceptance is not i.i.d.: it varies with the position).

    Each position's rate is shrunk towards the pooled rate of all positions, itself
    shrunk towards ``prior_alpha`` (``prior_strength`` pseudo-tests at each level), so
    a position with few or no tests reads as the pooled α.
    """
    if not 0.0 <= prior_alpha <= 1.0:
        raise ValueError(f"prior_alpha must be in [0, 1], got {prior_alpha}")
    if prior_strength <= 0:
        raise ValueError(f"prior_strength must be > 0, got {prior_strength}")
    tests = np.asarray(tests, np.float64)
    passes = np.asarray(passes, np.float64)
    if tests.shape != passes.shape or (passes > tests + 1e-9).any() or (passes < 0).any():
        raise ValueError(f"need 0 <= passes <= tests per position, got {passes} / {tests}")
    pooled = (passes.sum() + prior_strength * prior_alpha) / (tests.sum() + prior_strength)
    betas = []
    for i in range(positions):
        n, a = (tests[i], passes[i]) if i < tests.size else (0.0, 0.0)
        betas.append(float((a + prior_strength * pooled) / (n + prior_strength)))
    return betas


def expected_tokens_by_position(betas, gamma: int) -> float:
    """Expected tokens per iteration with per-position acceptance:
    1 + Σ_{i=1..γ} Π_{j≤i} β_j (Equation 1 when every β_j = α); 1 at γ = 0."""
    if gamma < 0 or gamma > len(betas):
        raise ValueError(f"gamma must be in [0, {len(betas)}] (the βs given), got {gamma}")
    if any(not 0.0 <= b <= 1.0 for b in betas):
        raise ValueError(f"every β must be in [0, 1], got {list(betas)}")
    return float(1.0 + np.cumprod(np.asarray(betas[:gamma], np.float64)).sum())


def iteration_costs(
    gamma_max: int,
    *,
    target_step_s: float,
    draft_c: float,
    target_slope: float,
    overhead_s: float = 0.0,
    measured_s: Mapping[int, float] | None = None,
) -> dict[int, float]:
    """Seconds per loop step for γ = 0..γ_max: γ = 0 is one target step decoding
    alone; γ ≥ 1 is an iteration, γ draft steps + one target call on γ+1 tokens + the
    loop's own work.

    The model: T_target(k) = target_step_s·(1 + target_slope·(k − 1)) (``target_step_s``
    is the target's call on one token), a draft step draft_c·target_step_s, and
    ``overhead_s``, the loop's own work per step (sampling, commit, the host), which
    the target decoding alone pays as well: γ = 0 costs target_step_s + overhead_s.
    ``measured_s``: per-step times measured at some γ; those are used as they are. An
    unmeasured γ ≥ 1 between two measured γ (γ = 0 among them) lies on the straight line
    between them: the measured curve is not straight (in the compiled loop the first
    drafted token costs about half what each later one does), and a line through the
    model missed that. Beyond the largest measured γ ≥ 1 the curve goes on along its last
    measured segment (a cheap first token would otherwise make longer blocks look cheap);
    with only one measured point it takes the model's figure scaled by measured / model
    at the nearest measured γ ≥ 1 (the curve's shape from the model, its level from
    measurement).
    """
    if gamma_max < 0:
        raise ValueError(f"gamma_max must be >= 0, got {gamma_max}")
    if target_step_s <= 0 or draft_c < 0 or target_slope < 0 or overhead_s < 0:
        raise ValueError(
            "need target_step_s > 0 and draft_c, target_slope, overhead_s >= 0, got "
            f"{target_step_s}, {draft_c}, {target_slope}, {overhead_s}"
        )
    measured = {g: s for g, s in (measured_s or {}).items() if 0 <= g <= gamma_max}

    def model(g: int) -> float:
        if g == 0:
            return target_step_s + overhead_s
        target = target_step_s * (1.0 + target_slope * g)
        return target + g * draft_c * target_step_s + overhead_s

    anchors = sorted(g for g in measured if g >= 1)
    costs = {}
    for g in range(gamma_max + 1):
        below = [a for a in measured if a < g]
        above = [a for a in measured if a > g]
        if g in measured:
            costs[g] = float(measured[g])
        elif g >= 1 and ((below and above) or len(below) >= 2):
            costs[g] = along_segments(measured, g)
        elif g >= 1 and anchors:
            near = min(anchors, key=lambda a: (abs(a - g), a))
            costs[g] = model(g) * measured[near] / model(near)
        else:
            costs[g] = model(g)
    return costs


def along_segments(points: Mapping[int, float], x: int) -> float:
    """The value at ``x`` of the piecewise-linear curve through ``points`` (x -> value): on
    the line between the nearest points below and above ``x``; past the largest, along the
    last segment, never below the last point (a cost does not fall with more tokens).
    ``iteration_costs`` prices untimed block lengths with it, and a job's prediction the
    verification sizes its cost probe did not time (``pipelines.job_prediction``)."""
    if x in points:
        return float(points[x])
    below = sorted(k for k in points if k < x)
    above = [k for k in points if k > x]
    if below and above:
        low, high = below[-1], min(above)
        return float(points[low] + (x - low) / (high - low) * (points[high] - points[low]))
    if len(below) < 2:
        raise ValueError(f"no segment of {sorted(points)} reaches {x}")
    last, before = below[-1], below[-2]
    per_step = max((points[last] - points[before]) / (last - before), 0.0)
    return float(points[last] + (x - last) * per_step)


def gamma_improvements(betas, costs: Mapping[int, float]) -> dict[int, float]:
    """The expected wall-time improvement of each γ over the target alone (Theorem 3.8
    generalised): expected tokens per step from the βs over the step's cost, relative
    to γ = 0 (one token per ``costs[0]``)."""
    if 0 not in costs:
        raise ValueError("need the target-alone step cost costs[0]")
    return {
        g: expected_tokens_by_position(betas, g) * costs[0] / costs[g]
        for g in sorted(costs)
        if g <= len(betas)
    }


def choose_gamma(betas, costs: Mapping[int, float]) -> int:
    """The γ (0 = the target decodes alone) with the highest expected tokens per second;
    the smallest γ among ties."""
    improvements = gamma_improvements(betas, costs)
    return max(improvements, key=lambda g: (improvements[g], -g))
