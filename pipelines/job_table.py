"""The job's printed table: the summary (:class:`pipelines.job_summary.JobSummary`) as
label / value lines, as ``specdec translate`` and ``specdec summarize`` print it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipelines.job_report import draft_name

if TYPE_CHECKING:
    from pipelines.job_config import JobConfig
    from pipelines.job_summary import JobSummary


def _step_costs_line(costs: dict | None) -> str:
    if not costs:
        return "n/a"
    guessed = {str(k) for k in costs.get("interpolated") or ()}  # job_prediction.probe_ks
    target = ", ".join(
        f"k={k} {v:.2f}" + (" (interpolated)" if k in guessed else "")
        for k, v in costs["target"].items()
    )
    fixed = costs.get("batch_fixed")
    return (
        f"target {target}; draft step {costs['draft_step']:.2f}; "
        f"loop {costs['loop_per_step']:.2f} per step"
        + ("" if fixed is None else f"; encoder and setup {fixed:.2f} per batch")
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, list):
        return " ".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
    return str(value)


def _batch(job: JobConfig, summary: JobSummary) -> str:
    """The batch size, and where the job chose it (``--batch-size auto``) that it did."""
    if summary.batch_choice is None:
        return str(job.settings.batch_size)
    return f"auto ({summary.batch_choice['batch_size']})"


def format_summary(job: JobConfig, summary: JobSummary) -> str:
    """The human-readable table printed at the end of a job."""
    sampling = job.settings.sampling
    rows = [
        ("models", f"target {job.target.spec.name}, draft {draft_name(job)}"),
        (
            "decoding",
            f"γ={f'auto (0..{job.settings.gamma})' if job.engine.adaptive else job.engine.gamma}"
            f" T={sampling.temperature} top-k={sampling.top_k} "
            f"top-p={sampling.top_p} sampling={sampling.rule} batch={_batch(job, summary)} "
            f"workers={job.engine.kind}",
        ),
        (
            "records in / out / failed",
            f"{summary.records_in} / {summary.records_out} / {summary.records_failed}",
        ),
        ("failed by reason", _fmt(summary.failed_by_reason)),
        ("speedup (whole decode path)", _speedup_line(summary)),
        ("  the loops' timers alone", _fmt(summary.speedup_loop)),
        ("  of which compiling (s)", _compile_line(summary)),
        ("  compiled ahead (s)", _warmup_line(summary)),
        ("tokens/s speculative (loop)", _fmt(summary.tokens_per_s)),
        ("tokens/s target alone (loop)", _fmt(summary.baseline_tokens_per_s)),
        ("acceptance rate α (ML)", _fmt(summary.alpha)),
        ("  accepted / drafted", _fmt(summary.accepted_per_drafted)),
        (
            "batches at each γ",
            ", ".join(f"γ={g}: {n}" for g, n in (summary.gamma_histogram or {}).items()),
        ),
        ("tokens per iteration", _fmt(summary.mean_accepted_length)),
        ("  predicted from α", _fmt(summary.predicted_tokens_per_iteration)),
        ("acceptance by position", _fmt(summary.acceptance_by_position)),
        ("cost coefficient c (est.)", _fmt(summary.c_estimate)),
        ("  a drafted token in the loop", _fmt(summary.draft_c_loop)),
        ("predicted speedup (costs)", _fmt(summary.predicted_speedup)),
        ("  loop's measured / predicted", _fmt(summary.efficiency)),
        ("  target alone at its call", _fmt(summary.baseline_at_limit)),
        ("step costs (ms)", _step_costs_line(summary.step_costs_ms)),
        ("bytes per iteration (Ray)", _fmt(summary.bytes_per_iteration)),
        ("early blocks kept (pipelined)", _early_blocks(summary.early_blocks)),
        (
            "time breakdown (s)",
            ", ".join(
                f"{phase} {seconds:.1f}"
                for phase, seconds in (summary.time_breakdown or {}).items()
            ),
        ),
    ]
    if job.kind.quality_metric == "bleu":
        rows.append(("BLEU", _fmt(summary.bleu)))
    else:
        rows.append(
            ("ROUGE-1/2/L", " / ".join(map(_fmt, (summary.rouge1, summary.rouge2, summary.rougeL))))
        )
    rows += [
        ("identical to the target alone", _fmt(summary.identical_to_baseline)),
        ("outputs", summary.output),
        ("dead letters", summary.dead_letter),
        *([("resumed records", str(summary.records_resumed))] if summary.records_resumed else []),
        (
            "MLflow run",
            f"{summary.mlflow_run_id} (experiment {job.kind.name!r})"
            if summary.mlflow_run_id
            else f"none: {summary.mlflow_error} (specdec log-run logs it later)",
        ),
        ("browse", f"specdec ui --tracking-uri {summary.tracking_uri}"),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"specdec {job.kind.name}: done {_job_time(summary)}"]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    return "\n".join(lines)


def _compile_line(summary: JobSummary) -> str:
    """Seconds each path spent compiling, inside its time (the first batch of each
    program shape); says so when the speculative side's was longer by a tenth of a
    second or more."""
    spec, base = summary.compile_s, summary.baseline_compile_s
    if spec is None:
        return "n/a"
    line = f"speculative {spec:.3g}"
    if base is not None:
        line += f", target alone {base:.3g}"
        if spec - base >= 0.1:
            line += " (the speculative side compiled more)"
    return line


def _warmup_line(summary: JobSummary) -> str:
    """What the warm-up compiled in the background, outside both paths' times."""
    if summary.warmup_programs is None:
        return "none (--no-warmup, or a placement that compiles on the batches' path)"
    return (
        f"{summary.warmup_compile_s:.3g} in the background, off both paths "
        f"({summary.warmup_programs} programs)"
    )


def _speedup_line(summary: JobSummary) -> str:
    """The headline ratio and the two paths' wall times it comes from."""
    if summary.speedup is None:
        return "n/a"
    return (
        f"{_fmt(summary.speedup)} (speculative {summary.decode_path_s:.3g} s, "
        f"target alone {summary.baseline_path_s:.3g} s)"
    )


def _job_time(summary: JobSummary) -> str:
    """The job's time since its process started (what a user waits), then its parts."""
    phases = summary.time_breakdown or {}
    before = phases.get("startup", 0.0) + phases.get("ray_start", 0.0)
    text = f"{summary.job_s + before:.1f} s after the process started"
    parts = [f"{summary.job_s:.1f} s after imports and Ray's start"]
    if summary.first_record_s is not None:
        parts.append(f"first record at {summary.first_record_s:.1f} s")
    return f"{text} ({'; '.join(parts)})"


def _early_blocks(early: dict | None) -> str:
    """``--pipelined``: the iterations whose early block stood for the whole batch."""
    if not early:
        return "n/a"
    return f"{early['kept']} of {early['proposed']} iterations ({early['kept_share']:.0%})"
