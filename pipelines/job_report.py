"""What a finished job reports: its summary figures, the printed table, its MLflow run.

Everything here is computed from the rows the job wrote (output JSONL rows carry the
per-record statistics and the id of the batch they were decoded in), so it does not
depend on the runner. Terms:

- *tokens per iteration* (``mean_accepted_length``): accepted drafted tokens plus the
  one token each iteration adds (recovered or bonus), per iteration;
- *speedup*: the whole decode paths' tokens per second, speculative over the target
  alone's, on the same records in the same job (``--compare-baseline``): each path's
  wall time from a batch entering the engine to its results leaving it, summed over
  the batches (the job's ``decode`` and ``baseline`` phases), so the policy's
  exploration, the draft's set-up and the transport count. At T=0 both paths produce
  the same tokens, so this is the ratio of their wall times (:func:`path_speedup`).
  Each batch is decoded once per path: the first batch of a program shape compiles
  inside the path's time;
- *compile_s*, *baseline_compile_s*: of each path's time, the seconds spent compiling
  (tracing, lowering, compiling or loading XLA programs; ``compile_ms`` and
  ``baseline_compile_ms`` of the rows, measured where the batch ran);
- *speedup_loop*: the same ratio from the per-batch timers of the engines' decode calls
  (``wall_ms`` and ``baseline_wall_ms`` of the rows) less their compiling, which leave
  out what a batch costs around its timed decode;
- *c_estimate*: the cost coefficient c implied by the timings if one verification
  costs one target step (the paper's assumption; on CPU it costs more, so this reads
  high).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipelines import part_files, record_io
from workers.batching import DecodeSettings

if TYPE_CHECKING:
    from pipelines.job_config import JobConfig

# ------------------------------------------------------------------------ summary


def _wall_s(rows: Iterable[dict], key: str) -> float:
    """Seconds over distinct batches (rows of one batch share its wall time), each less
    the seconds its call on that path spent compiling (``compile_ms``, or
    ``baseline_compile_ms`` for a ``baseline_`` key; at most the time itself): timings
    that price the decoding, not the first batch of a program shape."""
    compile_key = "baseline_compile_ms" if key.startswith("baseline_") else "compile_ms"
    per_batch = {row["batch"]: max(row[key] - (row.get(compile_key) or 0.0), 0.0) for row in rows}
    return sum(per_batch.values()) / 1e3


def _compile_s(rows: Iterable[dict], key: str) -> float:
    """Seconds of compiling over distinct batches (0 where a row's batch did not
    measure it)."""
    per_batch = {row["batch"]: row.get(key) or 0.0 for row in rows}
    return sum(per_batch.values()) / 1e3


def _per_batch_max(rows: Iterable[dict], key: str) -> int:
    """Σ over batches of the largest ``key``: loop steps a padded batch runs."""
    maxima: dict[str, int] = {}
    for row in rows:
        maxima[row["batch"]] = max(maxima.get(row["batch"], 0), row[key])
    return sum(maxima.values())


def row_gamma(row: dict) -> int:
    """The γ a row was decoded at (0: by the target alone, under ``--gamma auto``)."""
    return len(row["accepted_by_position"])


def acceptance_by_position(rows: Sequence[dict], gamma: int | None = None) -> list[float]:
    """Fraction of draft blocks whose token at position i was accepted, i = 1..γ (the
    largest γ among the rows; at each position over the blocks that had it)."""
    gamma = max((row_gamma(row) for row in rows), default=0) if gamma is None else gamma
    rates = []
    for i in range(gamma):
        having = [row for row in rows if row_gamma(row) > i]
        blocks = sum(row["drafted"] / row_gamma(row) for row in having)
        if not blocks:
            break
        rates.append(sum(row["accepted_by_position"][i] for row in having) / blocks)
    return rates


def gamma_histogram(rows: Sequence[dict]) -> dict[str, int]:
    """Batches decoded at each γ ({"0": n, "2": m, ...}; 0: the target alone)."""
    per_batch = {row["batch"]: row_gamma(row) for row in rows}
    counts: dict[int, int] = {}
    for gamma in per_batch.values():
        counts[gamma] = counts.get(gamma, 0) + 1
    return {str(g): counts[g] for g in sorted(counts)}


def cost_coefficient(rows: Sequence[dict], gamma: int) -> float | None:
    """c implied by the timings, if a verification costs one target step (paper, §3).

    One target step: baseline seconds per baseline step; one iteration: speculative
    seconds per iteration = γ·c·t + t. Needs --compare-baseline.
    """
    if not rows or "baseline_wall_ms" not in rows[0]:
        return None
    target_step = _wall_s(rows, "baseline_wall_ms") / max(
        _per_batch_max(rows, "baseline_tokens"), 1
    )
    iteration = _wall_s(rows, "wall_ms") / max(_per_batch_max(rows, "iterations"), 1)
    return (iteration / target_step - 1.0) / gamma if target_step > 0 else None


def quality(rows: Sequence[dict], metric: str) -> dict[str, float | None]:
    """BLEU (sacrebleu) or ROUGE-1/2/L F1 ×100 (rouge-score) over rows with references."""
    scored = [row for row in rows if row.get("reference")]
    result: dict[str, float | None] = {"bleu": None, "rouge1": None, "rouge2": None, "rougeL": None}
    if not scored:
        return result
    outputs = [row["output"] for row in scored]
    references = [row["reference"] for row in scored]
    if metric == "bleu":
        import sacrebleu

        result["bleu"] = float(sacrebleu.corpus_bleu(outputs, [references]).score)
    else:
        from rouge_score import rouge_scorer

        names = ("rouge1", "rouge2", "rougeL")
        scorer = rouge_scorer.RougeScorer(list(names), use_stemmer=True)
        scores = [scorer.score(ref, out) for ref, out in zip(references, outputs, strict=True)]
        for name in names:
            result[name] = 100.0 * sum(s[name].fmeasure for s in scores) / len(scores)
    return result


def compute_summary(
    rows: Sequence[dict],
    dead: Sequence[dict],
    *,
    records_in: int,
    settings: DecodeSettings,
    compare_baseline: bool,
    quality_metric: str,
) -> dict[str, Any]:
    """The job's summary (the ``--summary-json`` fields) from its output rows."""
    from specdec_core import theory

    tokens = sum(row["tokens"] for row in rows)
    iterations = sum(row["iterations"] for row in rows)
    drafted = sum(row["drafted"] for row in rows)
    accepted = sum(row["accepted"] for row in rows)
    spec_compile_s = _compile_s(rows, "compile_ms")
    spec_s = _wall_s(rows, "wall_ms")
    speculative = [row for row in rows if row_gamma(row) > 0]  # not the target alone (γ=0)
    fully_accepted = sum(row["accepted_by_position"][-1] for row in speculative)
    alpha = theory.empirical_alpha(  # None without tests
        accepted, sum(row["iterations"] for row in speculative), fully_accepted
    )
    gammas = {row_gamma(row) for row in rows}
    if alpha is not None and iterations:  # E[tokens] per iteration at each row's γ
        predicted = (
            sum(
                row["iterations"]
                * (theory.expected_tokens(min(alpha, 1.0), row_gamma(row)) if row_gamma(row) else 1)
                for row in rows
            )
            / iterations
        )
    else:
        predicted = None
    summary: dict[str, Any] = {
        "records_in": records_in,
        "records_out": len(rows),
        "records_failed": len(dead),
        "failed_by_reason": {
            r: n for r in record_io.REASONS if (n := sum(d["reason"] == r for d in dead))
        },
        "speedup": None,  # the whole decode paths': path_speedup, from the job's phases
        "speedup_loop": None,
        "alpha": alpha,
        "accepted_per_drafted": accepted / drafted if drafted else None,
        "mean_accepted_length": (accepted + iterations) / iterations if iterations else None,
        "predicted_tokens_per_iteration": predicted,
        "c_estimate": None,
        "tokens": tokens,
        "decode_s": spec_s,
        "compile_s": spec_compile_s,
        "baseline_compile_s": None,
        "tokens_per_s": tokens / spec_s if spec_s > 0 else None,
        "baseline_tokens_per_s": None,
        "identical_to_baseline": None,
        "acceptance_by_position": acceptance_by_position(rows),
        "gamma_histogram": gamma_histogram(rows),
    }
    if compare_baseline and rows:
        summary["baseline_compile_s"] = _compile_s(rows, "baseline_compile_ms")
        base_s = _wall_s(rows, "baseline_wall_ms")
        base_tps = sum(row["baseline_tokens"] for row in rows) / base_s if base_s > 0 else None
        summary["baseline_tokens_per_s"] = base_tps
        if base_tps and summary["tokens_per_s"]:
            summary["speedup_loop"] = summary["tokens_per_s"] / base_tps
        if len(gammas) == 1 and min(gammas) > 0:  # one γ for every batch
            summary["c_estimate"] = cost_coefficient(rows, min(gammas))
        if settings.sampling.greedy or settings.sampling.invariant:  # the same tokens promised
            summary["identical_to_baseline"] = all(row["matches_baseline"] for row in rows)
    summary |= quality(rows, quality_metric)
    return summary


