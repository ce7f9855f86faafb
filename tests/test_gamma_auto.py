"""``--gamma auto``: the pure chooser (specdec_core.theory), the online policy
(workers.gamma.AdaptiveGamma), greedy identity with the target alone, and exactness of
the output distribution while γ changes from batch to batch (a G-test as in
tests/test_exactness.py, with its negative control)."""

import dataclasses
import pathlib

import numpy as np
import pytest

from specdec_core import acceptance, decoding, theory
from specdec_core.models import bound, registry, table
from specdec_core.sampling import SamplingConfig
from tests import stub_models
from tests import test_exactness as exact
from tests.stub_models import bound as bind_table
from workers.batching import DecodeSettings, Request, pack
from workers.engine import InProcessEngine
from workers.gamma import MAX_SLOPE, SHARED_SLOTS_MAX_ROWS, AdaptiveGamma, GammaPrior
from workers.gamma import STALE_BATCHES as STALE
from workers.spec import ModelSpec
from workers.step_times import StepTimes

# ---------------------------------------------------------------- the pure chooser


def test_expected_tokens_by_position_generalises_equation_1():
    for alpha in (0.0, 0.4, 0.9):
        for gamma in (1, 3, 5):
            assert theory.expected_tokens_by_position([alpha] * 5, gamma) == pytest.approx(
                theory.expected_tokens(alpha, gamma)
            )
    # Not i.i.d.: 1 + β1 + β1β2 + β1β2β3.
    assert theory.expected_tokens_by_position([0.8, 0.5, 0.25], 3) == pytest.approx(
        1 + 0.8 + 0.4 + 0.1
    )
    assert theory.expected_tokens_by_position([0.8], 0) == 1.0
    with pytest.raises(ValueError, match="gamma"):
        theory.expected_tokens_by_position([0.5], 2)
    with pytest.raises(ValueError, match="β"):
        theory.expected_tokens_by_position([1.5], 1)


def test_position_tests_follow_algorithm_1():
    # 10 iterations at γ=3: position 1 accepted 6 times, 2 three times, 3 once.
    tests, passes = theory.position_tests([6, 3, 1], 10)
    assert tests.tolist() == [10, 6, 3] and passes.tolist() == [6, 3, 1]
    # Per row ([B, γ] and [B]) sums the same.
    tests2, passes2 = theory.position_tests([[4, 2, 1], [2, 1, 0]], [6, 4])
    assert tests2.tolist() == tests.tolist() and passes2.tolist() == passes.tolist()


def test_position_acceptance_shrinks_to_the_pooled_rate():
    tests, passes = np.array([1000.0, 500.0]), np.array([500.0, 100.0])
    betas = theory.position_acceptance(
        tests, passes, prior_alpha=0.9, prior_strength=1.0, positions=4
    )
    # With many tests each position reads as its own rate ...
    assert betas[0] == pytest.approx(0.5, abs=2e-3) and betas[1] == pytest.approx(0.2, abs=2e-3)
    # ... an untested position as the pooled rate (600/1500), barely moved by the prior.
    assert betas[2] == betas[3] == pytest.approx(0.4, abs=1e-3)
    # Nothing measured: the prior.
    assert theory.position_acceptance(
        [], [], prior_alpha=0.3, prior_strength=5, positions=2
    ) == pytest.approx([0.3, 0.3])
    with pytest.raises(ValueError, match="passes"):
        theory.position_acceptance([1], [2], prior_alpha=0.5, prior_strength=1, positions=1)


def test_iteration_costs_model_and_measured_anchor():
    model = theory.iteration_costs(
        3, target_step_s=2.0, draft_c=0.1, target_slope=0.5, overhead_s=0.2
    )
    # γ=2: target on 3 tokens 2·(1 + 0.5·2) + 2 draft steps 2·0.2 + 0.2; the target
    # alone pays the loop's work too: 2 + 0.2.
    assert model[0] == pytest.approx(2.2) and model[2] == pytest.approx(4.0 + 0.4 + 0.2)
    measured = theory.iteration_costs(
        3,
        target_step_s=2.0,
        draft_c=0.1,
        target_slope=0.5,
        overhead_s=0.2,
        measured_s={1: 6.0},
    )
    # γ=1 as measured, the others scaled by measured / model at γ=1.
    assert measured[1] == 6.0
    assert measured[3] == pytest.approx(model[3] * 6.0 / model[1])
    assert measured[0] == pytest.approx(2.2)


def test_chooser_picks_the_target_alone_for_a_useless_draft():
    costs = theory.iteration_costs(4, target_step_s=1.0, draft_c=0.05, target_slope=0.1)
    assert theory.choose_gamma([0.02] * 4, costs) == 0
    # Even a free draft does not pay when verification costs as much as decoding alone.
    steep = theory.iteration_costs(4, target_step_s=1.0, draft_c=0.0, target_slope=1.0)
    assert theory.choose_gamma([0.6] * 4, steep) == 0


def test_chooser_picks_long_blocks_for_a_good_cheap_draft():
    costs = theory.iteration_costs(6, target_step_s=1.0, draft_c=0.02, target_slope=0.02)
    gamma = theory.choose_gamma([0.9] * 6, costs)
    assert gamma >= 4
    # Matches the paper's optimum when T(k) is flat and there is no overhead.
    flat = theory.iteration_costs(12, target_step_s=1.0, draft_c=0.05, target_slope=0.0)
    assert theory.choose_gamma([0.8] * 12, flat) == theory.optimal_gamma(0.8, 0.05, max_gamma=12)
    # Acceptance that falls with the position shortens the block.
    falling = [0.9, 0.9, 0.1, 0.1, 0.1, 0.1]
    assert theory.choose_gamma(falling, costs) == 2
    improvements = theory.gamma_improvements(falling, costs)
    assert improvements[0] == 1.0 and improvements[2] == max(improvements.values())


# ---------------------------------------------------------------- the online policy


def _observe(policy, gamma, *, per_position, iterations=100, seconds_per_step=1.0):
    counts = [iterations]
    for beta in per_position[:gamma]:
        counts.append(counts[-1] * beta)
    policy.observe(
        gamma,
        seconds=seconds_per_step * iterations,
        steps=iterations,
        accepted_by_position=np.array(counts[1:]) if gamma else None,
        iterations=iterations,
    )


