"""The loop-step seconds that ``--gamma auto`` has measured at each γ: recent batches
only, and those the job's warm-up compiled beside kept apart.

A job's first batches are its slowest: its Ray daemons, its pipeline and MLflow start
beside them, and the warm-up compiles its programs in a background thread on the same
cores (:mod:`workers.warmup`). They run at γ = 0 while the loops compile. Priced from
them for the rest of the job, the target alone read dearer than it is, and a draft that
did not pay looked as if it did. So:

- a γ is priced from its batches of the job's last :data:`HORIZON` (at most
  :data:`WINDOW` of them), or its newest one where it has none that recent: an old, slow
  batch ages out;
- a batch decoded while the warm-up compiled (``DecodeResult.contended``) counts only
  while its γ has no clean batch in that window;
- :meth:`StepTimes.stale` says when a γ was last timed that many batches ago, or only
  beside the warm-up, so that the policy times it again.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

WINDOW = 16  # the batches per γ that price it, at most: the most recent ones
HORIZON = 64  # ... of the job's last this many batches (every γ counted)


class StepTimes:
    """Per γ, the last :data:`WINDOW` batches' (seconds, loop steps, contended, when),
    and when each γ was last timed cleanly, counted in batches (not thread-safe:
    :class:`workers.gamma.AdaptiveGamma` holds its lock around it)."""

    def __init__(self, window: int = WINDOW, horizon: int = HORIZON):
        if window < 1 or horizon < 1:
            raise ValueError(f"window and horizon must be >= 1, got {window} and {horizon}")
        self._batches: dict[int, collections.deque] = {}
        self._window, self._horizon = window, horizon
        self._count = 0  # batches added, every γ
        self._last: dict[int, int] = {}  # γ -> the count when a clean batch was last added

    def add(self, gamma: int, seconds: float, steps: int, *, contended: bool = False) -> None:
        """One batch's loop seconds over its loop steps at ``gamma``."""
        recent = self._batches.setdefault(gamma, collections.deque(maxlen=self._window))
        self._count += 1
        recent.append((seconds, steps, contended, self._count))
        if not contended:
            self._last[gamma] = self._count

    def get(self, gamma: int) -> tuple[float, int]:
        """(seconds, steps) summed over ``gamma``'s recent clean batches, or its recent
        contended ones where it has no clean one; (0.0, 0) where none was timed."""
        timed = [b for b in self._batches.get(gamma, ()) if b[1] > 0]
        recent = [b for b in timed if self._count - b[3] < self._horizon] or timed[-1:]
        chosen = [b for b in recent if not b[2]] or recent
        return sum(b[0] for b in chosen), sum(b[1] for b in chosen)

    def items(self) -> Iterator[tuple[int, tuple[float, int]]]:
        """(γ, :meth:`get`) for every γ timed, in order of γ."""
        for gamma in sorted(self._batches):
            seconds, steps = self.get(gamma)
            if steps > 0:
                yield gamma, (seconds, steps)

    def clean_steps(self, gamma: int) -> int:
        """Loop steps of ``gamma``'s recent batches with nothing compiling beside them."""
        return sum(b[1] for b in self._batches.get(gamma, ()) if not b[2])

    def stale(self, gamma: int, after: int) -> bool:
        """Whether ``gamma`` was timed, but not cleanly within the last ``after`` batches
        (only beside the warm-up, or long ago)."""
        if gamma not in self._batches:
            return False
        last = self._last.get(gamma)
        return last is None or self._count - last >= after
