"""Per-call time of the T5 cached ``forward`` at k = 1, 2, 4, 8, and HF greedy decoding.

For each shape and batch size, one random T5 1.1 is built with ``transformers`` and
imported into this project's params with ``checkpoints.import_hf_t5``, so both sides
run the same weights. Ours: ``jax.jit(partial(t5.forward, config), donate_argnums=1)``
called on a cache holding ``--context`` decoder positions; each call writes k
positions and is rolled back, so every call sees the same lengths. HF: greedy
``generate`` (``num_beams=1``, KV cache on) with every decoding step timestamped by a
stopping criterion (so the encoder pass is excluded). Timing runs in interleaved
rounds (each k, then one HF generate), in blocks of 5 calls/steps; each column reports
its fastest block, which filters out load from other processes on a shared machine.
float32, CPU. Prints a markdown table. Usage:

    .venv/bin/python benchmarks/bench_t5_forward.py [--shapes small,mini,tiny] [--batches 1,8]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from specdec_core import checkpoints
from specdec_core.models import t5

SHAPES = {  # name: (emb_dim, num_heads, head_dim, mlp_dim, layers per stack)
    "small": (512, 6, 64, 1024, 8),  # T5 1.1 small (t5x/examples/t5/t5_1_1/small.gin)
    "mini": (256, 4, 64, 512, 4),
    "tiny": (128, 2, 64, 256, 2),
}
VOCAB = 32128
KS = (1, 2, 4, 8)
TORCH_THREADS = torch.get_num_threads()  # torch's default intra-op threads
BLOCK = 5  # calls per timed block; the fastest block is reported (the machine is shared)


def hf_model(shape: str):
    """A random HF T5 1.1 (gated-gelu, untied lm_head) of the given shape, eval mode."""
    emb, heads, head_dim, mlp, layers = SHAPES[shape]
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=emb, d_kv=head_dim, num_heads=heads, d_ff=mlp,
        num_layers=layers, num_decoder_layers=layers, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, dropout_rate=0.0, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    model.lm_head = torch.nn.Linear(emb, VOCAB, bias=False)  # T5 1.1: untied (transformers 5)
    return model.eval()


def ours_timer(config, params, encoder_tokens, *, k: int, context: int):
    """A function timing one block of ``forward`` calls writing k positions each.

    The cache holds ``context`` committed positions; every call is rolled back, so all
    calls see the same lengths. Returns ``time_block() -> seconds per call``.
    """
    init = jax.jit(t5.init_cache, static_argnums=0, static_argnames="max_decode_len")
    step = jax.jit(functools.partial(t5.forward, config), donate_argnums=1)
    batch = encoder_tokens.shape[0]
    cache = init(config, params, encoder_tokens, max_decode_len=context + max(KS))
    context_tokens = jnp.ones((batch, context), jnp.int32)
    _, cache = jax.jit(functools.partial(t5.forward, config))(params, cache, context_tokens)
    committed = np.asarray(cache.lengths)  # host copy: the device one gets donated
    tokens = jnp.full((batch, k), 5, jnp.int32)
    state = {"cache": cache}

    def time_block() -> float:
        cache = state["cache"]
        start = time.perf_counter()
        for _ in range(BLOCK):
            logits, cache = step(params, cache, tokens)
            logits.block_until_ready()
            cache = cache.replace(lengths=jnp.asarray(committed))  # rollback: O(1)
        state["cache"] = cache
        return (time.perf_counter() - start) / BLOCK

    time_block()  # compile and warm up
    return time_block


def hf_timer(model, encoder_tokens: np.ndarray, *, new_tokens: int, threads: int):
    """A function running HF greedy ``generate`` once; returns per-step block times.

    A stopping criterion (called once per generated token) timestamps every step, so
    the encoder pass is excluded; steps are averaged in blocks of ``BLOCK``. torch
    runs with ``threads`` intra-op threads (on a loaded machine its OpenMP pool can
    be ~10x slower with 2 threads than with 1, so both are measured).
    """

    class StepClock(transformers.StoppingCriteria):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores, **kwargs):
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    inputs = torch.as_tensor(encoder_tokens, dtype=torch.long)

    def run() -> list[float]:
        torch.set_num_threads(threads)
        clock = StepClock()
        with torch.inference_mode():
            out = model.generate(
                input_ids=inputs, attention_mask=(inputs > 0).long(), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, num_beams=1, use_cache=True,
                stopping_criteria=transformers.StoppingCriteriaList([clock]),
            )  # fmt: skip
        assert out.shape[1] == new_tokens + 1, out.shape
        steps = np.diff(clock.times)  # [new_tokens - 1]: one decoder step + argmax each
        return [steps[i : i + BLOCK].mean() for i in range(0, len(steps) - BLOCK + 1, BLOCK)]

    run()  # warm up
    return run


def bench_shape(shape: str, batch: int, args) -> dict:
    """Times ours at every k and HF, interleaved round by round so that load from
    other processes hits all columns alike; each column keeps its fastest block."""
    model = hf_model(shape)
    emb, heads, head_dim, mlp, layers = SHAPES[shape]
    config = t5.T5Config(
        vocab_size=VOCAB, emb_dim=emb, num_heads=heads, num_encoder_layers=layers,
        num_decoder_layers=layers, head_dim=head_dim, mlp_dim=mlp,
    )  # fmt: skip
    params = jax.device_put(checkpoints.import_hf_t5(model.state_dict()))
    rng = np.random.default_rng(0)
    encoder_tokens = rng.integers(2, VOCAB, size=(batch, args.source_len)).astype(np.int32)
    ours = {
        k: ours_timer(config, params, jnp.asarray(encoder_tokens), k=k, context=args.context)
        for k in KS
    }
    hf = {
        f"hf{n}": hf_timer(model, encoder_tokens, new_tokens=args.hf_tokens, threads=n)
        for n in sorted({1, TORCH_THREADS})
    }
    times = {key: [] for key in (*KS, *hf)}
    for _ in range(args.rounds):
        for k in KS:
            times[k].append(ours[k]())
        for key, run in hf.items():
            times[key] += run()
    row = {"shape": shape, "batch": batch, **{key: min(v) for key, v in times.items()}}
    row["hf"] = min(row[key] for key in hf)
    return row


def markdown(rows: list[dict]) -> str:
    hf_cols = [f"hf{n}" for n in sorted({1, TORCH_THREADS})]
    head = (
        "| shape | batch | " + " | ".join(f"k={k} ms/call" for k in KS) + " | k=8 / k=1 | "
        + " | ".join(f"HF greedy ms/token ({c[2:]} thr)" for c in hf_cols)
        + " | ours k=1 / best HF |"
    )  # fmt: skip
    lines = [head, "|" + "---|" * (len(KS) + len(hf_cols) + 4)]
    for r in rows:
        cells = [f"{1e3 * r[k]:.2f}" for k in KS] + [f"{r[8] / r[1]:.2f}"]
        cells += [f"{1e3 * r[c]:.2f}" for c in hf_cols] + [f"{r[1] / r['hf']:.2f}"]
        lines.append(f"| {r['shape']} | {r['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="small,mini,tiny")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--source-len", type=int, default=32, help="encoder tokens per row")
    parser.add_argument("--context", type=int, default=24, help="decoder positions held")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved timing rounds")
    parser.add_argument("--hf-tokens", type=int, default=11, help="HF tokens per round")
    args = parser.parse_args()
    print(
        f"# T5 forward benchmark: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, jax {jax.__version__} ({jax.default_backend()}), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), float32, "
        f"source {args.source_len} tokens, decoder context {args.context}, cache "
        f"{args.context + max(KS)} slots, vocab {VOCAB}\n"
    )
    rows = []
    for shape in args.shapes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            rows.append(bench_shape(shape, batch, args))
            print(f"done {shape} batch {batch}", flush=True)
    print(markdown(rows))


if __name__ == "__main__":
    main()
