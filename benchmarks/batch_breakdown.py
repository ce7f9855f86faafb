"""Where a job's batches spend their time, both paths side by side, from a finished job.

Reads a ``specdec translate --compare-baseline`` job's output JSONL and its summary JSON
(``--summary-json``) and prints, per batch (means over the job's batches), for the
speculative path and the target alone's:

- **phase**: the path's share of the job's ``time_breakdown`` (``decode`` or
  ``baseline``: the handler's whole call, from the batch entering the engine to its
  results leaving it) over the batches;
- **engine**: the batch's wall time as the engine timed it (``wall_ms``);
- **loop**: its decode loop alone (``loop_ms``), what γ changes;
- **encoders and setup**: engine less loop (the encoders, the caches, the prefill, the
  transport of the batch and its result);
- **compiling**: on the batch's path (``compile_ms``);
- **outside the engine**: phase less engine (packing, unpacking, the warm-up's
  hand-over, the policy's bookkeeping outside its timer, Beam's handler).

The last column of the speculative row is what speculation adds to a batch beyond the
target alone's, and its share of the speculative batch's phase.

Usage::

    .venv/bin/python benchmarks/batch_breakdown.py runs/translate/sample.jsonl \\
        runs/translate/sample.summary.json
"""

from __future__ import annotations

import argparse
import json
import pathlib


def breakdown(rows: list[dict], summary: dict) -> dict[str, dict[str, float]]:
    """Per-batch means (ms) of both paths: phase, engine, loop, encoders and setup,
    compiling, outside the engine."""
    batches: dict[str, dict] = {}
    for row in rows:
        batches.setdefault(row["batch"], row)  # a batch's timings are on each of its rows
    n = len(batches)
    if n == 0:
        raise SystemExit("the output has no decoded rows")
    phases = summary["time_breakdown"]
    paths = {}
    for name, prefix, phase in (
        ("speculative", "", "decode"),
        ("target alone", "baseline_", "baseline"),
    ):
        if f"{prefix}wall_ms" not in next(iter(batches.values())):
            raise SystemExit("the job ran without --compare-baseline: no target-alone path")
        mean = {
            key: sum(b[f"{prefix}{key}"] or 0.0 for b in batches.values()) / n
            for key in ("wall_ms", "loop_ms", "compile_ms")
        }
        phase_ms = 1e3 * phases[phase] / n
        paths[name] = {
            "phase": phase_ms,
            "engine": mean["wall_ms"],
            "loop": mean["loop_ms"],
            "encoders and setup": mean["wall_ms"] - mean["loop_ms"],
            "compiling": mean["compile_ms"],
            "outside the engine": phase_ms - mean["wall_ms"],
        }
    return paths


def table(paths: dict[str, dict[str, float]], batches: int) -> str:
    columns = list(next(iter(paths.values())))
    lines = [
        f"per batch, ms (means over {batches} batches)",
        "",
        "| path | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name, figures in paths.items():
        lines.append(f"| {name} | " + " | ".join(f"{figures[c]:.1f}" for c in columns) + " |")
    spec, alone = paths["speculative"], paths["target alone"]
    extra = sum(spec[c] - alone[c] for c in ("encoders and setup", "outside the engine"))
    lines += [
        "",
        f"speculation's own work per batch beyond the target alone's (encoders and setup, "
        f"outside the engine): {extra:.1f} ms, {100 * extra / spec['phase']:.1f}% of a "
        "speculative batch's phase",
    ]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="the job's output JSONL")
    parser.add_argument("summary", help="the job's summary JSON (--summary-json)")
    args = parser.parse_args(argv)
    rows = [
        json.loads(line)
        for line in pathlib.Path(args.output).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    summary = json.loads(pathlib.Path(args.summary).read_text(encoding="utf-8"))
    paths = breakdown(rows, summary)
    print(table(paths, len({row["batch"] for row in rows})))


if __name__ == "__main__":
    main()
