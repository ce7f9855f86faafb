"""What ``--gamma auto`` assumes of a draft before it has measured anything: the prior
of :class:`workers.gamma.AdaptiveGamma`, from a draft config's ``gamma_prior:`` and an
earlier run of the same job (:meth:`GammaPrior.measured`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

MAX_SLOPE = 10.0  # a batch-1 growth per token beyond this reads as "verification never pays"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GammaPrior:
    """What is assumed before anything is measured."""

    alpha: float = 0.5  # acceptance at every position
    strength: float = 20.0  # pseudo-tests behind the prior α (and behind each position's pooling)
    draft_c: float = 0.15  # draft step / target step
    target_slope: float = 0.15  # at batch 1: extra target-call time per extra token / target step
    overhead: float = 0.1  # loop work per iteration / target step
    # seconds to compile a program shape's speculative loop (trace, lower, load from the
    # persistent cache) until the job has measured one: what the first is weighed against
    loop_compile_s: float = 1.0

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"gamma_prior.alpha must be in [0, 1], got {self.alpha}")
        if self.strength <= 0:
            raise ValueError(f"gamma_prior.strength must be > 0, got {self.strength}")
        for key in ("draft_c", "target_slope", "overhead", "loop_compile_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"gamma_prior.{key} must be >= 0, got {getattr(self, key)}")

    def measured(
        self,
        *,
        alpha: float | None = None,
        step_costs_ms: Mapping[str, Any] | None = None,
        rows: int = 1,
        draft_c_loop: float | None = None,
        loop_compile_s: float | None = None,
    ) -> GammaPrior:
        """This prior with what an earlier run measured: its α, and from its timed
        calls (``step_costs_ms`` as a job's summary gives them, at ``rows`` rows) the
        draft's c, the loop's overhead and, where a call on more than one token was
        timed, the target's growth per token at batch 1 (:meth:`slope_at` inverted),
        from the fewest tokens timed: the first verified token's growth decides whether
        γ = 1 pays, and where a compute-bound call's cost curve bends it is the dearest
        per token. ``draft_c_loop`` (the run's
        ``draft_c_loop``: a drafted token's cost as its decode loop paid it) is the draft's
        c where given, before the draft call timed alone. ``loop_compile_s``: what its
        shapes' first speculative batches compiled. What it did not measure stays."""
        changes: dict[str, float] = {}
        if loop_compile_s is not None and math.isfinite(loop_compile_s):
            changes["loop_compile_s"] = max(float(loop_compile_s), 0.0)
        if alpha is not None and math.isfinite(alpha):
            changes["alpha"] = min(max(float(alpha), 0.0), 1.0)
        costs = step_costs_ms or {}
        target = {int(k): float(v) for k, v in (costs.get("target") or {}).items()}
        step = target.get(1)
        if step is not None and step > 0:
            if costs.get("draft_step") is not None:
                changes["draft_c"] = max(float(costs["draft_step"]), 0.0) / step
            if draft_c_loop is not None and math.isfinite(draft_c_loop):
                changes["draft_c"] = max(float(draft_c_loop), 0.0)
            if costs.get("loop_per_step") is not None:
                changes["overhead"] = max(float(costs["loop_per_step"]), 0.0) / step
            longer = sorted(k for k in target if k > 1)
            if longer:
                k = longer[0]
                at_rows = max((target[k] / step - 1.0) / (k - 1), 0.0)
                # slope_at(rows) = rows·s / (1 + (rows − 1)·s), solved for s
                denominator = rows - (rows - 1) * at_rows
                changes["target_slope"] = (
                    MAX_SLOPE if denominator <= 0 else min(at_rows / denominator, MAX_SLOPE)
                )
        return dataclasses.replace(self, **changes)

    def slope_at(self, rows: int) -> float:
        """The target's extra time per extra verified token, over its γ = 0 step, for a
        call on ``rows`` rows (``target_slope`` at 1 row; see the module's docstring)."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        s = self.target_slope
        return rows * s / (1.0 + (rows - 1) * s)