def test_policy_drops_to_the_target_alone_when_nothing_is_accepted():
    policy = AdaptiveGamma(4, prior=GammaPrior(alpha=0.6))
    assert policy.choose() >= 1  # the prior says the draft might pay
    _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    gamma = policy.choose()
    _observe(policy, gamma, per_position=[0.0] * 4, seconds_per_step=1.3)
    assert policy.betas()[0] < 0.2
    assert policy.choose() == 0
    assert policy.histogram() == {0: 1, gamma: 1}


def test_policy_follows_the_measured_acceptance_and_costs():
    policy = AdaptiveGamma(4, prior=GammaPrior(alpha=0.3))
    _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    for _ in range(5):  # a draft that is almost always right and costs little
        gamma = policy.choose()
        _observe(policy, gamma, per_position=[0.95] * 4, seconds_per_step=1.0 + 0.08 * gamma)
    assert policy.choose() == 4
    assert policy.improvements()[4] > 2.5
    # Now verification turns expensive: γ shrinks.
    policy = AdaptiveGamma(4, prior=GammaPrior(alpha=0.3))
    _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    for gamma in (1, 2, 3, 4):
        _observe(policy, gamma, per_position=[0.6] * 4, seconds_per_step=1.0 + 0.4 * gamma)
    assert policy.choose() == 1


def test_the_loops_own_steps_price_the_blocks_not_yet_run():
    """A compiled loop does not time its draft calls apart: the draft's c comes from its
    measured steps. Priced with the draft call's own cost (the prior's c = 0.03) longer
    blocks looked cheap, and the job ran γ = 3-4 where γ = 1 was the fastest."""
    prior = GammaPrior(alpha=0.4, draft_c=0.03, target_slope=0.0, overhead=0.3)
    policy = AdaptiveGamma(4, prior=prior)
    assert policy.fitted_c() is None  # nothing measured: the prior's c
    _observe(policy, 0, per_position=[], seconds_per_step=1.3)  # a call + the loop's 0.3
    _observe(policy, 1, per_position=[0.4], iterations=400, seconds_per_step=1.5)
    assert policy.fitted_c() == pytest.approx(0.2)  # (1.5 - 1.3) / 1 call per drafted token
    assert policy.costs()[3] == pytest.approx(1.3 + 3 * 0.2)
    assert policy.choose() == 1
    # a γ = 1 step measured below γ = 0's (noise; the first drafted token nearly free)
    # fits c = 0, never a negative cost
    noisy = AdaptiveGamma(4, prior=prior)
    _observe(noisy, 0, per_position=[], seconds_per_step=1.3)
    _observe(noisy, 1, per_position=[0.4], seconds_per_step=1.25)
    assert noisy.fitted_c() == 0.0


def test_a_block_length_next_to_the_chosen_one_is_timed_before_it_is_ruled_out():
    """An untimed γ is priced by a linear model of a drafted token's cost; where it comes
    within 10% of the best, one batch in ``explore_every`` times it (the first drafted
    token costs less than the model says, and γ = 1 was the fastest)."""
    prior = GammaPrior(alpha=0.4, draft_c=0.03, target_slope=0.0, overhead=0.3)
    policy = AdaptiveGamma(4, prior=prior, explore_every=2)
    _observe(policy, 0, per_position=[], seconds_per_step=1.3)
    _observe(policy, 2, per_position=[0.4] * 2, seconds_per_step=1.6)
    assert policy.choose() == 2  # the best estimate; not an exploring batch
    _observe(policy, 2, per_position=[0.4] * 2, seconds_per_step=1.6)
    assert policy.choose() == 1  # estimated 1.26 against γ = 2's 1.27: timed now
    _observe(policy, 1, per_position=[0.4], iterations=60, seconds_per_step=1.32)
    assert policy.choose() == 1  # measured: the first drafted token is nearly free
    _observe(policy, 1, per_position=[0.4], iterations=60, seconds_per_step=1.32)
    assert policy.choose() == 1  # timed enough: no more exploring next to it
    # a neighbour far below the best is never tried
    sure = AdaptiveGamma(4, prior=prior, explore_every=2)
    _observe(sure, 0, per_position=[], seconds_per_step=1.3)
    _observe(sure, 1, per_position=[0.9], seconds_per_step=1.3)
    _observe(sure, 4, per_position=[0.9] * 4, seconds_per_step=1.35)
    assert [sure.choose() for _ in range(3)] == [4, 4, 4]


def test_a_dear_prior_c_does_not_keep_the_job_at_gamma_0_for_good():
    """Until a γ ≥ 1 batch is timed, "may γ = 1 still pay" prices the draft at nothing:
    a prior's c from a noisy earlier run (0.34) and one record of low acceptance (the
    untimed first batch) kept a job at γ = 0 for all 50 batches where γ = 1 paid 1.2x."""
    prior = GammaPrior(alpha=0.355, draft_c=0.341, target_slope=0.0, overhead=0.0)
    policy = AdaptiveGamma(4, prior=prior, explore_every=2)
    assert policy.choose() == 0  # the prior's gain for γ = 1 (1.01) does not pay
    _observe(policy, 0, per_position=[])
    assert policy.choose() == 1  # explored
    policy.observe(1, seconds=None, steps=12, accepted_by_position=[1], iterations=12)
    assert policy.choose() == 0  # one record accepted 1 in 12
    _observe(policy, 0, per_position=[])
    assert policy.choose() == 1  # explored: with c = 0, γ = 1 may still pay
    _observe(policy, 1, per_position=[0.35], seconds_per_step=1.02)
    assert policy.fitted_c() == pytest.approx(0.02)
    assert policy.choose() >= 1  # measured: it pays


def test_the_policy_times_a_batchs_loop_not_its_encoder():
    """γ changes only the loop: a batch's encoder and prefill, in its wall time, would
    be spread over fewer steps at longer blocks and make them look dear."""
    policy = AdaptiveGamma(2)
    batch = pack(_requests(1), DecodeSettings(gamma=2, max_new_tokens=8, batch_size=1))

    def result(loop_s):
        ones = np.ones(1, np.int32)
        return decoding.DecodeResult(
            tokens=np.zeros((1, 8), np.int32), lengths=ones * 8, iterations=ones * 8,
            drafted=ones * 0, accepted=ones * 0, accepted_by_position=np.zeros((1, 0), np.int32),
            draft_s=0.0, target_s=0.0, overhead_s=0.0, total_s=1.0, loop_s=loop_s,
        )  # fmt: skip

    for _ in range(2):  # the first batch of a shape compiles: not timed
        policy.decode_baseline(batch, lambda: result(0.4))
    assert policy.costs()[0] == pytest.approx(0.4 / 8)
    policy = AdaptiveGamma(2)
    for _ in range(2):  # an engine that does not time its loop: the wall time
        policy.decode_baseline(batch, lambda: result(float("nan")))
    assert 0.0 < policy.costs()[0] < 0.001  # the stand-in returns at once