def path_speedup(
    rows: Sequence[dict], phases: Mapping[str, float], resumed: set[str]
) -> dict[str, float | None]:
    """The headline ``speedup``: tokens per second of the whole speculative decode path
    over the target alone's, from the job's ``decode`` and ``baseline`` phases (wall
    seconds of ``engine.generate`` and ``engine.generate_baseline`` over every batch)
    and the tokens of the rows this run decoded (``resumed``: ids decoded by an earlier
    run, whose time is not in the phases). None without both paths' time."""
    decoded = [row for row in rows if row["id"] not in resumed]
    spec_s, base_s = phases.get("decode", 0.0), phases.get("baseline", 0.0)
    tokens = sum(row["tokens"] for row in decoded)
    base_tokens = sum(row.get("baseline_tokens") or 0 for row in decoded)
    speedup = None
    if spec_s > 0 and base_s > 0 and tokens and base_tokens:
        speedup = (tokens / spec_s) / (base_tokens / base_s)
    return {"speedup": speedup, "decode_path_s": spec_s or None, "baseline_path_s": base_s or None}


# ------------------------------------------------------------------------ MLflow


def job_params(job: JobConfig) -> dict[str, Any]:
    """MLflow params: models, checkpoints, γ, sampling, batch, dataset, seed, commit."""
    from pipelines import tracking

    sampling, engine = job.settings.sampling, job.engine
    params: dict[str, Any] = {
        "job": job.kind.name,
        "dataset": job.input,
        "workers": engine.kind,
        "draft_placement": engine.draft_placement if engine.kind == "ray" else None,
        "transport": engine.transport if engine.kind == "ray" else None,
        "pipelined": engine.pipelined if engine.kind == "ray" else None,
        "gamma": "auto" if engine.adaptive else engine.gamma,
        "gamma_max": job.settings.gamma if engine.adaptive else None,
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "sampling_rule": sampling.rule,
        "seed": job.settings.seed,
        "batch_size": "auto" if job.batch_size_auto else job.settings.batch_size,
        "max_new_tokens": job.settings.max_new_tokens,
        "max_input_tokens": job.max_input_tokens,
        "compare_baseline": job.compare_baseline,
        "vocab": job.vocab_path,
        "runner": " ".join(job.beam_args) or "FnApiRunner (in-process)",
        "git_commit": tracking.git_commit(),
    }
    params |= {f"target_{k}": v for k, v in job.target.describe().items()}
    if job.no_draft:
        params["draft_name"] = "none"
    else:
        params |= {f"draft_{k}": v for k, v in job.draft.describe().items()}
    return params


