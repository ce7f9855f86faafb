"""What a user waits for: the same translation job with speculation and without, whole.

Each cell is one ``specdec translate`` process on held-out test-split sentences of the
Debian corpus (``read_split``'s round-robin mix of ``--sources``), ``make run``'s pair
and placement (the draft in the target's Ray actor), with no ``--compare-baseline``:
the job at ``--gamma auto`` (or another ``--modes`` value) against the same job at
``--gamma 0``, the target alone through the same engine and workers. Per batch size
the jobs run one after the other, their order alternating from round to round, so load
that drifts over minutes touches both.

Per batch size the table gives, medians over the rounds:

- each job's process wall time (start-up, Ray, model loading and every batch:
  what a user waits for) and its decode phase (the batches alone, compiling included),
  and the speculative job's compiling;
- the ratios of the target alone's times over the speculative job's (> 1: speculation
  pays), for the process and for the decode phase;
- tokens per second of each job's decode phase, and whether every output was the
  target alone's (T = 0).

The last line names the fastest job for an offline user: the (mode, batch size) with
the most tokens per second of process wall time. A batch size of ``auto`` runs the jobs
with ``--batch-size auto`` (the table shows the size each chose).

Usage (BENCHMARKS.md, "The whole job", gives the command run)::

    .venv/bin/python benchmarks/bench_whole_jobs.py [--per-source 150]
        [--sources ding,catalogs,lohelp,mozilla] [--batch-sizes 1,4,16,64,auto]
        [--modes auto,auto+cold,DRAFT:auto] [--draft ende_draft_debian_seq2] [--rounds 2]
        [--json runs/bench/whole_jobs.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_jobs_gamma import IN_TARGET, RAY, translate_args  # noqa: E402

DATA = REPO / "assets" / "data" / "debian"


def write_input(path: pathlib.Path, sources: list[str], per_source: int) -> int:
    """The first ``per_source`` test-split pairs of each source, interleaved; a TSV of
    ``english<TAB>german`` lines. Returns the number of records."""
    from pipelines.data.debian.build import read_source_split

    columns = [read_source_split(DATA, source, "test")[:per_source] for source in sources]
    pairs = [pair for row in zip(*columns, strict=False) for pair in row]
    path.write_text("".join(f"{en}\t{de}\n" for en, de in pairs), encoding="utf-8")
    return len(pairs)


def run_job(
    input_tsv: pathlib.Path,
    gamma: str,
    batch: str,
    folder: pathlib.Path,
    draft: str = "ende_draft_debian_seq2",
    warmup: bool = True,
) -> dict:
    """One job as a process: its summary, process wall seconds and output ids by record
    (``warmup``: False runs it with ``--no-warmup``)."""
    stem = folder / f"{draft}_g{gamma}_b{batch}{'' if warmup else '_cold'}"
    args = list(translate_args(draft))
    args[args.index("--input") + 1] = str(input_tsv)
    command = [
        str(REPO / ".venv" / "bin" / "specdec"), *args, *RAY, *IN_TARGET,
        "--gamma", gamma, "--batch-size", str(batch),
        "--output", f"{stem}.jsonl", "--summary-json", f"{stem}.summary.json",
        "--quiet", "--tracking-uri", f"sqlite:///{folder}/mlflow.db",
        *([] if warmup else ["--no-warmup"]),
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"γ={gamma} batch {batch}: exit {done.returncode}\n{done.stderr[-3000:]}")
    summary = json.loads(pathlib.Path(f"{stem}.summary.json").read_text())
    rows = [json.loads(line) for line in pathlib.Path(f"{stem}.jsonl").read_text().splitlines()]
    pathlib.Path(f"{stem}.jsonl").unlink()
    return {
        "process_s": process_s,
        "decode_s": summary["time_breakdown"]["decode"],
        "compile_s": summary.get("compile_s"),
        "warmup_compile_s": summary.get("warmup_compile_s"),
        "tokens": summary["tokens"],
        "gamma_histogram": summary.get("gamma_histogram"),
        "batch_chosen": (summary.get("batch_choice") or {}).get("batch_size"),
        "bleu": summary.get("bleu"),
        "outputs": {row["id"]: row["output_ids"] for row in rows},
    }


def write_json(path: str, runs_by_cell: dict[str, list[dict]]) -> None:
    """Every run's figures by cell, without their outputs, as JSON at ``path``."""
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    slim = {
        cell: [{k: v for k, v in run.items() if k != "outputs"} for run in runs]
        for cell, runs in runs_by_cell.items()
    }
    target.write_text(json.dumps(slim, indent=2))


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def table(results: dict, modes: list[str], batch_sizes: list[str], records: int) -> str:
    lines = [
        "| batch | job | process s | decode phase s | of which compiling | "
        "target alone / this: process | decode phase | tokens/s (decode phase) | "
        "γ chosen | identical |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    best = None
    for batch in batch_sizes:
        alone = results[(batch, "0")]
        for mode in ["0", *modes]:
            runs = results[(batch, mode)]
            process, decode = _median(runs, "process_s"), _median(runs, "decode_s")
            rate = runs[0]["tokens"] / decode
            throughput = runs[0]["tokens"] / process
            if best is None or throughput > best[0]:
                best = (throughput, mode, batch)
            same = all(run["outputs"] == alone[0]["outputs"] for run in runs)
            histogram = runs[-1]["gamma_histogram"] or {}
            chosen = sorted({run["batch_chosen"] for run in runs if run.get("batch_chosen")})
            shown = f"{batch} ({', '.join(map(str, chosen))})" if chosen else batch
            lines.append(
                f"| {shown} | γ={mode} | {process:.1f} | {decode:.1f} | "
                f"{_median(runs, 'compile_s'):.1f} | "
                f"{_median(alone, 'process_s') / process:.3f} | "
                f"{_median(alone, 'decode_s') / decode:.3f} | {rate:.0f} | "
                + (", ".join(f"{g}: {n}" for g, n in histogram.items()) or "—")
                + f" | {same} |"
            )
    lines.append("")
    lines.append(
        f"{records} records. Fastest offline: γ={best[1]} at batch {best[2]}, "
        f"{best[0]:.0f} tokens per second of process wall time."
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-source", type=int, default=150)
    parser.add_argument("--sources", default="ding,catalogs,lohelp,mozilla")
    parser.add_argument("--batch-sizes", default="1,4,16,64")
    parser.add_argument(
        "--modes",
        default="auto",
        help="--gamma values set against --gamma 0, each GAMMA (--draft's) or DRAFT:GAMMA; "
        "a +cold suffix (auto+cold) runs that job with --no-warmup",
    )
    parser.add_argument("--draft", default="ende_draft_debian_seq2", help="make run's draft")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write every run's figures here")
    args = parser.parse_args(argv)
    batch_sizes = args.batch_sizes.split(",")
    for b in batch_sizes:
        if b != "auto" and not (b.isdigit() and int(b) >= 1):
            parser.error(f"--batch-sizes takes sizes >= 1 and auto, got {b!r}")
    modes = [m for m in args.modes.split(",") if m and m != "0"]
    results: dict[tuple[int, str], list[dict]] = {
        (b, m): [] for b in batch_sizes for m in ["0", *modes]
    }
    with tempfile.TemporaryDirectory(prefix="bench-whole-") as tmp:
        folder = pathlib.Path(tmp)
        input_tsv = folder / "test_split.tsv"
        records = write_input(input_tsv, args.sources.split(","), args.per_source)
        for round_ in range(args.rounds):
            for batch in batch_sizes:
                order = ["0", *modes] if round_ % 2 == 0 else [*modes, "0"]
                for mode in order:
                    draft, _, gamma = mode.removesuffix("+cold").rpartition(":")
                    warm = not mode.endswith("+cold")
                    run = run_job(input_tsv, gamma, batch, folder, draft or args.draft, warm)
                    results[(batch, mode)].append(run)
                    print(
                        f"round {round_ + 1}: batch {batch} γ={mode}: process "
                        f"{run['process_s']:.1f} s, decode {run['decode_s']:.1f} s "
                        f"(compiling {run['compile_s']:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    if args.json:
        write_json(args.json, {f"batch {b} γ={m}": runs for (b, m), runs in results.items()})
    print(table(results, modes, batch_sizes, records))


if __name__ == "__main__":
    main()
