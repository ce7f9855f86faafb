"""The study's output: MLflow runs (a parent per study, a nested child per cell), the
results as the paper's Table 3, plots, the printed table and ``--summary-json`` rows."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pipelines.study.config import StudyConfig

EXPERIMENT = "acceptance-study"


# ------------------------------------------------------------------------ MLflow


def cell_run_name(row: Mapping) -> str:
    return f"{row['target']} | {row['draft']} | T={row['temperature']:g}"


def cell_params(study: StudyConfig, row: Mapping) -> dict[str, Any]:
    decode, dataset = study.decode, study.dataset
    return {
        "task": row["task"],
        "target": row["target"],
        "draft": row["draft"],
        "temperature": row["temperature"],
        "top_k": decode.top_k,
        "top_p": decode.top_p,
        "gammas": list(decode.gammas),
        "max_new_tokens": decode.max_new_tokens,
        "prompts": row["sequences"],
        "prompt_tokens": dataset.prompt_tokens,
        "dataset": f"{dataset.source}:{dataset.path}:{dataset.split}",
        "tokenizer": dataset.tokenizer,
        "seed": study.seed,
        "c_source": row["c_source"],
        "target_source": row["target_source"],
        "draft_source": row["draft_source"],
        "target_checkpoint": row["target_checkpoint"],
        "draft_checkpoint": row["draft_checkpoint"],
        "target_params": row["target_params"],
        "draft_params": row["draft_params"],
        "ci": f"{study.theory.confidence:g} percentile bootstrap over sequences "
        f"({study.theory.bootstrap_resamples} resamples)",
    }


def cell_metrics(row: Mapping) -> tuple[dict[str, float], dict[str, list[tuple[int, float]]]]:
    """(scalar metrics, stepped metrics {name: [(step, value)]}) of one cell's child run."""
    keys = (
        "alpha",
        "alpha_ci_low",
        "alpha_ci_high",
        "empirical_acceptance",
        "optimal_gamma",
        "predicted_improvement",
        "c",
        "positions",
        "sequences",
    )
    scalars = {k: float(row[k]) for k in keys}
    scalars["agrees_with_alpha"] = float(row["agrees_with_alpha"])
    for g in row["by_gamma"]:
        for name in (
            "empirical_acceptance",
            "empirical_acceptance_ci_low",
            "empirical_acceptance_ci_high",
            "tokens_per_iteration",
            "predicted_tokens_per_iteration",
            "accepted_per_drafted",
        ):
            scalars[f"{name}_gamma_{g['gamma']}"] = float(g[name])
    stepped = {
        "beta_by_position": [
            (j + 1, b) for j, b in enumerate(row["beta_by_position"]) if b is not None
        ],
        "predicted_improvement_by_gamma": [
            (g, v) for g, v in enumerate(row["improvement_by_gamma"], start=1)
        ],
    }
    return scalars, stepped


def _log_stepped(run_id: str, stepped: Mapping[str, list[tuple[int, float]]]) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, s) for k, pairs in stepped.items() for s, v in pairs]
    client = MlflowClient()
    for start in range(0, len(metrics), 900):  # log_batch takes at most 1000 metrics
        client.log_batch(run_id, metrics=metrics[start : start + 900])


# Table 3's columns: (column, the row key it shows)
_TABLE3_COLUMNS = (
    ("TASK", "task"),
    ("target", "target"),
    ("draft", "draft"),
    ("T", "temperature"),
    ("alpha", "alpha"),
    ("alpha_ci_low", "alpha_ci_low"),
    ("alpha_ci_high", "alpha_ci_high"),
    ("empirical_acceptance", "empirical_acceptance"),
    ("agrees", "agrees_with_alpha"),
    ("optimal_gamma", "optimal_gamma"),
    ("predicted_improvement", "predicted_improvement"),
    ("c", "c"),
    ("positions", "positions"),
)


def table3(rows: Sequence[Mapping]) -> dict[str, list]:
    """The results as columns, laid out like the paper's Table 3 (TASK, Mp, Mq, T, α, ...)."""
    return {column: [r[key] for r in rows] for column, key in _TABLE3_COLUMNS}


