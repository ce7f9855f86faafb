"""A pytest plugin: where the test suite's CPU time goes, per test module: the CPU time
of the test process and the seconds JAX spent tracing, lowering and compiling (XLA)
there (its monitoring events: wall seconds, so on a busy machine they can exceed the
CPU time). Ray's actors and job subprocesses are not counted.

Usage (BENCHMARKS.md "Test suite" gives the command run)::

    PYTHONPATH=benchmarks SPECDEC_COMPILE_PROFILE=runs/bench/compile_profile \\
        .venv/bin/pytest -q -n 2 --dist loadfile -p pytest_compile_profile
    .venv/bin/python benchmarks/pytest_compile_profile.py runs/bench/compile_profile

Each pytest process writes ``<dir>/<worker>.json``; run as a script, it sums them and
prints the modules by CPU time.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import sys
import time

COMPILE = "/jax/core/compile/backend_compile_duration"
TRACE = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
)
_totals: dict[str, dict[str, float]] = collections.defaultdict(
    lambda: collections.defaultdict(float)
)
_module = ["(collection)"]


def _on_duration(event: str, duration: float, **_) -> None:
    _totals[_module[0]][event] += duration


def pytest_configure(config) -> None:
    import jax.monitoring

    jax.monitoring.register_event_duration_secs_listener(_on_duration)


def pytest_runtest_protocol(item, nextitem):
    _module[0] = item.module.__name__
    _totals[_module[0]]["cpu_s"] -= time.process_time()


def pytest_runtest_logfinish(nodeid, location):
    _totals[_module[0]]["cpu_s"] += time.process_time()


def pytest_unconfigure(config) -> None:
    out = pathlib.Path(os.environ.get("SPECDEC_COMPILE_PROFILE", "runs/bench/compile_profile"))
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    rows = {module: dict(events) for module, events in _totals.items()}
    (out / f"{worker}.json").write_text(json.dumps(rows, indent=1))


def summarize(directory: pathlib.Path) -> list[tuple[str, float, float, float]]:
    """(module, CPU s, compile s, trace + lowering s), the most CPU first."""
    rows = []
    for path in sorted(directory.glob("*.json")):
        for module, events in json.loads(path.read_text()).items():
            trace = sum(events.get(name, 0.0) for name in TRACE)
            rows.append((module, events.get("cpu_s", 0.0), events.get(COMPILE, 0.0), trace))
    return sorted(rows, key=lambda row: -row[1])


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not pathlib.Path(argv[0]).is_dir():
        print("usage: pytest_compile_profile.py DIR (a profile run's output folder)")
        return 2
    rows = summarize(pathlib.Path(argv[0]))
    print(f"{'module':40s} {'CPU s':>8s} {'compile s':>10s} {'trace s':>8s}")
    for module, cpu, compile_s, trace in rows:
        print(f"{module:40s} {cpu:8.1f} {compile_s:10.1f} {trace:8.1f}")
    cpu, compile_s, trace = (sum(row[i] for row in rows) for i in (1, 2, 3))
    share = compile_s / cpu if cpu else float("nan")
    print(f"{'all':40s} {cpu:8.1f} {compile_s:10.1f} {trace:8.1f}  (compile / CPU {share:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
