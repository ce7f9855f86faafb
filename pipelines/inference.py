"""The translate/summarize job's inference step: the Beam ``ModelHandler`` whose "model"
is an engine (:mod:`workers.engine`), and how the job learns what its engines did.

:class:`SpeculativeModelHandler` is what ``RunInference`` calls in
:mod:`pipelines.transforms`. Beam may run it in this process (the default FnApiRunner)
or in worker processes (``--direct_running_mode multi_processing``, a remote runner),
so everything the job reports about its engines travels as Beam metrics (namespace
:data:`METRICS`): seconds per phase, Ray traffic, actor restarts, placement, when the
first record was decoded. :func:`read_metrics` turns a finished pipeline's metrics
into the job's figures. The engines this process built are kept only to close them
(:func:`close_engines`); a worker process's engines end with it. See
docs/ARCHITECTURE.md for the job's data flow.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter

from pipelines import record_io, text
from pipelines.beam_inference import ModelHandler
from workers.batching import DecodeSettings, Generation, Request
from workers.engine import EngineConfig
from workers.engines import build_engine

log = logging.getLogger(__name__)


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


# ------------------------------------------------------------------------ metrics

METRICS = "specdec"  # Beam metrics namespace of the job's engine figures
_PHASE = "phase_us."  # counter prefix: microseconds spent in a phase, summed over workers
_RESTARTS = "restarts."  # counter prefix: Ray restarts of a role's actor
_PLACED = "placement."  # counter prefix: "ROLE=NODE", a role's actor seen on a node
# Pipelined engines: iterations that settled an early block, and those that kept it whole.
EARLY_BLOCKS = ("early_blocks_proposed", "early_blocks_kept")
_IMPORTED_AT = time.time()


def process_started_at() -> float:
    """When this process started (``time.time()`` scale); this module's import time
    where the process's own start time cannot be read."""
    try:
        import psutil

        return psutil.Process().create_time()
    except (ImportError, OSError):
        return _IMPORTED_AT


def add_phase(phase: str, seconds: float) -> None:
    """Adds ``seconds`` to one phase of the job's time breakdown (a Beam counter; only
    inside a bundle: Beam drops metrics updated elsewhere, e.g. in ``setup``)."""
    Metrics.counter(METRICS, _PHASE + phase).inc(round(seconds * 1e6))


class MeteredEngine:
    """An engine and what it has reported so far. :meth:`report`, called inside a bundle,
    adds its start-up time (once), the growth of its Ray traffic and restarts since the
    last report, and its placement (``placement.ROLE=NODE`` counters) to the Beam
    metrics. Thread-safe (Beam may share one engine across threads); every engine
    interface call goes through to the engine."""

    def __init__(self, engine, *, start_s: float):
        self.engine = engine
        self._lock = threading.Lock()
        self._start_s: float | None = start_s  # reported by the first report()
        self._seen = {"iterations": 0, "bytes": 0}
        self._restarts: dict[str, int] | None = None

    def __getattr__(self, name):  # only for names this class does not have
        if name == "engine":  # not set yet (e.g. while being copied): no recursion
            raise AttributeError(name)
        return getattr(self.engine, name)

    def report(self) -> None:
        with self._lock:
            if self._start_s is not None:
                add_phase("engine_start", self._start_s)
                self._start_s = None
            if hasattr(self.engine, "traffic"):
                self._report_ray()

    def _report_ray(self) -> None:
        traffic, restarts = self.engine.traffic(), self.engine.restarts()
        for key in EARLY_BLOCKS:  # pipelined engines only
            if key in traffic:
                self._seen.setdefault(key, 0)
        for key, seen in self._seen.items():
            # a restarted coordinator counts from 0 again: all of its count is new
            grew = traffic[key] - seen if traffic[key] >= seen else traffic[key]
            Metrics.counter(METRICS, key).inc(grew)
            self._seen[key] = traffic[key]
        if restarts == self._restarts:
            return
        for role, count in restarts.items():  # first report, or an actor restarted
            grew = count - (self._restarts or {}).get(role, 0)
            Metrics.counter(METRICS, _RESTARTS + role).inc(grew)
        for role, node in self.engine.placement().items():
            Metrics.counter(METRICS, f"{_PLACED}{role}={node}").inc()
        self._restarts = dict(restarts)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineMetrics:
    """What a finished pipeline's engines reported (:func:`read_metrics`)."""

    phases: dict[str, float]  # seconds per phase, summed over worker processes
    traffic: dict | None  # Ray engines: iterations, bytes, bytes_per_iteration,
    # worker_restarts (role -> count), placement (role -> node id, or a list of them),
    # early_blocks (pipelined; else None)
    first_record_at: float | None  # time.time() when the first record was decoded