def table3_markdown(rows: Sequence[Mapping]) -> str:
    """Table 3 as a Markdown table (the parent run's description and ``table3.md``)."""
    header = ("TASK", "Mp", "Mq", "T", "α", "95% CI", "α̂ spec", "agree", "γ*", "improv.", "c")
    lines = [
        "**Table 3** (acceptance α per target Mp, draft Mq and temperature T)",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for r in rows:
        cells = (r["task"], f"{r['target']} ({_size(r['target_params'])})", *_cells(r))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Plots: artifacts `plots/alpha_by_draft.png`, `plots/improvement_vs_gamma.png`."]
    return "\n".join(lines) + "\n"


def log_study(study: StudyConfig, rows: list[dict], *, tracking_uri: str) -> str:
    """Parent run + one nested child run per cell; sets ``row["mlflow_run_id"]``."""
    import mlflow

    from pipelines import tracking

    tracking.ensure_experiment(EXPERIMENT, tracking_uri)  # artifacts beside the store
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(EXPERIMENT)
    tags = {"git_commit": tracking.git_commit(), "study": study.name}
    with mlflow.start_run(run_name=study.name, tags=tags) as parent:
        mlflow.log_params(tracking.flatten_params(study_params(study)))
        for row in rows:
            with mlflow.start_run(run_name=cell_run_name(row), nested=True, tags=tags) as child:
                mlflow.log_params(tracking.flatten_params(cell_params(study, row)))
                scalars, stepped = cell_metrics(row)
                mlflow.log_metrics(scalars)
                _log_stepped(child.info.run_id, stepped)
                mlflow.log_dict(row, "cell.json")
                row["mlflow_run_id"] = child.info.run_id
        mlflow.log_table(data=table3(rows), artifact_file="table3.json")
        markdown = table3_markdown(rows)
        mlflow.log_text(markdown, "table3.md")
        mlflow.set_tag("mlflow.note.content", markdown)  # the run page's Description
        mlflow.log_dict({"rows": rows, "skipped": list(study.skipped)}, "cells.json")
        mlflow.log_artifact(study.path, "config")
        log_plots(rows, study)
    return parent.info.run_id


def study_params(study: StudyConfig) -> dict[str, Any]:
    return {
        "study": study.name,
        "config": study.path,
        "seed": study.seed,
        "dataset": dataclasses.asdict(study.dataset),
        "decode": dataclasses.asdict(study.decode),
        "theory": dataclasses.asdict(study.theory),
        "grid": [f"{e.target.name}: {', '.join(d.name for d in e.drafts)}" for e in study.grid],
        "runner": "FnApiRunner (in-process)",
    }


# ------------------------------------------------------------------------ plots


def plot_csvs(rows: Sequence[Mapping], study: StudyConfig) -> dict[str, str]:
    """The plots' data as CSV text: α per draft and temperature; improvement vs γ."""
    alpha = ["target,draft,temperature,alpha,alpha_ci_low,alpha_ci_high"]
    alpha += [
        f"{r['target']},{r['draft']},{r['temperature']:g},{r['alpha']:.6f},"
        f"{r['alpha_ci_low']:.6f},{r['alpha_ci_high']:.6f}"
        for r in rows
    ]
    curve = ["target,draft,temperature,gamma,predicted_improvement,measured_improvement"]
    for r in rows:
        measured = {
            g["gamma"]: g["tokens_per_iteration"] / (g["gamma"] * r["c"] + 1) for g in r["by_gamma"]
        }
        for g, value in enumerate(r["improvement_by_gamma"], start=1):
            point = f"{measured[g]:.6f}" if g in measured else ""
            curve.append(f"{r['target']},{r['draft']},{r['temperature']:g},{g},{value:.6f},{point}")
    return {
        "alpha_by_draft.csv": "\n".join(alpha) + "\n",
        "improvement_vs_gamma.csv": "\n".join(curve) + "\n",
    }


def log_plots(rows: Sequence[Mapping], study: StudyConfig) -> None:
    """CSV always; PNG figures when matplotlib is installed."""
    import mlflow

    for name, text in plot_csvs(rows, study).items():
        mlflow.log_text(text, f"plots/{name}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for name, figure in (
        ("alpha_by_draft.png", alpha_figure(plt, rows)),
        ("improvement_vs_gamma.png", improvement_figure(plt, rows)),
    ):
        mlflow.log_figure(figure, f"plots/{name}")
        plt.close(figure)


def _targets(rows: Sequence[Mapping]) -> list[str]:
    return list(dict.fromkeys(r["target"] for r in rows))


def alpha_figure(plt, rows: Sequence[Mapping]):
    """Bars: α per draft (x) and temperature (colour), one panel per target, CI whiskers."""
    targets = _targets(rows)
    fig, axes = plt.subplots(1, len(targets), figsize=(4.5 * len(targets), 3.4), squeeze=False)
    for ax, target in zip(axes[0], targets, strict=True):
        mine = [r for r in rows if r["target"] == target]
        drafts = list(dict.fromkeys(r["draft"] for r in mine))
        temps = sorted({r["temperature"] for r in mine})
        width = 0.8 / len(temps)
        for k, temp in enumerate(temps):
            cells = {r["draft"]: r for r in mine if r["temperature"] == temp}
            xs = [i + k * width for i, d in enumerate(drafts) if d in cells]
            got = [cells[d] for d in drafts if d in cells]
            errors = [
                [r["alpha"] - r["alpha_ci_low"] for r in got],
                [r["alpha_ci_high"] - r["alpha"] for r in got],
            ]
            ax.bar(xs, [r["alpha"] for r in got], width, yerr=errors, label=f"T={temp:g}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(drafts))], drafts, rotation=20)
        ax.set(title=f"target {target}", ylabel="α", ylim=(0, 1.05))
        ax.legend()
    fig.tight_layout()
    return fig


def improvement_figure(plt, rows: Sequence[Mapping]):
    """Predicted improvement vs γ (lines) with the measured-acceptance points (markers)."""
    targets = _targets(rows)
    fig, axes = plt.subplots(1, len(targets), figsize=(4.8 * len(targets), 3.4), squeeze=False)
    for ax, target in zip(axes[0], targets, strict=True):
        for i, r in enumerate(row for row in rows if row["target"] == target):
            gammas = range(1, len(r["improvement_by_gamma"]) + 1)
            label = f"{r['draft']} T={r['temperature']:g} (c={r['c']:.3g})"
            ax.plot(gammas, r["improvement_by_gamma"], color=f"C{i % 10}", label=label)
            measured = [
                (g["gamma"], g["tokens_per_iteration"] / (g["gamma"] * r["c"] + 1))
                for g in r["by_gamma"]
            ]
            ax.plot(*zip(*measured, strict=True), "o", color=f"C{i % 10}")
        ax.set(title=f"target {target}", xlabel="γ", ylabel="predicted improvement (×)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------ output


def _size(n: int) -> str:
    """Parameter counts as the paper writes them: 97M, 137B (n-grams: table entries)."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)


def _cells(r: Mapping) -> tuple[str, ...]:
    """A Table 3 row's cells from the draft on (Mq, T, α, CI, α̂, agree, γ*, improv., c)."""
    return (
        f"{r['draft']} ({_size(r['draft_params'])})",
        f"{r['temperature']:g}",
        f"{r['alpha']:.3f}",
        f"[{r['alpha_ci_low']:.3f}, {r['alpha_ci_high']:.3f}]",
        f"{r['empirical_acceptance']:.3f}",
        "yes" if r["agrees_with_alpha"] else "NO",
        str(r["optimal_gamma"]),
        f"{r['predicted_improvement']:.2f}x",
        f"{r['c']:.3g}",
    )


def format_table(rows: Sequence[Mapping]) -> str:
    """The paper's Table 3 layout (TASK/Mp, Mq, T, α) plus CI, α̂, γ*, improvement, c."""
    header = ("TASK (Mp)", "Mq", "T", "α", "CI", "α̂ spec", "agree", "γ*", "improv.", "c")
    lines = []
    for r in rows:
        lines.append((f"{r['task']} ({_size(r['target_params'])})", *_cells(r)))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
    rule = "-" * len(fmt(header))
    return "\n".join([fmt(header), rule, *map(fmt, lines)])


SUMMARY_KEYS = (
    "target",
    "draft",
    "temperature",
    "alpha",
    "alpha_ci_low",
    "alpha_ci_high",
    "empirical_acceptance",
    "optimal_gamma",
    "mlflow_run_id",
)


def summary_rows(rows: Sequence[Mapping]) -> list[dict[str, Any]]:
    """One ``--summary-json`` row per (target, draft, temperature)."""
    return [{k: r[k] for k in SUMMARY_KEYS} for r in rows]