def draft_name(job: JobConfig) -> str:
    """The job's draft model, or ``none`` for ``--draft none``."""
    return "none" if job.no_draft else job.draft.spec.name


def resolved_config(job: JobConfig) -> dict[str, Any]:
    """The job as run, models' full configs included (the ``job_config.json`` artifact)."""
    config = {k: v for k, v in job_params(job).items() if k != "git_commit"}
    config |= {"output": job.output, "dead_letter": job.dead_letter, "prefix": job.kind.prefix}
    for role, model in (("target", job.target), ("draft", job.draft)):
        config[f"{role}_config"] = dataclasses.asdict(model.spec.config)
    return config


_TARGET_COST = re.compile(r"step_cost_target_(\d+)_ms")


def step_cost_metrics(step_costs_ms: Mapping[str, Any]) -> dict[str, float]:
    """A summary's ``step_costs_ms`` as MLflow metrics (``step_cost_target_<k>_ms``,
    ``step_cost_draft_step_ms``, ``step_cost_loop_per_step_ms``), which a later job's γ
    prior reads back (:func:`step_costs_from_metrics`)."""
    metrics = {
        f"step_cost_target_{k}_ms": float(ms)
        for k, ms in (step_costs_ms.get("target") or {}).items()
    }
    for name in ("draft_step", "loop_per_step", "batch_fixed"):
        if step_costs_ms.get(name) is not None:
            metrics[f"step_cost_{name}_ms"] = float(step_costs_ms[name])
    return metrics


