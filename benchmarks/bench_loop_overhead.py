"""Overhead of the in-process speculative loop, measured with stub models.

The target is the table stub with dense "work" layers sized so one target call costs
>= 5 ms; the draft is the bare table (microseconds). Overhead is wall time minus the
time inside draft and target calls (acceptance, commit, rollback, the host loop), per
iteration and as a share of the iteration. Beside it, the same decode with the loop
compiled into one call (``compiled=True``, the in-process engine's default): its
iteration time, and host-loop time over compiled-loop time in the same run. Usage:

    .venv/bin/python benchmarks/bench_loop_overhead.py [--work-dim 1024 --work-layers 24 48]
"""

from __future__ import annotations

import argparse
import functools
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from specdec_core import decoding
from specdec_core.models import table
from specdec_core.sampling import GREEDY, SamplingConfig


def time_call(fn, *args, repeats: int = 10) -> float:
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
    return (time.perf_counter() - start) / repeats


def run(batch: int, gamma: int, config: SamplingConfig, args, work_layers: int) -> dict:
    vocab = 64
    target_params = table.init_params(
        jax.random.key(0),
        vocab_size=vocab,
        scale=3.0,
        work_dim=args.work_dim,
        work_layers=work_layers,
    )
    other = table.init_params(jax.random.key(1), vocab_size=vocab, scale=3.0)
    draft_params = table.from_table(0.8 * target_params.table + 0.2 * other.table)
    target = functools.partial(table.forward, target_params)
    draft = functools.partial(table.forward, draft_params)
    max_len = 8 + args.new_tokens + gamma + 2
    step_s = time_call(
        jax.jit(target), table.init_cache(batch, max_len), jnp.ones((batch, gamma + 1), jnp.int32)
    )
    prompts = np.random.default_rng(0).integers(0, vocab, (batch, 8)).astype(np.int32)

    def once(compiled=False):
        return decoding.speculative_generate(
            target=target,
            target_cache=table.init_cache(batch, max_len),
            draft=draft,
            draft_cache=table.init_cache(batch, max_len),
            prompt_tokens=prompts,
            prompt_lengths=np.full(batch, 8),
            request_ids=np.arange(batch),
            max_new_tokens=args.new_tokens,
            gamma=gamma,
            sampling_config=config,
            compiled=compiled,
        )

    once(), once(compiled=True)  # compile both
    results, fused = [], []
    for _ in range(args.repeats):  # interleaved, so both see the same machine
        results.append(once())
        fused.append(once(compiled=True))
    fused_total = np.array([r.total_s for r in fused])
    iterations = np.array([r.iterations.max() for r in results])
    overhead = np.array([r.overhead_s for r in results])
    total = np.array([r.total_s for r in results])
    return {
        "batch": batch,
        "gamma": gamma,
        "temperature": config.temperature,
        "target_call_ms": 1e3 * step_s,
        "iteration_ms": 1e3 * float(np.median(total / iterations)),
        "overhead_per_iteration_ms": 1e3 * float(np.median(overhead / iterations)),
        "overhead_share": float(np.median(overhead / total)),
        "compiled_iteration_ms": 1e3 * float(np.median(fused_total / iterations)),
        "host_over_compiled": float(np.median(total) / np.median(fused_total)),
        "acceptance": float(results[0].accepted.sum() / results[0].drafted.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dim", type=int, default=1024)
    parser.add_argument("--work-layers", type=int, nargs="+", default=[24, 48])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"# loop overhead — {platform.processor() or platform.machine()}, "
        f"{jax.device_count()} {jax.default_backend()} device(s), jax {jax.__version__}"
    )
    print(
        "| batch | γ | T | target call (γ+1 tokens) ms | iteration ms | overhead/iter ms "
        "| overhead share | acceptance | compiled loop: iteration ms | host / compiled |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for layers in args.work_layers:
        for batch in (1, 16):
            for config in (GREEDY, SamplingConfig(temperature=1.0)):
                r = run(batch, 4, config, args, layers)
                print(
                    f"| {r['batch']} | {r['gamma']} | {r['temperature']:g} | "
                    f"{r['target_call_ms']:.2f} | {r['iteration_ms']:.2f} | "
                    f"{r['overhead_per_iteration_ms']:.3f} | {100 * r['overhead_share']:.1f}% | "
                    f"{r['acceptance']:.2f} | {r['compiled_iteration_ms']:.2f} | "
                    f"{r['host_over_compiled']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
