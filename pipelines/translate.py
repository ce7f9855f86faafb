"""The Beam jobs: ``specdec translate`` (En→De) and ``specdec summarize``.

This module runs a job (:func:`run_job`). Its kinds and config (:class:`JobConfig`,
built by :func:`make_job` from the CLI's flags) are in :mod:`pipelines.job_config`, the
transforms in :mod:`pipelines.transforms`, the inference step in
:mod:`pipelines.inference`; the whole path is drawn in docs/ARCHITECTURE.md.

One pipeline serves both (they differ only in :class:`JobKind`: prefix, field names,
quality metric, MLflow experiment)::

    records (read here, bad lines already dead letters)
      -> Tokenize          prefix + SentencePiece + EOS; over-long -> dead letter
      -> KeyByLength       key = encoder length bucket (text.LENGTH_BUCKET tokens)
      -> GroupIntoBatches  batch_size records of one bucket
      -> RunInference      SpeculativeModelHandler: load_model builds the engine (Ray
                           actors or in-process), run_inference decodes one batch
                           speculatively (and with the target alone for --compare-baseline)
      -> Format            detokenize -> output row; a failed record -> dead letter
      -> WriteParts        rows and dead letters, a batch at a time, to part files
                           written atomically in <output>.parts/ (what a rerun resumes)

Beam runs on the in-process ``FnApiRunner`` unless the Beam options (``specdec
translate ... -- --runner=...``) name another runner. After the pipeline the job
assembles the output and dead-letter JSONL from the parts, reads both files back,
asserts that their ids partition the input ids
(:func:`pipelines.record_io.check_partition`), computes the summary
(:class:`pipelines.job_summary.JobSummary`) and logs one MLflow run
(:mod:`pipelines.job_report`).

Timing: every batch is decoded once per path. The first batch of each padded shape
compiles inside its path's time, which is what a user waits for; the engines measure
the seconds spent compiling (``compile_ms`` of the rows, ``compile_s`` of the summary),
and the per-batch timers (``wall_ms``, tokens/s, ``speedup_loop``) leave them out.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from pipelines import (
    batch_choice,
    job_prediction,
    job_report,
    part_files,
    previous_run,
    record_io,
    text,
)
from pipelines.job_config import JobConfig, default_summary_path
from pipelines.job_summary import JobSummary
from workers.background import Background
from workers.engine import EngineConfig
from workers.gamma import GammaPrior

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pipelines.inference import EngineMetrics


# the phases the engines time inside the pipeline (pipelines.inference): their start,
# then the two decode paths
ENGINE_PHASES = ("engine_start", "decode", "baseline")


# ------------------------------------------------------------------------ the job


def run_job(job: JobConfig) -> JobSummary:
    """Reads the input, runs the pipeline, checks no id was lost, logs and returns the summary.

    Resumable: finished records go to part files in ``<output>.parts/`` as they come
    out, and a rerun of a killed job (same settings) decodes only the records no part
    holds (``records_resumed`` in the summary counts the others). The output and
    dead-letter files are assembled from the parts at the end, then the parts removed.
    MLflow is optional: when it is unavailable the summary says why (``mlflow_error``),
    keeps what ``specdec log-run`` needs (``mlflow_pending``) and is written even
    without ``summary_json`` (to ``<output>.summary.json``).

    Raises record_io.InputError for unusable input (record_io.ResumeError for parts of a job with
    other settings) and record_io.PartitionError if output and dead-letter ids do not
    partition the input ids.
    """
    from pipelines import tracking

    records, parts, done = _records_and_parts(job)
    input_ids = [r.id for r in records]
    todo = [r for r in records if r.id not in done]
    tracking_uri = job.tracking_uri or tracking.default_tracking_uri()
    # Ray's daemons and MLflow's store start while this process imports Beam; the job
    # waits for each where it needs it (the phases count only that wait).
    ray_start = _start_ray(job) if todo else None
    store = Background(
        lambda: tracking.ensure_experiment(job.kind.name, tracking_uri), name="mlflow-store"
    )
    from pipelines.early_ray import EARLY_NAME
    from pipelines.inference import close_engines, job_engine, process_started_at

    # imports, parsing, models resolved, input read
    phases = {"startup": time.time() - process_started_at()}
    # the records' encoder tokens: the warm-up's shapes and --batch-size auto's plan
    encoded = _encoded(todo, job) if todo and (job.warmup or job.batch_size_auto) else []
    choice = None
    if job.batch_size_auto and encoded:  # while Ray starts
        start = time.perf_counter()
        job, choice = batch_choice.resolve(job, encoded)
        phases["batch_choice"] = time.perf_counter() - start
    if ray_start is not None:
        start = time.perf_counter()
        ray_start.wait()
        phases["ray_start"] = time.perf_counter() - start
    summary_path = job.summary_json or default_summary_path(job.output)
    started = time.perf_counter()
    params = job_report.job_params(job)  # the run's, and what an earlier run must match
    with (
        contextlib.ExitStack() as stack,
        tracking.OptionalRun(
            job.kind.name,
            run_name=job_report.run_name(job),
            params=params,
            tags={"workers": job.engine.kind},
            tracking_uri=tracking_uri,
            hint=f"; log it later with: specdec log-run --summary-json {summary_path}",
            store=store,
        ) as run,
    ):
        job, prior_from = _with_previous_prior(job, run, params)
        phases["mlflow"] = time.perf_counter() - started
        job_id = run.run_id or uuid.uuid4().hex
        pipeline_start = time.perf_counter()
        stack.callback(close_engines, job_id)  # on failure; after the cost probe otherwise
        lengths = [len(tokens) for tokens in encoded] if job.warmup else []
        engines = (
            _run_pipeline(todo, job=job, job_id=job_id, parts=parts, encoder_lengths=lengths)
            if todo
            else None
        )
        in_pipeline = time.perf_counter() - pipeline_start
        traffic = engines.traffic if engines else None
        phases |= engines.phases if engines else {}
        # the rest of the pipeline's wall time (0 where worker processes decoded in parallel)
        phases["beam_io"] = max(
            in_pipeline - sum(phases.get(k, 0.0) for k in ENGINE_PHASES),
            0.0,
        )
        report_start = time.perf_counter()
        part_files.assemble(
            job.output, job.dead_letter, *part_files.read_parts(parts), order=input_ids
        )
        rows, dead = record_io.read_jsonl(job.output), record_io.read_jsonl(job.dead_letter)
        record_io.check_partition(input_ids, [r["id"] for r in rows], [d["id"] for d in dead])
        part_files.remove_parts(parts)
        summary = job_report.compute_summary(
            rows,
            dead,
            records_in=len(records),
            settings=job.settings,
            compare_baseline=job.compare_baseline,
            quality_metric=job.kind.quality_metric,
        )
        summary |= job_report.path_speedup(rows, phases, set(done))
        engine = job_engine(job_id)
        policy = getattr(engine, "gamma_policy", None)  # the engine MeteredEngine wraps
        summary["loop_compile_s"] = getattr(policy, "loop_compile_s", lambda: None)()
        ahead = getattr(engine, "warmup", None)  # workers.warmup: stopped, the job decoded
        if ahead is not None and (warmed := ahead.report(stop=True)):
            summary |= {
                "warmup_compile_s": warmed["compile_s"],
                "warmup_programs": warmed["programs"],
            }
        if job.compare_baseline and summary["speedup_loop"] is not None:
            probe_start = time.perf_counter()  # on the job's own engine, where it has one
            summary |= job_prediction.probe(job, rows, summary, engine)
            phases["cost_probe"] = time.perf_counter() - probe_start
        close_engines(job_id)  # the probe timed their models: Ray may stop now
        ray_stop = _stop_ray(ray_start)
        summary |= _engine_figures(
            engines, early_ray=ray_start is not None and ray_start.name == EARLY_NAME
        )
        summary |= {
            "records_resumed": len(done),
            "batch_choice": choice.to_dict() if choice is not None else None,
            "job_s": time.perf_counter() - started,
            "time_breakdown": phases,
            # --gamma auto's prior: the draft config's, updated by an earlier run's figures
            "gamma_prior": (
                dataclasses.asdict(job.draft.spec.gamma_prior or GammaPrior())
                if job.engine.adaptive
                else None
            ),
            "gamma_prior_run_id": prior_from,
            "output": job.output,
            "dead_letter": job.dead_letter,
            "mlflow_run_id": run.run_id,
            "mlflow_error": None,
            "tracking_uri": tracking_uri,
        }
        # assembling, checking, summary (the cost probe is its own phase)
        phases["report"] = time.perf_counter() - report_start - phases.get("cost_probe", 0.0)
        log_start = time.perf_counter()
        run.call(job_report.log_run, job, summary, rows, traffic)
        phases["mlflow"] += time.perf_counter() - log_start
    if ray_stop is not None:
        ray_stop.wait()
    result = JobSummary.from_mapping(
        summary | {"mlflow_run_id": run.run_id, "mlflow_error": run.error}
    )
    if run.error is not None:
        result = result.replace(mlflow_pending=job_report.saved_run(job))
    if job.summary_json or run.error is not None:
        part_files.write_atomic(summary_path, json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def _records_and_parts(job: JobConfig) -> tuple[list, str, set[str]]:
    """(the input's records, the job's part folder, the ids its parts already hold): the
    parts of a killed run with the same settings are resumed; parts of other settings,
    or with ids the input lacks, raise record_io.ResumeError."""
    records = record_io.read_records(job.input, fields=job.kind.fields, limit=job.limit)
    if not records:
        raise record_io.InputError(f"no records in {job.input}")
    parts = part_files.parts_dir(job.output)
    part_files.start_parts(parts, resume_settings(job))
    done = {row["id"] for group in part_files.read_parts(parts) for row in group}
    unknown = sorted(done - {r.id for r in records})
    if unknown:
        raise record_io.ResumeError(
            f"{parts} holds ids that {job.input} does not have ({', '.join(unknown[:5])}); "
            "delete it to start afresh"
        )
    if done:  # said even with --quiet: not a progress line
        log.info("  resuming: %d of %d records are done in %s", len(done), len(records), parts)
    return records, parts, done


def _engine_figures(engines: EngineMetrics | None, *, early_ray: bool) -> dict[str, Any]:
    """The summary's figures of the engines (None where no record was decoded, or
    where the engine does not have them: Ray's traffic, restarts and nodes, the
    pipelined loop's early blocks), and when the first record came out."""
    from pipelines.inference import process_started_at

    traffic = engines.traffic if engines else None
    first = engines.first_record_at if engines else None
    return {
        "bytes_per_iteration": traffic["bytes_per_iteration"] if traffic else None,
        "worker_restarts": traffic["worker_restarts"] if traffic else None,
        "placement": traffic["placement"] if traffic else None,  # Ray node per role
        "ray_started_early": early_ray,
        "early_blocks": traffic["early_blocks"] if traffic else None,  # --pipelined
        "first_record_s": first - process_started_at() if first is not None else None,
    }