def test_policy_explores_once_in_a_while_while_position_1_is_untested():
    policy = AdaptiveGamma(3, prior=GammaPrior(alpha=0.0), explore_every=3, explore_tests=50)
    _observe(policy, 0, per_position=[])
    assert policy.choose() == 0
    _observe(policy, 0, per_position=[])
    assert policy.choose() == 1  # the third batch in a row at 0 tries γ=1
    _observe(policy, 1, per_position=[0.0], iterations=60, seconds_per_step=1.2)
    for _ in range(5):  # position 1 now has 60 tests, all rejected: 0 from now on
        assert policy.choose() == 0
        _observe(policy, 0, per_position=[])


def test_policy_stops_exploring_a_draft_that_cannot_pay_before_its_test_quota():
    policy = AdaptiveGamma(3, prior=GammaPrior(alpha=0.5), explore_every=2, explore_tests=500)
    _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    # γ = 1 measured: 20 tests, 2 accepted, and a step 1.6x the target's. Even at the
    # upper bound (~0.2) its 1.2 tokens per 1.6 steps lose: no more exploring.
    _observe(policy, 1, per_position=[0.1], iterations=20, seconds_per_step=1.6)
    for _ in range(6):
        assert policy.choose() == 0
        _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    # The same counts with a step that costs almost nothing: γ = 1 may pay, explore.
    cheap = AdaptiveGamma(3, prior=GammaPrior(alpha=0.5), explore_every=2, explore_tests=500)
    _observe(cheap, 0, per_position=[], seconds_per_step=1.0)
    _observe(cheap, 1, per_position=[0.1], iterations=20, seconds_per_step=1.02)
    choices = []
    for _ in range(4):
        choices.append(cheap.choose())
        _observe(cheap, choices[-1], per_position=[0.1] * choices[-1], iterations=20,
                 seconds_per_step=1.0 + 0.02 * choices[-1])  # fmt: skip
    assert 1 in choices


def test_the_targets_cost_growth_follows_the_tokens_a_call_scores():
    prior = GammaPrior(target_slope=0.26)
    assert prior.slope_at(1) == pytest.approx(0.26)
    # 16 rows: a call on k = 2 scores 32 tokens against 16, 1 + 0.26·31 over 1 + 0.26·15
    assert 1 + prior.slope_at(16) == pytest.approx((1 + 0.26 * 31) / (1 + 0.26 * 15))
    slopes = [prior.slope_at(rows) for rows in (1, 2, 4, 8, 16, 64)]
    assert slopes == sorted(slopes) and slopes[-1] < 1.0
    assert GammaPrior(target_slope=0.0).slope_at(16) == 0.0
    with pytest.raises(ValueError, match="rows must be >= 1"):
        prior.slope_at(0)


@pytest.mark.parametrize("draft_c", [0.0, 0.29])
def test_policy_does_not_explore_where_verification_costs_its_length(draft_c):
    """Where a call on 2 tokens costs two calls on one (a compute-bound call), even a
    perfect draft at γ = 1 gains nothing, so no batch is spent finding out, at any
    batch; with a flatter prior (s = 0.26) the same policy explores at batch 1 (and
    would find out)."""
    for slope, rows, explores in ((1.0, 16, False), (1.0, 1, False), (0.26, 1, True)):
        prior = GammaPrior(alpha=0.39, draft_c=draft_c, target_slope=slope, overhead=0.0)
        policy = AdaptiveGamma(4, prior=prior, explore_every=2, explore_tests=64)
        choices = []
        for _ in range(6):
            choices.append(policy.choose(rows=rows))
            _observe(policy, choices[-1], per_position=[0.4] * choices[-1], iterations=4,
                     seconds_per_step=1.0 + 0.9 * choices[-1])  # fmt: skip
        assert (max(choices) > 0) == explores, (slope, rows, choices)
    prior = GammaPrior(alpha=0.39, draft_c=draft_c, target_slope=0.26)
    fresh = AdaptiveGamma(4, prior=prior)
    assert fresh.costs(rows=16)[1] > fresh.costs(rows=1)[1] > fresh.costs(rows=16)[0]


def test_a_prior_takes_what_an_earlier_run_measured():
    base = GammaPrior(alpha=0.39, draft_c=0.29, target_slope=0.15)
    # at 16 rows the target's k = 2 call cost 1.85 steps: s at batch 1 is 0.26
    at_16 = base.measured(
        alpha=0.6,
        step_costs_ms={"target": {"1": 10.0, "2": 18.5}, "draft_step": 0.3, "loop_per_step": 2.0},
        rows=16,
    )
    assert at_16.alpha == 0.6 and at_16.strength == base.strength
    assert at_16.draft_c == pytest.approx(0.03) and at_16.overhead == pytest.approx(0.2)
    assert at_16.target_slope == pytest.approx(0.26, abs=0.005)
    assert 1 + at_16.slope_at(16) == pytest.approx(1.85)
    # at batch 1 the growth per token is the slope itself, from the fewest tokens timed
    at_1 = base.measured(step_costs_ms={"target": {"1": 8.0, "4": 11.0, "2": 10.0}}, rows=1)
    assert at_1.target_slope == pytest.approx(0.25) and at_1.alpha == base.alpha
    assert at_1.draft_c == base.draft_c  # not measured: stays
    # a growth no batch-1 slope explains reads as the largest; nothing measured: unchanged
    assert base.measured(step_costs_ms={"target": {"1": 1.0, "2": 3.0}}, rows=2).target_slope == 10
    assert base.measured() == base


