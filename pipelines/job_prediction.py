"""What the cost model predicts for a finished job, from the rows it wrote and the model
calls timed after it (``specdec_core.costs``), and how much of it the job reached:
``predicted_speedup``, ``efficiency``, ``baseline_at_limit``, ``draft_c_loop`` and the
``step_costs_ms`` of its summary (terms: :mod:`pipelines.job_report`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pipelines.job_report import _per_batch_max, _wall_s, row_gamma


def probe(job, rows: Sequence[dict], summary: dict[str, Any], engine=None) -> dict[str, Any]:
    """The cost model's predicted speedup for the run and measured / predicted
    (:func:`prediction`), from the model calls timed after the pipeline on the run's
    median-length record (batch and cache as the engine packs it; k = 1, 2 and γ+1 for
    each γ that decoded a tenth of the tokens, the other γ's k interpolated:
    :func:`probe_ks`).

    ``engine``: the job's own engine, still open (``pipelines.inference.job_engine``).
    It times the calls where the job ran them: a Ray engine in the target's worker (and
    the draft's), on their devices, a target on a mesh included; the in-process engine
    on its loaded models. Without one (Beam's worker processes built the engines) the
    models load here and are timed on this host. ``step_costs_ms["measured_in"]`` says
    which. Where the calls cannot be timed (a draft with no model calls), the summary
    says why instead (``prediction_error``)."""
    from pipelines import text
    from workers.batching import Request
    from workers.engine import measure_step_costs

    if engine is None and job.target.spec.mesh is not None:
        return {"predicted_speedup": None, "prediction_error": "the target runs on a mesh"}
    ks, interpolated = probe_ks(rows)
    median = sorted(rows, key=lambda row: len(row["source"]))[len(rows) // 2]
    eos_id = job.input_eos_id
    encoded = text.encode(
        text.sentencepiece(job.vocab_path), job.kind.prefix, median["source"], eos_id
    )
    request = Request(
        id="cost-probe", prompt_tokens=(text.DECODER_START_ID,), encoder_tokens=encoded
    )
    try:
        if engine is not None:
            costs, measured_in = engine.step_costs(request, ks), MEASURED_IN[job.engine.kind]
        else:
            specs = (job.target.spec, job.draft.spec)
            costs = measure_step_costs(*specs, job.settings, request, ks=ks)
            measured_in = "job process"
        costs = dataclasses.replace(
            costs, target_s=with_interpolated(dict(costs.target_s), interpolated)
        )
        predicted = prediction(rows, summary, costs)
    except Exception as error:  # reported in the summary: the job's result stands
        error = getattr(error, "cause", None) or error  # a worker's, not Ray's traceback
        return {"predicted_speedup": None, "prediction_error": f"{type(error).__name__}: {error}"}
    predicted["step_costs_ms"] |= {"interpolated": interpolated, "measured_in": measured_in}
    return predicted


# where the job's own engine times the probe's calls (step_costs_ms["measured_in"])
MEASURED_IN = {"ray": "workers", "inprocess": "in-process engine"}


def prediction(rows: Sequence[dict], summary: dict[str, Any], costs) -> dict[str, Any]:
    """What the cost model predicts for this run, and how much of it the run reached.

    ``costs`` (``theory.StepCosts``): the target's call seconds on k tokens and a draft
    step, measured on decode-sized caches (:func:`probe`). The
    loop's own work per step (sampling, commit, the loop) is what the run's target-alone
    decode loop spent per step beyond the target call (``baseline_loop_ms`` where the
    engine timed its loop apart, else the batch's wall time); a speculative iteration is
    assumed to pay it once too. With the run's acceptance at each position and the
    tokens it decoded at each γ, ``specdec_core.costs.predicted_tokens_speedup`` gives
    the loop's predicted speedup. The batches' fixed work (the encoder, the prefill,
    the setup: the target alone's wall time beyond its loop) is the same at any γ, so
    ``predicted_speedup`` applies the loop's speedup to the loop only; ``efficiency`` =
    measured / predicted (below 1: time lost outside the model), ``baseline_at_limit``
    = the target call's seconds over the target-alone loop's seconds per step (1: no
    time outside the call). ``draft_c_loop``: :func:`draft_c_in_loop`.
    """
    from specdec_core import costs as cost_model

    steps = max(_per_batch_max(rows, "baseline_tokens"), 1)
    base_wall_s = _wall_s(rows, "baseline_wall_ms")
    looped = _loop_timed(rows, "baseline_loop_ms")
    base_loop_s = _wall_s(rows, "baseline_loop_ms") if looped else base_wall_s
    base_step_s = base_loop_s / steps
    # a batch's encoder, prefill and setup: what its wall time holds beyond its loop
    fixed_s = max(base_wall_s - base_loop_s, 0.0)
    overhead = max(base_step_s - costs.target_s[1], 0.0)
    full = dataclasses.replace(costs, overhead_s=overhead, baseline_overhead_s=overhead)
    in_loop = cost_model.predicted_tokens_speedup(
        summary["acceptance_by_position"], _tokens_by_gamma(rows), full
    )
    # speculation speeds up the loop; the batches' fixed work costs what it costs
    predicted = (fixed_s + base_loop_s) / (fixed_s + base_loop_s / in_loop)
    batches = len({row["batch"] for row in rows})
    return {
        "predicted_speedup": predicted,
        # the prediction models the timed batches: it is measured by the loops' timers
        "efficiency": summary["speedup_loop"] / predicted if summary["speedup_loop"] else None,
        "baseline_at_limit": costs.target_s[1] / base_step_s if base_step_s > 0 else None,
        "draft_c_loop": draft_c_in_loop(rows, base_step_s, costs) if looped else None,
        "step_costs_ms": {
            "target": {str(k): 1e3 * v for k, v in sorted(costs.target_s.items())},
            "draft_step": 1e3 * costs.draft_step_s,
            "loop_per_step": 1e3 * overhead,
            "batch_fixed": 1e3 * fixed_s / batches if looped else None,
        },
    }


# a γ that decoded less than this share of a run's tokens has its verification's cost
# interpolated rather than timed (each timed k costs the job a compile and its calls)
PROBE_SHARE = 0.1


def probe_ks(rows: Sequence[dict], share: float = PROBE_SHARE) -> tuple[list[int], list[int]]:
    """(the target call sizes k to time, those to interpolate) for a run's prediction.

    Timed: k = 1 and 2 always (a later run's γ prior reads the first verified token's
    cost) and γ + 1 for each γ that decoded at least ``share`` of the run's tokens. The
    others that the run used (an exploring batch or two) are interpolated by
    :func:`with_interpolated`: their tokens weigh little in the prediction.
    """
    tokens = _tokens_by_gamma(rows)
    total = max(sum(tokens.values()), 1)
    used = {g + 1 for g in tokens if g}
    timed = {1, 2} | {g + 1 for g, n in tokens.items() if g and n / total >= share}
    return sorted(timed), sorted(used - timed)


def with_interpolated(target_s: dict[int, float], ks: Sequence[int]) -> dict[int, float]:
    """``target_s`` with each k of ``ks`` added, linear in k between the nearest timed
    sizes below and above it (beyond the largest: along the two largest's slope, never
    below the largest's cost)."""
    from specdec_core import theory

    if len(target_s) < 2:
        raise ValueError(f"interpolation needs two timed call sizes, got {sorted(target_s)}")
    return {**target_s, **{k: theory.along_segments(target_s, k) for k in ks}}


def _tokens_by_gamma(rows: Sequence[dict]) -> dict[int, int]:
    """Tokens the run decoded at each γ (0: by the target alone)."""
    tokens: dict[int, int] = {}
    for row in rows:
        tokens[row_gamma(row)] = tokens.get(row_gamma(row), 0) + row["tokens"]
    return tokens


def _loop_timed(rows: Sequence[dict], key: str) -> bool:
    return bool(rows) and all(row.get(key) is not None for row in rows)


def draft_c_in_loop(rows: Sequence[dict], target_step_s: float, costs) -> float | None:
    """The draft's cost per drafted token as the decode loop paid it, over a target
    call: for each γ ≥ 1 the run decoded at (its loop's seconds per iteration, from
    ``loop_ms``), the step beyond the target alone's loop step (``target_step_s``) less
    the target's extra cost for γ more tokens (``costs.target_s``), per drafted token,
    over T(1); the median over the γ. None where the loop was not timed apart or no
    γ ≥ 1 ran. A later run's ``--gamma auto`` starts from it (``pipelines.previous_run``):
    the draft call timed alone (``draft_step``) misses the loop's work per drafted token."""
    by_gamma: dict[int, list[dict]] = {}
    for row in rows:
        if row_gamma(row) >= 1:
            by_gamma.setdefault(row_gamma(row), []).append(row)
    call = costs.target_s[1]
    fits = []
    for gamma, having in sorted(by_gamma.items()):
        if gamma + 1 not in costs.target_s or not _loop_timed(having, "loop_ms"):
            continue
        step = _wall_s(having, "loop_ms") / max(_per_batch_max(having, "iterations"), 1)
        # never below 0: a noisy probe can time T(2) under T(1), which would inflate c
        growth = max(costs.target_s[gamma + 1] - call, 0.0)
        fits.append(max((step - target_step_s - growth) / (gamma * call), 0.0))
    return float(sorted(fits)[len(fits) // 2]) if fits else None
