"""The two sampling rules on the main job: ``make run``'s command at T > 0 with
``--sampling paper`` and ``--sampling invariant``, each a fresh ``specdec`` process, in
interleaved rounds (every rule and temperature once per round). Reports per cell the
acceptance α, tokens per iteration, the whole decode paths' speedup and the loops'
timers' ratio (medians over rounds), and whether every output equalled the target
alone's.

Usage (BENCHMARKS.md, "Sampling rules" gives the command run)::

    .venv/bin/python benchmarks/bench_sampling_rules.py [--rounds 2] [--gamma 2]
        [--temperatures 1,0.7] [--json runs/bench/sampling_rules.json]
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


def run_once(out: pathlib.Path, rule: str, temperature: float, gamma: str) -> dict:
    summary = out / "summary.json"
    command = [
        sys.executable, "-m", "pipelines.launch", *JOB, "--sampling", rule,
        "--temperature", str(temperature), "--gamma", gamma,
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
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    cells = [(rule, float(t)) for t in args.temperatures.split(",") for rule in RULES]
    runs: dict[tuple, list[dict]] = {cell: [] for cell in cells}
    with tempfile.TemporaryDirectory(prefix="bench_rules_") as tmp:
        for round_ in range(args.rounds):
            for rule, temperature in cells:
                out = pathlib.Path(tmp) / f"{round_}-{rule}-{temperature}"
                out.mkdir()
                result = run_once(out, rule, temperature, args.gamma)
                runs[(rule, temperature)].append(result)
                print(f"round {round_ + 1}: {rule} T={temperature}: {result}", flush=True)
    print("\n| rule | T | α | tokens per iteration | speedup (whole path) | loops' timers | "
          "identical to the target alone |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    table = {}
    for (rule, temperature), results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in FIGURES}
        same = [r["identical_to_baseline"] for r in results]
        table[f"{rule} T={temperature}"] = {**med, "identical": same}
        print(
            f"| {rule} | {temperature} | {med['alpha']:.3f} | {med['mean_accepted_length']:.3f} "
            f"| {med['speedup']:.3f} | {med['speedup_loop']:.3f} | {same} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"gamma": args.gamma, "cells": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