def step_costs_from_metrics(metrics: Mapping[str, float]) -> dict[str, Any]:
    """:func:`step_cost_metrics` undone: a run's metrics back in the summary's
    ``step_costs_ms`` form."""
    target = {
        match.group(1): value
        for name, value in metrics.items()
        if (match := _TARGET_COST.fullmatch(name))
    }
    return {
        "target": target,
        "draft_step": metrics.get("step_cost_draft_step_ms"),
        "loop_per_step": metrics.get("step_cost_loop_per_step_ms"),
    }


def _numeric_metrics(summary: dict[str, Any], traffic: dict | None) -> dict[str, float]:
    keys = (
        "records_in records_out records_failed speedup speedup_loop alpha accepted_per_drafted "
        "mean_accepted_length "
        "predicted_tokens_per_iteration c_estimate tokens tokens_per_s baseline_tokens_per_s "
        "predicted_speedup efficiency baseline_at_limit draft_c_loop "
        "decode_s decode_path_s baseline_path_s compile_s baseline_compile_s loop_compile_s "
        "warmup_compile_s warmup_programs "
        "bleu rouge1 rouge2 "
        "rougeL job_s first_record_s"
    ).split()
    metrics = {k: float(summary[k]) for k in keys if summary.get(k) is not None}
    if summary.get("identical_to_baseline") is not None:
        metrics["identical_to_baseline"] = float(summary["identical_to_baseline"])
    if choice := summary.get("batch_choice"):  # --batch-size auto
        metrics["batch_size_chosen"] = float(choice["batch_size"])
    if traffic:
        metrics["bytes_per_iteration"] = float(traffic["bytes_per_iteration"])
    if early := summary.get("early_blocks"):  # --pipelined: the share of early blocks kept
        metrics["early_blocks_kept"] = early["kept_share"]
    for i, rate in enumerate(summary["acceptance_by_position"], start=1):
        metrics[f"acceptance_at_position_{i}"] = rate
    for phase, seconds in (summary.get("time_breakdown") or {}).items():
        metrics[f"time_{phase}_s"] = float(seconds)
    metrics |= step_cost_metrics(summary.get("step_costs_ms") or {})
    histogram = summary.get("gamma_histogram") or {}
    for gamma, batches in histogram.items():
        metrics[f"gamma_batches_{gamma}"] = float(batches)
    if histogram:
        metrics["gamma_mean"] = sum(int(g) * n for g, n in histogram.items()) / sum(
            histogram.values()
        )
    return metrics


def _acceptance_artifacts(summary: dict[str, Any], gamma: int) -> None:
    """Per-position acceptance: a PNG via matplotlib when installed, and a CSV."""
    import mlflow

    rates = summary["acceptance_by_position"]
    alpha = summary["alpha"]
    lines = ["position,accepted_fraction,alpha_pow_position"]
    lines += [
        f"{i},{rate:.6f},{alpha**i if alpha is not None else ''}"
        for i, rate in enumerate(rates, start=1)
    ]
    mlflow.log_text("\n".join(lines) + "\n", "acceptance_by_position.csv")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.2))
    positions = list(range(1, len(rates) + 1))
    ax.bar(positions, rates, label="measured")
    if alpha is not None:
        ax.plot(positions, [alpha**i for i in positions], "o--", color="C1", label="α^i (i.i.d.)")
    ax.set(xlabel="draft position i", ylabel="P(token i accepted)", ylim=(0, 1.05))
    ax.set_title(f"acceptance by position (γ={gamma}, α={alpha or 0:.3f})")
    ax.legend()
    fig.tight_layout()
    mlflow.log_figure(fig, "acceptance_by_position.png")
    plt.close(fig)


def _samples_table(rows: Sequence[dict], n: int = 20) -> dict[str, list]:
    """The first ``n`` rows (by id) as columns for ``mlflow.log_table``."""
    chosen = sorted(rows, key=lambda r: (len(r["id"]), r["id"]))[:n]
    columns = ["id", "source", "output", "reference", "baseline_output", "tokens", "accepted"]
    present = [c for c in columns if any(c in row for row in chosen)]
    return {c: [row.get(c) for row in chosen] for c in present}


def log_run(job: JobConfig, summary: dict, rows: Sequence[dict], traffic: dict | None) -> None:
    """Metrics and artifacts of the active MLflow run."""
    log_results(summary, rows, traffic, saved_run(job))


