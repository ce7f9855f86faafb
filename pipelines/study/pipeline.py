"""The study's Beam job (the package docstring's graph) and its entry points: :func:`run`,
and ``specdec study`` / ``python -m pipelines.study`` (:func:`add_arguments`,
:func:`command`, :func:`main`)."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from pipelines.configs import ConfigError
from pipelines.study.config import StudyConfig, load_study_config
from pipelines.study.dataset import Prompt, iter_prompts
from pipelines.study.measure import MeasureSettings, measure_batch, pack_prompts
from pipelines.study.model_refs import ModelRef, load_study_model
from pipelines.study.report import EXPERIMENT, format_table, log_study, summary_rows
from pipelines.study.stats import CellStats, merge_stats, summarize_cell

if TYPE_CHECKING:
    from specdec_core.models.bound import BoundModel

DESCRIPTION = "acceptance-rate studies (the paper's Table 3) as a Beam job"


# ------------------------------------------------------------------------ the Beam job


def cell_keys(study: StudyConfig) -> list[tuple[int, int]]:
    """(entry index, temperature index) for every entry and its temperatures."""
    return [(e, t) for e, entry in enumerate(study.grid) for t in range(len(entry.temperatures))]


def measure_settings(study: StudyConfig, temperature: float) -> MeasureSettings:
    return MeasureSettings(
        sampling=study.decode.sampling(temperature),
        gammas=study.decode.gammas,
        max_new_tokens=study.decode.max_new_tokens,
        seed=study.seed,
        eos_id=study.dataset.eos_id,
        measure_cost=study.theory.cost_coefficient == "measured",
    )


def entry_models(study: StudyConfig, index: int) -> tuple[BoundModel, list[BoundModel]]:
    """The loaded target and drafts of grid entry ``index`` (loaded once per process)."""
    entry = study.grid[index]
    load = functools.partial(load_study_model, target=entry.target, dataset=study.dataset)
    return load(entry.target), [load(d) for d in entry.drafts]


def measure_keyed_batch(study: StudyConfig, keyed: tuple[tuple[int, int], list[Prompt]]):
    """((entry, temperature), prompts) -> ((entry, draft, temperature), CellStats) per draft."""
    (entry_index, temp_index), prompts = keyed
    entry = study.grid[entry_index]
    target, drafts = entry_models(study, entry_index)
    batch = pack_prompts(
        prompts,
        family=entry.target.family,
        dataset=study.dataset,
        batch_size=study.decode.batch_size,
        max_new_tokens=study.decode.max_new_tokens,
    )
    settings = measure_settings(study, entry.temperatures[temp_index])
    for draft_index, stats in enumerate(measure_batch(target, drafts, batch, settings)):
        yield (entry_index, draft_index, temp_index), stats


def cell_row(study: StudyConfig, key: tuple[int, int, int], parts: Iterable[CellStats]) -> dict:
    """One finished cell: names, the temperature and :func:`summarize_cell`'s numbers."""
    entry_index, draft_index, temp_index = key
    entry = study.grid[entry_index]
    target, drafts = entry_models(study, entry_index)
    summary = summarize_cell(merge_stats(parts), theory_config=study.theory, seed=study.seed)
    return {
        "entry": entry_index,
        "draft_index": draft_index,
        "task": entry.label,
        "target": entry.target.name,
        "draft": entry.drafts[draft_index].name,
        "temperature": entry.temperatures[temp_index],
        "target_params": target.param_count(),
        "draft_params": drafts[draft_index].param_count(),
        "target_source": entry.target.source or entry.target.name,
        "draft_source": entry.drafts[draft_index].source or "fit on the training split",
        "target_checkpoint": _weights(entry.target),
        "draft_checkpoint": _weights(entry.drafts[draft_index]),
        **summary,
    }


def _weights(ref: ModelRef) -> str:
    """Where a model's weights came from (the checkpoint step folder, for the record)."""
    if ref.is_ngram:
        return "n-gram fit on the training split"
    return ref.checkpoint or f"random init (seed {ref.init_seed}, test-only)"


