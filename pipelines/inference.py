"""The translate/summarize job's inference step: the Beam ``ModelHandler`` whose "model"
is an engine (:mod:`workers.engine`), and the per-process registry of the engines a job
built (their traffic, restarts, time breakdown, and closing them).

:class:`SpeculativeModelHandler` is what ``RunInference`` calls in
:mod:`pipelines.transforms`; :mod:`pipelines.translate` reads the registry after the
pipeline has run. See docs/ARCHITECTURE.md for the job's data flow.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from apache_beam.ml.inference.base import ModelHandler

from pipelines import record_io, text
from workers.batching import DecodeSettings, Generation, Request, pack
from workers.engine import EngineConfig, build_engine


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


def engine_traffic(job_id: str) -> dict | None:
    """Bytes per iteration between Ray workers, summed over the job's engines, their
    actors' restarts, and where the roles ran (``placement``)."""
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
        "placement": _placement([e.placement() for e in engines]),
    }


def _placement(placements: list[dict[str, str | None]]) -> dict:
    """role -> node id where every engine put that role alike, else role -> the node ids
    of the job's engines (None: an actor that was gone)."""
    merged = {}
    for role in placements[0]:
        nodes = sorted({p[role] for p in placements}, key=str)
        merged[role] = nodes[0] if len(nodes) == 1 else nodes
    return merged


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

    ``load_model`` builds the engine that ``engine`` describes (Ray actors or in-process,
    :func:`workers.engine.build_engine`), registered under ``job_id`` so the job can
    read its traffic and close it. ``run_inference`` returns one :class:`Decoded` per
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
        warmup: bool = True,
        total_records: int = 0,
        progress: bool = True,
    ):
        super().__init__()
        self.target, self.draft, self.settings, self.engine = target, draft, settings, engine
        self.compare_baseline, self.job_id, self.warmup = compare_baseline, job_id, warmup
        self.total_records, self.show_progress = total_records, progress
        self._warm: set[tuple] = set()
        self._progress: Progress | None = None

    def load_model(self):
        start = time.perf_counter()
        engine = build_engine(
            self.engine,
            target=self.target,
            draft=self.draft,
            settings=self.settings,
            warm_up=self.warmup,
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
            Request(
                id=t.record.id,
                prompt_tokens=(text.DECODER_START_ID,),
                encoder_tokens=t.encoder_tokens,
            )
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
