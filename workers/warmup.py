"""A job's programs compiled ahead of its batches, off their path.

An offline job knows its inputs before it decodes them, so it knows the shapes its
batches will have: one per encoder width bucket (``batching.LENGTH_BUCKET``), at the
job's batch size. Every shape needs the target alone's programs (the baseline, and
``--gamma auto``'s γ = 0) and the speculative loop's. Compiling them, or loading them
from the persistent cache (tracing and lowering still run in every process), takes
seconds that a batch met them on would wait for.

:class:`Warmup` runs programs once in a background thread, as a *dry run*
(``decoding``'s ``dry_run``: every row starts done, so nothing is generated and the
call costs little beyond compiling): every shape's target-alone program first, first
seen first; then, for a fixed γ, every shape's loop; under ``--gamma auto`` a shape's
loop when the policy buys it (:meth:`Warmup.buy`), so that a loop the job may never
run costs no CPU beside its batches. Meanwhile the job decodes: a batch whose shape is
being warmed waits for the program in flight rather than compile it a second time
(:meth:`Warmup.settle`), and a bought shape runs at γ = 0 until its loop is warm
(:meth:`Warmup.loop_ready`). Where the warm-up fails, the batch compiles on its own path
as it would have without one. Its compiling is not a batch's: the job reports it apart.

The warm-up's thread runs at the lowest CPU priority, so it compiles on the cores the
batches leave idle. A batch it ran beside is marked (:func:`beside`,
``DecodeResult.contended``): ``--gamma auto`` prices a γ from such a batch only where it
has no other (:mod:`workers.step_times`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from specdec_core.decoding import DecodeResult, measured_compile_s
from workers.batching import LENGTH_BUCKET, DecodeSettings, PackedBatch, Request, padded_length
from workers.gamma import SHARED_SLOTS_MAX_ROWS, AdaptiveGamma, at_gamma

WARMUP_ID = "warmup"  # the id of the requests that stand for a job's shapes


def shape_requests(encoder_lengths: Iterable[int], prompt_tokens: tuple[int, ...]) -> list[Request]:
    """One request per encoder width bucket among ``encoder_lengths`` (the job's records'
    encoder tokens, in the order the job reads them), first seen first: packed, each has
    the shape of the job's batches of that bucket."""
    widths = dict.fromkeys(padded_length(n, LENGTH_BUCKET) for n in encoder_lengths)
    return [
        Request(id=f"{WARMUP_ID}-{width}", prompt_tokens=prompt_tokens, encoder_tokens=(1,) * width)
        for width in widths
    ]


def loop_settings(settings: DecodeSettings, policy, rows: int) -> list[DecodeSettings]:
    """The settings of every speculative loop program a batch of ``rows`` rows may run:
    the fixed γ's (no ``policy``); under ``--gamma auto`` (:class:`AdaptiveGamma`) the
    one program every γ shares at a few rows, else one per γ ≥ 1, smallest first;
    none for a policy that never speculates (``--gamma 0``)."""
    if policy is None:
        return [settings]
    if not isinstance(policy, AdaptiveGamma) or policy.gamma_max == 0:
        return []
    gammas = [settings.gamma] if rows <= SHARED_SLOTS_MAX_ROWS else range(1, settings.gamma + 1)
    return [at_gamma(settings, gamma, rows=rows) for gamma in gammas]


def eager_loops(policy) -> bool:
    """Whether the loops warm at once: a fixed γ (no ``policy``) and the paper's rule at
    T > 0 (``speculative_zero``: γ = 0 runs the loop too) run one from the first batch;
    ``--gamma auto`` otherwise warms a shape's loop when it buys it."""
    return policy is None or bool(getattr(policy, "speculative_zero", False))


@dataclasses.dataclass(frozen=True)
class Program:
    """One program to warm: for a batch of ``key`` (``PackedBatch.shape``: the encoder
    width too) and ``shape`` (``PackedBatch.program_shape``: what its loops compile
    for), ``run()`` dry-runs it; ``loop``: the speculative loop (else the target alone's)."""

    key: tuple
    shape: tuple
    run: Callable[[], object]
    loop: bool


def programs(
    batches: Sequence[PackedBatch],
    *,
    baseline: Callable[[PackedBatch], object],
    loop: Callable[[PackedBatch, DecodeSettings], object],
    loops: Sequence[DecodeSettings],
) -> tuple[list[Program], dict[tuple, list[Program]]]:
    """(every batch's target-alone program, ``baseline(batch)`` dry-running it; each
    program shape's loops, ``loop(batch, settings)`` for each batch of the shape and
    each of ``loops``). A batch of a new shape needs its target-alone program at once
    (``--gamma auto`` starts a shape at γ = 0), and it compiles in a fraction of a
    loop's time."""
    alone = [
        Program(b.shape(), b.program_shape(), functools.partial(baseline, b), False)
        for b in batches
    ]
    by_shape: dict[tuple, list[Program]] = {}
    for b in batches:
        by_shape.setdefault(b.program_shape(), []).extend(
            Program(b.shape(), b.program_shape(), functools.partial(loop, b, settings), True)
            for settings in loops
        )
    return alone, by_shape


def beside(warm: Warmup | None, run: Callable[[], DecodeResult]) -> DecodeResult:
    """``run()``'s result, marked ``contended`` where ``warm`` ran a program beside it."""
    if warm is None:
        return run()
    mark = warm.mark()
    result = run()
    return result.replace(contended=True) if warm.overlapped(mark) else result


