"""Measured step costs: what a model call costs on decode-sized caches.

:func:`step_costs` times the target on k = 1..max_k tokens and one draft step, each on a
cache prefilled as a decode's would be (``cache_len`` slots: attention covers every slot,
so the decode's cache size matters). The result is a :class:`theory.StepCosts`, from which
:func:`theory.predicted_speedup` and :func:`predicted_tokens_speedup` give the speedup the
cost model predicts. The jobs (``--compare-baseline``) and the benchmarks use it.

:func:`compile_clock` counts the seconds this thread spends tracing, lowering and
compiling (or loading from the persistent cache) XLA programs, so that a job can show
its compilation apart from its decoding.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from specdec_core import decoding, theory
from specdec_core.models.api import rollback

# JAX's own compile-phase events: tracing to a jaxpr, lowering to MLIR, and the backend's
# compile, which includes a persistent-cache lookup and load
COMPILE_EVENTS = frozenset(
    {
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    }
)
_compiling = threading.local()
_listening = threading.Lock()
_listener_registered = False


def _on_event(event: str, duration: float, **_) -> None:
    if event in COMPILE_EVENTS:
        _compiling.seconds = getattr(_compiling, "seconds", 0.0) + duration


def compile_seconds() -> float:
    """Seconds this thread has spent compiling since :func:`compile_clock` was first used
    in the process (a running total: read it before and after)."""
    return getattr(_compiling, "seconds", 0.0)


@contextlib.contextmanager
def compile_clock():
    """``with compile_clock() as elapsed:`` … ``elapsed()``: seconds this thread spent
    compiling inside the block (JAX's tracing, lowering and backend compile events;
    calls that found their program in memory add nothing)."""
    global _listener_registered
    with _listening:
        if not _listener_registered:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _listener_registered = True
    start = compile_seconds()
    end: list[float] = []
    yield lambda: (end[0] if end else compile_seconds()) - start
    end.append(compile_seconds())


def median_seconds(fn: Callable[[], object], repeats: int = 7) -> float:
    """Median wall seconds of ``fn()`` (outputs blocked on) after one untimed call."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def call_seconds(model, encoder_tokens: np.ndarray | None, *, in_loop: bool = True, **options):
    """Seconds of one ``model.forward`` call as :func:`call_timer` sets it up (``k``,
    ``cache_len``, ``batch``, ``repeats`` in ``options``): the median of a few runs after
    an untimed one, per model call."""
    timer = call_timer(model, encoder_tokens, in_loop=in_loop, **options)
    return interleaved_seconds({"call": timer}, rounds=_rounds(in_loop))["call"]


def _rounds(in_loop: bool) -> int:
    """Timed runs per call: 5 of a compiled loop of calls, 7 of a single host call."""
    return 5 if in_loop else 7


def call_timer(
    model,
    encoder_tokens: np.ndarray | None,
    *,
    k: int,
    cache_len: int,
    batch: int | None = None,
    in_loop: bool = True,
    repeats: int = 16,
) -> tuple[Callable[[], object], int]:
    """A ``model.forward`` call on ``k`` tokens per row after the start token, set up to
    be timed: (a call that runs the timed program once, the model calls that run makes).
    Nothing is compiled until the first run. A trained model's params are inputs of the
    timed program, as in the decode loops.

    ``encoder_tokens``: int32 [B, S] (encoder-decoder models; None for decoder-only, then
    ``batch`` rows, 1 by default). ``in_loop`` (for the compiled loop): ``repeats`` calls
    inside one jitted ``fori_loop``, each rolling the cache back and rewriting the same k
    positions: the call's cost with no per-call dispatch. Otherwise one jitted call from
    the host (the host loop's cost).
    """
    if encoder_tokens is not None:
        batch = encoder_tokens.shape[0]
    batch = batch or 1
    cache = model.new_cache(encoder_tokens, batch, cache_len)
    # the forwards go in through decoding.jit_over: a trained model's params are inputs
    step = decoding.jit_over(lambda forward: forward, (model.forward,))
    _, cache = step(cache, np.zeros((batch, 1), np.int32))  # the start token
    tokens = np.full((batch, k), 5, np.int32)
    if not in_loop:
        return (lambda: step(cache, tokens)[0]), 1

    def make(forward):
        def many(cache, tokens):
            start = cache.lengths

            def body(_, carry):
                cache, acc = carry
                logits, cache = forward(rollback(cache, start), tokens)
                # every logit stays live, as in a decode (which samples from all of
                # them): a slice here let XLA compute one vocabulary column, and the
                # vocabulary projection is a third of a small decoder's step
                return cache, acc + logits.max(axis=(1, 2))[:, None]

            acc = jnp.zeros((batch, 1), jnp.float32)
            return jax.lax.fori_loop(0, repeats, body, (cache, acc))[1]

        return many

    many = decoding.jit_over(make, (model.forward,))
    return (lambda: many(cache, tokens)), repeats


