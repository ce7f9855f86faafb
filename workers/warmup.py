"""A job's programs compiled ahead of its batches, off their path.

An offline job knows its inputs before it decodes them, so it knows the shapes its
batches will have: one per encoder width bucket (``batching.LENGTH_BUCKET``), at the
job's batch size. Every shape needs the target alone's programs (the baseline, and
``--gamma auto``'s γ = 0) and the speculative loop's. Compiling them, or loading them
from the persistent cache (tracing and lowering still run in every process), takes
seconds that a batch met them on would wait for.

:class:`Warmup` runs each shape's programs once in a background thread, first seen
first, as a *dry run* (``decoding``'s ``dry_run``: every row starts done, so nothing
is generated and the call costs little beyond compiling): every shape's target-alone
program first, then the loops. Meanwhile the job decodes: a batch whose shape is being warmed
waits for the program in flight rather than compile it a second time
(:meth:`Warmup.settle`); ``--gamma auto`` runs a shape's loop once it is warm
(:meth:`Warmup.loop_ready`), or once it would have bought it anyway, and then waits for
it where the warm-up has it in flight. Where the warm-up fails, the batch compiles on
its own path as it would have without one. Its compiling is not a batch's: the job
reports it apart.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from specdec_core.decoding import measured_compile_s
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


@dataclasses.dataclass(frozen=True)
class Program:
    """One program to warm: for a batch of ``shape`` (``PackedBatch.program_shape``),
    ``run()`` dry-runs it; ``loop``: the speculative loop (else the target alone's)."""

    shape: tuple
    run: Callable[[], object]
    loop: bool


def programs(
    batches: Sequence[PackedBatch],
    *,
    baseline: Callable[[PackedBatch], object],
    loop: Callable[[PackedBatch, DecodeSettings], object],
    loops: Sequence[DecodeSettings],
) -> list[Program]:
    """Every batch's target-alone program (``baseline(batch)`` dry-runs it), then every
    batch's loops (``loop(batch, settings)`` for each of ``loops``). A batch of a new
    shape needs its target-alone program at once (``--gamma auto`` starts a shape at
    γ = 0), and a target-alone program compiles in a fraction of a loop's time."""
    alone = [Program(b.program_shape(), functools.partial(baseline, b), False) for b in batches]
    return alone + [
        Program(b.program_shape(), functools.partial(loop, b, settings), True)
        for b in batches
        for settings in loops
    ]


class Warmup:
    """Runs ``work`` (:class:`Program`) in a daemon thread, in order; thread-safe."""

    def __init__(self, work: Sequence[Program]):
        self._work = list(work)
        self._cond = threading.Condition()
        self._current: Program | None = None
        self._left = {}  # shape -> its loop programs not yet warm
        for program in self._work:
            if program.loop:
                self._left[program.shape] = self._left.get(program.shape, 0) + 1
        self._ready: set[tuple] = {s for s, n in self._left.items() if n == 0}
        self._failed: set[tuple] = set()
        self.compile_s = 0.0  # seconds the warm-up spent compiling (its own thread's)
        self.seconds = 0.0  # its wall seconds so far
        self.programs_run = 0
        self.errors: list[str] = []
        self._ended = self._stopped = False
        self._thread = threading.Thread(target=self._run, name="warmup", daemon=True)
        self._thread.start()

    def first(self) -> None:
        """Waits for the first program (the first batch's target-alone program: a job
        needs it whether it speculates or not, so its wait is the engine's start)."""
        with self._cond:
            self._cond.wait_for(lambda: self.programs_run + len(self.errors) >= 1 or self._ended)

    def _run(self) -> None:
        start = time.perf_counter()
        for program in self._work:
            with self._cond:
                if self._stopped:
                    break
                if program.shape in self._failed:
                    continue
                self._current = program
            ok = False
            try:
                result = program.run()
                self.compile_s += measured_compile_s(result) or 0.0
                ok = True
            except Exception as error:  # the batch compiles on its own path instead
                error_text = f"{type(error).__name__}: {error}"
            with self._cond:
                self._current = None
                self.programs_run += ok
                self.seconds = time.perf_counter() - start
                if not ok:
                    self.errors.append(error_text)
                    self._failed.add(program.shape)
                elif program.loop:
                    self._left[program.shape] -= 1
                    if self._left[program.shape] == 0:
                        self._ready.add(program.shape)
                self._cond.notify_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def settle(self, shape: tuple, *, loop: bool) -> None:
        """Waits while the warm-up runs a program that a batch of ``shape`` needs now:
        the target alone's, or (``loop``: the batch runs the speculative loop) any."""
        with self._cond:
            self._cond.wait_for(
                lambda: (
                    self._current is None
                    or self._current.shape != shape
                    or (self._current.loop and not loop)
                )
            )

    def loop_ready(self, shape: tuple) -> bool | None:
        """Whether ``shape``'s loop programs are warm; None where the warm-up has none
        for it (not one of the job's shapes, or its warm-up failed)."""
        with self._cond:
            if shape in self._ready:
                return True
            if shape in self._failed or shape not in self._left:
                return None
            return False

    def done(self) -> bool:
        with self._cond:
            return self._ended

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def report(self, *, stop: bool = False) -> dict:
        """What the warm-up did so far: programs run, its compiling and wall seconds;
        ``stop``: the job has ended, so the programs not begun are left out."""
        with self._cond:
            self._stopped = self._stopped or stop
            return {
                "programs": self.programs_run,
                "of": len(self._work),
                "compile_s": self.compile_s,
                "seconds": self.seconds,
                "errors": list(self.errors),
            }
