"""Throughput of the Ray workers vs the in-process loop on the same records.

Both engines decode the same requests with the same T5 shapes and settings (so the
same tokens: the script checks it); the ratio of their tokens/s is the cost of
hosting draft and target in separate Ray actors (two round trips per iteration plus
the state and one V-vector per row), for both draft placements — its own actor
(``worker``) or inside the coordinator's actor (``coordinator``) — and both transports
of the loop's calls: the direct channel (``socket``) or Ray actor calls (``ray``).
Usage:

    .venv/bin/python benchmarks/bench_ray_vs_inprocess.py [--records 16] [--gamma 4]
        [--placements coordinator,worker] [--transports socket,ray] [--batches 1,16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from workers.ray_engine import RayEngine, ensure_ray
from workers.spec import DRAFT_PLACEMENTS, TRANSPORTS

ensure_ray(num_cpus=8)  # before JAX starts threads; logical CPUs for all engines' actors

from specdec_core.models import bound, registry  # noqa: E402
from workers.batching import DecodeSettings, Request  # noqa: E402
from workers.engine import EngineConfig, InProcessEngine  # noqa: E402
from workers.spec import ModelSpec  # noqa: E402


def t5_shape(*, emb_dim: int, num_heads: int, mlp_dim: int, layers: int) -> dict:
    """``t5_tiny_test`` overrides: 64-wide heads, ``layers`` encoder and decoder layers,
    over the 8000-token vocabulary that target and draft share."""
    widths = dict(emb_dim=emb_dim, num_heads=num_heads, head_dim=64, mlp_dim=mlp_dim)
    return dict(vocab_size=8000, **widths, num_encoder_layers=layers, num_decoder_layers=layers)


TARGET = t5_shape(emb_dim=512, num_heads=8, mlp_dim=1536, layers=4)
DRAFT = t5_shape(emb_dim=128, num_heads=2, mlp_dim=256, layers=1)


def requests(n: int, vocab: int) -> list[Request]:
    rng = np.random.default_rng(0)
    return [
        Request(
            id=str(i),
            prompt_tokens=(0,),
            encoder_tokens=(*rng.integers(3, vocab, 8 + i % 16).tolist(), 1),
        )
        for i in range(n)
    ]


def one_pass(engine, reqs, batch_size: int) -> list:
    out = []
    for i in range(0, len(reqs), batch_size):
        out += engine.generate(reqs[i : i + batch_size])
    return out


def timed_pass(engine, reqs, batch_size: int) -> tuple[float, list]:
    """(tokens/s, generations) of one pass over the records."""
    start = time.perf_counter()
    out = one_pass(engine, reqs, batch_size)
    elapsed = time.perf_counter() - start
    return sum(len(g.tokens) for g in out) / elapsed, out


def interleaved(engines: dict, reqs, batch_size: int, rounds: int) -> dict:
    """Per engine: tokens/s of each of ``rounds`` timed passes, and its generations.

    Every engine first decodes all records untimed (which compiles every bucket shape:
    records differ in encoder length, so one warm-up batch would leave compiles in the
    timed pass); the timed passes then alternate between engines round by round, so a
    slow spell of the shared machine hits all of them rather than one.
    """
    for engine in engines.values():
        one_pass(engine, reqs, batch_size)
    results = {name: ([], None) for name in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            tps, out = timed_pass(engine, reqs, batch_size)
            results[name][0].append(tps)
            results[name] = (results[name][0], out)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=16)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--placements", default=",".join(DRAFT_PLACEMENTS))
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--rounds", type=int, default=3, help="timed passes per engine")
    args = parser.parse_args()
    target_config = registry.get_config("t5_tiny_test", **TARGET)
    draft_config = registry.get_config("t5_tiny_test", **DRAFT)
    target_spec = ModelSpec(name="target", family="t5", config=target_config, init_seed=0)
    draft_spec = ModelSpec(name="draft", family="t5", config=draft_config, init_seed=1)
    target = bound.load_model("target", "t5", target_config, init_seed=0)
    draft = bound.load_model("draft", "t5", draft_config, init_seed=1)
    print(
        f"target {target.param_count() / 1e6:.1f}M params, draft "
        f"{draft.param_count() / 1e6:.1f}M params, γ={args.gamma}, greedy"
    )
    print(
        "| batch | draft placement | transport | in-process tokens/s | Ray tokens/s "
        "| Ray / in-process (median, per round) | bytes/iteration | same tokens |"
    )
    print("|---|---|---|---|---|---|---|---|")
    grid = [
        (placement, transport)
        for placement in args.placements.split(",")
        for transport in args.transports.split(",")
    ]
    for batch_size in map(int, args.batches.split(",")):
        settings = DecodeSettings(
            gamma=args.gamma, max_new_tokens=args.max_new_tokens, batch_size=batch_size, eos_id=None
        )
        reqs = requests(args.records if batch_size == 1 else max(args.records, 32), 8000)
        # The host loop: the same per-iteration steps the coordinator drives, so the
        # ratio is the cost of hosting the models in workers.
        engines = {"inprocess": InProcessEngine(target, draft, settings, compiled=False)}
        try:
            for placement, transport in grid:
                engines[placement, transport] = RayEngine(
                    target_spec,
                    draft_spec,
                    settings,
                    config=EngineConfig(kind="ray", draft_placement=placement, transport=transport),
                )
            results = interleaved(engines, reqs, batch_size, args.rounds)
            local_tps, local_out = results.pop("inprocess")
            for (placement, transport), (ray_tps, ray_out) in results.items():
                engine = engines[placement, transport]
                traffic = engine.traffic()
                ratios = [r / lo for r, lo in zip(ray_tps, local_tps, strict=True)]
                same = [g.tokens for g in local_out] == [g.tokens for g in ray_out]
                print(
                    f"| {batch_size} | {placement} | {engine.transport} | "
                    f"{np.median(local_tps):.1f} | {np.median(ray_tps):.1f} | "
                    f"{np.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)}) | "
                    f"{traffic['bytes_per_iteration']:.0f} | {same} |",
                    flush=True,
                )
        finally:
            for engine in engines.values():
                if isinstance(engine, RayEngine):
                    engine.close()


if __name__ == "__main__":
    main()