def test_the_newest_finished_run_of_the_same_job_gives_the_prior(tmp_path):
    from mlflow.tracking import MlflowClient

    from pipelines import previous_run, tracking

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    experiment = tracking.ensure_experiment("translate", uri)
    client = MlflowClient(tracking_uri=uri)
    same = {"target_name": "t", "draft_name": "d", "batch_size": "16", "temperature": "0.0"}

    starts = iter(range(1_000, 10_000, 1_000))  # ms: the runs' order, one per call

    def logged(params, alpha, step_ms, status="FINISHED"):
        run = client.create_run(experiment, start_time=next(starts))
        for key, value in params.items():
            client.log_param(run.info.run_id, key, value)
        client.log_metric(run.info.run_id, "alpha", alpha)
        client.log_metric(run.info.run_id, "step_cost_target_1_ms", step_ms)
        client.log_metric(run.info.run_id, "step_cost_target_2_ms", 1.85 * step_ms)
        client.log_metric(run.info.run_id, "step_cost_draft_step_ms", 0.1 * step_ms)
        client.set_terminated(run.info.run_id, status)
        return run.info.run_id

    logged(same, 0.3, 10.0)
    newest = logged(same, 0.5, 20.0)
    logged(same | {"batch_size": "1"}, 0.9, 5.0)  # another job
    logged(same, 0.9, 5.0, status="FAILED")  # did not finish
    base = GammaPrior(alpha=0.39, target_slope=0.15)
    prior, run_id = previous_run.gamma_prior(
        base, experiment_id=experiment, tracking_uri=uri, params=same | {"seed": "1"}, rows=16
    )
    assert run_id == newest
    assert prior.alpha == 0.5 and prior.draft_c == pytest.approx(0.1)
    assert prior.target_slope == pytest.approx(0.26, abs=0.005)
    assert prior.overhead == base.overhead  # that run logged no loop cost
    none = previous_run.gamma_prior(
        base,
        experiment_id=experiment,
        tracking_uri=uri,
        params=same | {"draft_name": "other"},
        rows=16,
    )
    assert none == (base, None)


def test_a_drafts_config_gives_auto_gamma_its_prior(tmp_path):
    from pipelines import configs, model_resolver
    from workers.engine import EngineConfig
    from workers.engines import build_engine

    draft = model_resolver.resolve_model("ende_draft_debian_seq2", role="draft").spec
    assert draft.gamma_prior == GammaPrior(
        alpha=0.391, draft_c=0.035, target_slope=0.03, overhead=0.3
    )
    # With that prior the first batch drafts: verifying 2 tokens costs what 1 does. With
    # the same figures and a call that costs its length, it is the target alone.
    assert AdaptiveGamma(4, prior=draft.gamma_prior).choose() >= 1
    steep = dataclasses.replace(draft.gamma_prior, target_slope=1.0)
    assert AdaptiveGamma(4, prior=steep).choose() == 0
    tiny = ModelSpec(name="t", family="t5", config=registry.get_config("t5_tiny_test"))
    engine = build_engine(
        EngineConfig(kind="inprocess"),
        target=tiny,
        draft=dataclasses.replace(tiny, name="d", gamma_prior=draft.gamma_prior),
        settings=DecodeSettings(gamma=4),
    )
    assert engine.gamma_policy.prior == draft.gamma_prior
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {vocab_size: 32}\ngamma_prior: {alpha: 1.5}\n")
    with pytest.raises(configs.ConfigError, match=r"gamma_prior\.alpha must be in \[0, 1\]"):
        configs.load_model_config(bad)


def test_policy_rejects_counts_of_the_wrong_length():
    policy = AdaptiveGamma(3)
    with pytest.raises(ValueError, match="positions"):
        policy.observe(2, seconds=1.0, steps=3, accepted_by_position=[1, 0, 0], iterations=3)
    with pytest.raises(ValueError, match="gamma"):
        policy.observe(4, seconds=1.0, steps=3)


def _row(record_id, batch, tokens, iterations, by_position):
    gamma = len(by_position)
    return {
        "id": record_id, "batch": batch, "wall_ms": 100.0, "tokens": tokens,
        "iterations": iterations, "drafted": gamma * iterations, "accepted": sum(by_position),
        "accepted_by_position": by_position, "baseline_wall_ms": 100.0,
        "baseline_tokens": tokens, "matches_baseline": True, "output": "x", "reference": "x",
    }  # fmt: skip


def test_job_summary_with_gamma_changing_between_batches():
    from pipelines import job_report

    rows = [
        _row("1", "a", 5, 5, []),  # γ=0: the target alone, 5 steps, no tests
        _row("2", "a", 4, 4, []),
        _row("3", "b", 6, 3, [2, 1]),  # γ=2: 3 iterations, 1 fully accepted
        _row("4", "c", 5, 2, [2, 1, 0, 0]),  # γ=4
    ]
    summary = job_report.compute_summary(
        rows, [], records_in=4, settings=DecodeSettings(gamma=4), compare_baseline=True,
        quality_metric="bleu",
    )  # fmt: skip
    assert summary["gamma_histogram"] == {"0": 1, "2": 1, "4": 1}
    # α from the speculative rows only: 3 + 3 accepted, tests 3 + (3 − 1) and 3 + (2 − 0).
    assert summary["alpha"] == pytest.approx(6 / 10)
    # Position i over the blocks that had it: (2 + 2) / 5, (1 + 1) / 5, then 0 / 2 twice.
    assert summary["acceptance_by_position"] == pytest.approx([0.8, 0.4, 0.0, 0.0])
    assert summary["c_estimate"] is None  # needs one γ for every batch
    alpha = 0.6
    expected = (
        9 * 1 + 3 * (1 + alpha + alpha**2) + 2 * (1 + alpha + alpha**2 + alpha**3 + alpha**4)
    ) / 14
    assert summary["predicted_tokens_per_iteration"] == pytest.approx(expected)
    metrics = job_report._numeric_metrics(summary, None)
    assert metrics["gamma_batches_0"] == 1.0 and metrics["gamma_batches_4"] == 1.0
    assert metrics["gamma_mean"] == pytest.approx(2.0)


# ---------------------------------------------------------------- greedy identity

VOCAB = 512
CONFIG = registry.get_config("t5_tiny_test", vocab_size=VOCAB)


def _requests(n: int, offset: int = 0) -> list[Request]:
    return stub_models.encoder_requests(n, VOCAB, offset)


class Scripted(AdaptiveGamma):
    """The real policy's decode path with γ taken from a script (to force changes)."""

    def __init__(self, gamma_max, script):
        super().__init__(gamma_max)
        self.script = list(script)

    def choose(self, rows: int = 1, shape=None) -> int:
        return self.script.pop(0)


