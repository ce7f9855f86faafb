"""The loop-step seconds that ``--gamma auto`` has measured at each γ, kept apart by
whether the job's warm-up compiled beside the batch.

A job compiles its programs ahead in a background thread (:mod:`workers.warmup`) that
shares the machine's cores with the batches. A batch decoded while it compiles is
slower than the same batch alone, and the first batches, at γ = 0 while the loops
compile, are the ones it slows. Priced from them, the target alone reads dearer than it
is, and a draft that does not pay looks as if it did. So a batch's seconds count as
*clean* only where no warm-up program ran beside it (``DecodeResult.contended``);
the *contended* ones stand in only for a γ that has no clean ones.
"""

from __future__ import annotations

from collections.abc import Iterator


class StepTimes:
    """Seconds and loop steps summed per γ, clean and contended apart (not thread-safe:
    :class:`workers.gamma.AdaptiveGamma` holds its lock around it)."""

    def __init__(self):
        self._clean: dict[int, list[float]] = {}
        self._contended: dict[int, list[float]] = {}

    def add(self, gamma: int, seconds: float, steps: int, *, contended: bool = False) -> None:
        """One batch's loop seconds over its loop steps at ``gamma``."""
        sums = (self._contended if contended else self._clean).setdefault(gamma, [0.0, 0])
        sums[0] += seconds
        sums[1] += steps

    def get(self, gamma: int) -> tuple[float, int]:
        """(seconds, steps) at ``gamma``: the clean batches' where there are any, else the
        contended ones'; (0.0, 0) where none was timed."""
        for sums in (self._clean, self._contended):
            if sums.get(gamma, (0.0, 0))[1] > 0:
                return sums[gamma][0], int(sums[gamma][1])
        return 0.0, 0

    def items(self) -> Iterator[tuple[int, tuple[float, int]]]:
        """(γ, :meth:`get`) for every γ timed, in order of γ."""
        for gamma in sorted(set(self._clean) | set(self._contended)):
            seconds, steps = self.get(gamma)
            if steps > 0:
                yield gamma, (seconds, steps)

    def clean_steps(self, gamma: int) -> int:
        """Loop steps timed at ``gamma`` with nothing compiling beside them."""
        return int(self._clean.get(gamma, (0.0, 0))[1])

    def contended_only(self, gamma: int) -> bool:
        """Whether ``gamma`` was timed only beside the warm-up's compiling."""
        return self.clean_steps(gamma) == 0 and self._contended.get(gamma, (0.0, 0))[1] > 0
