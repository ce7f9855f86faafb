"""The Beam transforms of the translate/summarize job: tokenize, batch by length, decode
(``RunInference`` with :class:`pipelines.inference.SpeculativeModelHandler`), format,
and write part files. :func:`build_pipeline` puts them together; the job around them
is :mod:`pipelines.translate`. See docs/ARCHITECTURE.md for the data flow.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import apache_beam as beam
from apache_beam.runners.runner import PipelineState

from pipelines import part_files, record_io, text
from pipelines.beam_inference import RunInference
from pipelines.inference import Decoded, SpeculativeModelHandler, Tokenized

if TYPE_CHECKING:
    from pipelines.job_config import JobConfig

DEAD = "dead"  # tag of the dead-letter outputs


class _VocabFn(beam.DoFn):
    """A DoFn over the job's SentencePiece model: dead letters pass to the DEAD output,
    every other item becomes what :meth:`convert` returns."""

    def __init__(self, *, vocab_path: str, eos_id: int | None):
        self.vocab_path, self.eos_id = vocab_path, eos_id

    def setup(self):
        self.processor = text.sentencepiece(self.vocab_path)

    def process(self, item):
        if isinstance(item, record_io.DeadLetter):
            yield beam.pvalue.TaggedOutput(DEAD, item)
        else:
            yield self.convert(item)

    def convert(self, item):
        raise NotImplementedError


class TokenizeFn(_VocabFn):
    """Record -> Tokenized; dead letters (from reading, or over-long) -> the DEAD output."""

    def __init__(self, *, vocab_path: str, prefix: str, eos_id: int, max_input_tokens: int):
        super().__init__(vocab_path=vocab_path, eos_id=eos_id)
        self.prefix, self.max_input_tokens = prefix, max_input_tokens

    def convert(self, item):
        tokens = text.encode(self.processor, self.prefix, item.source, self.eos_id)
        dead = record_io.too_long(item, len(tokens), self.max_input_tokens)
        if dead is not None:
            return beam.pvalue.TaggedOutput(DEAD, dead)
        return Tokenized(record=item, encoder_tokens=tokens)


def length_bucket(item: Tokenized) -> int:
    """Records of one bucket pad to the same encoder width."""
    return text.length_bucket(len(item.encoder_tokens))


# ------------------------------------------------------------------------ formatting


class FormatFn(_VocabFn):
    """Decoded -> output row (dict); dead letters -> the DEAD output."""

    def convert(self, item):
        return output_row(item, self.processor, self.eos_id)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def output_row(item: Decoded, processor, eos_id: int | None) -> dict:
    """The output JSONL row of one decoded record."""
    record, generation = item.record, item.generation
    row = {
        "id": record.id,
        "source": record.source,
        "output": text.decode(processor, generation.tokens, eos_id),
    }
    if record.reference is not None:
        row["reference"] = record.reference
    row |= {
        "tokens": len(generation.tokens),
        "iterations": generation.iterations,
        "accepted": generation.accepted,
        "wall_ms": round(generation.batch_wall_ms, 3),
        "loop_ms": _ms(generation.batch_loop_ms),
        "compile_ms": _ms(generation.batch_compile_ms),
        "drafted": generation.drafted,
        "accepted_by_position": generation.accepted_by_position,
        "output_ids": list(generation.tokens),
        "batch": item.batch,
    }
    if item.baseline is not None:
        row |= {
            "baseline_output": text.decode(processor, item.baseline.tokens, eos_id),
            "baseline_tokens": len(item.baseline.tokens),
            "baseline_wall_ms": round(item.baseline.batch_wall_ms, 3),
            "baseline_loop_ms": _ms(item.baseline.batch_loop_ms),
            "baseline_compile_ms": _ms(item.baseline.batch_compile_ms),
            "matches_baseline": list(item.baseline.tokens) == list(generation.tokens),
        }
    return row


# ------------------------------------------------------------------------ pipeline


class WritePartsFn(beam.DoFn):
    """``(kind, row)`` items -> part files (:func:`pipelines.part_files.write_part`) of at most
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
            part_files.write_part(self.folder, self.buffer)
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
    eos_id = job.input_eos_id
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
        | "DeadToJson" >> beam.Map(lambda d: (part_files.DEAD_KIND, d.to_json()))
    )
    outputs = decoded.ok | "TagOutputs" >> beam.Map(lambda row: (part_files.OUTPUT_KIND, row))
    (
        (outputs, dead)
        | "AllRows" >> beam.Flatten()
        | "WriteParts"
        >> beam.ParDo(
            WritePartsFn(parts or part_files.parts_dir(job.output), job.settings.batch_size)
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


def engine_copies(beam_args: Sequence[str]) -> int:
    """How many engines the pipeline builds: one per Beam worker process of the direct
    runner's ``multi_processing`` mode (``--direct_num_workers``, 0 = one per core), else
    one (threads of one process share an engine)."""
    import os

    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions

    direct = PipelineOptions(list(beam_args)).view_as(DirectOptions)
    if direct.direct_running_mode != "multi_processing":
        return 1
    return direct.direct_num_workers or os.cpu_count() or 1


def run_pipeline(
    records, *, job: JobConfig, handler: SpeculativeModelHandler, parts: str | None = None
):
    """Builds and runs the pipeline to completion (rows into the ``parts`` folder);
    returns its finished ``PipelineResult`` (read by :func:`pipelines.inference.read_metrics`)."""
    runner, options = pipeline_options(job.beam_args)
    for path in (job.output, job.dead_letter):
        parent = pathlib.Path(path).parent
        if "://" not in path and not parent.is_dir():
            parent.mkdir(parents=True, exist_ok=True)
    pipeline = beam.Pipeline(runner=runner, options=options)
    build_pipeline(pipeline, records, job=job, handler=handler, parts=parts)
    result = pipeline.run()
    state = result.wait_until_finish()
    if state != PipelineState.DONE:
        raise RuntimeError(f"the Beam pipeline ended in state {state}")
    return result
