"""``--gamma auto``: the draft length chosen per batch from what the job has measured.

:class:`AdaptiveGamma` is the engines' policy object. Before each batch it picks
γ ∈ {0, 1, …, γ_max} by :func:`specdec_core.theory.choose_gamma`: expected tokens per
loop step from per-position acceptance β_i (:func:`theory.position_acceptance`) over
the step's cost (:func:`theory.iteration_costs`), relative to the target decoding
alone (γ = 0). After each batch the engine reports what it measured
(:meth:`AdaptiveGamma.observe`): acceptance counts per position, and seconds per
loop step: its decode loop's (``DecodeResult.loop_s``; the encoder and prefill cost the
same at any γ) else its wall seconds, over its loop steps, from its recent batches, those
the warm-up compiled beside only where there is no other (:mod:`workers.step_times`).

γ = 0 runs the target alone for that batch: the same tokens as the baseline (the
baseline is the target). Under the paper's rule at a temperature above 0 the target alone
would draw other samples than the speculative loop (``SamplingConfig.drafts_bonus``: there
every token is the draft's proposal, tested), so there γ = 0 is the loop with nothing but
the bonus position drafted (``speculative_zero``): one draft step and a target call on one
token per token, and the same samples as every other γ. For γ ≥ 1 every iteration is
Algorithm 1 at that γ; the choice depends only on earlier batches, never on the draws of
the batch it is used for, so each record's output keeps the target's distribution.

Start: a prior (α, the draft's cost ratio c, the target's cost growth per verified
token at batch 1), which the draft's model config gives (``gamma_prior:``, measured with its
target) or, without one, :class:`GammaPrior`'s defaults; until a position has
been tested, its β reads as the prior's α. While γ = 0 is the choice and position 1
has fewer than ``explore_tests`` tests, one batch in ``explore_every`` runs at γ = 1
so that a pessimistic prior can be corrected, as long as γ = 1 may still pay (position
1's acceptance at its upper confidence bound over the costs measured so far); later,
γ = 0 is final. The draft's c, once γ = 0 and a γ ≥ 1 are measured, is fitted to the
loop's own steps (:meth:`AdaptiveGamma.fitted_c`): the γ not yet measured are priced
with what a drafted token costs inside the loop, not what a draft call costs alone.
While a γ ≥ 1 is the choice, one batch in ``explore_every`` times an untimed γ that may
be as good (:meth:`AdaptiveGamma._untimed_neighbour`): γ = 1 first, which anchors the
measured cost curve (the loop's first drafted token is its cheapest), then γ ± 1 of the
best. Between timed γ the costs are interpolated (``theory.iteration_costs``).

The target's cost growth depends on the batch: a call scores rows·k tokens, so at
batch 16 one more verified token per row adds 16 tokens of work to the call. The prior's
``target_slope`` is the growth per token at batch 1 (s); a call on n tokens is taken to
cost 1 + s·(n − 1) calls on one, so at B rows the growth per verified token is
B·s / (1 + (B − 1)·s) of the γ = 0 step (:meth:`GammaPrior.slope_at`). With s = 0.26,
T(2)/T(1) is 1.26 at batch 1 and 1.85 at batch 16, where a call is compute-bound and
a block of draft tokens costs nearly its length in target steps. Measured step times
replace the model once the job has them.

Compiling is bought like skis. A program shape's speculative loop costs seconds to
compile (the target alone's loop, a fraction of that), and a short job, or a shape that
few batches have, does not earn them back. So the first batches of a shape without a
speculative loop run at γ = 0, and each adds what speculation would have saved on it
(its loop's seconds times 1 − 1/the estimated improvement, optimistically while γ = 1
is still explored) to the shape's forgone seconds; once they reach the loop's compile
cost (the median of the job's measured loop compiles, else the prior's
``loop_compile_s``, times its programs: one per γ beyond a few rows), it is compiled.
Like renting until the rent has paid for the skis, this never loses more than twice
what knowing the job's length would, and spends nothing on shapes too rare to pay.
Where the engine knows the job's batch count (``batches``), a loop is also not bought
while the batches left, each saving what the last γ = 0 batch would have (by the
estimate, not its bound), could not earn it back: a short job stays with the target alone.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from collections.abc import Callable

import numpy as np

from specdec_core import theory
from specdec_core.decoding import DecodeResult, measured_compile_s, measured_loop_s
from workers.batching import DecodeSettings, PackedBatch
from workers.gamma_prior import MAX_SLOPE as MAX_SLOPE
from workers.gamma_prior import GammaPrior
from workers.step_times import StepTimes

DEFAULT_GAMMA_MAX = 4
EXPLORE_Z = 1.0  # standard errors above position 1's rate for "γ = 1 may still pay"
# "may still pay" means by more than this: a batch spent exploring costs its whole
# shortfall, which a gain this small at an optimistic rate would not earn back
EXPLORE_MARGIN = 0.05
# a γ >= 1 runs only where its loop is estimated this much faster than the target
# alone's: the loops' timers leave out the draft's per-batch set-up, and on a busy
# machine a gain this small is within their noise (BENCHMARKS.md, "The whole job")
PAY_MARGIN = 0.05
# a block length next to the chosen one, estimated within this share of its gain, is
# timed before the estimate is trusted (NEIGHBOUR_STEPS loop steps of it)
NEIGHBOUR_MARGIN = 0.1
NEIGHBOUR_STEPS = 48
# γ = 1 anchors the measured cost curve (the first drafted token is the cheapest): while
# the best is γ ≥ 2 and γ = 1 is estimated within this share of it, it is timed too
ANCHOR_MARGIN = 0.2
STALE_BATCHES = 24  # γ = 0 timed this long ago is timed again (workers.step_times)
# batches of up to this many rows run every γ in one compiled loop (DecodeSettings.slots):
# the target scores γ_max + 1 tokens per call, which costs about what γ + 1 do at a few
# rows, and the job compiles one speculative program per shape instead of one per γ
SHARED_SLOTS_MAX_ROWS = 4


def at_gamma(settings: DecodeSettings, gamma: int, *, rows: int) -> DecodeSettings:
    """``settings`` (``settings.gamma`` the largest γ) for one batch of ``rows`` rows at
    the γ the policy chose: at up to :data:`SHARED_SLOTS_MAX_ROWS` rows the compiled loop
    of ``settings.gamma`` slots runs it, the program every γ shares."""
    slots = settings.gamma if rows <= SHARED_SLOTS_MAX_ROWS else None
    return dataclasses.replace(settings, gamma=gamma, slots=slots)


class AdaptiveGamma:
    """Online γ choice for one job (thread-safe: Beam may decode from several threads)."""

    def __init__(
        self,
        gamma_max: int = DEFAULT_GAMMA_MAX,
        *,
        prior: GammaPrior | None = None,
        explore_every: int = 4,
        explore_tests: int = 64,
        batches: int | None = None,
        speculative_zero: bool = False,
    ):
        if gamma_max < 0:
            raise ValueError(f"gamma_max must be >= 0, got {gamma_max}")
        if explore_every < 1:
            raise ValueError(f"explore_every must be >= 1, got {explore_every}")
        self.gamma_max, self.prior = gamma_max, prior or GammaPrior()
        self.explore_every, self.explore_tests = explore_every, explore_tests
        self.batches = batches  # the job's batches, where known (an upper bound will do)
        # γ = 0 runs speculative(0), the draft proposing the bonus position alone: the
        # target alone would draw other samples (the module's docstring)
        self.speculative_zero = speculative_zero
        self._tests = np.zeros(gamma_max)
        self._passes = np.zeros(gamma_max)
        self._time = StepTimes()  # loop seconds and steps per γ, the recent batches
        self._draft_c: list[float] = []  # draft step / target step, where the split is known
        self.history: list[int] = []  # γ of every batch decoded, in order
        self._zeros_in_a_row = 0
        self._seen: set[tuple] = set()  # (γ, program shape) already compiled
        self._loop_shapes: set[tuple] = set()  # program shapes with a speculative loop
        # program shape -> seconds speculation would have saved on its γ = 0 batches
        self._forgone: dict[tuple, float] = collections.defaultdict(float)
        self._loop_compiles: list[float] = []  # measured seconds of loops' compiling
        self._batch_saving_s = 0.0  # what speculation would have saved on the last γ = 0 batch
        self.ahead = None  # workers.warmup.Warmup: the job's loops compiled ahead, if any
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- estimates

    def betas(self) -> list[float]:
        with self._lock:
            return self._betas()

    def _betas(self) -> list[float]:
        return theory.position_acceptance(
            self._tests,
            self._passes,
            prior_alpha=self.prior.alpha,
            prior_strength=self.prior.strength,
            positions=self.gamma_max,
        )

    def costs(self, rows: int = 1) -> dict[int, float]:
        """Estimated seconds per loop step for γ = 0..γ_max on a batch of ``rows`` rows
        (relative units before any measurement: a target step = 1)."""
        with self._lock:
            return self._costs(rows)

    def _costs(self, rows: int, draft_c: float | None = None) -> dict[int, float]:
        slope = self.prior.slope_at(rows)
        measured = {g: s / n for g, (s, n) in self._time.items() if n > 0}
        c = self._c(slope) if draft_c is None else draft_c
        # the loop's own work per step; with the bonus position drafted, one more draft
        # step at every γ (γ = 0 included)
        overhead = self.prior.overhead + (c if self.speculative_zero else 0.0)
        # in units of the target's call on one token, the loop's work included
        unit = theory.iteration_costs(
            self.gamma_max,
            target_step_s=1.0,
            draft_c=c,
            target_slope=slope,
            overhead_s=overhead,
        )
        call = 1.0  # seconds of that call: from the measured γ nearest 0, if any
        if measured:
            g = min(measured)
            call = measured[g] / unit[g]
        return theory.iteration_costs(
            self.gamma_max,
            target_step_s=call,
            draft_c=c,
            target_slope=slope,
            overhead_s=overhead * call,
            measured_s=measured,
        )

    def _c(self, slope: float) -> float:
        """The draft's cost per drafted token over a target call: timed apart where the
        engine splits its time (the host loop), else fitted to the loop's measured
        steps (:meth:`fitted_c`), else the prior's."""
        if self._draft_c:
            return float(np.median(self._draft_c))
        fitted = self._fitted_c(slope)
        return self.prior.draft_c if fitted is None else fitted

    def fitted_c(self, rows: int = 1) -> float | None:
        """c as the compiled loop pays it, from its measured steps: each γ ≥ 1's step
        over γ = 0's, less the target's growth for γ more tokens (the prior's slope), per
        drafted token, in target calls (γ = 0's step less the prior's overhead); the
        median over the γ measured. None until γ = 0 and some γ ≥ 1 are measured.

        A draft step timed alone (the cost probe) misses what the loop adds per drafted
        token (sampling it, its probabilities kept for verification, one more step of the
        draft's scan), which can be several times the call itself, so a prior built on the
        call alone makes long blocks look cheap."""
        with self._lock:
            return self._fitted_c(self.prior.slope_at(rows))

    def _fitted_c(self, slope: float) -> float | None:
        seconds, steps = self._time.get(0)
        if steps <= 0 or seconds <= 0:
            return None
        zero = seconds / steps
        call = zero / (1.0 + self.prior.overhead)
        fits = [
            max(((s / n - zero) / call - slope * g) / g, 0.0)
            for g, (s, n) in self._time.items()
            if g >= 1 and n > 0
        ]
        return float(np.median(fits)) if fits else None

    def improvements(self, rows: int = 1) -> dict[int, float]:
        with self._lock:
            return theory.gamma_improvements(self._betas(), self._costs(rows))

    # ---------------------------------------------------------------- the policy

    def choose(self, rows: int = 1, shape: tuple | None = None) -> int:
        """γ for the next batch, of ``rows`` rows (padding included: they are computed)
        and program ``shape`` (``PackedBatch.program_shape``; None: compiling is not
        weighed); recorded in :attr:`history` by :meth:`observe`."""
        with self._lock:
            gamma = self._choose(rows)
            if gamma >= 1 and shape is not None and not self._loop_paid(shape, rows):
                return 0
            return gamma

    def _choose(self, rows: int) -> int:
        if self.gamma_max == 0:
            return 0
        costs = self._costs(rows)
        betas = self._betas()
        gains = theory.gamma_improvements(betas, costs)
        best = theory.choose_gamma(betas, costs)
        if best >= 1 and gains[best] < 1 + PAY_MARGIN:  # within the timers' noise: step aside
            best = 0
        if best == 0 and self._exploring() and self._may_pay(self._explore_costs(rows)):
            return 1
        if best >= 1 and len(self.history) % self.explore_every == self.explore_every - 1:
            if self._time.stale(0, STALE_BATCHES):  # the target alone, timed afresh
                return 0
            neighbour = self._untimed_neighbour(best, gains)
            if neighbour is not None:
                return neighbour
        return best

    def _exploring(self) -> bool:
        """γ = 1 is still tried now and then while γ = 0 is the choice."""
        return (
            self._tests[0] < self.explore_tests and self._zeros_in_a_row >= self.explore_every - 1
        )

    def _explore_costs(self, rows: int) -> dict[int, float]:
        return self._costs(rows, draft_c=self._explore_c())

    def loop_compile_s(self) -> float | None:
        """The median seconds a shape's first speculative batch spent compiling, as the
        job measured them (what the next run's prior starts from); None: none measured."""
        with self._lock:
            return float(np.median(self._loop_compiles)) if self._loop_compiles else None

    def _loop_paid(self, shape: tuple, rows: int) -> bool:
        """Whether ``shape`` has its loop (warm, where compiled ahead), or has forgone enough
        to buy it and, the job's batches known, enough left to earn it (always where
        ``speculative_zero``: every batch runs it)."""
        if shape in self._loop_shapes or self.speculative_zero:
            return True
        warm = None if self.ahead is None else self.ahead.loop_ready(shape)
        if warm is not None:  # compiled ahead (workers.warmup), or compiling there
            return warm
        measured = self._loop_compiles
        each = float(np.median(measured)) if measured else self.prior.loop_compile_s
        compile_s = each * (1 if rows <= SHARED_SLOTS_MAX_ROWS else self.gamma_max)
        if self._forgone[shape] < compile_s:
            return False
        paid = self.batches is None or (
            self._batch_saving_s * max(self.batches - len(self.history), 0) >= compile_s
        )  # bought: a warm-up that takes the purchase compiles it, off the batches' path
        return paid and not (self.ahead is not None and self.ahead.buy(shape))

    def _saving(self, rows: int, optimistic: bool = True) -> float:
        """The share of a γ = 0 batch's loop time that speculation would save, as
        estimated now: 1 − 1/(the best γ's improvement), or, ``optimistic``, while γ = 1
        is explored its improvement at position 1's upper confidence bound; at least 0."""
        costs = self._costs(rows)
        ratio = max(theory.gamma_improvements(self._betas(), costs).values())
        if optimistic and self._tests[0] < self.explore_tests:
            costs = self._explore_costs(rows)
            ratio = max(ratio, (1 + self._upper_beta1()) * costs[0] / costs[1])
        return max(1.0 - 1.0 / ratio, 0.0)

    def _untimed_neighbour(self, best: int, gains: dict[int, float]) -> int | None:
        """γ = 1 while the best is γ ≥ 2, if estimated within :data:`ANCHOR_MARGIN` of it;
        else γ ± 1 of the best (≥ 1) within :data:`NEIGHBOUR_MARGIN`; either only while
        it has fewer than :data:`NEIGHBOUR_STEPS` timed loop steps. An untimed γ is priced
        by the model (a drafted token's cost, fitted linearly): the first drafted token
        costs less than the later ones in the compiled loop (the draft's first call carries
        two tokens and no scan step), so untimed, γ = 1 reads dearer than it is and a job
        can stay at a slower γ = 2. Timed, γ = 1 anchors the curve (``theory.iteration_costs``
        puts the γ between two timed ones on the line between them), so a job that a noisy
        prior started at a long block need not walk down one γ at a time."""
        candidates = [(best - 1, NEIGHBOUR_MARGIN), (best + 1, NEIGHBOUR_MARGIN)]
        if best >= 2:
            candidates.insert(0, (1, ANCHOR_MARGIN))
        for gamma, margin in candidates:
            if (
                1 <= gamma <= self.gamma_max
                and self._time.clean_steps(gamma) < NEIGHBOUR_STEPS
                and gains[gamma] >= (1.0 - margin) * gains[best]
            ):
                return gamma
        return None

    def _explore_c(self) -> float | None:
        """The draft's c for "may γ = 1 still pay": 0 (the cheapest it can be) until a
        γ ≥ 1 batch is timed, then the fitted one. With a prior's c from a noisy earlier
        run, too high, a first record of low acceptance can make every rate look unable to
        pay and keep the job at γ = 0 for good, where γ = 1 would have paid."""
        timed = any(g >= 1 and n > 0 for g, (_, n) in self._time.items())
        return None if timed else 0.0

    def _may_pay(self, costs: dict[int, float]) -> bool:
        """Whether γ = 1 could still beat the target alone by :data:`EXPLORE_MARGIN`:
        position 1's acceptance at its upper confidence bound (Wilson score, one standard
        error; 1 before any test) over ``costs``, the step costs as estimated now for
        this batch's rows (:meth:`_explore_c`). Exploring a draft that cannot pay costs
        time."""
        return (1 + self._upper_beta1()) * costs[0] / costs[1] > 1 + EXPLORE_MARGIN

    def _upper_beta1(self) -> float:
        """Position 1's acceptance at its upper confidence bound (Wilson score, one
        standard error; 1 before any test)."""
        tests = self._tests[0]
        if tests <= 0:
            return 1.0
        rate, z2 = self._passes[0] / tests, EXPLORE_Z**2
        spread = EXPLORE_Z * math.sqrt(rate * (1 - rate) / tests + z2 / (4 * tests**2))
        return (rate + z2 / (2 * tests) + spread) / (1 + z2 / tests)

    def observe(
        self,
        gamma: int,
        *,
        seconds: float | None,
        steps: int,
        accepted_by_position=None,
        iterations=None,
        draft_s: float | None = None,
        contended: bool = False,
    ) -> None:
        """What one batch measured: its γ; ``seconds`` of wall time over ``steps`` loop
        steps (None: not to be used, e.g. it included compilation); for γ ≥ 1 the
        accepted count at each draft position and the iterations (summed over rows or
        per row); ``draft_s`` seconds in draft calls where the engine splits them;
        ``contended``: the warm-up compiled beside it (:mod:`workers.step_times`)."""
        if not 0 <= gamma <= self.gamma_max:
            raise ValueError(f"gamma must be in [0, {self.gamma_max}], got {gamma}")
        with self._lock:
            self.history.append(gamma)
            self._zeros_in_a_row = self._zeros_in_a_row + 1 if gamma == 0 else 0
            if gamma >= 1 and accepted_by_position is not None:
                tests, passes = theory.position_tests(accepted_by_position, iterations)
                if tests.size != gamma:
                    raise ValueError(f"{tests.size} positions of acceptance counts for γ={gamma}")
                self._tests[:gamma] += tests
                self._passes[:gamma] += passes
            if seconds is None or steps <= 0 or not math.isfinite(seconds):
                return
            self._time.add(gamma, seconds, steps, contended=contended)
            target_step = self._time.get(0)
            if gamma >= 1 and draft_s is not None and math.isfinite(draft_s) and target_step[1] > 0:
                step = target_step[0] / target_step[1]
                self._draft_c.append(draft_s / (steps * gamma) / step)

    def histogram(self) -> dict[int, int]:
        """Batches decoded at each γ."""
        with self._lock:
            return dict(sorted(collections.Counter(self.history).items()))

    # ---------------------------------------------------------------- engines' hooks

    def decode(
        self,
        batch: PackedBatch,
        speculative: Callable[[int], DecodeResult],
        baseline: Callable[[], DecodeResult],
    ) -> tuple[DecodeResult, int, float]:
        """Decodes one packed batch, once, at the γ chosen now: ``speculative(γ)`` for
        γ ≥ 1, ``baseline()`` (the target alone) for γ = 0 (``speculative(0)`` with
        ``speculative_zero``); observes what it measured.
        Returns (result, γ, wall seconds). A batch that compiled a program is not timed
        for the policy (:meth:`_timed`): its seconds would price compilation as decoding."""
        rows, shape = batch.prompt_tokens.shape[0], batch.program_shape()
        gamma = self.choose(rows=rows, shape=shape)
        alone = gamma == 0 and not self.speculative_zero
        run = baseline if alone else (lambda: speculative(gamma))
        result, seconds, compiled = self._timed(batch, gamma, run)
        self._account(shape, gamma, rows, result, seconds, compiled)
        self.observe(
            gamma,
            seconds=None if compiled else _loop_seconds(result, seconds),
            steps=int(np.max(result.iterations)),
            accepted_by_position=result.accepted_by_position if gamma else None,
            iterations=result.iterations,
            draft_s=result.draft_s,
            contended=_beside(result),
        )
        return result, gamma, seconds

    def _account(self, shape, gamma: int, rows: int, result, seconds: float, compiled: bool):
        """Compiling bought like skis (the module's docstring): a γ = 0 batch of a shape
        without a speculative loop adds what speculation would have saved on it; a γ ≥ 1
        batch gives its shape a loop, and what compiling it cost."""
        with self._lock:
            if gamma >= 1:
                compile_s = measured_compile_s(result)
                if shape not in self._loop_shapes and compiled and compile_s is not None:
                    self._loop_compiles.append(compile_s)  # the batch that bought the loop
                self._loop_shapes.add(shape)
            elif shape not in self._loop_shapes and not compiled:
                loop_s = _loop_seconds(result, seconds)
                self._forgone[shape] += loop_s * self._saving(rows)
                self._batch_saving_s = loop_s * self._saving(rows, optimistic=False)

    def decode_baseline(
        self, batch: PackedBatch, baseline: Callable[[], DecodeResult]
    ) -> tuple[DecodeResult, float]:
        """The target alone on one batch (``--compare-baseline``); its time per step is
        the γ = 0 cost (not a batch of the job's own decoding: not in :attr:`history`)."""
        result, seconds, compiled = self._timed(batch, 0, baseline)
        if not compiled:
            with self._lock:
                steps = int(np.max(result.iterations))
                self._time.add(0, _loop_seconds(result, seconds), steps, contended=_beside(result))
        return result, seconds

    def _timed(self, batch: PackedBatch, gamma: int, run):
        """(result, wall seconds, whether it compiled its loop): its (γ, program shape)
        is new to this policy, and the engine, where it measured the call's compiling
        (``DecodeResult.compile_s``), saw some (a program already compiled in this
        process, by an earlier job, costs nothing)."""
        shape = batch.program_shape()  # a new encoder width alone compiles no loop
        with self._lock:
            new = (gamma, shape) not in self._seen
            self._seen.add((gamma, shape))
        start = time.perf_counter()
        result = run()
        seconds = time.perf_counter() - start
        compile_s = measured_compile_s(result)
        return result, seconds, new and (compile_s is None or compile_s > 0)


def _beside(result: DecodeResult) -> bool:
    return bool(getattr(result, "contended", False))  # the warm-up compiled beside it


def _loop_seconds(result: DecodeResult, wall_s: float) -> float:
    """The batch's decode loop alone where the engine timed it (``loop_s``), else its
    wall time. The encoder and the prefill cost the same at every γ, so they only blur
    the per-step costs that the choice compares."""
    loop_s = measured_loop_s(result)
    return wall_s if loop_s is None else loop_s
