"""What a row's same bits at any batch size cost, and what they buy: the same sampled
job with ``specdec_core.xla_flags``'s flags (the default) and with YNNPACK's reduce
fusions back on, at batch 1 and 16.

Each cell is one ``specdec translate`` process on held-out test-split sentences
(``bench_whole_jobs.write_input``), ``make run``'s pair and placement, at ``--temperature
1 --seed 11`` under the default ``--sampling invariant`` (a seeded sample is the
target's own, so any record that differs between batch 1 and 16 is a row whose logits
changed with its batch), ``--gamma 0`` by default (the target alone: the models' cost,
no policy). The two variants alternate within each round, their order swapped from
round to round, each with a compile cache of its own.

The table gives, per variant and batch size, medians over the rounds: the decode phase
and its compiling, tokens per second and the ratio of the default's time over the
variant's with compiling set aside, and how many records' outputs differ between batch
1 and 16 within each variant.

Usage (BENCHMARKS.md, "Same bits for every call", gives the command run)::

    .venv/bin/python benchmarks/bench_xla_flags.py [--per-source 100] [--rounds 2]
        [--gamma 0] [--json runs/bench/xla_flags.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.bench_jobs_gamma import IN_TARGET, RAY, translate_args  # noqa: E402
from benchmarks.bench_whole_jobs import write_input, write_json  # noqa: E402
from specdec_core.xla_flags import ROW_INVARIANT_FLAGS  # noqa: E402

# the variant's XLA_FLAGS: a flag of the same name as specdec_core's keeps it out
VARIANTS = {
    "same bits (default)": "",
    "YNNPACK reduce fusions": " ".join(
        f"{flag.split('=')[0]}=+reduce" for flag in ROW_INVARIANT_FLAGS
    ),
}
BATCHES = (1, 16)


def run_job(input_tsv, variant: str, batch: int, gamma: str, folder: pathlib.Path) -> dict:
    """One job as a process: its decode phase, tokens and outputs by record."""
    tag = list(VARIANTS).index(variant)
    stem = folder / f"v{tag}_b{batch}"
    args = list(translate_args("ende_draft_debian_seq2"))
    args[args.index("--input") + 1] = str(input_tsv)
    command = [
        str(REPO / ".venv" / "bin" / "specdec"), *args, *RAY, *IN_TARGET,
        "--gamma", gamma, "--batch-size", str(batch), "--temperature", "1", "--seed", "11",
        "--output", f"{stem}.jsonl", "--summary-json", f"{stem}.summary.json",
        "--quiet", "--tracking-uri", f"sqlite:///{folder}/mlflow.db",
    ]  # fmt: skip
    env = {
        **os.environ,
        "XLA_FLAGS": VARIANTS[variant],
        "SPECDEC_COMPILE_CACHE": str(folder / f"cache{tag}"),
    }
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{variant} batch {batch}: exit {done.returncode}\n{done.stderr[-3000:]}")
    summary = json.loads(pathlib.Path(f"{stem}.summary.json").read_text())
    rows = [json.loads(line) for line in pathlib.Path(f"{stem}.jsonl").read_text().splitlines()]
    return {
        "process_s": time.perf_counter() - start,
        "decode_s": summary["time_breakdown"]["decode"],
        "compile_s": summary.get("compile_s"),
        "tokens": summary["tokens"],
        "outputs": {row["id"]: row["output_ids"] for row in rows},
    }


def _work_s(run: dict) -> float:
    """The decode phase less its compiling: what the flags change per token (each variant
    compiles into a cache of its own, cold in the first round)."""
    return run["decode_s"] - (run["compile_s"] or 0.0)


def table(results: dict, records: int) -> str:
    lines = [
        "| variant | batch | decode phase s | of which compiling | tokens/s, compiling aside | "
        "default / this (compiling aside) | records differing, batch 1 vs 16 |",
        "|---|---|---|---|---|---|---|",
    ]
    default = next(iter(VARIANTS))
    for variant in VARIANTS:
        ones, sixteens = results[(variant, 1)], results[(variant, 16)]
        differing = sum(
            ones[0]["outputs"][i] != sixteens[0]["outputs"][i] for i in ones[0]["outputs"]
        )
        for batch in BATCHES:
            runs = results[(variant, batch)]
            work = statistics.median(_work_s(r) for r in runs)
            base = statistics.median(_work_s(r) for r in results[(default, batch)])
            lines.append(
                f"| {variant} | {batch} | {statistics.median(r['decode_s'] for r in runs):.1f} | "
                f"{statistics.median(r['compile_s'] or 0.0 for r in runs):.1f} | "
                f"{runs[0]['tokens'] / work:.0f} | {base / work:.3f} | {differing} of {records} |"
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-source", type=int, default=100)
    parser.add_argument("--sources", default="ding,catalogs,lohelp,mozilla")
    parser.add_argument("--gamma", default="0", help="the jobs' --gamma (0: the target alone)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write every run's figures here")
    args = parser.parse_args(argv)
    results: dict[tuple[str, int], list[dict]] = {(v, b): [] for v in VARIANTS for b in BATCHES}
    with tempfile.TemporaryDirectory(prefix="bench-xla-flags-") as tmp:
        folder = pathlib.Path(tmp)
        input_tsv = folder / "test_split.tsv"
        records = write_input(input_tsv, args.sources.split(","), args.per_source)
        for round_ in range(args.rounds):
            order = list(VARIANTS) if round_ % 2 == 0 else list(reversed(VARIANTS))
            for batch in BATCHES:
                for variant in order:
                    run = run_job(input_tsv, variant, batch, args.gamma, folder)
                    results[(variant, batch)].append(run)
                    print(
                        f"round {round_ + 1}: {variant}, batch {batch}: decode "
                        f"{run['decode_s']:.1f} s (compiling {run['compile_s'] or 0:.1f} s)",
                        file=sys.stderr,
                        flush=True,
                    )
    if args.json:
        write_json(args.json, {f"{v}, batch {b}": runs for (v, b), runs in results.items()})
    print(table(results, records))


if __name__ == "__main__":
    main()
