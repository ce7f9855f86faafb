"""``--gamma auto``'s prior from the newest finished run of the same job in MLflow.

A job with ``--compare-baseline`` logs its α and its timed model calls
(``step_cost_*_ms`` metrics: the target on 1 and γ+1 tokens, a draft step, the loop's
own work per step; ``draft_c_loop``, a drafted token's cost inside the loop). The next
run of the same job — same kind, models and checkpoints,
batch size, temperature and engine — starts its γ policy from those figures instead of
the draft config's ``gamma_prior:`` (which holds figures measured once, on one
machine, at batch 1). What the earlier run did not measure (α when it never left
γ = 0, the growth per token when it timed only k = 1) stays as the config gives it.
The job's own measurements then take over as they come (``workers/gamma.py``). γ is
not matched: a run at a fixed γ measures the same pair's α and costs.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipelines import job_report
from workers.gamma import GammaPrior

# The params whose values make two runs the same job for the prior (besides the
# experiment, which is the job's kind).
MATCHED_PARAMS = (
    "target_name",
    "target_checkpoint",
    "draft_name",
    "draft_checkpoint",
    "batch_size",
    "temperature",
    "workers",
)


def newest_run(experiment_id: str, tracking_uri: str, params: Mapping[str, str]):
    """The newest FINISHED run of the experiment whose params equal ``params``; None if
    there is none (or a value cannot be put in MLflow's filter: it holds a quote)."""
    from mlflow.tracking import MlflowClient

    if any("'" in value or "'" in key for key, value in params.items()):
        return None
    clauses = [f"params.`{key}` = '{value}'" for key, value in params.items()]
    runs = MlflowClient(tracking_uri=tracking_uri).search_runs(
        [experiment_id],
        filter_string=" and ".join([*clauses, "attributes.status = 'FINISHED'"]),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def gamma_prior(
    base: GammaPrior | None,
    *,
    experiment_id: str,
    tracking_uri: str,
    params: Mapping[str, str],
    rows: int,
) -> tuple[GammaPrior | None, str | None]:
    """(prior, the run id it came from): ``base`` (the draft config's prior, or the
    defaults) updated with the newest matching run's α and step costs; (``base``,
    None) when no finished run of the same job measured them."""
    wanted = {key: str(params[key]) for key in MATCHED_PARAMS if key in params}
    run = newest_run(experiment_id, tracking_uri, wanted)
    if run is None:
        return base, None
    metrics = run.data.metrics
    costs = job_report.step_costs_from_metrics(metrics)
    if metrics.get("alpha") is None and not costs["target"]:
        return base, None
    prior = (base or GammaPrior()).measured(
        alpha=metrics.get("alpha"),
        step_costs_ms=costs,
        rows=rows,
        draft_c_loop=metrics.get("draft_c_loop"),
        loop_compile_s=metrics.get("loop_compile_s"),
    )
    return prior, run.info.run_id
