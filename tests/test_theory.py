"""The paper's formulas (Leviathan et al., 2023, Section 3) and the measured cost model."""

import numpy as np
import pytest

from specdec_core import theory


def test_expected_tokens_matches_capped_geometric_sum():
    # E[#tokens] = Σ_{i=0..γ} α^i: i accepted drafts each with probability α, plus one.
    for alpha in [0.0, 0.3, 0.75, 0.99]:
        for gamma in [1, 3, 7]:
            assert theory.expected_tokens(alpha, gamma) == pytest.approx(
                sum(alpha**i for i in range(gamma + 1))
            )
    assert theory.expected_tokens(1.0, 5) == 6.0


def test_paper_example_alpha_075_gamma_7_c_002():
    alpha, gamma, c = 0.75, 7, 0.02
    tokens = (1 - 0.75**8) / 0.25
    assert theory.expected_tokens(alpha, gamma) == pytest.approx(3.59954834, rel=1e-8)
    assert theory.walltime_improvement(alpha, gamma, c) == pytest.approx(tokens / 1.14)
    assert theory.walltime_improvement(alpha, gamma, c) == pytest.approx(3.1575, abs=1e-4)
    # Theorem 3.11 with ĉ = 0 (draft ops negligible): (γ + 1)(1 − α)/(1 − α^(γ+1)).
    assert theory.arithmetic_ops_increase(alpha, gamma, 0.0) == pytest.approx(8 / tokens)


def test_optimal_gamma_is_argmax_and_beats_the_lower_bound():
    for alpha, c in [(0.75, 0.02), (0.6, 0.05), (0.9, 0.01), (0.5, 0.3)]:
        best = theory.optimal_gamma(alpha, c)
        values = [theory.walltime_improvement(alpha, g, c) for g in range(1, 65)]
        assert best == int(np.argmax(values)) + 1
        # Corollary 3.9: with α > c some γ improves by at least (1 + α)/(1 + c).
        assert max(values) >= (1 + alpha) / (1 + c) - 1e-12
    # At α=0.75, c=0.02 the improvement peaks at γ=9 (3.199×), above γ=7 (3.158×).
    assert theory.optimal_gamma(0.75, 0.02) == 9


def test_beta_and_alpha():
    p = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    q = np.array([[0.25, 0.25, 0.5], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(theory.beta(p, q), [0.5, 1.0])
    assert theory.alpha(p, q) == pytest.approx(0.75)


def test_cost_model_reduces_to_theorem_3_8_when_verification_is_free():
    costs = theory.StepCosts(target_s={1: 0.010, 4: 0.010, 8: 0.010}, draft_step_s=0.0002)
    assert costs.c == pytest.approx(0.02)
    assert theory.predicted_speedup(0.75, 7, costs) == pytest.approx(
        theory.walltime_improvement(0.75, 7, 0.02)
    )


def test_cost_model_charges_verification_and_overhead():
    costs = theory.StepCosts(
        target_s={1: 0.010, 4: 0.015, 8: 0.025}, draft_step_s=0.0005, overhead_s=0.001
    )
    expected = theory.expected_tokens(0.8, 3) * 0.010 / (3 * 0.0005 + 0.015 + 0.001)
    assert theory.predicted_speedup(0.8, 3, costs) == pytest.approx(expected)
    assert theory.best_gamma(0.8, costs) == 3  # k=8 costs 2.5 target steps: too dear at α=0.8
    with pytest.raises(ValueError, match="k=6"):
        theory.predicted_speedup(0.8, 5, costs)


@pytest.mark.parametrize("alpha, gamma", [(-0.1, 3), (1.5, 3), (0.5, 0)])
def test_bad_arguments_are_rejected(alpha, gamma):
    with pytest.raises(ValueError):
        theory.expected_tokens(alpha, gamma)


def test_cost_model_charges_baseline_overhead_per_gamma_overhead_and_request_costs():
    costs = theory.StepCosts(
        target_s={1: 0.010, 3: 0.013, 4: 0.015},
        draft_step_s=0.0005,
        overhead_s={3: 0.004},
        baseline_overhead_s=0.001,
        target_fixed_s=0.020,
        draft_fixed_s=0.005,
    )
    per_token = (3 * 0.0005 + 0.015 + 0.004) / theory.expected_tokens(0.6, 3)
    assert theory.predicted_speedup(0.6, 3, costs) == pytest.approx(0.011 / per_token)
    assert theory.predicted_speedup(0.6, 3, costs, tokens_per_request=20) == pytest.approx(
        (0.020 + 20 * 0.011) / (0.025 + 20 * per_token)
    )
    # γ=2 has a target time but no measured overhead: it is neither predicted nor chosen.
    with pytest.raises(ValueError, match="no measured loop overhead for gamma=2"):
        theory.predicted_speedup(0.6, 2, costs)
    assert theory.best_gamma(0.99, costs) == 3
    with pytest.raises(ValueError, match="tokens_per_request"):
        theory.predicted_speedup(0.6, 3, costs, tokens_per_request=0)


def test_empirical_alpha_recovers_alpha_where_accepted_per_drafted_does_not():
    # Algorithm 1 under the paper's model: each of γ tests accepts with probability α,
    # until the first rejection. 20,000 iterations at α = 0.6, γ = 4.
    rng = np.random.default_rng(0)
    alpha, gamma, iterations = 0.6, 4, 20_000
    accepts = rng.random((iterations, gamma)) < alpha
    n_accepted = np.where(accepts.all(1), gamma, np.argmin(accepts, 1))  # leading run
    accepted, full = int(n_accepted.sum()), int((n_accepted == gamma).sum())
    estimate = theory.empirical_alpha(accepted, iterations, full)
    assert estimate == pytest.approx(alpha, abs=0.01)  # sd ≈ 0.0023 over ~43,500 tests
    per_drafted = accepted / (gamma * iterations)
    expected = (theory.expected_tokens(alpha, gamma) - 1) / gamma  # (τ − 1) / γ
    assert per_drafted == pytest.approx(expected, abs=0.01)
    assert per_drafted < alpha - 0.15  # the biased ratio is far below α at γ = 4
    assert theory.acceptance_tests(accepted, iterations, full) == accepted + iterations - full
    assert theory.empirical_alpha(0, 0, 0) is None
    assert theory.empirical_alpha(3, 3, 3) == 1.0  # every test accepted
