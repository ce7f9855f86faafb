"""What a job reports: :class:`JobSummary`, one typed record of a finished job.

``pipelines.translate.run_job`` returns it, the printed table (``pipelines.job_table``)
reads it, and its :meth:`JobSummary.to_dict` is the summary JSON (``--summary-json``)
and what ``specdec log-run`` logs later. The fields are grouped as the job computes
them: the records, the speed of the two decode paths, acceptance, quality, the cost
model's prediction, the engine, time, ``--gamma auto``'s prior, and where things went.
A figure the job could not compute is None (a run without ``--compare-baseline`` has no
baseline figures; a translation has no ROUGE).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobSummary:
    """A finished job (the module's docstring). Built once, from every figure at once
    (:meth:`from_mapping` names a missing or unknown one)."""

    # the records: in = out + failed, and out includes those an earlier run finished
    records_in: int
    records_out: int
    records_failed: int
    failed_by_reason: dict[str, int]
    records_resumed: int

    # speed: speedup is the whole decode paths' (``job_report.path_speedup``),
    # speedup_loop the engines' loop timers'; decode_s, tokens_per_s and the compile
    # seconds are the speculative side's, the baseline_* the target alone's
    speedup: float | None
    speedup_loop: float | None
    decode_path_s: float | None
    baseline_path_s: float | None
    tokens: int
    decode_s: float
    compile_s: float | None
    baseline_compile_s: float | None
    loop_compile_s: float | None  # a shape's speculative loop, as --gamma auto measured it
    # the job's programs compiled ahead, in the background (workers.warmup): seconds it
    # spent compiling, off both paths' times, and programs warmed (None: no warm-up)
    warmup_compile_s: float | None = None
    warmup_programs: int | None = None
    # --batch-size auto: the size chosen and the figures behind it
    # (pipelines.batch_choice.BatchChoice.to_dict); None for a given size
    batch_choice: dict[str, Any] | None = None
    tokens_per_s: float | None
    baseline_tokens_per_s: float | None
    identical_to_baseline: bool | None  # None where the rule does not promise it

    # acceptance
    alpha: float | None
    accepted_per_drafted: float | None
    mean_accepted_length: float | None  # tokens per iteration
    predicted_tokens_per_iteration: float | None
    acceptance_by_position: list[float]
    gamma_histogram: dict[str, int]
    c_estimate: float | None

    # quality against the references, where the input has them
    bleu: float | None
    rouge1: float | None
    rouge2: float | None
    rougeL: float | None  # the metric's own name, as MLflow logs it

    # the cost model's prediction (``job_prediction.probe``, with --compare-baseline)
    predicted_speedup: float | None = None
    prediction_error: str | None = None
    efficiency: float | None = None
    baseline_at_limit: float | None = None
    draft_c_loop: float | None = None
    step_costs_ms: dict[str, Any] | None = None

    # the engine (Ray only: bytes, restarts, nodes; --pipelined: early blocks)
    bytes_per_iteration: float | None
    worker_restarts: dict[str, int] | None
    placement: dict[str, str] | None
    ray_started_early: bool
    early_blocks: dict[str, int] | None

    # time: seconds since the job's start, the first record since the process's, phases
    job_s: float
    first_record_s: float | None
    time_breakdown: dict[str, float]

    # --gamma auto's prior, and the earlier run it was updated from
    gamma_prior: dict[str, Any] | None
    gamma_prior_run_id: str | None

    # where things went
    output: str
    dead_letter: str
    tracking_uri: str
    mlflow_run_id: str | None
    mlflow_error: str | None
    mlflow_pending: dict[str, Any] | None = None  # what log-run needs, where MLflow failed

    @classmethod
    def from_mapping(cls, figures: Mapping[str, Any]) -> JobSummary:
        """The summary of ``figures``; raises ValueError naming any field that is missing
        or that the summary does not have."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(figures) - set(fields))
        required = {
            name
            for name, f in fields.items()
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(figures))
        if unknown or missing:
            raise ValueError(
                f"a job summary takes JobSummary's fields: unknown {unknown}, missing {missing}"
            )
        return cls(**figures)

    def to_dict(self) -> dict[str, Any]:
        """The summary JSON: every field, ``mlflow_pending`` only where it is set."""
        figures = dataclasses.asdict(self)
        if figures["mlflow_pending"] is None:
            del figures["mlflow_pending"]
        return figures

    def replace(self, **changes: Any) -> JobSummary:
        return dataclasses.replace(self, **changes)
