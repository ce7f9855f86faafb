"""Start-up of the main job: ``make run``'s command, timed whole.

Runs make run's job (``specdec translate`` on the shipped Debian sample with
``--compare-baseline``) as a new process, from this checkout and, with ``--against
REV``, from a git worktree of REV, the two in alternation for ``--rounds`` rounds, so
that both see the same load and the same warm compile cache (``runs/jax_cache`` of this
checkout, shared through ``SPECDEC_COMPILE_CACHE``). One untimed run of each comes first
(it fills the cache and Python's bytecode). Each run gives the wall time of the whole
command (process start to exit), and from its summary JSON ``job_s``,
``first_record_s``, the speedup and the phases before the first record (``startup``,
``ray_start``, ``mlflow``, ``engine_start``, ``warmup``).

Usage (BENCHMARKS.md "Start-up" gives the command run)::

    .venv/bin/python benchmarks/bench_startup.py [--rounds 3] [--against REV]
        [--json runs/bench/startup.json]
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
# make run's job; --against REV runs it in both checkouts, so REV must ship this pair
JOB = (
    "translate",
    "--input", "assets/samples/en_de_debian_sample.tsv",
    "--target", "ende_target_debian", "--draft", "ende_draft_debian_seq2",
    "--draft-placement", "target", "--compare-baseline", "--quiet",
)  # fmt: skip
PHASES = ("startup", "ray_start", "mlflow", "engine_start", "warmup", "cost_probe")


def run_once(checkout: pathlib.Path, out: pathlib.Path, cache: pathlib.Path) -> dict:
    """One job from ``checkout`` (its own code, this interpreter's packages)."""
    summary = out / "summary.json"
    # what the checkout's `specdec` script runs: pipelines.launch where it has one (it
    # starts a Ray job's Ray before the CLI's imports), else pipelines.cli
    launch = (checkout / "pipelines" / "launch.py").is_file()
    command = [
        sys.executable, "-m", "pipelines.launch" if launch else "pipelines.cli", *JOB,
        "--output", str(out / "out.jsonl"), "--summary-json", str(summary),
        "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout), "SPECDEC_COMPILE_CACHE": str(cache)}
    start = time.perf_counter()
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(
            f"the job failed in {checkout} ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    result = json.loads(summary.read_text())
    phases = result["time_breakdown"]
    return {
        "wall_s": wall,
        "job_s": result["job_s"],
        "first_record_s": result["first_record_s"],
        "speedup": result["speedup"],
        "identical": result["identical_to_baseline"],
        **{f"{p}_s": phases.get(p, 0.0) for p in PHASES},
    }


def worktree(rev: str, folder: pathlib.Path) -> pathlib.Path:
    """A detached worktree of ``rev`` (the exports are tracked: where ``rev`` has this
    checkout's weights, only the code differs)."""
    path = folder / f"rev-{rev}"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(path), rev], cwd=REPO, check=True
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", default=None, help="a git revision to alternate with")
    parser.add_argument("--json", default=None, help="write every run here")
    args = parser.parse_args(argv)
    cache = REPO / "runs" / "jax_cache"
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as tmp:
        folder = pathlib.Path(tmp)
        checkouts = {"this checkout": REPO}
        if args.against:
            checkouts[args.against] = worktree(args.against, folder)
        runs: dict[str, list[dict]] = {name: [] for name in checkouts}
        try:
            for round_ in range(args.rounds + 1):  # round 0: untimed
                for name, path in checkouts.items():
                    out = folder / f"{len(runs[name])}-{round_}-{name.replace(' ', '_')}"
                    out.mkdir()
                    result = run_once(path, out, cache)
                    label = "warm-up" if round_ == 0 else f"round {round_}"
                    print(
                        f"{label:8s} {name:14s} wall {result['wall_s']:5.1f} s  job "
                        f"{result['job_s']:5.1f} s  first record {result['first_record_s']:5.1f} s"
                        f"  {result['speedup']:.3f}x",
                        flush=True,
                    )
                    if round_:
                        runs[name].append(result)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(checkouts[args.against])],
                    cwd=REPO,
                    check=False,
                )
    print("\n| code | wall (median) | job_s | first_record_s | " + " | ".join(PHASES) + " |")
    print("|---|---|---|---|" + "---|" * len(PHASES))
    for name, results in runs.items():
        med = {k: statistics.median(r[k] for r in results) for k in results[0] if k != "identical"}
        cells = " | ".join(f"{med[f'{p}_s']:.1f}" for p in PHASES)
        print(
            f"| {name} | {med['wall_s']:.1f} s ({min(r['wall_s'] for r in results):.1f}–"
            f"{max(r['wall_s'] for r in results):.1f}) | {med['job_s']:.1f} | "
            f"{med['first_record_s']:.1f} ({min(r['first_record_s'] for r in results):.1f}–"
            f"{max(r['first_record_s'] for r in results):.1f}) | {cells} |"
        )
    identical = all(r["identical"] for results in runs.values() for r in results)
    print(f"\nevery output identical to the target's: {identical}")
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(runs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