@pytest.mark.slow
@pytest.mark.parametrize("draft_seed", [0, 1])  # the target itself as draft / an unrelated one
def test_auto_gamma_greedy_output_equals_the_target_alone(draft_seed):
    settings = DecodeSettings(gamma=3, max_new_tokens=10, batch_size=2)
    target = bound.load_model("target", "t5", CONFIG, init_seed=0)
    draft = bound.load_model("draft", "t5", CONFIG, init_seed=draft_seed)
    policy = AdaptiveGamma(3, prior=GammaPrior(loop_compile_s=0.0))  # compiling priced free
    engine = InProcessEngine(target, draft, settings, gamma_policy=policy)
    scripted = InProcessEngine(target, draft, settings, gamma_policy=Scripted(3, [0, 3, 1, 2]))
    plain = InProcessEngine(target, draft, settings)
    for offset in range(0, 8, 2):
        reqs = _requests(2, offset=offset)
        base = plain.generate_baseline(reqs)
        engine.generate_baseline(reqs)  # the γ=0 cost, as --compare-baseline gives it
        for auto in (engine.generate(reqs), scripted.generate(reqs)):
            assert [g.tokens for g in auto] == [g.tokens for g in base]
    assert scripted.gamma_policy.history == [0, 3, 1, 2]
    # The measured acceptance moves β̂ from the prior: up when the draft is the target
    # (everything accepted), down for an unrelated draft.
    if draft_seed == 0:
        assert policy.betas()[0] > policy.prior.alpha
    else:
        assert policy.betas()[0] < policy.prior.alpha


def test_auto_gamma_rows_report_the_gamma_they_were_decoded_at():
    settings = DecodeSettings(gamma=2, max_new_tokens=6, batch_size=2)
    target = bound.load_model("target", "t5", CONFIG, init_seed=0)
    engine = InProcessEngine(target, target, settings, gamma_policy=Scripted(2, [0, 2]))
    reqs = _requests(2)
    alone, spec = engine.generate(reqs), engine.generate(reqs)
    assert all(g.accepted_by_position == [] and g.drafted == 0 for g in alone)
    assert all(len(g.accepted_by_position) == 2 and g.drafted > 0 for g in spec)
    assert [g.tokens for g in alone] == [g.tokens for g in spec]


# ---------------------------------------------------------------- exactness while γ changes

SCRIPT = [0, 1, 2, 3, 4, 2, 0, 3, 1, 4]  # γ of each of 10 batches of 5,000 samples
PER_BATCH = exact.SAMPLES // len(SCRIPT)


def _samples_with_changing_gamma(draft: np.ndarray, config: SamplingConfig, seed: int):
    target_fn, draft_fn = (
        bind_table(table.from_table(exact.TARGET)),
        bind_table(table.from_table(draft)),
    )
    policy = Scripted(max(SCRIPT), SCRIPT)
    outputs = []
    for b in range(len(SCRIPT)):
        rows = np.tile(np.array(exact.PROMPT, np.int32), (PER_BATCH, 1))
        common = dict(
            prompt_tokens=rows,
            prompt_lengths=np.full(PER_BATCH, len(exact.PROMPT)),
            request_ids=np.arange(b * PER_BATCH, (b + 1) * PER_BATCH),
            max_new_tokens=exact.NEW_TOKENS,
            sampling_config=config,
            seed=seed,
        )
        batch = pack([Request(id="x", prompt_tokens=(0,))], DecodeSettings(gamma=4))
        result, gamma, _ = policy.decode(
            batch,
            lambda g, common=common: decoding.speculative_generate(
                target=target_fn,
                target_cache=table.init_cache(PER_BATCH, 16),
                draft=draft_fn,
                draft_cache=table.init_cache(PER_BATCH, 16),
                gamma=g,
                **common,
            ),
            lambda common=common: decoding.autoregressive_generate(
                target=target_fn, target_cache=table.init_cache(PER_BATCH, 16), **common
            ),
        )
        assert gamma == SCRIPT[b] and result.accepted_by_position.shape[1] == gamma
        assert (result.lengths == exact.NEW_TOKENS).all()
        outputs.append(result.tokens)
    return np.concatenate(outputs)


@pytest.mark.slow
@pytest.mark.parametrize(
    "draft, config",
    [
        ("related", SamplingConfig(temperature=1.0)),
        ("adversarial", SamplingConfig(temperature=0.8, top_k=3)),
    ],
)
def test_samples_follow_the_target_while_gamma_changes(draft, config):
    samples = _samples_with_changing_gamma(exact.DRAFTS[draft], config, seed=4321)
    pvalue = exact.g_test_pvalue(samples, exact.exact_distribution(exact.TARGET, config))
    assert pvalue > 1e-3, f"G-test rejects exactness under changing γ ({draft}): p={pvalue:.2e}"


@pytest.mark.slow
def test_negative_control_wrong_rule_is_caught_while_gamma_changes(monkeypatch):
    config = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(acceptance, "draft_half", exact._biased_draft_half)
    decoding.clear_compiled()
    try:
        samples = _samples_with_changing_gamma(exact.DRAFTS["independent"], config, seed=4321)
    finally:
        monkeypatch.undo()
        decoding.clear_compiled()
    pvalue = exact.g_test_pvalue(samples, exact.exact_distribution(exact.TARGET, config))
    assert pvalue < 1e-6, f"the wrong rule went undetected under changing γ (p={pvalue:.2e})"


# ---------------------------------------------------------------- the job, end to end

from tests.test_translate_job import models, run_job, tracking_uri, workdir  # noqa: E402, F401

PHASES = {"startup", "mlflow", "engine_start", "decode", "baseline", "beam_io", "report",
          "cost_probe"}  # fmt: skip


@pytest.mark.slow
def test_job_with_auto_gamma_reports_its_choices_and_time(run_job):  # noqa: F811
    job = run_job("inprocess", 0.0, "--compare-baseline", "--gamma", "auto", "--gamma-max", "3")
    assert job.code == 0 and job.dead == []
    summary = job.summary
    assert summary["identical_to_baseline"] is True  # every γ, 0 included, gives the target's
    histogram = summary["gamma_histogram"]
    assert set(histogram) <= {"0", "1", "2", "3"}
    assert sum(histogram.values()) == len({row["batch"] for row in job.rows.values()})
    assert all(len(row["accepted_by_position"]) <= 3 for row in job.rows.values())
    breakdown = summary["time_breakdown"]
    assert set(breakdown) == PHASES and all(v >= 0 for v in breakdown.values())
    assert breakdown["decode"] <= summary["job_s"]
    assert 0 < summary["first_record_s"]
    # the cost model's prediction covers the γ = 0 batches (a target-alone token each)
    assert summary["predicted_speedup"] > 0
    assert summary["efficiency"] == pytest.approx(
        summary["speedup_loop"] / summary["predicted_speedup"]
    )