def _with_previous_prior(job: JobConfig, run, params) -> tuple[JobConfig, str | None]:
    """``--gamma auto``: the job with its draft's prior updated from the newest finished
    run of the same job in MLflow (:mod:`pipelines.previous_run`), and that run's id;
    the job as it is (and None) without one, when MLflow is unavailable, or when the
    lookup fails (said on stderr; the run's own logging goes on). ``params``: the job's
    MLflow params."""
    from pipelines import tracking

    if not job.engine.adaptive or run.run_id is None:
        return job, None
    try:
        prior, run_id = previous_run.gamma_prior(
            job.draft.spec.gamma_prior,
            experiment_id=run.experiment_id,
            tracking_uri=run.tracking_uri,
            params=tracking.flatten_params(params),
            rows=job.settings.batch_size,
        )
    except Exception as error:  # a prior is a head start, never a reason to fail
        log.warning(
            "  --gamma auto: could not read an earlier run's figures (%s); starting from "
            "the draft config's prior",
            tracking.describe_error(error),
        )
        return job, None
    if run_id is None:
        return job, None
    spec = dataclasses.replace(job.draft.spec, gamma_prior=prior)
    return dataclasses.replace(job, draft=dataclasses.replace(job.draft, spec=spec)), run_id


def _start_ray(job: JobConfig) -> Background | None:
    """A Ray job's local instance (or its connection to ``--ray-address``), started in the
    background; None for an in-process job. A local instance gets a CPU per model worker
    of every engine the pipeline builds (one per Beam worker process)."""
    if job.engine.kind != "ray":
        return None
    from pipelines.early_ray import take_early_ray
    from workers.spec import ensure_ray, ray_cpus

    early = take_early_ray()  # begun by the console script: no Beam options, one engine
    if early is not None:
        return early
    copies = 1
    if job.beam_args:  # Beam's options module is slow to import: only when there are options
        from pipelines.transforms import engine_copies

        copies = engine_copies(job.beam_args)
    return Background(
        lambda: ensure_ray(job.engine.ray_address, num_cpus=ray_cpus(copies)),
        name="ray-start",
        hold=lambda started_local: started_local,
    )


