"""Pipelined speculation against the sequential loop, on the embedded pair.

For each batch size, draft placement and γ, two Ray engines decode the same sentences
of the shipped Debian sample (tokenised as the job does, greedy, at most 64 new
tokens): the sequential loop (the draft proposes after the target's verdict) and the
pipelined one (``EngineConfig(pipelined=True)``: the draft proposes the next block
while the target verifies). The target alone (the sequential engine's
``generate_baseline``) runs beside them. Every engine decodes all sentences once
untimed, then the three alternate pass by pass for ``--rounds`` rounds. The table gives
median tokens/s, the pipelined / sequential ratio (median and per round), each loop's
speedup over the target alone, the share of iterations whose early block stood for the
whole batch, and whether all three decoded the same tokens.

Usage (BENCHMARKS.md gives the command run)::

    .venv/bin/python benchmarks/bench_pipelined.py [--records 32] [--rounds 3]
        [--batch-sizes 1,16] [--placements coordinator,worker] [--gammas 1,2,3]
        [--draft MODEL] [--one-thread-each] [--json FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import time

from workers.ray_engine import RayEngine, ensure_ray

ensure_ray(num_cpus=8)  # before JAX starts threads: logical CPUs for every engine's actors

from bench_target_loop import sample_requests  # noqa: E402

from pipelines import model_resolver  # noqa: E402
from workers.batching import DecodeSettings  # noqa: E402
from workers.engine import EngineConfig  # noqa: E402


def timed(decode, requests, batch_size: int) -> tuple[float, list]:
    """(tokens/s, generations) of one pass over ``requests`` in batches."""
    start, out = time.perf_counter(), []
    for i in range(0, len(requests), batch_size):
        out += decode(requests[i : i + batch_size])
    return sum(len(g.tokens) for g in out) / (time.perf_counter() - start), out


def measure(target, draft, requests, *, batch_size, placement, gamma, rounds) -> dict:
    settings = DecodeSettings(gamma=gamma, max_new_tokens=64, batch_size=batch_size)
    engines = {
        name: RayEngine(
            target,
            draft,
            settings,
            config=EngineConfig(draft_placement=placement, gamma=gamma, pipelined=pipelined),
        )
        for name, pipelined in (("sequential", False), ("pipelined", True))
    }
    try:
        passes = {
            "sequential": engines["sequential"].generate,
            "pipelined": engines["pipelined"].generate,
            "target alone": engines["sequential"].generate_baseline,
        }
        for decode in passes.values():  # untimed: compiles every shape
            timed(decode, requests, batch_size)
        early_before = engines["pipelined"].traffic()
        speeds = {name: [] for name in passes}
        outputs = {}
        for _ in range(rounds):
            for name, decode in passes.items():
                tps, outputs[name] = timed(decode, requests, batch_size)
                speeds[name].append(tps)
        early = engines["pipelined"].traffic()
    finally:
        for engine in engines.values():
            engine.close()
    proposed = early["early_blocks_proposed"] - early_before["early_blocks_proposed"]
    tokens = {name: [g.tokens for g in out] for name, out in outputs.items()}
    median = {name: statistics.median(s) for name, s in speeds.items()}
    return {
        "batch_size": batch_size,
        "placement": placement,
        "gamma": gamma,
        "tokens_per_s": median,
        "pipelined_over_sequential": [
            p / s for p, s in zip(speeds["pipelined"], speeds["sequential"], strict=True)
        ],
        "speedup": {
            name: median[name] / median["target alone"] for name in ("sequential", "pipelined")
        },
        "early_blocks_kept": (early["early_blocks_kept"] - early_before["early_blocks_kept"])
        / max(proposed, 1),
        "same_tokens": tokens["sequential"] == tokens["pipelined"] == tokens["target alone"],
    }


ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def one_thread(spec):
    """``spec`` with its worker's XLA:CPU on one thread (an environment variable of the
    actor's process, as a model config's ``worker: env:`` gives)."""
    placement = spec.placement
    env = dict(placement.env) | {"XLA_FLAGS": ONE_THREAD}
    return dataclasses.replace(
        spec, placement=dataclasses.replace(placement, env=tuple(sorted(env.items())))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--placements", default="coordinator,worker")
    parser.add_argument("--gammas", default="1,2,3")
    parser.add_argument("--draft", default=None, help="a draft model (default: the job's)")
    parser.add_argument(
        "--one-thread-each",
        action="store_true",
        help="XLA:CPU runs each worker's programs on one thread (the target and the draft "
        "then have a core each on a 2-core machine)",
    )
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args()
    target = model_resolver.resolve_model(model_resolver.DEFAULT_TARGET, role="--target")
    draft = model_resolver.resolve_model(args.draft or model_resolver.DEFAULT_DRAFT, role="--draft")
    requests = sample_requests(str(target.vocab_path), args.records)
    specs = [target.spec, draft.spec]
    if args.one_thread_each:
        specs = [one_thread(spec) for spec in specs]
    threads = ", one XLA thread per worker" if args.one_thread_each else ""
    print(f"{target.spec.name} + {draft.spec.name}, {len(requests)} sentences, greedy{threads}")
    print(
        "| batch | draft placement | γ | sequential tokens/s | pipelined tokens/s "
        "| pipelined / sequential (median; per round) | speedup sequential | speedup pipelined "
        "| target alone tokens/s | early blocks kept | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for batch_size in map(int, args.batch_sizes.split(",")):
        for placement in args.placements.split(","):
            for gamma in map(int, args.gammas.split(",")):
                row = measure(
                    *specs,
                    requests,
                    batch_size=batch_size,
                    placement=placement,
                    gamma=gamma,
                    rounds=args.rounds,
                )
                rows.append(row)
                tps, ratios = row["tokens_per_s"], row["pipelined_over_sequential"]
                print(
                    f"| {batch_size} | {placement} | {gamma} | {tps['sequential']:.1f} "
                    f"| {tps['pipelined']:.1f} | {statistics.median(ratios):.3f}; "
                    f"{', '.join(f'{r:.3f}' for r in ratios)} "
                    f"| {row['speedup']['sequential']:.3f} | {row['speedup']['pipelined']:.3f} "
                    f"| {tps['target alone']:.1f} | {row['early_blocks_kept']:.0%} "
                    f"| {row['same_tokens']} |",
                    flush=True,
                )
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