def log_results(summary: dict, rows: Sequence[dict], traffic: dict | None, saved: dict) -> None:
    """Metrics and artifacts of the active MLflow run, from plain data (a job's, or a
    summary JSON's for ``specdec log-run``); ``saved``: the job's :func:`saved_run`
    (its resolved config, model config files and γ are logged)."""
    import pathlib

    import mlflow

    from pipelines import tracking

    tracking.log_metrics(_numeric_metrics(summary, traffic))
    for role, node in (summary.get("placement") or {}).items():  # Ray node per role
        if node is not None:
            mlflow.set_tag(f"placement_{role}", node if isinstance(node, str) else str(node))
    mlflow.log_dict(saved["job_config"], "job_config.json")
    for source in saved["model_configs"]:
        if pathlib.Path(source).is_file():
            mlflow.log_artifact(source, "model_configs")
    if rows:
        mlflow.log_table(data=_samples_table(rows), artifact_file="samples.json")
        _acceptance_artifacts(summary, saved["gamma"])
    mlflow.log_dict(summary, "summary.json")


def run_name(job: JobConfig) -> str:
    """The MLflow run name of a job."""
    models = f"{job.target.spec.name}-{draft_name(job)}"
    gamma = "auto" if job.engine.adaptive else job.engine.gamma
    return f"{job.kind.name}-{models}-g{gamma}"


def saved_run(job: JobConfig) -> dict[str, Any]:
    """What ``specdec log-run`` needs to log the job's run later (kept in the summary
    JSON as ``mlflow_pending`` when MLflow was unavailable): experiment, run name,
    params, tags, the resolved config, the model config files and γ."""
    return {
        "experiment": job.kind.name,
        "run_name": run_name(job),
        "params": job_params(job),
        "tags": {"workers": job.engine.kind},
        "job_config": resolved_config(job),
        "model_configs": [
            m.source for m in (job.target, job.draft) if not m.source.startswith("preset:")
        ],
        "gamma": job.settings.gamma,
    }


def read_saved_run(summary_json: str) -> tuple[dict, list[dict]]:
    """(summary, output rows) of a job that ran without MLflow, checked for
    ``specdec log-run``. Raises FileNotFoundError or ValueError (already logged, not
    such a summary, output changed)."""
    import json
    import pathlib

    path = pathlib.Path(summary_json)
    if not path.is_file():
        raise FileNotFoundError(f"summary JSON not found: {summary_json}")
    try:
        summary = json.loads(path.read_text())
    except ValueError as error:
        raise ValueError(f"{summary_json} is not a job summary: {error}") from None
    if not isinstance(summary, dict) or "records_out" not in summary:
        raise ValueError(f"{summary_json} is not a job summary")
    if summary.get("mlflow_run_id"):
        raise ValueError(f"{summary_json}: already logged as MLflow run {summary['mlflow_run_id']}")
    if not isinstance(summary.get("mlflow_pending"), dict):
        raise ValueError(
            f"{summary_json} has no mlflow_pending entry: not from a job without MLflow"
        )
    rows = record_io.read_jsonl(summary["output"])
    if len(rows) != summary["records_out"]:
        raise ValueError(
            f"{summary['output']} holds {len(rows)} rows, the summary says {summary['records_out']}"
        )
    return summary, rows


def log_saved_run(summary_json: str, tracking_uri: str | None = None) -> str:
    """Logs the MLflow run of a job that ran without one (``specdec log-run``).

    Reads the summary JSON the job wrote and its output rows (:func:`read_saved_run`),
    logs params, metrics and artifacts as the job would have, rewrites the summary
    with the new run id and returns it.
    """
    import json

    from pipelines import tracking

    summary, rows = read_saved_run(summary_json)
    saved = summary["mlflow_pending"]
    uri = tracking_uri or summary.get("tracking_uri") or tracking.default_tracking_uri()
    bytes_per_iteration = summary.get("bytes_per_iteration")
    traffic = {"bytes_per_iteration": bytes_per_iteration} if bytes_per_iteration else None
    logged = {k: v for k, v in summary.items() if k != "mlflow_pending"}
    tags = {**saved["tags"], "logged_by": "specdec log-run"}
    with tracking.start_run(
        saved["experiment"],
        run_name=saved["run_name"],
        params=saved["params"],
        tags=tags,
        tracking_uri=uri,
    ) as run:
        logged |= {"mlflow_run_id": run.info.run_id, "mlflow_error": None, "tracking_uri": uri}
        log_results(logged, rows, traffic, saved)
    part_files.write_atomic(summary_json, json.dumps(logged, indent=2) + "\n")
    return run.info.run_id
