"""``--gamma 0``: the engines' policy hooks with every batch by the target alone."""

from __future__ import annotations

import time
from collections.abc import Callable

from specdec_core.decoding import DecodeResult
from workers.batching import PackedBatch


class TargetAlone:
    """``--gamma 0``: every batch by the target alone, through the engine and workers a
    speculative job uses (the engines' policy hooks, as :class:`AdaptiveGamma`'s γ = 0),
    so a user can time the same job with and without speculation."""

    def decode(
        self,
        batch: PackedBatch,
        speculative: Callable[[int], DecodeResult],
        baseline: Callable[[], DecodeResult],
    ) -> tuple[DecodeResult, int, float]:
        """``baseline()`` on the batch: (result, γ = 0, wall seconds)."""
        del batch, speculative
        start = time.perf_counter()
        result = baseline()
        return result, 0, time.perf_counter() - start

    def decode_baseline(
        self, batch: PackedBatch, baseline: Callable[[], DecodeResult]
    ) -> tuple[DecodeResult, float]:
        """The target alone for ``--compare-baseline``: (result, wall seconds)."""
        result, _, seconds = self.decode(batch, lambda gamma: None, baseline)
        return result, seconds
