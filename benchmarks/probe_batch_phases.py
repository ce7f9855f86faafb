"""Where one batch's time goes, and what a loop step costs at each γ.

Loads the embedded Debian pair and decodes the first ``--records`` sentences of the
shipped sample one batch at a time (``--batch`` rows, greedy or at ``--temperature``
under the paper's rule, seed 11, the job's padding): the target alone
(``decoding.autoregressive_generate``) and the compiled speculative loop at each γ of
``--gammas`` (``decoding.speculative_generate(compiled=True)``; at T > 0 also γ = 0, the
loop that drafts and tests one token per target call, ``SamplingConfig.drafts_bonus``),
every batch once untimed, then ``--rounds`` interleaved rounds. Per batch it splits the
wall time into

- *encoders*: ``model.new_cache`` (the T5 encoder and the cross-attention keys, the
  draft's too for γ ≥ 1);
- *setup*: the decode call outside its loop (the state's set-up, the prefill);
- *loop*: ``DecodeResult.loop_s``;
- *rest*: the rest of the call (the result fetched to the host).

and fits the loop's seconds against its iterations over the batches (least squares):
the slope is a loop step's cost at that γ, the intercept what a loop call costs beyond
its steps. ``tokens/iter`` and ``loop ms/token`` give the loop's own speedup over the
target alone.

Usage (BENCHMARKS.md gives the command run)::

    .venv/bin/python benchmarks/probe_batch_phases.py [--batch 1] [--gammas 1,2,3]
        [--records 32] [--rounds 2] [--temperature 0]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_target_loop import debian_pair, greedy_decode_args, sample_requests  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gammas", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--draft", default="ende_draft_debian_seq2")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)

    import jax

    from specdec_core import decoding
    from specdec_core.sampling import SamplingConfig
    from workers.batching import DecodeSettings, pack

    config = SamplingConfig(temperature=args.temperature)
    ALONE = "target alone"
    gammas = [ALONE, *([0] if config.drafts_bonus else []), *map(int, args.gammas.split(","))]

    target, draft, vocab = debian_pair(args.draft)
    requests = sample_requests(vocab, args.records)

    def batches(gamma: int):
        settings = DecodeSettings(gamma=gamma if gamma != ALONE else 1, max_new_tokens=64,
                                  batch_size=args.batch, sampling=config)  # fmt: skip
        return [
            pack(requests[i : i + args.batch], settings)
            for i in range(0, len(requests), args.batch)
        ]

    packed = {gamma: batches(gamma) for gamma in gammas}

    def decode(gamma: int, p) -> dict:
        start = time.perf_counter()
        common = greedy_decode_args(target, p)  # the target's encoder runs here
        common.update(sampling_config=config, seed=11)
        jax.block_until_ready(common["target_cache"])
        if gamma != ALONE:
            draft_cache = jax.block_until_ready(
                draft.new_cache(p.encoder_tokens, p.prompt_tokens.shape[0], p.max_len)
            )
        encoders = time.perf_counter() - start
        if gamma != ALONE:
            result = decoding.speculative_generate(
                **common, draft=draft.forward, draft_cache=draft_cache, gamma=gamma, compiled=True
            )
        else:
            result = decoding.autoregressive_generate(**common)
        wall = time.perf_counter() - start
        return {
            "encoders": encoders,
            "setup": result.total_s - result.loop_s,
            "loop": result.loop_s,
            "rest": wall - encoders - result.total_s,
            "iterations": int(np.max(result.iterations)),
            "tokens": int(np.sum(result.lengths)),
        }

    for gamma in gammas:  # compiles every shape
        for p in packed[gamma]:
            decode(gamma, p)
    runs: dict[int, list[dict]] = {gamma: [] for gamma in gammas}
    for _ in range(args.rounds):
        for gamma in gammas:
            runs[gamma] += [decode(gamma, p) for p in packed[gamma]]

    ms = 1e3
    print(
        f"batch {args.batch}, {len(packed[ALONE])} batches x {args.rounds} rounds, "
        f"draft {args.draft}, T = {args.temperature}"
    )
    print(
        "| γ | encoders ms/batch | setup ms/batch | loop ms/batch | rest ms/batch "
        "| loop ms/step (fit) | loop ms/call beyond its steps (fit) | tokens/iter "
        "| loop ms/token | loop speedup |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    base_per_token = None
    for gamma in gammas:
        rows = runs[gamma]
        n = len(rows)

        def mean(key, rows=rows, n=n):
            return sum(r[key] for r in rows) / n * ms

        loop = np.array([r["loop"] for r in rows]) * ms
        iterations = np.array([r["iterations"] for r in rows])
        slope, intercept = np.polyfit(iterations, loop, 1)
        tokens = sum(r["tokens"] for r in rows)
        per_token = loop.sum() / tokens
        base_per_token = base_per_token or per_token
        print(
            f"| {gamma} | {mean('encoders'):.2f} | {mean('setup'):.2f} | {mean('loop'):.2f} | "
            f"{mean('rest'):.2f} | {slope:.2f} | {intercept:.2f} | "
            f"{tokens / iterations.sum():.2f} | {per_token:.2f} | "
            f"{base_per_token / per_token:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
