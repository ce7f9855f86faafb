"""The Beam jobs: ``specdec translate`` (En→De) and ``specdec summarize``.

One pipeline serves both (they differ only in :class:`JobKind`: prefix, field names,
quality metric, MLflow experiment)::

    records (read here, bad lines already dead letters)
      -> Tokenize          prefix + SentencePiece + EOS; over-long -> dead letter
      -> KeyByLength       key = encoder length bucket (16 tokens, as workers.batching pads)
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
(:func:`pipelines.record_io.check_partition`), computes the summary and logs one MLflow run
(:mod:`pipelines.job_report`).

Timing: the first batch of each padded shape compiles; with ``warmup`` (default) it is
decoded once untimed first, so ``wall_ms``, tokens/s and the speedup measure decoding,
not compilation.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam.ml.inference.base import ModelHandler, RunInference

from pipelines import job_report, record_io
from pipelines.model_resolver import DEFAULT_GAMMA, ResolvedModel
from workers.batching import DecodeSettings, Generation, Request, pack
from workers.spec import DEFAULT_DRAFT_PLACEMENT, DEFAULT_TRANSPORT, DRAFT_PLACEMENTS, TRANSPORTS

DEAD = "dead"  # tag of the dead-letter outputs
LENGTH_BUCKET = 16  # encoder tokens per length bucket (= workers.batching's padding)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobKind:
    name: str  # subcommand and MLflow experiment
    prefix: str  # T5's task prefix, as in pipelines.tasks and pipelines.train
    fields: record_io.FieldNames  # JSONL keys of source and reference
    quality_metric: str  # "bleu" | "rouge"
    max_input_tokens: int  # default --max-input-tokens
    max_new_tokens: int  # default --max-new-tokens


TRANSLATE = JobKind(
    name="translate",
    prefix="translate English to German: ",
    fields=record_io.FieldNames(source=("source", "en"), reference=("reference", "de")),
    quality_metric="bleu",
    max_input_tokens=256,
    max_new_tokens=64,
)
SUMMARIZE = JobKind(
    name="summarize",
    prefix="summarize: ",
    fields=record_io.FieldNames(
        source=("source", "article"), reference=("reference", "summary", "highlights")
    ),
    quality_metric="rouge",
    max_input_tokens=1024,
    max_new_tokens=128,
)
KINDS = {kind.name: kind for kind in (TRANSLATE, SUMMARIZE)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobConfig:
    """Everything a job needs, resolved (models found, paths absolute)."""

    kind: JobKind
    input: str  # file path or seqio:TASK:SPLIT
    output: str  # output JSONL
    dead_letter: str  # dead-letter JSONL
    target: ResolvedModel
    draft: ResolvedModel
    vocab_path: str  # SentencePiece model
    settings: DecodeSettings
    adaptive_gamma: bool = False  # --gamma auto: γ per batch in 0..settings.gamma (workers.gamma)
    workers: str = "ray"  # "ray" | "inprocess"
    draft_placement: str = DEFAULT_DRAFT_PLACEMENT  # ray: workers.spec.DRAFT_PLACEMENTS
    transport: str = DEFAULT_TRANSPORT  # ray: workers.spec.TRANSPORTS
    compare_baseline: bool = False
    max_input_tokens: int = 256
    limit: int | None = None  # read at most this many input records
    ray_address: str | None = None
    tracking_uri: str | None = None  # None: pipelines.tracking.default_tracking_uri()
    summary_json: str | None = None
    beam_args: tuple[str, ...] = ()  # Beam pipeline options (--runner=..., ...)
    warmup: bool = True  # decode each new shape once untimed before timing it
    progress: bool = True  # progress lines on stderr


# ------------------------------------------------------------------------ tokens


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tokenized:
    record: record_io.Record
    encoder_tokens: tuple[int, ...]  # prefix + source pieces + EOS


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decoded:
    record: record_io.Record
    generation: Generation
    baseline: Generation | None  # the target alone on the same record (--compare-baseline)
    batch: str  # id of the batch it was decoded in (rows of one batch share wall_ms)


@functools.lru_cache(maxsize=4)
def sentencepiece(path: str):
    """The SentencePiece processor at ``path`` (cached per process)."""
    import sentencepiece as spm

    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
    return spm.SentencePieceProcessor(model_file=path)


def encode(processor, prefix: str, text: str, eos_id: int) -> tuple[int, ...]:
    """``prefix + text`` as piece ids with EOS appended (what seqio's task feeds T5)."""
    return (*processor.encode(prefix + text), eos_id)


def decode(processor, tokens: Sequence[int], eos_id: int | None) -> str:
    """Generated ids up to (not including) EOS as text; ids beyond the pieces are dropped."""
    if eos_id is not None and eos_id in tokens:
        tokens = tokens[: list(tokens).index(eos_id)]
    size = processor.get_piece_size()
    return processor.decode([int(t) for t in tokens if 0 <= t < size])


class TokenizeFn(beam.DoFn):
    """Record -> Tokenized; dead letters (from reading, or over-long) -> the DEAD output."""

    def __init__(self, *, vocab_path: str, prefix: str, eos_id: int, max_input_tokens: int):
        self.vocab_path, self.prefix = vocab_path, prefix
        self.eos_id, self.max_input_tokens = eos_id, max_input_tokens

    def setup(self):
        self.processor = sentencepiece(self.vocab_path)

    def process(self, item):
        if isinstance(item, record_io.DeadLetter):
            yield beam.pvalue.TaggedOutput(DEAD, item)
            return
        tokens = encode(self.processor, self.prefix, item.source, self.eos_id)
        dead = record_io.too_long(item, len(tokens), self.max_input_tokens)
        if dead is not None:
            yield beam.pvalue.TaggedOutput(DEAD, dead)
        else:
            yield Tokenized(record=item, encoder_tokens=tokens)


def length_bucket(item: Tokenized) -> int:
    """Records of one bucket pad to the same encoder width."""
    return -(-len(item.encoder_tokens) // LENGTH_BUCKET)


# ------------------------------------------------------------------------ engines

_ENGINES: dict[str, list[Any]] = {}  # job id -> engines its handler built (this process)
_ENGINES_LOCK = threading.Lock()
_FIRST_RECORD: dict[str, float] = {}  # job id -> time.time() its first record was decoded
_IMPORTED_AT = time.time()


def process_started_at() -> float:
    """When this process started (``time.time()`` scale); this module's import time
    where the process's own start time cannot be read."""
    try:
        import psutil

        return psutil.Process().create_time()
    except (ImportError, OSError):
        return _IMPORTED_AT


_PHASES: dict[str, dict[str, float]] = {}  # job id -> seconds per phase (this process)


def add_phase(job_id: str, phase: str, seconds: float) -> None:
    """Adds ``seconds`` to one phase of a job's time breakdown."""
    with _ENGINES_LOCK:
        phases = _PHASES.setdefault(job_id, {})
        phases[phase] = phases.get(phase, 0.0) + seconds


def time_breakdown(job_id: str) -> dict[str, float]:
    """The job's phases so far (seconds), removed from the registry."""
    with _ENGINES_LOCK:
        return _PHASES.pop(job_id, {})


def first_record_s(job_id: str) -> float | None:
    """Seconds from the process's start until the job's first record was decoded."""
    at = _FIRST_RECORD.pop(job_id, None)
    return None if at is None else at - process_started_at()


def _checkpoint_version(spec) -> int | None:
    """mtime of the checkpoint folder: a new export (a new checkpoint_<step>) changes it."""
    if spec.checkpoint is None:
        return None
    path = pathlib.Path(spec.checkpoint)
    return path.stat().st_mtime_ns if path.exists() else None


@functools.lru_cache(maxsize=4)
def _cached_model(spec, version: int | None):
    from specdec_core.models.bound import load_model

    del version  # part of the cache key only
    return load_model(
        spec.name, spec.family, spec.config, checkpoint=spec.checkpoint, init_seed=spec.init_seed
    )


def _bound_model(spec):
    """One BoundModel per spec (and checkpoint version) per process: compiled steps are
    cached per model object, so repeated in-process jobs (tests, notebooks) do not
    recompile."""
    return _cached_model(spec, _checkpoint_version(spec))


def build_engine(
    *,
    target,
    draft,
    settings: DecodeSettings,
    workers: str,
    ray_address: str | None,
    draft_placement: str = DEFAULT_DRAFT_PLACEMENT,
    transport: str = DEFAULT_TRANSPORT,
    gamma_policy=None,
):
    """An engine (workers.engine interface) over two ModelSpecs; ``gamma_policy``
    (workers.gamma.AdaptiveGamma) chooses γ per batch."""
    if workers == "ray":
        from workers.coordinator import RayEngine

        return RayEngine(
            target,
            draft,
            settings,
            address=ray_address,
            draft_placement=draft_placement,
            transport=transport,
            gamma_policy=gamma_policy,
        )
    if workers == "inprocess":
        from workers.engine import InProcessEngine

        return InProcessEngine(
            _bound_model(target), _bound_model(draft), settings, gamma_policy=gamma_policy
        )
    raise ValueError(f"--workers must be ray or inprocess, got {workers!r}")


def engine_traffic(job_id: str) -> dict | None:
    """Bytes per iteration between Ray workers, summed over the job's engines."""
    engines = [e for e in _ENGINES.get(job_id, []) if hasattr(e, "traffic")]
    if not engines:
        return None
    totals = [e.traffic() for e in engines]
    iterations = sum(t["iterations"] for t in totals)
    n_bytes = sum(t["bytes"] for t in totals)
    restarts: dict[str, int] = {}  # Ray restarts of each actor (workers.recovery)
    for engine in engines:
        for role, count in engine.restarts().items():
            restarts[role] = restarts.get(role, 0) + count
    return {
        "iterations": iterations,
        "bytes": n_bytes,
        "bytes_per_iteration": n_bytes / max(iterations, 1),
        "worker_restarts": restarts,
    }


def close_engines(job_id: str) -> None:
    """Closes (for Ray: kills the actors of) every engine the job built here."""
    with _ENGINES_LOCK:
        engines = _ENGINES.pop(job_id, [])
    for engine in engines:
        engine.close()


class Progress:
    """Decoded-record count on stderr, at most every ``every_s`` seconds."""

    def __init__(self, total: int, *, enabled: bool, every_s: float = 5.0):
        self.total, self.enabled, self.every_s = total, enabled, every_s
        self.done, self.start, self.last = 0, time.monotonic(), 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self.last >= self.every_s or self.done >= self.total):
            self.last = now
            print(
                f"  decoded {self.done}/{self.total} records ({now - self.start:.0f} s)",
                file=sys.stderr,
                flush=True,
            )


# ------------------------------------------------------------------------ model handler


class SpeculativeModelHandler(ModelHandler):
    """RunInference handler: the "model" is an engine; a batch is a list of Tokenized.

    ``load_model`` builds the engine (Ray actors with ``workers="ray"``), registered
    under ``job_id`` so the job can read its traffic and close it. ``run_inference``
    returns one :class:`Decoded` per record, or a dead letter for a record the engine
    failed on (a failed batch is retried record by record, so one bad record costs
    only itself).
    """

    def __init__(
        self,
        *,
        target,
        draft,
        settings: DecodeSettings,
        workers: str,
        ray_address: str | None,
        compare_baseline: bool,
        job_id: str,
        draft_placement: str = DEFAULT_DRAFT_PLACEMENT,
        transport: str = DEFAULT_TRANSPORT,
        warmup: bool = True,
        total_records: int = 0,
        progress: bool = True,
        adaptive_gamma: bool = False,
    ):
        super().__init__()
        self.adaptive_gamma = adaptive_gamma
        self.target, self.draft, self.settings = target, draft, settings
        self.workers, self.ray_address = workers, ray_address
        self.draft_placement, self.transport = draft_placement, transport
        self.compare_baseline, self.job_id, self.warmup = compare_baseline, job_id, warmup
        self.total_records, self.show_progress = total_records, progress
        self._warm: set[tuple] = set()
        self._progress: Progress | None = None

    def load_model(self):
        start = time.perf_counter()
        policy = None
        if self.adaptive_gamma:
            from workers.gamma import AdaptiveGamma

            policy = AdaptiveGamma(self.settings.gamma, warm_up=self.warmup)
        engine = build_engine(
            gamma_policy=policy,
            target=self.target,
            draft=self.draft,
            settings=self.settings,
            workers=self.workers,
            ray_address=self.ray_address,
            draft_placement=self.draft_placement,
            transport=self.transport,
        )
        with _ENGINES_LOCK:
            _ENGINES.setdefault(self.job_id, []).append(engine)
        add_phase(self.job_id, "engine_start", time.perf_counter() - start)
        return engine

    def run_inference(
        self, batch, model, inference_args=None
    ) -> list[Decoded | record_io.DeadLetter]:
        items = list(batch)
        if self._progress is None:
            self._progress = Progress(self.total_records, enabled=self.show_progress)
        try:
            results = self._decode(items, model)
        except Exception as error:  # retried one by one to find the culprit
            print(
                f"  a batch of {len(items)} failed ({type(error).__name__}: {error}); "
                "retrying its records one by one",
                file=sys.stderr,
                flush=True,
            )
            results = [self._decode_one(item, model) for item in items]
        if any(isinstance(result, Decoded) for result in results):
            _FIRST_RECORD.setdefault(self.job_id, time.time())
        self._progress.update(len(items))
        return results

    def _requests(self, items: Sequence[Tokenized]) -> list[Request]:
        return [
            Request(id=t.record.id, prompt_tokens=(0,), encoder_tokens=t.encoder_tokens)
            for t in items
        ]

    def _decode(self, items: Sequence[Tokenized], engine) -> list[Decoded]:
        requests = self._requests(items)
        if self.warmup:
            start = time.perf_counter()
            self._warm_up(requests, engine)
            add_phase(self.job_id, "warmup", time.perf_counter() - start)
        start = time.perf_counter()
        generations = engine.generate(requests)
        add_phase(self.job_id, "decode", time.perf_counter() - start)
        baselines = None
        if self.compare_baseline:
            start = time.perf_counter()
            baselines = engine.generate_baseline(requests)
            add_phase(self.job_id, "baseline", time.perf_counter() - start)
        batch_id = uuid.uuid4().hex[:12]
        return [
            Decoded(
                record=item.record,
                generation=generation,
                baseline=baselines[i] if baselines else None,
                batch=batch_id,
            )
            for i, (item, generation) in enumerate(zip(items, generations, strict=True))
        ]

    def _decode_one(self, item: Tokenized, engine) -> Decoded | record_io.DeadLetter:
        try:
            return self._decode([item], engine)[0]
        except Exception as error:  # becomes the record's dead letter
            return record_io.engine_error(item.record, error)

    def _warm_up(self, requests: list[Request], engine) -> None:
        """Decodes a batch of a not-yet-seen padded shape once, untimed (compilation)."""
        packed = pack(requests, self.settings)
        encoder_width = None if packed.encoder_tokens is None else packed.encoder_tokens.shape
        shape = (encoder_width, packed.prompt_tokens.shape, packed.max_len)
        if shape in self._warm:
            return
        engine.generate(requests)
        if self.compare_baseline:
            engine.generate_baseline(requests)
        self._warm.add(shape)


# ------------------------------------------------------------------------ formatting


class FormatFn(beam.DoFn):
    """Decoded -> output row (dict); dead letters -> the DEAD output."""

    def __init__(self, *, vocab_path: str, eos_id: int | None):
        self.vocab_path, self.eos_id = vocab_path, eos_id

    def setup(self):
        self.processor = sentencepiece(self.vocab_path)

    def process(self, item):
        if isinstance(item, record_io.DeadLetter):
            yield beam.pvalue.TaggedOutput(DEAD, item)
        else:
            yield output_row(item, self.processor, self.eos_id)


def output_row(item: Decoded, processor, eos_id: int | None) -> dict:
    """The output JSONL row of one decoded record."""
    record, generation = item.record, item.generation
    row = {
        "id": record.id,
        "source": record.source,
        "output": decode(processor, generation.tokens, eos_id),
    }
    if record.reference is not None:
        row["reference"] = record.reference
    row |= {
        "tokens": len(generation.tokens),
        "iterations": generation.iterations,
        "accepted": generation.accepted,
        "wall_ms": round(generation.batch_wall_ms, 3),
        "drafted": generation.drafted,
        "accepted_by_position": generation.accepted_by_position,
        "output_ids": list(generation.tokens),
        "batch": item.batch,
    }
    if item.baseline is not None:
        row |= {
            "baseline_output": decode(processor, item.baseline.tokens, eos_id),
            "baseline_tokens": len(item.baseline.tokens),
            "baseline_wall_ms": round(item.baseline.batch_wall_ms, 3),
            "matches_baseline": list(item.baseline.tokens) == list(generation.tokens),
        }
    return row


# ------------------------------------------------------------------------ pipeline


class WritePartsFn(beam.DoFn):
    """``(kind, row)`` items -> part files (:func:`pipelines.record_io.write_part`) of at most
    ``every`` items, so a killed job loses only the records of the part it was gathering
    (rows of one decoded batch arrive together: ``every`` = the batch size)."""

    def __init__(self, folder: str, every: int):
        self.folder, self.every = folder, max(every, 1)

    def start_bundle(self):
        self.buffer: list[tuple[str, dict]] = []

    def process(self, item):
        self.buffer.append(item)
        if len(self.buffer) >= self.every:
            self._flush()

    def finish_bundle(self):
        self._flush()

    def _flush(self) -> None:
        if self.buffer:
            record_io.write_part(self.folder, self.buffer)
            self.buffer = []


def build_pipeline(
    pipeline: beam.Pipeline,
    records: Sequence[record_io.Record | record_io.DeadLetter],
    *,
    job: JobConfig,
    handler: SpeculativeModelHandler,
    parts: str | None = None,
) -> None:
    """Adds the job's transforms (read, tokenize, batch, infer, format, write) to ``pipeline``.

    Rows and dead letters go to part files in ``parts`` (default: the output's parts
    folder); :func:`run_job` assembles the output files from them.
    """
    eos_id = job.settings.eos_id if job.settings.eos_id is not None else 1
    tokenized = (
        pipeline
        | "Read" >> beam.Create(list(records), reshuffle=False)
        | "Tokenize"
        >> beam.ParDo(
            TokenizeFn(
                vocab_path=job.vocab_path,
                prefix=job.kind.prefix,
                eos_id=eos_id,
                max_input_tokens=job.max_input_tokens,
            )
        ).with_outputs(DEAD, main="ok")
    )
    decoded = (
        tokenized.ok
        | "KeyByLength" >> beam.Map(lambda item: (length_bucket(item), item))
        | "BatchByLength" >> beam.GroupIntoBatches(job.settings.batch_size)
        | "DropKeys" >> beam.Values()
        | "Decode" >> RunInference(handler.with_no_batching(), model_identifier=handler.job_id)
        | "Format"
        >> beam.ParDo(FormatFn(vocab_path=job.vocab_path, eos_id=job.settings.eos_id)).with_outputs(
            DEAD, main="ok"
        )
    )
    dead = (
        (tokenized[DEAD], decoded[DEAD])
        | "AllDead" >> beam.Flatten()
        | "DeadToJson" >> beam.Map(lambda d: (record_io.DEAD_KIND, d.to_json()))
    )
    outputs = decoded.ok | "TagOutputs" >> beam.Map(lambda row: (record_io.OUTPUT_KIND, row))
    (
        (outputs, dead)
        | "AllRows" >> beam.Flatten()
        | "WriteParts"
        >> beam.ParDo(
            WritePartsFn(parts or record_io.parts_dir(job.output), job.settings.batch_size)
        )
    )


def pipeline_options(beam_args: Sequence[str]):
    """(runner, options): the in-process FnApiRunner unless ``beam_args`` name a runner."""
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

    options = PipelineOptions(list(beam_args))
    if options.view_as(StandardOptions).runner:
        return None, options
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return FnApiRunner(), options


def run_pipeline(
    records, *, job: JobConfig, handler: SpeculativeModelHandler, parts: str | None = None
) -> None:
    """Builds and runs the pipeline to completion (rows into the ``parts`` folder)."""
    runner, options = pipeline_options(job.beam_args)
    for path in (job.output, job.dead_letter):
        parent = pathlib.Path(path).parent
        if "://" not in path and not parent.is_dir():
            parent.mkdir(parents=True, exist_ok=True)
    with beam.Pipeline(runner=runner, options=options) as pipeline:
        build_pipeline(pipeline, records, job=job, handler=handler, parts=parts)


# ------------------------------------------------------------------------ the job


def run_job(job: JobConfig) -> dict[str, Any]:
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

    entered = time.time()
    phases = {"startup": entered - process_started_at()}  # imports, parsing, models resolved
    records = record_io.read_records(job.input, fields=job.kind.fields, limit=job.limit)
    if not records:
        raise record_io.InputError(f"no records in {job.input}")
    input_ids = [r.id for r in records]
    parts = record_io.parts_dir(job.output)
    record_io.start_parts(parts, resume_settings(job))
    done = {row["id"] for group in record_io.read_parts(parts) for row in group}
    unknown = sorted(done - set(input_ids))
    if unknown:
        raise record_io.ResumeError(
            f"{parts} holds ids that {job.input} does not have ({', '.join(unknown[:5])}); "
            "delete it to start afresh"
        )
    todo = [r for r in records if r.id not in done]
    if done:  # said even with --quiet: not a progress line
        print(
            f"  resuming: {len(done)} of {len(records)} records are done in {parts}",
            file=sys.stderr,
            flush=True,
        )
    if job.workers == "ray" and todo:
        from workers.coordinator import ensure_ray

        start = time.perf_counter()
        ensure_ray(job.ray_address)  # before any JAX computation in this process
        phases["ray_start"] = time.perf_counter() - start
    tracking_uri = job.tracking_uri or tracking.default_tracking_uri()
    summary_path = job.summary_json or default_summary_path(job.output)
    started = time.perf_counter()
    with tracking.OptionalRun(
        job.kind.name,
        run_name=job_report.run_name(job),
        params=job_report.job_params(job),
        tags={"workers": job.workers},
        tracking_uri=tracking_uri,
        hint=f"; log it later with: specdec log-run --summary-json {summary_path}",
    ) as run:
        phases["mlflow"] = time.perf_counter() - started
        job_id = run.run_id or uuid.uuid4().hex
        pipeline_start = time.perf_counter()
        traffic = _run_and_close(todo, job=job, job_id=job_id, parts=parts) if todo else None
        in_pipeline = time.perf_counter() - pipeline_start
        phases |= time_breakdown(job_id)
        phases["beam_io"] = in_pipeline - sum(
            phases.get(k, 0.0) for k in ("engine_start", "warmup", "decode", "baseline")
        )
        report_start = time.perf_counter()
        record_io.assemble(
            job.output, job.dead_letter, *record_io.read_parts(parts), order=input_ids
        )
        rows, dead = record_io.read_jsonl(job.output), record_io.read_jsonl(job.dead_letter)
        record_io.check_partition(input_ids, [r["id"] for r in rows], [d["id"] for d in dead])
        record_io.remove_parts(parts)
        summary = job_report.compute_summary(
            rows,
            dead,
            records_in=len(records),
            settings=job.settings,
            compare_baseline=job.compare_baseline,
            quality_metric=job.kind.quality_metric,
        )
        summary |= {
            "records_resumed": len(done),
            "bytes_per_iteration": traffic["bytes_per_iteration"] if traffic else None,
            "worker_restarts": traffic["worker_restarts"] if traffic else None,
            "job_s": time.perf_counter() - started,
            "first_record_s": first_record_s(job_id),
            "time_breakdown": phases,
            "output": job.output,
            "dead_letter": job.dead_letter,
            "mlflow_run_id": run.run_id,
            "mlflow_error": None,
            "tracking_uri": tracking_uri,
        }
        phases["report"] = time.perf_counter() - report_start  # assembling, checking, summary
        log_start = time.perf_counter()
        run.call(job_report.log_run, job, summary, rows, traffic)
        phases["mlflow"] += time.perf_counter() - log_start
    summary |= {"mlflow_run_id": run.run_id, "mlflow_error": run.error}
    if run.error is not None:
        summary["mlflow_pending"] = job_report.saved_run(job)
    if job.summary_json or run.error is not None:
        record_io.write_atomic(summary_path, json.dumps(summary, indent=2) + "\n")
    return summary


def default_summary_path(output: str) -> str:
    """``<output>.summary.json``: where a job without ``summary_json`` writes its summary
    when MLflow was unavailable (for ``specdec log-run``)."""
    return f"{output}.summary.json"


RESUME_IGNORED = ("git_commit", "workers", "draft_placement", "transport", "runner")


def resume_settings(job: JobConfig) -> dict[str, Any]:
    """What a rerun must share with the killed job to resume it: the MLflow params
    except those that cannot change a record's output (commit, worker layout, runner),
    and the output paths."""
    params = {k: v for k, v in job_report.job_params(job).items() if k not in RESUME_IGNORED}
    return params | {"output": job.output, "dead_letter": job.dead_letter}


def _run_and_close(records, *, job: JobConfig, job_id: str, parts: str) -> dict | None:
    """Runs the pipeline; reads the engines' traffic and closes them, even on failure
    (which raises record_io.JobFailed)."""
    handler = SpeculativeModelHandler(
        target=job.target.spec,
        draft=job.draft.spec,
        settings=job.settings,
        workers=job.workers,
        ray_address=job.ray_address,
        draft_placement=job.draft_placement,
        transport=job.transport,
        compare_baseline=job.compare_baseline,
        job_id=job_id,
        warmup=job.warmup,
        total_records=len(records),
        progress=job.progress,
        adaptive_gamma=job.adaptive_gamma,
    )
    try:
        run_pipeline(records, job=job, handler=handler, parts=parts)
        return engine_traffic(job_id)
    except Exception as error:
        raise record_io.JobFailed(
            f"the pipeline failed ({type(error).__name__}: {error}); the records it finished "
            f"are kept in {parts}: rerun the same command to continue"
        ) from error
    finally:
        close_engines(job_id)


def make_job(
    kind: JobKind,
    *,
    input: str,
    output: str,
    target: str | None = None,
    draft: str | None = None,
    gamma: int | str = DEFAULT_GAMMA,
    gamma_max: int | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 1,
    max_new_tokens: int | None = None,
    max_input_tokens: int | None = None,
    workers: str = "ray",
    compare_baseline: bool = False,
    dead_letter: str | None = None,
    vocab: str | None = None,
    allow_random_init: bool = False,
    **options: Any,
) -> JobConfig:
    """Resolves models and vocabulary and validates settings into a JobConfig.

    ``gamma``: drafted tokens per iteration, or ``"auto"``: chosen per batch in
    0..``gamma_max`` from the job's measurements (workers.gamma).
    ``target``/``draft`` default to the embedded pair; ``options`` are the remaining
    JobConfig fields (limit, ray_address, tracking_uri, summary_json, beam_args, ...).
    Raises ValueError (ModelResolutionError, ConfigError, ...) with a message for users.
    """
    from pipelines import model_resolver
    from specdec_core.sampling import SamplingConfig

    if workers not in ("ray", "inprocess"):
        raise ValueError(f"--workers must be ray or inprocess, got {workers!r}")
    adaptive = gamma == "auto"
    if adaptive:
        from workers.gamma import DEFAULT_GAMMA_MAX

        gamma = DEFAULT_GAMMA_MAX if gamma_max is None else gamma_max
        if gamma < 1:
            raise ValueError(f"--gamma-max must be >= 1, got {gamma}")
    elif not isinstance(gamma, int) or isinstance(gamma, bool):
        raise ValueError(f"--gamma must be an integer >= 1 or 'auto', got {gamma!r}")
    elif gamma_max is not None:
        raise ValueError("--gamma-max is for --gamma auto only")
    placement = options.get("draft_placement", DEFAULT_DRAFT_PLACEMENT)
    if placement not in DRAFT_PLACEMENTS:
        raise ValueError(f"--draft-placement must be one of {DRAFT_PLACEMENTS}, got {placement!r}")
    transport = options.get("transport", DEFAULT_TRANSPORT)
    if transport not in TRANSPORTS:
        raise ValueError(f"--transport must be one of {TRANSPORTS}, got {transport!r}")
    resolved = {
        role: model_resolver.resolve_model(
            ref or default, role=role, allow_random_init=allow_random_init, init_seed=init_seed
        )
        for role, ref, default, init_seed in (
            ("target", target, model_resolver.DEFAULT_TARGET, 0),
            ("draft", draft, model_resolver.DEFAULT_DRAFT, 1),
        )
    }
    vocab_path = str(vocab or resolved["target"].vocab_path or model_resolver.DEFAULT_VOCAB)
    pieces = sentencepiece(vocab_path).get_piece_size()
    model_resolver.check_pair(resolved["target"], resolved["draft"], vocab_size=pieces)
    settings = DecodeSettings(
        gamma=gamma,
        sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p),
        seed=seed,
        max_new_tokens=max_new_tokens or kind.max_new_tokens,
        batch_size=batch_size,
    )
    output = _absolute(output)
    return JobConfig(
        kind=kind,
        input=input,
        output=output,
        dead_letter=_absolute(dead_letter or record_io.default_dead_letter_path(output)),
        target=resolved["target"],
        draft=resolved["draft"],
        vocab_path=vocab_path,
        settings=settings,
        adaptive_gamma=adaptive,
        workers=workers,
        compare_baseline=compare_baseline,
        max_input_tokens=max_input_tokens or kind.max_input_tokens,
        **options,
    )


def _absolute(path: str) -> str:
    """Local paths made absolute (Beam writes through temp folders); URLs unchanged."""
    return path if "://" in path else str(pathlib.Path(path).resolve())
