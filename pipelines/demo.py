"""``specdec demo``: speculative vs target-only decoding on stub models, in one run.

The target is a table model with dense work layers (so its step costs something), the
draft a noisy copy of its table; both decode the same random prompts with
:func:`specdec_core.decoding.autoregressive_generate` and
:func:`~specdec_core.decoding.speculative_generate`, after one run that compiles. Prints
the speedup, the measured acceptance rate α, the mean accepted length, the tokens per
iteration that α predicts and, when greedy, whether the outputs are identical.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import numpy as np

from pipelines.arguments import ranged

VOCAB_SIZE = 64
PROMPT_LENGTH = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``specdec demo``."""
    add = parser.add_argument
    add("--gamma", type=ranged(int, "--gamma", low=1), default=4, help="drafted tokens per step")
    add("--temperature", type=ranged(float, "--temperature", low=0.0), default=0.0)
    add("--top-k", type=ranged(int, "--top-k", low=0), default=0, help="0 = off")
    add("--top-p", type=ranged(float, "--top-p", low=0.0, high=1.0, low_open=True), default=1.0)
    add("--seed", type=int, default=0)
    add("--batch-size", type=ranged(int, "--batch-size", low=1), default=1)
    add("--max-new-tokens", type=ranged(int, "--max-new-tokens", low=1), default=64)
    add("--target-layers", type=ranged(int, "--target-layers", low=0), default=12)
    add("--summary-json", default=None, help="write the summary here")


def _stub_models(args: argparse.Namespace):
    """(target forward, draft forward): the work-layer table and its noisy copy."""
    import jax

    from specdec_core.models import table

    target_params = table.init_params(
        jax.random.key(args.seed),
        vocab_size=VOCAB_SIZE,
        scale=4.0,
        work_dim=1024,
        work_layers=args.target_layers,
    )
    noise = table.init_params(jax.random.key(args.seed + 1), vocab_size=VOCAB_SIZE, scale=4.0)
    draft_params = table.from_table(0.85 * target_params.table + 0.15 * noise.table)
    return (
        functools.partial(table.forward, target_params),
        functools.partial(table.forward, draft_params),
    )


def _decode_both(target, draft, args: argparse.Namespace, config):
    """(target-only result, speculative result) of one run over the same prompts (the
    same forwards each run, so a second run reuses the first one's compilation)."""
    from specdec_core import decoding
    from specdec_core.models import table

    batch = args.batch_size
    max_len = PROMPT_LENGTH + args.max_new_tokens + args.gamma + 2
    prompts = np.random.default_rng(args.seed).integers(0, VOCAB_SIZE, (batch, PROMPT_LENGTH))
    common = dict(
        prompt_tokens=prompts,
        prompt_lengths=np.full(batch, PROMPT_LENGTH),
        request_ids=np.arange(batch),
        max_new_tokens=args.max_new_tokens,
        sampling_config=config,
        seed=args.seed,
    )
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


def summarize(base, spec, *, gamma: int, greedy: bool) -> dict:
    """Speedup, α, accepted length, predicted tokens per iteration, rates and times."""
    from specdec_core import theory

    alpha = theory.empirical_alpha(
        int(spec.accepted.sum()),
        int(spec.iterations.sum()),
        int(spec.accepted_by_position[:, -1].sum()),
    )
    predicted = theory.expected_tokens(min(alpha, 1.0), gamma) if alpha is not None else None
    return {
        "speedup": base.total_s / spec.total_s,
        "alpha": alpha,
        "mean_accepted_length": float(
            (spec.accepted.sum() + spec.iterations.sum()) / spec.iterations.sum()
        ),
        "predicted_tokens_per_iteration": predicted,
        "tokens_per_s": float(spec.lengths.sum() / spec.total_s),
        "baseline_tokens_per_s": float(base.lengths.sum() / base.total_s),
        "identical_to_baseline": bool((spec.tokens == base.tokens).all()) if greedy else None,
        "draft_s": spec.draft_s,
        "target_s": spec.target_s,
        "overhead_s": spec.overhead_s,
    }


def run(args: argparse.Namespace) -> int:
    """Compiles, decodes both ways, prints (and with --summary-json writes) the summary."""
    from specdec_core.sampling import SamplingConfig

    config = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    target, draft = _stub_models(args)
    print("compiling ...", file=sys.stderr, flush=True)
    _decode_both(target, draft, args, config)
    base, spec = _decode_both(target, draft, args, config)
    summary = summarize(base, spec, gamma=args.gamma, greedy=config.greedy)
    print("speculative decoding demo (stub table models, target with dense work layers)")
    for key, value in summary.items():
        print(f"  {key:32s} {value:.4f}" if isinstance(value, float) else f"  {key:32s} {value}")
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0