def _yield_cores() -> None:
    """Gives this thread the lowest CPU priority (Linux: a thread's own nice value), so
    that compiling ahead takes the cores the batches leave idle rather than theirs."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):  # not Linux, or not allowed: compile beside them
        pass


class Warmup:
    """Runs :class:`Program` s in a daemon thread, in order; thread-safe.

    ``work`` starts at once. A loop program in it, or one that :meth:`buy` queues later,
    is the loop of its shape: the shape's loop is warm once all of its loop programs
    have run (:meth:`loop_ready`). ``on_demand`` (shape -> loop programs): loops that
    run only once bought.
    """

    def __init__(self, work: Sequence[Program], on_demand: dict | None = None):
        self._queue = list(work)
        self._on_demand = dict(on_demand or {})
        self._cond = threading.Condition()
        self._current: Program | None = None
        self._left: dict[tuple, int] = {}  # shape -> its loop programs not yet warm
        for program in self._queue:
            if program.loop:
                self._left[program.shape] = self._left.get(program.shape, 0) + 1
        self._ready: set[tuple] = set()
        self._failed: set[tuple] = set()
        self.compile_s = 0.0  # seconds the warm-up spent compiling (its own thread's)
        self.seconds = 0.0  # its wall seconds, programs run
        self.programs_run = 0
        self.programs_queued = len(self._queue)
        self.errors: list[str] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="warmup", daemon=True)
        self._thread.start()

    def mark(self) -> tuple[int, bool]:
        """Where the warm-up is now, for :meth:`overlapped`."""
        with self._cond:
            return self.programs_run + len(self.errors), self._current is not None

    def overlapped(self, mark: tuple[int, bool]) -> bool:
        """Whether a program ran since ``mark`` (:meth:`mark`), in part or whole."""
        with self._cond:
            count, busy = mark
            return (
                busy or self._current is not None or self.programs_run + len(self.errors) != count
            )

    def first(self) -> None:
        """Waits for the first program (the first batch's target-alone program: a job
        needs it whether it speculates or not, so its wait is the engine's start)."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self.programs_run + len(self.errors) >= 1 or self._finished() or self._stopped
                )
            )

    def buy(self, shape: tuple) -> bool:
        """Queues ``shape``'s loop programs (``on_demand``), to compile after what is
        queued; False where it has none to queue (not a shape of the job, or its
        warm-up failed: the caller compiles the loop on its own path)."""
        with self._cond:
            if self._stopped or shape in self._failed:
                return False
            if shape in self._left or shape in self._ready:
                return True
            loops = self._on_demand.get(shape)
            if not loops:
                return False
            self._queue += loops
            self.programs_queued += len(loops)
            self._left[shape] = len(loops)
            self._cond.notify_all()
            return True

    def _finished(self) -> bool:
        """Nothing running, and nothing queued or stopped (under ``_cond``)."""
        return self._current is None and (not self._queue or self._stopped)

    def _run(self) -> None:
        _yield_cores()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._stopped)
                if self._stopped:
                    self._cond.notify_all()
                    return
                program = self._current = self._queue.pop(0)
                if program.shape in self._failed:
                    self._current = None
                    self._cond.notify_all()
                    continue
            start, error_text = time.perf_counter(), None
            try:
                result = program.run()
            except Exception as error:  # the batch compiles on its own path instead
                error_text = f"{type(error).__name__}: {error}"
            with self._cond:
                self._current = None
                self.seconds += time.perf_counter() - start
                if error_text is not None:
                    self.errors.append(error_text)
                    self._failed.add(program.shape)
                else:
                    self.programs_run += 1
                    self.compile_s += measured_compile_s(result) or 0.0
                    if program.loop:
                        self._left[program.shape] -= 1
                        if self._left[program.shape] == 0:
                            self._ready.add(program.shape)
                self._cond.notify_all()

    def settle(self, key: tuple, *, loop: bool) -> None:
        """Waits while the warm-up runs a program that a batch of ``key``
        (``PackedBatch.shape``) needs now: its target-alone program, or (``loop``: the
        batch runs the speculative loop) either."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._current is None
                    or self._current.key != key
                    or (self._current.loop and not loop)
                )
            )

    def loop_ready(self, shape: tuple) -> bool | None:
        """Whether ``shape``'s loop is warm (False: queued or compiling); None where the
        warm-up has none for it (not bought, not one of the job's shapes, failed, or the
        warm-up stopped before it)."""
        with self._cond:
            if shape in self._ready:
                return True
            if shape in self._failed or self._stopped or shape not in self._left:
                return None
            return False

    def done(self) -> bool:
        """Nothing running, and nothing queued or stopped (a later :meth:`buy` may queue
        more)."""
        with self._cond:
            return self._finished()

    def join(self, timeout: float | None = None) -> None:
        """Waits until :meth:`done`."""
        with self._cond:
            self._cond.wait_for(self._finished, timeout)

    def report(self, *, stop: bool = False) -> dict:
        """What the warm-up did so far: programs run of those queued, its compiling and
        wall seconds; ``stop``: the job has ended, so what is queued is left out."""
        with self._cond:
            if stop:
                self._stopped = True
                self._cond.notify_all()
            return {
                "programs": self.programs_run,
                "of": self.programs_queued,
                "compile_s": self.compile_s,
                "seconds": self.seconds,
                "errors": list(self.errors),
            }
