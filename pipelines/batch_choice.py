"""``--batch-size auto``: the batch size that decodes an offline job's records soonest.

An offline job's competitor is not the target alone at batch 1 but the target alone at
its best batch size: where a call on 16 rows costs a few calls on one, batching gains
more than a draft does. The job knows its records before it decodes any, so it chooses:

1. **Time the target's decode step at each candidate batch size** (:data:`CANDIDATES`,
   those the job's records can fill), on decode-sized caches packed as the engine packs
   the job's most common encoder width (``specdec_core.costs.call_timer``, in
   interleaved rounds). The target loads in this process (the in-process engine reuses
   it; a Ray job's workers load their own copy), so the figures are this host's.
2. **Plan the job's batches at each size** as the pipeline forms them (records keyed
   by length bucket, in input order, a bucket's last batch padded to full rows) and
   count the target steps they run: a batch runs until its longest record is done,
   whose output length its encoder length stands in for (:func:`planned_steps`).
3. **Take the size whose steps cost least** (step seconds × planned steps).

γ is then chosen per batch as ever (``--gamma auto``: the draft where it pays at that
size, the target alone where it does not). The summary reports the chosen size and the
figures behind it (``batch_choice``), and MLflow logs them.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

CANDIDATES = (1, 4, 16, 64)  # batch sizes the choice times
PROBE_CALLS = 4  # target calls per timed run of each candidate
PROBE_ROUNDS = 2  # timed runs of each candidate (interleaved), medians taken


@dataclasses.dataclass(frozen=True)
class BatchChoice:
    """The chosen batch size and what chose it, per candidate: the target's step
    seconds and the job's planned steps at that size."""

    batch_size: int
    step_s: dict[int, float]
    planned_steps: dict[int, int]

    @property
    def predicted_s(self) -> dict[int, float]:
        """The target's decode seconds for the job at each candidate size."""
        return {b: self.step_s[b] * self.planned_steps[b] for b in self.step_s}

    def to_dict(self) -> dict[str, Any]:
        """The summary's ``batch_choice``: string keys (JSON), milliseconds and seconds."""
        return {
            "batch_size": self.batch_size,
            "step_ms": {str(b): round(s * 1e3, 3) for b, s in self.step_s.items()},
            "planned_steps": {str(b): n for b, n in self.planned_steps.items()},
            "predicted_s": {str(b): round(s, 3) for b, s in self.predicted_s.items()},
        }


def candidates(records: int) -> list[int]:
    """The candidate sizes worth timing for ``records`` records: every candidate up to
    the first that holds them all in one batch (a larger one only pads more rows)."""
    if records < 1:
        raise ValueError(f"a batch size is chosen for at least one record, got {records}")
    chosen = []
    for size in CANDIDATES:
        chosen.append(size)
        if size >= records:
            break
    return chosen


def planned_steps(buckets: Sequence[int], lengths: Sequence[int], rows: int) -> int:
    """Target steps of the job's batches at ``rows`` per batch: records grouped by
    bucket in input order into batches of ``rows`` (a bucket's last one partial), each
    batch running for its longest record's ``lengths`` (the encoder tokens, standing in
    for the output's)."""
    if len(buckets) != len(lengths):
        raise ValueError(f"{len(buckets)} buckets for {len(lengths)} lengths")
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    open_batches: dict[int, list[int]] = collections.defaultdict(list)
    steps = 0
    for bucket, length in zip(buckets, lengths, strict=True):
        batch = open_batches[bucket]
        batch.append(length)
        if len(batch) == rows:
            steps += max(batch)
            batch.clear()
    return steps + sum(max(batch) for batch in open_batches.values() if batch)


def choose(
    step_s: Mapping[int, float], buckets: Sequence[int], lengths: Sequence[int]
) -> BatchChoice:
    """The candidate of ``step_s`` (batch size -> the target's step seconds) whose
    planned steps cost least; a tie goes to the smaller size."""
    if not step_s:
        raise ValueError("no candidate batch size was timed")
    steps = {b: planned_steps(buckets, lengths, b) for b in sorted(step_s)}
    best = min(steps, key=lambda b: (step_s[b] * steps[b], b))
    return BatchChoice(batch_size=best, step_s=dict(sorted(step_s.items())), planned_steps=steps)


def time_steps(target, settings, encoder_tokens: Sequence[int], sizes: Sequence[int]):
    """The target's decode-step seconds at each of ``sizes`` rows, on caches packed as the
    engine packs a batch of copies of one record with ``encoder_tokens`` (its cache
    slots included), in interleaved rounds."""
    from pipelines import text
    from specdec_core import costs
    from workers.batching import Request, pack

    request = Request(
        id="batch-probe",
        prompt_tokens=(text.DECODER_START_ID,),
        encoder_tokens=tuple(encoder_tokens),
    )
    timers = {}
    for size in sizes:
        batch = pack([request] * size, dataclasses.replace(settings, batch_size=size))
        timers[size] = costs.call_timer(
            target, batch.encoder_tokens, k=1, cache_len=batch.max_len, repeats=PROBE_CALLS
        )
    return costs.interleaved_seconds(timers, rounds=PROBE_ROUNDS)


def resolve(job, encoded: Sequence[Sequence[int]]):
    """``job`` with its batch size chosen for the records whose encoder tokens are
    ``encoded`` (in input order), and the :class:`BatchChoice`."""
    from pipelines import text
    from workers.engine import bound_model

    if not encoded:
        raise ValueError("--batch-size auto needs at least one record to decode")
    if job.target.spec.mesh is not None:
        raise ValueError(
            "--batch-size auto times the target in the job's process, and this target "
            "runs on a mesh: give --batch-size a number"
        )
    lengths = [len(tokens) for tokens in encoded]
    buckets = [text.length_bucket(n) for n in lengths]
    common = collections.Counter(buckets).most_common(1)[0][0]
    sample = next(tokens for tokens, b in zip(encoded, buckets, strict=True) if b == common)
    sizes = candidates(len(lengths))
    log.info("  --batch-size auto: timing the target at batch %s", ", ".join(map(str, sizes)))
    step_s = time_steps(bound_model(job.target.spec), job.settings, sample, sizes)
    choice = choose(step_s, buckets, lengths)
    log.info(
        "  --batch-size auto: batch %d (predicted target seconds: %s)",
        choice.batch_size,
        ", ".join(f"{b}: {s:.1f}" for b, s in choice.predicted_s.items()),
    )
    settings = dataclasses.replace(job.settings, batch_size=choice.batch_size)
    return dataclasses.replace(job, settings=settings), choice
