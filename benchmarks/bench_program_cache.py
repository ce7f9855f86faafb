"""What a compiled step's lookup costs (decoding.program_cache): the host loop looks its
steps up every iteration, so the structural key must stay far below a decode step.

Times, on the embedded target (``ende_target_debian``), a cache hit of
``decoding.score_fn`` (keyed by the forward's structure) against the same builder under
``functools.lru_cache`` (keyed by the forward object, as before program_cache), the two
in alternation for ``--rounds`` rounds, and one compiled decode step of the target at
batch 1 (``costs.call_seconds``, k = 1) for scale.

Usage (BENCHMARKS.md "Test suite" gives the command run)::

    .venv/bin/python benchmarks/bench_program_cache.py [--rounds 5] [--calls 20000]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

import numpy as np

from pipelines.model_resolver import resolve_model
from specdec_core import costs, decoding
from specdec_core.sampling import GREEDY


def per_call_us(lookup, forward, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        lookup(forward, GREEDY)
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    target = resolve_model("ende_target_debian", role="target").spec.load()
    by_identity = functools.lru_cache(maxsize=decoding.COMPILED_CACHE_SIZE)(
        decoding.score_fn.__wrapped__
    )
    lookups = {"program_cache": decoding.score_fn, "lru_cache (identity)": by_identity}
    for lookup in lookups.values():
        lookup(target.forward, GREEDY)  # built once: every timed call is a hit
    times: dict[str, list[float]] = {name: [] for name in lookups}
    for round_index in range(args.rounds):
        order = list(lookups) if round_index % 2 == 0 else list(reversed(lookups))
        for name in order:
            times[name].append(per_call_us(lookups[name], target.forward, args.calls))
    encoder = np.array([[5, 6, 7, 8, 9, 1]], np.int32)
    step_us = costs.call_seconds(target, encoder, k=1, cache_len=64) * 1e6
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"{name:22s} {median:6.2f} µs per hit (median of {args.rounds}; "
            f"{min(values):.2f}–{max(values):.2f}), {median / step_us:.2%} of a target step"
        )
    print(f"{'target step (batch 1)':22s} {step_us:8.1f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
