"""Throughput of the Ray workers vs the in-process loop on the same records.

Both engines decode the same requests with the same T5 shapes and settings (so the
same tokens: the script checks it); the ratio of their tokens/s is the cost of
hosting draft and target in separate Ray actors (two round trips per iteration plus
the state and one V-vector per row), for both draft placements: its own actor
(``worker``) or inside the coordinator's actor (``coordinator``). Usage:

    .venv/bin/python benchmarks/bench_ray_vs_inprocess.py [--records 16] [--gamma 4]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from workers.coordinator import RayEngine, ensure_ray
from workers.spec import DRAFT_PLACEMENTS

ensure_ray(num_cpus=4)  # before JAX starts threads in this process

from specdec_core.models import bound, registry  # noqa: E402
from workers.batching import DecodeSettings, Request  # noqa: E402
from workers.engine import InProcessEngine  # noqa: E402
from workers.spec import ModelSpec  # noqa: E402

TARGET = dict(
    vocab_size=8000,
    emb_dim=512,
    num_heads=8,
    head_dim=64,
    mlp_dim=1536,
    num_encoder_layers=4,
    num_decoder_layers=4,
)
DRAFT = dict(
    vocab_size=8000,
    emb_dim=128,
    num_heads=2,
    head_dim=64,
    mlp_dim=256,
    num_encoder_layers=1,
    num_decoder_layers=1,
)


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


def run(engine, reqs, batch_size: int) -> tuple[float, list]:
    """Tokens/s of a timed pass after an untimed one (which compiles every bucket shape:
    records differ in encoder length, so one warm-up batch would leave compiles in the
    timed pass)."""
    one_pass(engine, reqs, batch_size)
    start = time.perf_counter()
    out = one_pass(engine, reqs, batch_size)
    elapsed = time.perf_counter() - start
    return sum(len(g.tokens) for g in out) / elapsed, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=16)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
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
        "| batch | draft placement | in-process tokens/s | Ray tokens/s | Ray / in-process "
        "| bytes/iteration | same tokens |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch_size in (1, 16):
        settings = DecodeSettings(
            gamma=args.gamma, max_new_tokens=args.max_new_tokens, batch_size=batch_size, eos_id=None
        )
        reqs = requests(args.records if batch_size == 1 else max(args.records, 32), 8000)
        local_tps, local_out = run(InProcessEngine(target, draft, settings), reqs, batch_size)
        for placement in DRAFT_PLACEMENTS:
            engine = RayEngine(target_spec, draft_spec, settings, draft_placement=placement)
            try:
                ray_tps, ray_out = run(engine, reqs, batch_size)
                traffic = engine.traffic()
            finally:
                engine.close()
            same = [g.tokens for g in local_out] == [g.tokens for g in ray_out]
            print(
                f"| {batch_size} | {placement} | {local_tps:.1f} | {ray_tps:.1f} | "
                f"{ray_tps / local_tps:.2f} | {traffic['bytes_per_iteration']:.0f} | {same} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