def _inprocess_job(folder, pair, store_uri, name: str, *extra: str):
    """A greedy in-process translate job of the module's pair (the ``models`` fixture),
    written as ``name`` in ``folder`` and logged to ``store_uri``."""
    from pipelines.cli import main
    from tests.test_translate_job import JobRun, job_args

    output = folder / f"{name}.jsonl"
    args = job_args(
        folder / "sentences.tsv",
        output,
        models=pair,
        workers="inprocess",
        temperature=0.0,
        tracking_uri=store_uri,
    )
    return JobRun(main([*args, *extra]), output, pathlib.Path(f"{output}.summary.json"))


def test_a_second_job_starts_from_the_first_ones_figures(workdir, models, tracking_uri):  # noqa: F811
    """--gamma auto's prior comes from the newest finished run of the same job: the
    second of two identical jobs reads the first's step costs from MLflow."""
    # --no-warmup: a bought loop compiles on its batch's path, so the first job times a
    # γ ≥ 1 however fast the machine (a loop compiled in the background may be warm only
    # after this short job's last batch)
    extra = ("--compare-baseline", "--gamma", "auto", "--gamma-max", "3", "--batch-size", "3")
    extra += ("--no-warmup",)
    jobs = [
        _inprocess_job(workdir, models, tracking_uri, name, *extra)
        for name in ("prior_first", "prior_second")
    ]
    first, second = (job.summary for job in jobs)
    assert [job.code for job in jobs] == [0, 0]
    assert first["gamma_prior_run_id"] is None  # no earlier run of this job (batch 3)
    assert first["warmup_programs"] is None  # --no-warmup: nothing compiled ahead
    assert second["gamma_prior_run_id"] == first["mlflow_run_id"]
    costs = first["step_costs_ms"]
    step = costs["target"]["1"]
    # a drafted token's cost as the first job's loop paid it (its loop is timed apart)
    assert first["draft_c_loop"] is not None
    assert second["gamma_prior"]["draft_c"] == pytest.approx(first["draft_c_loop"])
    # what the first job's loops cost to compile (none, where this process had compiled
    # them already: then the tiny draft config's prior, 0, stays)
    measured = first["loop_compile_s"]
    assert measured is None or measured > 0
    assert second["gamma_prior"]["loop_compile_s"] == pytest.approx(measured or 0.0)
    assert second["gamma_prior"]["overhead"] == pytest.approx(costs["loop_per_step"] / step)
    growth = costs["target"]["2"] / step - 1.0  # at the job's 3 rows; k = 2 is always timed
    # within what a batch-1 slope can give at 3 rows (MAX_SLOPE; a noisy probe on these
    # tiny models once timed T(2) at 2.8 T(1))
    most = GammaPrior(target_slope=MAX_SLOPE).slope_at(3)
    assert GammaPrior(**second["gamma_prior"]).slope_at(3) == pytest.approx(
        min(max(growth, 0.0), most)
    )
    assert second["identical_to_baseline"] is True


def test_a_failed_prior_lookup_leaves_the_job_and_its_run_whole(
    workdir,  # noqa: F811
    models,  # noqa: F811
    tracking_uri,  # noqa: F811
    monkeypatch,
    capsys,
):
    from pipelines import previous_run

    def broken(*args, **kwargs):
        raise RuntimeError("the store refused the search")

    monkeypatch.setattr(previous_run, "gamma_prior", broken)
    job = _inprocess_job(workdir, models, tracking_uri, "prior_broken", "--gamma", "auto")
    assert job.code == 0 and job.dead == []
    assert "could not read an earlier run's figures (RuntimeError: the store refused" in (
        capsys.readouterr().err
    )
    summary = job.summary
    assert summary["mlflow_error"] is None and summary["mlflow_run_id"]  # logged all the same
    assert summary["gamma_prior_run_id"] is None


def test_a_new_encoder_width_of_a_compiled_program_shape_is_timed():
    """Caches pad their source to api.source_width, so a batch whose encoder width is new
    but whose decode loop is compiled needs no untimed run: its time counts."""
    policy = AdaptiveGamma(2)
    settings = DecodeSettings(gamma=2, max_new_tokens=8, batch_size=1)

    def batch(width):
        return pack([Request(id="r", prompt_tokens=(0,), encoder_tokens=(5,) * width)], settings)

    short, long = batch(10), batch(30)
    assert short.shape() != long.shape() and short.program_shape() == long.program_shape()
    calls = []

    def baseline(loop_s):
        def run():
            calls.append(loop_s)
            ones = np.ones(1, np.int32)
            return decoding.DecodeResult(
                tokens=np.zeros((1, 8), np.int32), lengths=ones * 8, iterations=ones * 8,
                drafted=ones * 0, accepted=ones * 0,
                accepted_by_position=np.zeros((1, 0), np.int32),
                draft_s=0.0, target_s=0.0, overhead_s=0.0, total_s=1.0, loop_s=loop_s,
            )  # fmt: skip

        return run

    policy.decode_baseline(short, baseline(0.4))  # compiles: not timed
    policy.decode_baseline(long, baseline(0.8))  # its loop is compiled: timed, run once
    assert calls == [0.4, 0.8]
    assert policy.costs()[0] == pytest.approx(0.8 / 8)


def test_costs_between_two_timed_block_lengths_lie_on_the_line_between_them():
    """The compiled loop's first drafted token costs about half what each later one does,
    so the γ between two timed ones are interpolated, not priced by the linear model."""
    costs = theory.iteration_costs(
        4, target_step_s=1.0, draft_c=0.1, target_slope=0.0, measured_s={0: 1.0, 1: 1.02, 4: 1.5}
    )
    assert costs[2] == pytest.approx(1.02 + 0.48 / 3) and costs[3] == pytest.approx(1.02 + 0.96 / 3)
    # beyond the largest timed γ: along the last timed segment
    tail = theory.iteration_costs(
        4, target_step_s=1.0, draft_c=0.1, target_slope=0.0, measured_s={0: 1.0, 1: 1.02, 2: 1.3}
    )
    assert tail[4] == pytest.approx(1.3 + 2 * 0.28)
    # with one timed γ >= 1 alone: the model, scaled at it
    alone = theory.iteration_costs(
        4, target_step_s=1.0, draft_c=0.1, target_slope=0.0, measured_s={2: 1.3}
    )
    assert alone[4] == pytest.approx(1.4 * 1.3 / 1.2)


