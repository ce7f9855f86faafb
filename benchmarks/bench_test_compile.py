"""The test suite's compile time: test modules run as the suite runs
them (tests/conftest.py compiles with XLA's CPU backend optimisation off) and as jobs
compile (``SPECDEC_TEST_XLA_OPT=default``), or, with ``--against REV``, from this
checkout and from a git worktree of REV (both as the suite runs them), the two arms in
alternation for ``--rounds`` rounds, each run a new pytest process, so that both see the
same load.

Each run gives its wall time and the CPU time of the processes it waited for
(pytest and its job subprocesses; Ray's actors are children of Ray's daemons, not
counted). The summary is the median of each arm and the ratio of the medians.

Usage (BENCHMARKS.md "Test suite" gives the command run)::

    .venv/bin/python benchmarks/bench_test_compile.py [--rounds 2] [--against REV]
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
import tempfile
import time

from bench_startup import worktree

REPO = pathlib.Path(__file__).resolve().parents[1]
FLAG_ARMS = {"tests' flags": {}, "jobs' flags": {"SPECDEC_TEST_XLA_OPT": "default"}}


def run_once(modules: list[str], env_extra: dict, checkout: pathlib.Path = REPO) -> dict:
    """One pytest process over ``modules`` in ``checkout`` (its own code and tests, this
    interpreter's packages): wall and child CPU seconds."""
    env = {**os.environ, "PYTHONPATH": str(checkout), **env_extra}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *modules],
        cwd=checkout,
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
    parser.add_argument("--against", default=None, help="a git revision to alternate with")
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    missing = [m for m in args.modules if not (REPO / m.split("::")[0]).is_file()]
    if missing:
        parser.error(f"no such test file: {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="bench_test_compile_") as tmp:
        if args.against:
            arms = {
                "this checkout": (REPO, {}),
                args.against: (worktree(args.against, pathlib.Path(tmp)), {}),
            }
        else:
            arms = {arm: (REPO, env) for arm, env in FLAG_ARMS.items()}
        try:
            runs = _alternate(args.modules, arms, args.rounds)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(arms[args.against][0])],
                    cwd=REPO,
                    check=False,
                )
    summary = {
        arm: {key: statistics.median(run[key] for run in arm_runs) for key in ("wall_s", "cpu_s")}
        for arm, arm_runs in runs.items()
    }
    first, second = summary.values()
    ratios = {key: first[key] / second[key] for key in ("wall_s", "cpu_s")}
    names = list(summary)
    print(
        f"median: {names[0]} {first['wall_s']:.1f} s wall / {first['cpu_s']:.1f} s CPU, "
        f"{names[1]} {second['wall_s']:.1f} s / {second['cpu_s']:.1f} s: "
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


def _alternate(modules: list[str], arms: dict, rounds: int) -> dict[str, list[dict]]:
    """Each arm's runs, the arms taken in turn, their order reversed every other round."""
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for round_index in range(rounds):
        order = list(arms) if round_index % 2 == 0 else list(reversed(arms))
        for arm in order:
            checkout, env = arms[arm]
            run = run_once(modules, env, checkout)
            runs[arm].append(run)
            print(
                f"round {round_index + 1}/{rounds} {arm}: {run['wall_s']:.1f} s wall, "
                f"{run['cpu_s']:.1f} s CPU ({run['result']})",
                flush=True,
            )
    return runs


if __name__ == "__main__":
    sys.exit(main())