def read_metrics(result) -> EngineMetrics:
    """The job's :class:`EngineMetrics` from a finished Beam ``PipelineResult``."""
    found = result.metrics().query(MetricsFilter().with_namespace(METRICS))
    counters = {r.key.metric.name: _value(r) for r in found["counters"]}
    phases = {k[len(_PHASE) :]: v / 1e6 for k, v in counters.items() if k.startswith(_PHASE)}
    first = [_value(r) for r in found["distributions"] if r.key.metric.name == "first_record_ms"]
    nodes = [k[len(_PLACED) :] for k in counters if k.startswith(_PLACED)]
    traffic = None
    if "iterations" in counters:
        restarts = {k[len(_RESTARTS) :]: v for k, v in counters.items() if k.startswith(_RESTARTS)}
        traffic = {
            "iterations": counters["iterations"],
            "bytes": counters["bytes"],
            "bytes_per_iteration": counters["bytes"] / max(counters["iterations"], 1),
            "worker_restarts": restarts,
            "placement": _placement(nodes),
            # pipelined: {"proposed": iterations, "kept": iterations whose early block
            # stood, "kept_share": kept / proposed}
            "early_blocks": _early_blocks(counters) if EARLY_BLOCKS[0] in counters else None,
        }
    first_ms = min((d.min for d in first if d is not None and d.count), default=None)
    return EngineMetrics(
        phases=phases,
        traffic=traffic,
        first_record_at=None if first_ms is None else first_ms / 1000,
    )


def _early_blocks(counters: dict[str, int]) -> dict[str, float]:
    proposed, kept = (counters[key] for key in EARLY_BLOCKS)
    return {"proposed": proposed, "kept": kept, "kept_share": kept / max(proposed, 1)}


def _value(result):
    """A metric's committed value where the runner keeps one, else its attempted one."""
    try:
        committed = result.committed
    except Exception:  # runners that do not commit metrics raise
        committed = None
    return result.attempted if committed is None else committed


def _placement(entries: list[str]) -> dict:
    """``ROLE=NODE`` entries -> role -> the node id where the job's engines ran that
    role, or the sorted node ids where it ran on several (None: an actor that was
    gone when it was asked)."""
    nodes: dict[str, set[str | None]] = {}
    for entry in entries:
        role, _, node = entry.partition("=")
        nodes.setdefault(role, set()).add(None if node == "None" else node)
    merged = {}
    for role, found in sorted(nodes.items()):
        found_nodes = sorted(found, key=str)
        merged[role] = found_nodes[0] if len(found_nodes) == 1 else found_nodes
    return merged


# ------------------------------------------------------------------------ engines

_ENGINES: dict[str, list[Any]] = {}  # job id -> engines this process built (to close them)
_ENGINES_LOCK = threading.Lock()


def close_engines(job_id: str) -> None:
    """Closes (for Ray: kills the actors of) every engine the job built in this process.
    Engines built in Beam worker processes end with those processes."""
    with _ENGINES_LOCK:
        engines = _ENGINES.pop(job_id, [])
    for engine in engines:
        engine.close()


def job_engine(job_id: str):
    """The first engine the job built in this process (still open until
    :func:`close_engines`), or None: none was, or Beam's workers built them elsewhere."""
    with _ENGINES_LOCK:
        engines = _ENGINES.get(job_id, [])
        return engines[0] if engines else None


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
            log.info("  decoded %d/%d records (%.0f s)", self.done, self.total, now - self.start)


# ------------------------------------------------------------------------ model handler