def test_gamma_1_is_timed_to_anchor_the_curve_while_a_longer_block_is_best():
    """While the best is γ >= 2 and γ = 1 is untimed but estimated within 20% of it, an
    exploring batch times γ = 1 (before the neighbours within 10%): the linear model
    prices γ = 1 too dear, and a job that a noisy prior started at γ = 4 had walked down
    one γ at a time (42 of 50 batches at γ = 4, 1.05x, where γ = 1 gave 1.22x)."""
    prior = GammaPrior(alpha=0.4, draft_c=0.05, target_slope=0.0, overhead=0.0)
    policy = AdaptiveGamma(4, prior=prior, explore_every=2)
    _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    _observe(policy, 3, per_position=[0.4, 0.7, 0.7], seconds_per_step=1.25)
    gains = policy.improvements()
    assert max(gains, key=gains.get) == 3
    assert 0.8 * gains[3] <= gains[1] < 0.9 * gains[3] <= gains[2]  # only the anchor rule
    assert policy.choose() == 3  # not an exploring batch (one in explore_every = 2)
    _observe(policy, 3, per_position=[0.4, 0.7, 0.7], seconds_per_step=1.25)
    assert policy.choose() == 1  # γ = 2, next to the best, would have been tried before
    _observe(policy, 1, per_position=[0.4], iterations=60, seconds_per_step=1.01)
    assert policy.costs()[2] == pytest.approx(1.13)  # between γ = 1 and γ = 3, timed
    assert policy.costs()[4] == pytest.approx(1.37)  # along the γ = 1 to 3 segment
    gains = policy.improvements()
    assert policy.choose() == max(gains, key=gains.get) != 4


def _stub_result(loop_s, compile_s=float("nan"), gamma=0):
    ones = np.ones(1, np.int32)
    return decoding.DecodeResult(
        tokens=np.zeros((1, 8), np.int32), lengths=ones * 8, iterations=ones * 8,
        drafted=ones * gamma, accepted=ones * 0,
        accepted_by_position=np.zeros((1, gamma), np.int32),
        draft_s=0.0, target_s=0.0, overhead_s=0.0, total_s=1.0, loop_s=loop_s,
        compile_s=compile_s,
    )  # fmt: skip


def test_a_new_gamma_is_decoded_once_and_its_compiling_batch_not_timed():
    """Exploring a γ costs no second decode of the batch: the batch that compiles its
    program runs once, and its time (compiling included) does not price that γ."""
    settings = DecodeSettings(gamma=2, max_new_tokens=8, batch_size=1)
    batch = pack([Request(id="r", prompt_tokens=(0,), encoder_tokens=(5,) * 10)], settings)
    policy = AdaptiveGamma(2)
    calls = []

    def speculative(gamma):
        calls.append(gamma)
        return _stub_result(0.5, compile_s=0.3 if len(calls) == 1 else 0.0, gamma=gamma)

    policy.choose = lambda rows=1, shape=None: 1  # the pick is not what is tested here
    policy.decode(batch, speculative, lambda: _stub_result(0.4))
    assert calls == [1] and policy.costs()[1] != pytest.approx(0.5 / 8)
    assert 1 not in {g for g, (_, n) in policy._time.items() if n > 0}  # not timed
    policy.decode(batch, speculative, lambda: _stub_result(0.4))
    assert calls == [1, 1] and policy._time.get(1) == (0.5, 8)  # compiled now: timed


def test_a_new_program_that_compiled_nothing_is_timed():
    """A (γ, shape) new to the policy whose program this process already holds (an
    earlier job's): the engine measured no compiling, so its first batch is timed."""
    settings = DecodeSettings(gamma=2, max_new_tokens=8, batch_size=1)
    batch = pack([Request(id="r", prompt_tokens=(0,), encoder_tokens=(5,) * 10)], settings)
    policy = AdaptiveGamma(2)
    policy.decode_baseline(batch, lambda: _stub_result(0.4, compile_s=0.0))
    assert policy._time.get(0) == (0.4, 8)


def _loop_batch(width: int):
    settings = DecodeSettings(gamma=2, max_new_tokens=8, batch_size=1)
    return pack([Request(id="r", prompt_tokens=(0,), encoder_tokens=(5,) * width)], settings)


def test_a_shape_runs_the_target_alone_until_it_has_forgone_its_loops_compiling():
    """Compiling bought like skis: a shape without a speculative loop runs at γ = 0, each
    batch adding what speculation would have saved on it, until that reaches the loop's
    compile cost; then its loop is compiled. Another shape starts again from nothing."""
    prior = GammaPrior(alpha=0.9, draft_c=0.05, target_slope=0.0, loop_compile_s=1.0)
    policy = AdaptiveGamma(2, prior=prior)
    assert policy.choose() >= 1  # the draft pays, compiling aside
    short, other = _loop_batch(10), _loop_batch(100)
    gammas = []

    def speculative(gamma):
        gammas.append(gamma)
        return _stub_result(0.3, compile_s=0.5 if len(gammas) == 1 else 0.0, gamma=gamma)

    def baseline():
        return _stub_result(0.4, compile_s=0.0)

    savings = []  # the optimistic estimates, which the forgone seconds add up
    saving = policy._saving

    def recorded(rows, optimistic=True):
        share = saving(rows, optimistic)
        if optimistic:
            savings.append(share)
        return share

    policy._saving = recorded
    chosen = [policy.decode(short, speculative, baseline)[1] for _ in range(40)]
    paid = chosen.index(next(g for g in chosen if g >= 1))
    assert paid >= 2 and len(savings) == paid and all(0 < s < 1 for s in savings)
    # the first batch at γ ≥ 1 is the one after the forgone seconds reached 1 s
    forgone = np.cumsum([0.4 * s for s in savings])
    assert forgone[-1] >= 1.0 > forgone[-2]
    later = chosen[paid:]  # speculation, but for the target alone timed afresh now and then
    assert all(g == 0 for g in chosen[:paid]) and all(g >= 1 for g in later[: STALE - 1])
    assert 1 <= sum(g == 0 for g in later) <= 1 + len(later) // STALE
    assert policy._loop_compiles == [0.5]  # measured: the next shape weighs 0.5 s
    first_other = [policy.decode(other, speculative, baseline)[1] for _ in range(3)]
    assert first_other[0] == 0


