"""The ``specdec`` command line.

Subcommands:
  demo   speculative vs target-only decoding on stub models, in one run (until the
         trained En→De pair lands, this is the main job of the README).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import numpy as np


def _demo(args: argparse.Namespace) -> int:
    import jax

    from specdec_core import decoding, theory
    from specdec_core.models import table
    from specdec_core.sampling import SamplingConfig

    config = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    vocab, prompt_len, batch = 64, 8, args.batch_size
    target_params = table.init_params(
        jax.random.key(args.seed),
        vocab_size=vocab,
        scale=4.0,
        work_dim=1024,
        work_layers=args.target_layers,
    )
    noise = table.init_params(jax.random.key(args.seed + 1), vocab_size=vocab, scale=4.0)
    draft_params = table.from_table(0.85 * target_params.table + 0.15 * noise.table)
    target = functools.partial(table.forward, target_params)
    draft = functools.partial(table.forward, draft_params)
    max_len = prompt_len + args.max_new_tokens + args.gamma + 2
    prompts = np.random.default_rng(args.seed).integers(0, vocab, (batch, prompt_len))
    common = dict(
        prompt_tokens=prompts,
        prompt_lengths=np.full(batch, prompt_len),
        request_ids=np.arange(batch),
        max_new_tokens=args.max_new_tokens,
        sampling_config=config,
        seed=args.seed,
    )

    def run_both():
        base = decoding.autoregressive_generate(
            target=target, target_cache=table.init_cache(batch, max_len), **common
        )
        spec = decoding.speculative_generate(
            target=target,
            target_cache=table.init_cache(batch, max_len),
            draft=draft,
            draft_cache=table.init_cache(batch, max_len),
            gamma=args.gamma,
            **common,
        )
        return base, spec

    print("compiling ...", file=sys.stderr, flush=True)
    run_both()
    base, spec = run_both()
    alpha = float(spec.accepted.sum() / spec.drafted.sum())
    summary = {
        "speedup": base.total_s / spec.total_s,
        "alpha": alpha,
        "mean_accepted_length": float(
            (spec.accepted.sum() + spec.iterations.sum()) / spec.iterations.sum()
        ),
        "predicted_tokens_per_iteration": theory.expected_tokens(min(alpha, 1.0), args.gamma),
        "tokens_per_s": float(spec.lengths.sum() / spec.total_s),
        "baseline_tokens_per_s": float(base.lengths.sum() / base.total_s),
        "identical_to_baseline": bool((spec.tokens == base.tokens).all())
        if config.greedy
        else None,
        "draft_s": spec.draft_s,
        "target_s": spec.target_s,
        "overhead_s": spec.overhead_s,
    }
    print("speculative decoding demo (stub table models, target with dense work layers)")
    for key, value in summary.items():
        print(f"  {key:32s} {value:.4f}" if isinstance(value, float) else f"  {key:32s} {value}")
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Speculative decoding jobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="speculative vs target-only decoding on stub models")
    demo.add_argument("--gamma", type=int, default=4)
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument("--top-k", type=int, default=0)
    demo.add_argument("--top-p", type=float, default=1.0)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--batch-size", type=int, default=1)
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--target-layers", type=int, default=12)
    demo.add_argument("--summary-json", default=None)
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:
        print(f"specdec: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
