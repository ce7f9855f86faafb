"""The Debian pair with float32 and with bfloat16 matmuls (a model config's
``matmul_dtype``), side by side in one process: the target's call time on k tokens,
the target alone and the compiled speculative loop in ms per generated token, and
whether every greedy output of the speculative loop is the target's own.

Both pairs are the same weights (``ende_target_debian`` + ``--draft``) loaded twice,
once with each ``matmul_dtype``. Timings run in interleaved rounds (every variant once
per round, float32 and bfloat16 alternating) and each figure is the fastest round's,
which filters load from other processes. The call times are
``specdec_core.costs.call_seconds`` (calls inside one compiled loop, decode-sized
cache); the loops decode the first ``--records`` sentences of make run's sample,
greedy, at ``--batch`` rows, with the job's padding.

Usage (BENCHMARKS.md "bfloat16 matmuls" gives the command run)::

    .venv/bin/python benchmarks/bench_matmul_dtype.py [--batches 1,16] [--records 32]
        [--rounds 2] [--draft ende_draft_debian_seq2]
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_target_loop import greedy_decode_args, sample_requests  # noqa: E402  (this folder)

DTYPES = ("float32", "bfloat16")
GAMMAS = (0, 1, 3)  # 0: the target alone
KS = (1, 2, 3, 4)


def load_pairs(draft_name: str):
    """{dtype: (target, draft)} and the vocabulary path."""
    from pipelines import model_resolver

    pairs = {}
    for dtype in DTYPES:
        models = []
        for name, role in (("ende_target_debian", "--target"), (draft_name, "--draft")):
            resolved = model_resolver.resolve_model(name, role=role)
            config = dataclasses.replace(resolved.spec.config, matmul_dtype=dtype)
            models.append(dataclasses.replace(resolved.spec, config=config).load())
            vocab = resolved.vocab_path
        pairs[dtype] = tuple(models)
    return pairs, vocab


def decode(target, draft, packed, gamma: int):
    from specdec_core import decoding

    args = greedy_decode_args(target, packed)
    if gamma == 0:
        return decoding.autoregressive_generate(**args)
    rows = packed.prompt_tokens.shape[0]
    return decoding.speculative_generate(
        **args,
        draft=draft.forward,
        draft_cache=draft.new_cache(packed.encoder_tokens, rows, packed.max_len),
        gamma=gamma,
        compiled=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--draft", default="ende_draft_debian_seq2")
    args = parser.parse_args(argv)

    from specdec_core import costs
    from workers.batching import DecodeSettings, pack

    pairs, vocab = load_pairs(args.draft)
    requests = sample_requests(vocab, args.records)
    print(f"target ende_target_debian, draft {args.draft}, {args.records} sentences, greedy")
    for batch in (int(b) for b in args.batches.split(",")):
        settings = DecodeSettings(gamma=max(GAMMAS), max_new_tokens=64, batch_size=batch)
        packed = [pack(requests[i : i + batch], settings) for i in range(0, len(requests), batch)]
        median = packed[len(packed) // 2]
        call_ms = {dtype: {k: np.inf for k in KS} for dtype in DTYPES}
        loop_ms = {dtype: {g: np.inf for g in GAMMAS} for dtype in DTYPES}
        identical = {dtype: True for dtype in DTYPES}
        for dtype in DTYPES:  # compile every shape, check greedy identity
            target, draft = pairs[dtype]
            for p in packed:
                base = decode(target, draft, p, 0).tokens
                for gamma in GAMMAS[1:]:
                    same = np.array_equal(decode(target, draft, p, gamma).tokens, base)
                    identical[dtype] &= same
        for _ in range(args.rounds):
            for dtype in DTYPES:
                target, draft = pairs[dtype]
                for k in KS:
                    seconds = costs.call_seconds(
                        target, median.encoder_tokens, k=k, cache_len=median.max_len
                    )
                    call_ms[dtype][k] = min(call_ms[dtype][k], seconds * 1e3)
                for gamma in GAMMAS:
                    start, tokens = time.perf_counter(), 0
                    for p in packed:
                        tokens += int(decode(target, draft, p, gamma).lengths.sum())
                    per_token = (time.perf_counter() - start) / tokens * 1e3
                    loop_ms[dtype][gamma] = min(loop_ms[dtype][gamma], per_token)
        print(f"\nbatch {batch} ({len(packed)} batches, cache {median.max_len} slots)")
        ks = " | ".join(f"T({k}) ms" for k in KS)
        loops = " | ".join(f"γ={g} ms/token" if g else "alone ms/token" for g in GAMMAS)
        print(f"| matmul_dtype | {ks} | T(4)/T(1) | {loops} | greedy identical |")
        print("|---" * (len(KS) + len(GAMMAS) + 3) + "|")
        for dtype in DTYPES:
            c, loop = call_ms[dtype], loop_ms[dtype]
            print(
                f"| {dtype} | "
                + " | ".join(f"{c[k]:.2f}" for k in KS)
                + f" | {c[4] / c[1]:.2f} | "
                + " | ".join(f"{loop[g]:.2f}" for g in GAMMAS)
                + f" | {identical[dtype]} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