def test_a_draft_that_cannot_pay_forgoes_nothing_and_a_free_compile_speculates_at_once():
    free = AdaptiveGamma(2, prior=GammaPrior(alpha=0.9, draft_c=0.05, loop_compile_s=0.0))
    assert free.choose(shape=_loop_batch(10).program_shape()) >= 1
    hopeless = AdaptiveGamma(2, prior=GammaPrior(alpha=0.0, draft_c=1.0), explore_tests=0)
    shape = _loop_batch(10).program_shape()
    for _ in range(20):
        _, gamma, _ = hopeless.decode(
            _loop_batch(10), lambda g: _stub_result(0.3, gamma=g), lambda: _stub_result(0.4)
        )
        assert gamma == 0
    assert hopeless._forgone[shape] == 0.0


def test_a_short_job_never_buys_a_loop_it_cannot_earn_back():
    """With the job's batch count known, a loop is bought only while the batches left,
    each saving what the last γ = 0 batch would have, could pay its compiling."""
    prior = GammaPrior(alpha=0.9, draft_c=0.05, target_slope=0.0, loop_compile_s=1.0)

    def chosen(batches):
        policy = AdaptiveGamma(2, prior=prior, batches=batches)
        return [
            policy.decode(
                _loop_batch(10),
                lambda g: _stub_result(0.3, compile_s=0.0, gamma=g),
                lambda: _stub_result(0.4, compile_s=0.0),
            )[1]
            for _ in range(batches)
        ]

    long_job, short_job = chosen(60), chosen(6)
    assert any(g >= 1 for g in long_job) and long_job[0] == 0
    assert short_job == [0] * 6  # forgone 1 s after 5 batches, one left


def test_a_batch_the_warmup_compiled_beside_prices_its_gamma_only_until_a_clean_one_does():
    """The first batches, at γ = 0 while the warm-up compiles the loops on the same
    cores (and the job's daemons start), are slower than the target alone is: priced
    from them, γ = 0 read dearer, and a draft that does not pay at batch 1 ran at γ = 4
    for a whole job. A contended batch's seconds stand in only while its γ has no clean
    ones, old batches age out, and γ = 0 timed long ago or only beside the warm-up is
    timed again on an exploring batch."""
    times = StepTimes()
    times.add(0, 2.0, 10, contended=True)
    assert times.get(0) == (2.0, 10) and times.stale(0, after=24) and times.clean_steps(0) == 0
    times.add(0, 1.0, 10)
    times.add(0, 5.0, 10, contended=True)  # the clean ones price γ = 0 now
    assert times.get(0) == (1.0, 10) and not times.stale(0, after=24)
    times.add(2, 3.0, 4, contended=True)
    assert list(times.items()) == [(0, (1.0, 10)), (2, (3.0, 4))] and times.get(1) == (0.0, 0)
    assert not times.stale(1, after=1)  # never timed: nothing to time again

    # old batches age out: a γ is priced from the job's last `horizon` batches
    times = StepTimes(horizon=4)
    times.add(0, 3.0, 1)  # a slow first batch
    for _ in range(4):
        times.add(1, 1.0, 1)
    assert times.get(0) == (3.0, 1)  # the newest of γ = 0, however old
    assert times.stale(0, after=4) and not times.stale(0, after=5)
    times.add(0, 1.0, 1)
    assert times.get(0) == (1.0, 1) and times.get(1) == (3.0, 3)

    prior = GammaPrior(alpha=0.4, draft_c=0.05, target_slope=0.0, overhead=0.0)
    policy = AdaptiveGamma(4, prior=prior, explore_every=2)
    policy.observe(0, seconds=2.0 * 100, steps=100, contended=True)  # twice the true cost
    _observe(policy, 1, per_position=[0.4], seconds_per_step=1.5)
    for _ in range(2):
        _observe(policy, 2, per_position=[0.4, 0.4], seconds_per_step=1.7)
    assert policy.costs()[0] == pytest.approx(2.0)  # only the contended batch prices γ = 0
    assert policy.choose() >= 1  # against a target alone twice as dear, the draft pays
    _observe(policy, 2, per_position=[0.4, 0.4], seconds_per_step=1.7)
    assert policy.choose() == 0  # the exploring batch times the target alone again
    _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    assert policy.costs()[0] == pytest.approx(1.0)
    assert policy.choose() == 0  # at its own cost the target alone is faster


def test_a_loop_costs_its_programs_compile_one_per_gamma_beyond_a_few_rows():
    """A few rows share one loop program for every γ; more rows compile one per γ, and a
    shape's loop is bought only once it has forgone that many programs' compiling: at
    batch 16 a job bought four programs' compiling (tens of seconds beside its
    batches) on the estimate of one, and then ran every batch at γ = 0."""
    policy = AdaptiveGamma(4, prior=GammaPrior(loop_compile_s=1.0))
    shape = ("shape",)
    policy._forgone[shape] = 2.0  # two programs' compiling forgone
    assert policy._loop_paid(shape, rows=SHARED_SLOTS_MAX_ROWS)
    assert not policy._loop_paid(shape, rows=SHARED_SLOTS_MAX_ROWS + 1)  # needs 4
    policy._forgone[shape] = 4.0
    assert policy._loop_paid(shape, rows=16)


@pytest.mark.parametrize(("step_s", "expected"), [(1.27, 0), (1.15, 1)])
def test_a_gamma_that_barely_beats_the_target_alone_steps_aside(step_s, expected):
    """γ = 1 at α = 0.3 yields 1.3 tokens per step: at 1.27 target steps per step its
    loop is 2% faster, within the timers' noise and short of the draft's per-batch
    set-up, so the target alone runs; at 1.15 it is 13% faster and runs."""
    policy = AdaptiveGamma(1, prior=GammaPrior(alpha=0.3, strength=1.0))
    _observe(policy, 0, per_position=[], seconds_per_step=1.0)
    _observe(policy, 1, per_position=[0.3], iterations=400, seconds_per_step=step_s)
    assert policy.improvements()[1] == pytest.approx(1.3 / step_s, rel=0.02)
    assert policy.choose() == expected