def _stop_ray(ray_start: Background | None) -> Background | None:
    """Shuts down the local Ray instance that this job started (none it joined), in the
    background: the job is done with Ray once the cost probe has timed the workers'
    models, and Ray's shutdown (mostly waiting on its daemons to exit) overlaps the report
    and the MLflow logging instead of delaying the process's exit."""
    if ray_start is None or not ray_start.done() or not ray_start.wait():
        return None
    import ray

    return Background(ray.shutdown, name="ray-stop")


RESUME_IGNORED = ("git_commit", "workers", "draft_placement", "transport", "pipelined", "runner")


def resume_settings(job: JobConfig) -> dict[str, Any]:
    """What a rerun must share with the killed job to resume it: the MLflow params
    except those that cannot change a record's output (commit, worker layout, runner),
    and the output paths."""
    params = {k: v for k, v in job_report.job_params(job).items() if k not in RESUME_IGNORED}
    return params | {"output": job.output, "dead_letter": job.dead_letter}


def _run_pipeline(
    records, *, job: JobConfig, job_id: str, parts: str, encoder_lengths: list[int]
) -> EngineMetrics:
    """Runs the pipeline and returns what its engines reported; a failure raises
    record_io.JobFailed. ``encoder_lengths``: the records' encoder tokens, for the
    engine's warm-up (none: no warm-up). The engines built in this process stay open (the job's cost
    probe times their models): the caller closes them (``close_engines``), on failure too."""
    from pipelines.inference import SpeculativeModelHandler, read_metrics
    from pipelines.transforms import run_pipeline

    handler = SpeculativeModelHandler(
        target=job.target.spec,
        draft=job.draft.spec,
        settings=job.settings,
        engine=_joinable(job.engine),
        compare_baseline=job.compare_baseline,
        job_id=job_id,
        total_records=len(records),
        progress=job.progress,
        encoder_lengths=encoder_lengths,
    )
    try:
        return read_metrics(run_pipeline(records, job=job, handler=handler, parts=parts))
    except Exception as error:
        raise record_io.JobFailed(
            f"the pipeline failed ({type(error).__name__}: {error}); the records it finished "
            f"are kept in {parts}: rerun the same command to continue"
        ) from error


def _encoded(records, job: JobConfig) -> list[tuple[int, ...]]:
    """The encoder tokens of each record the pipeline will decode, in order (as its
    Tokenize step makes them; dead letters and over-long records left out)."""
    processor = text.sentencepiece(job.vocab_path)
    eos_id = job.input_eos_id
    encoded = []
    for record in records:
        if not isinstance(record, record_io.DeadLetter):
            tokens = text.encode(processor, job.kind.prefix, record.source, eos_id)
            if len(tokens) <= job.max_input_tokens:
                encoded.append(tokens)
    return encoded


def _joinable(engine: EngineConfig) -> EngineConfig:
    """The engine config with the address of the Ray instance this process runs, so that
    Beam worker processes (multi_processing, remote runners) join it instead of each
    starting their own."""
    if engine.kind != "ray" or engine.ray_address:
        return engine
    import ray

    return dataclasses.replace(engine, ray_address=ray.get_runtime_context().gcs_address)
