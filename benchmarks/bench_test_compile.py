"""The test suite's compile time (issue 23 item 6): test modules run as the suite runs
them (tests/conftest.py compiles with XLA's CPU backend optimisation off) and as jobs
compile (``SPECDEC_TEST_XLA_OPT=default``), the two in alternation for ``--rounds``
rounds, each run a new pytest process, so that both see the same load.

Each run gives its wall time and the CPU time of the processes it waited for
(pytest and its job subprocesses; Ray's actors are children of Ray's daemons, not
counted). The summary is the median of each arm and the ratio of the medians.

Usage (BENCHMARKS.md "Test suite" gives the command run)::

    .venv/bin/python benchmarks/bench_test_compile.py [--rounds 2]
        [--json runs/bench/test_compile.json] tests/test_decoding.py ...
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
ARMS = {"tests' flags": {}, "jobs' flags": {"SPECDEC_TEST_XLA_OPT": "default"}}


def run_once(modules: list[str], env_extra: dict) -> dict:
    """One pytest process over ``modules``: wall and child CPU seconds."""
    env = {**os.environ, **env_extra}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *modules],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"pytest failed ({done.returncode}):\n{done.stdout[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "result": done.stdout.strip().splitlines()[-1]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="+", help="test files, as pytest takes them")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    missing = [m for m in args.modules if not (REPO / m.split("::")[0]).is_file()]
    if missing:
        parser.error(f"no such test file: {', '.join(missing)}")
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for round_index in range(args.rounds):
        arms = list(ARMS) if round_index % 2 == 0 else list(reversed(ARMS))
        for arm in arms:
            run = run_once(args.modules, ARMS[arm])
            runs[arm].append(run)
            print(
                f"round {round_index + 1}/{args.rounds} {arm}: {run['wall_s']:.1f} s wall, "
                f"{run['cpu_s']:.1f} s CPU ({run['result']})",
                flush=True,
            )
    summary = {
        arm: {key: statistics.median(run[key] for run in arm_runs) for key in ("wall_s", "cpu_s")}
        for arm, arm_runs in runs.items()
    }
    tests, jobs = summary["tests' flags"], summary["jobs' flags"]
    ratios = {key: tests[key] / jobs[key] for key in ("wall_s", "cpu_s")}
    print(
        f"median: tests' flags {tests['wall_s']:.1f} s wall / {tests['cpu_s']:.1f} s CPU, "
        f"jobs' flags {jobs['wall_s']:.1f} s / {jobs['cpu_s']:.1f} s: "
        f"ratio {ratios['wall_s']:.2f} wall, {ratios['cpu_s']:.2f} CPU"
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"modules": args.modules, "runs": runs, "median": summary, "ratio": ratios},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
