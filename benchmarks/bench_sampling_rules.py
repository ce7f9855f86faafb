"""The two sampling rules on the main job: ``make run``'s command at T > 0 with
``--sampling paper`` and ``--sampling invariant``, each a fresh ``specdec`` process, in
interleaved rounds (every rule, temperature and batch size once per round). Reports per
cell the acceptance α, tokens per iteration, the whole decode paths' speedup and the
loops' timers' ratio (medians over rounds), and whether every output equalled the
target alone's.

Usage (BENCHMARKS.md, "Sampling rules" gives the command run)::

    .venv/bin/python benchmarks/bench_sampling_rules.py [--rounds 2] [--gamma 2]
        [--temperatures 1,0.7] [--batch-sizes 1,16] [--json runs/bench/sampling_rules.json]
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

REPO = pathlib.Path(__file__).resolve().parents[1]
JOB = (
    "translate", "--input", "assets/samples/en_de_debian_sample.tsv",
    "--target", "ende_target_debian", "--draft", "ende_draft_debian_seq2",
    "--draft-placement", "target", "--compare-baseline", "--seed", "11", "--quiet",
)  # fmt: skip
RULES = ("paper", "invariant")
FIGURES = ("alpha", "mean_accepted_length", "speedup", "speedup_loop")


def run_once(out: pathlib.Path, rule: str, temperature: float, gamma: str, batch: int) -> dict:
    summary = out / "summary.json"
    command = [
        sys.executable, "-m", "pipelines.launch", *JOB, "--sampling", rule,
        "--temperature", str(temperature), "--gamma", gamma, "--batch-size", str(batch),
        "--output", str(out / "out.jsonl"), "--summary-json", str(summary),
        "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}",
    ]  # fmt: skip
    env = {**os.environ, "SPECDEC_COMPILE_CACHE": str(REPO / "runs" / "jax_cache")}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the job failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(summary.read_text())
    return {k: result[k] for k in (*FIGURES, "identical_to_baseline", "gamma_histogram")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gamma", default="2", help="--gamma of every job (a number or auto)")
    parser.add_argument("--temperatures", default="1,0.7")
    parser.add_argument("--batch-sizes", default="1")
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    cells = [
        (rule, float(t), int(b))
        for b in args.batch_sizes.split(",")
        for t in args.temperatures.split(",")
        for rule in RULES
    ]
    runs: dict[tuple, list[dict]] = {cell: [] for cell in cells}
    with tempfile.TemporaryDirectory(prefix="bench_rules_") as tmp:
        for round_ in range(args.rounds):
            for rule, temperature, batch in cells:
                out = pathlib.Path(tmp) / f"{round_}-{rule}-{temperature}-{batch}"
                out.mkdir()
                result = run_once(out, rule, temperature, args.gamma, batch)
                runs[(rule, temperature, batch)].append(result)
                print(f"round {round_ + 1}: {rule} T={temperature} b={batch}: {result}", flush=True)
    print("\n| rule | T | batch | α | tokens per iteration | speedup (whole path) | "
          "loops' timers | identical to the target alone |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    table = {}
    for (rule, temperature, batch), results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in FIGURES}
        same = [r["identical_to_baseline"] for r in results]
        table[f"{rule} T={temperature} b={batch}"] = {**med, "identical": same}
        figures = [f"{med[k]:.3f}" for k in FIGURES]
        print(f"| {rule} | {temperature} | {batch} | {' | '.join(figures)} | {same} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"gamma": args.gamma, "cells": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