def build_pipeline(pipeline, study: StudyConfig, output: str) -> None:
    """The study's Beam graph (module docstring), writing one JSON line per cell."""
    import apache_beam as beam
    from apache_beam import typehints

    keys = cell_keys(study)
    (
        pipeline
        | "Dataset" >> beam.Create([study.dataset])
        | "ReadPrompts" >> beam.FlatMap(iter_prompts)
        | "FanOut"
        >> beam.FlatMap(lambda prompt: [(key, prompt) for key in keys]).with_output_types(
            # a deterministic key coder for the stateful batching
            typehints.KV[typehints.Tuple[int, int], typehints.Any]
        )
        | "Batch" >> beam.GroupIntoBatches(study.decode.batch_size)
        | "Measure" >> beam.FlatMap(functools.partial(measure_keyed_batch, study))
        | "GroupCells" >> beam.GroupByKey()
        | "Summarize" >> beam.MapTuple(functools.partial(cell_row, study))
        | "ToJson" >> beam.Map(json.dumps)
        | "Write" >> beam.io.WriteToText(output, shard_name_template="", num_shards=1)
    )


def run_cells(study: StudyConfig) -> list[dict]:
    """Runs the pipeline on the in-process FnApiRunner; cells in grid order."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    with tempfile.TemporaryDirectory(prefix="specdec-study-") as folder:
        output = str(pathlib.Path(folder) / "cells.jsonl")
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            build_pipeline(pipeline, study, output)
        rows = [json.loads(line) for line in pathlib.Path(output).read_text().splitlines()]
    order = {(e, d, t): i for i, (e, d, t) in enumerate(_grid_order(study))}
    return sorted(rows, key=lambda r: order[(r["entry"], r["draft_index"], r["temperature"])])


def _grid_order(study: StudyConfig) -> Iterator[tuple[int, int, float]]:
    for e, entry in enumerate(study.grid):
        for d in range(len(entry.drafts)):
            for t in entry.temperatures:
                yield e, d, t


# ------------------------------------------------------------------------ entry points


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyResult:
    study: StudyConfig
    rows: list[dict]  # one per cell, grid order, with mlflow_run_id
    parent_run_id: str
    tracking_uri: str


def run(
    config: str | pathlib.Path,
    *,
    summary_json: str | None = None,
    tracking_uri: str | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> StudyResult:
    """Loads and checks the grid file, runs the Beam job, logs MLflow, writes the summary."""
    from pipelines import tracking

    study = load_study_config(config, seed=seed)
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda _: None)
    for note in study.skipped:
        say(f"specdec study: {note}")
    cells = sum(len(e.drafts) * len(e.temperatures) for e in study.grid)
    say(
        f"specdec study {study.name}: {cells} cells, {study.dataset.num_prompts} prompts, "
        f"γ in {list(study.decode.gammas)}"
    )
    start = time.perf_counter()
    rows = run_cells(study)
    say(f"specdec study {study.name}: measured in {time.perf_counter() - start:.0f}s")
    uri = tracking_uri or tracking.default_tracking_uri()
    parent = log_study(study, rows, tracking_uri=uri)
    if summary_json:
        path = pathlib.Path(summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary_rows(rows), indent=2) + "\n", encoding="utf-8")
    return StudyResult(study=study, rows=rows, parent_run_id=parent, tracking_uri=uri)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``specdec study`` flags (named as in ``specdec translate``)."""
    parser.add_argument("--config", required=True, help="grid file (configs/studies/*.yaml)")
    parser.add_argument("--summary-json", default=None, help="write one row per cell here")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow store (default sqlite:///<repo>/runs/mlflow.db)",
    )
    parser.add_argument("--seed", type=int, default=None, help="job seed (default: the file's)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def command(args: argparse.Namespace) -> int:
    """Runs the study of parsed ``args`` and prints the table; returns the exit status."""
    result = run(
        args.config,
        summary_json=args.summary_json,
        tracking_uri=args.tracking_uri,
        seed=args.seed,
        progress=not args.quiet,
    )
    print(format_table(result.rows))
    print(f"MLflow: experiment {EXPERIMENT!r}, run {result.parent_run_id} ({result.tracking_uri})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.study --config FILE ...``; grid errors exit 2 with one line."""
    parser = argparse.ArgumentParser(prog="specdec study", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command(args)
    except (ConfigError, FileNotFoundError) as error:
        print(f"specdec: error: {error}", file=sys.stderr)
        return 2