class SpeculativeModelHandler(ModelHandler):
    """RunInference handler: the "model" is an engine; a batch is a list of Tokenized.

    ``load_model`` builds the engine that ``engine`` describes (Ray actors or in-process,
    :func:`workers.engines.build_engine`), registered under ``job_id`` so that the job
    closes it, and wrapped in a :class:`MeteredEngine` that reports its traffic as Beam
    metrics after every batch. ``run_inference`` returns one :class:`Decoded` per
    record, or a dead letter for a record the engine failed on (a failed batch is
    retried record by record, so one bad record costs only itself).
    """

    def __init__(
        self,
        *,
        target,
        draft,
        settings: DecodeSettings,
        engine: EngineConfig,
        compare_baseline: bool,
        job_id: str,
        total_records: int = 0,
        progress: bool = True,
        encoder_lengths: Sequence[int] = (),
    ):
        super().__init__()
        # the records' encoder tokens, in the order read: the engine compiles the programs
        # of their batch shapes ahead of them (workers.warmup), where it can
        self.encoder_lengths = tuple(encoder_lengths)
        self.target, self.draft, self.settings, self.engine = target, draft, settings, engine
        self.compare_baseline, self.job_id = compare_baseline, job_id
        self.total_records, self.show_progress = total_records, progress
        self._batches = 0  # batches decoded (the paired calls' order alternates with it)
        self._progress: Progress | None = None

    def load_model(self):
        start = time.perf_counter()
        engine = build_engine(
            self.engine,
            target=self.target,
            draft=self.draft,
            settings=self.settings,
            batches=-(-self.total_records // self.settings.batch_size) or None,
        )
        with _ENGINES_LOCK:
            _ENGINES.setdefault(self.job_id, []).append(engine)
        if self.encoder_lengths and hasattr(engine, "warm"):
            engine.warm(self.encoder_lengths, (text.DECODER_START_ID,))
        return MeteredEngine(engine, start_s=time.perf_counter() - start)

    def run_inference(
        self, batch, model, inference_args=None
    ) -> list[Decoded | record_io.DeadLetter]:
        items = list(batch)
        if self._progress is None:
            self._progress = Progress(self.total_records, enabled=self.show_progress)
        try:
            results = self._decode(items, model)
        except Exception as error:  # retried one by one to find the culprit
            log.warning(
                "  a batch of %d failed (%s: %s); retrying its records one by one",
                len(items),
                type(error).__name__,
                error,
            )
            results = [self._decode_one(item, model) for item in items]
        if any(isinstance(result, Decoded) for result in results):
            Metrics.distribution(METRICS, "first_record_ms").update(round(time.time() * 1000))
        try:
            model.report()
        except Exception as error:  # figures only: never costs a decoded record
            log.warning("  could not read the engine's traffic (%s)", error)
        self._progress.update(len(items))
        return results

    def _requests(self, items: Sequence[Tokenized]) -> list[Request]:
        return [
            Request(
                id=t.record.id,
                prompt_tokens=(text.DECODER_START_ID,),
                encoder_tokens=t.encoder_tokens,
            )
            for t in items
        ]

    def _decode(self, items: Sequence[Tokenized], engine) -> list[Decoded]:
        requests = self._requests(items)
        # The paired calls alternate their order batch by batch: whichever runs second
        # finds caches and allocator warm (visible even at γ = 0, where both are the
        # target alone), so a fixed order would bias the speedup.
        self._batches += 1
        baseline_first = self.compare_baseline and self._batches % 2 == 0
        baselines = self._baseline(requests, engine) if baseline_first else None
        start = time.perf_counter()
        generations = engine.generate(requests)
        add_phase("decode", time.perf_counter() - start)
        if self.compare_baseline and not baseline_first:
            baselines = self._baseline(requests, engine)
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

    def _baseline(self, requests: list[Request], engine) -> list:
        start = time.perf_counter()
        baselines = engine.generate_baseline(requests)
        add_phase("baseline", time.perf_counter() - start)
        return baselines

    def _decode_one(self, item: Tokenized, engine) -> Decoded | record_io.DeadLetter:
        try:
            return self._decode([item], engine)[0]
        except Exception as error:  # becomes the record's dead letter
            return record_io.engine_error(item.record, error)