def interleaved_seconds(
    timers: Mapping[Hashable, tuple[Callable[[], object], int]], rounds: int = 5
) -> dict[Hashable, float]:
    """Median seconds per model call of each :func:`call_timer`: every program runs once
    untimed (compiled or loaded) before any is timed, then one run of each per round, so
    that a busy spell of a shared machine (a job's Ray instance stopping beside its
    probe) falls on all of them alike rather than on the first one timed."""
    for run, _ in timers.values():
        jax.block_until_ready(run())
    seconds: dict[Hashable, list[float]] = {key: [] for key in timers}
    for _ in range(rounds):
        for key, (run, calls) in timers.items():
            start = time.perf_counter()
            jax.block_until_ready(run())
            seconds[key].append((time.perf_counter() - start) / calls)
    return {key: float(np.median(times)) for key, times in seconds.items()}


def step_costs(target, draft, encoder_tokens: np.ndarray | None, **timed) -> theory.StepCosts:
    """Target call seconds for each k of ``ks`` tokens and one draft step (k = 1), timed
    in interleaved rounds: :func:`timed_calls` (its keywords) as ``theory.StepCosts``."""
    target_s, draft_s = timed_calls(target, draft, encoder_tokens, **timed)
    return theory.StepCosts(target_s=target_s, draft_step_s=draft_s)


def timed_calls(
    target,
    draft,
    encoder_tokens: np.ndarray | None,
    *,
    ks: Sequence[int],
    cache_len: int,
    batch: int | None = None,
    in_loop: bool = True,
    repeats: int = 16,
) -> tuple[dict[int, float], float | None]:
    """(the target's seconds per call on each k of ``ks`` tokens, the draft's per step)
    as :func:`step_costs` times them; ``draft`` None times the target alone (None for
    the draft: a worker that hosts only the target, whose draft another process times)."""
    timed = dict(cache_len=cache_len, batch=batch, in_loop=in_loop, repeats=repeats)
    timers: dict[Hashable, tuple] = {
        k: call_timer(target, encoder_tokens, k=k, **timed) for k in ks
    }
    if draft is not None:
        timers["draft"] = call_timer(draft, encoder_tokens, k=1, **timed)
    seconds = interleaved_seconds(timers, rounds=_rounds(in_loop))
    return {k: seconds[k] for k in ks}, seconds.get("draft")


def predicted_tokens_speedup(
    acceptance_by_position: Sequence[float],
    tokens_by_gamma: Mapping[int, int],
    costs: theory.StepCosts,
) -> float:
    """The speedup the cost model predicts for a run that decoded ``tokens_by_gamma[γ]``
    tokens at each γ (0: the target alone), given its measured acceptance.

    ``acceptance_by_position[i-1]``: the share of iterations whose position i was
    accepted (so an iteration at γ yields 1 + Σ_{i≤γ} of them tokens, in expectation: the
    per-position form of Equation 1). An iteration costs γ draft steps, one target call on
    γ+1 tokens and ``costs.iteration_overhead_s(γ)``; a target-alone token costs
    ``target_s[1] + baseline_overhead_s``. The run's figure is the token-weighted harmonic
    mean of the per-γ speedups (its total time over the target alone's).
    """
    baseline_token_s = costs.target_s[1] + costs.baseline_overhead_s
    total = sum(tokens_by_gamma.values())
    if total <= 0:
        raise ValueError("no tokens to predict a speedup for")
    seconds = 0.0
    for gamma, tokens in tokens_by_gamma.items():
        if gamma == 0:
            seconds += tokens * baseline_token_s
            continue
        if gamma > len(acceptance_by_position):
            raise ValueError(f"no acceptance measured at position {gamma}")
        per_iteration = 1.0 + float(sum(acceptance_by_position[:gamma]))
        iteration_s = (
            gamma * costs.draft_step_s
            + costs.target_s[gamma + 1]
            + costs.iteration_overhead_s(gamma)
        )
        seconds += tokens * iteration_s / per_iteration
    return total * baseline_token_s / seconds
