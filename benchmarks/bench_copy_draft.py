"""The copy draft against the model draft on the shipped translation sample: α and
tokens per iteration (no timing).

For the embedded pair's target (``ende_target_debian``) and three drafts — the default
model draft (``ende_draft_debian_seq2``), the copy draft (``copy:n=N``) and the two combined
(``copy:n=N+ende_draft_debian_seq2``: the copy where a match exists, the model elsewhere) —
on every sentence of ``assets/samples/en_de_debian_sample.tsv`` (the translate job's
preprocessing: ``translate English to German: {en}`` + EOS), in-process, the loop
compiled, at T=0 and T=1 and each γ:

- **α**: the maximum-likelihood α, accepted / acceptance tests
  (``theory.empirical_alpha``), over all sentences;
- **tokens / iteration**: generated tokens / target calls;
- at T=0, the outputs are checked equal to the target alone, token for token.

Along the target's own greedy translations it also reports how often the copy lookup
finds a match (of ≥ n_min tokens, in the source or the output so far) and how often a
matched proposal is the target's next token (which is its acceptance at T=0).

This is a translation pair: German output copies little from English input (names,
numbers, punctuation); summaries copy far more (configs/studies/summaries_copy.yaml).

Usage (its runs' commands are in BENCHMARKS.md's git history):

    .venv/bin/python benchmarks/bench_copy_draft.py [--n 3] [--gammas 2,4]
        [--temperatures 0,1] [--batch 8] [--limit N] [--json runs/bench/copy_draft.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from pipelines import model_resolver, text
from specdec_core import theory
from specdec_core.models import prompt_lookup
from specdec_core.sampling import SamplingConfig
from workers.batching import DecodeSettings, Request
from workers.engine import InProcessEngine

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "assets" / "samples" / "en_de_debian_sample.tsv"
PREFIX, EOS = text.TRANSLATE_PREFIX, text.EOS_ID
MAX_NEW = 64  # the translate job's default --max-new-tokens


def load(ref: str, role: str):
    return model_resolver.resolve_model(ref, role=role).spec.load()


def sample_requests() -> list[Request]:
    target = model_resolver.resolve_model(model_resolver.DEFAULT_TARGET, role="target")
    processor = text.sentencepiece(target.vocab_path)
    lines = [line.split("\t") for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    return [
        Request(
            id=f"line{i}",
            prompt_tokens=(text.DECODER_START_ID,),
            encoder_tokens=text.encode(processor, PREFIX, en),
        )
        for i, (en, _) in enumerate(lines)
    ]


def run(engine: InProcessEngine, requests, batch: int, baseline: bool = False):
    out = []
    for start in range(0, len(requests), batch):
        chunk = requests[start : start + batch]
        out += engine.generate_baseline(chunk) if baseline else engine.generate(chunk)
    return out


def summary(generations) -> dict:
    accepted = sum(g.accepted for g in generations)
    iterations = sum(g.iterations for g in generations)
    fully = sum(g.accepted_by_position[-1] for g in generations)
    tokens = sum(len(g.tokens) for g in generations)
    return {
        "alpha": theory.empirical_alpha(accepted, iterations, fully),
        "tokens_per_iteration": tokens / iterations,
        "accepted_per_drafted": accepted / sum(g.drafted for g in generations),
        "tests": theory.acceptance_tests(accepted, iterations, fully),
        "tokens": tokens,
        "iterations": iterations,
    }


def copy_lookup_stats(config, requests, greedy) -> dict:
    """Match rate and T=0 precision of the copy lookup along the target's greedy outputs."""
    width = max(len(g.tokens) for g in greedy) + 1
    tokens = np.zeros((len(greedy), width), np.int32)  # the start token 0, then the output
    source = np.zeros((len(requests), max(len(r.encoder_tokens) for r in requests)), np.int32)
    for row, (g, r) in enumerate(zip(greedy, requests, strict=True)):
        tokens[row, 1 : 1 + len(g.tokens)] = g.tokens
        source[row, : len(r.encoder_tokens)] = r.encoder_tokens
    proposals, lengths = prompt_lookup.proposals_along(config, tokens, None, source)
    positions = matched = correct = 0
    for row, g in enumerate(greedy):
        n = len(g.tokens)
        hit = lengths[row, :n] > 0
        positions += n
        matched += int(hit.sum())
        correct += int((hit & (proposals[row, :n] == tokens[row, 1 : n + 1])).sum())
    return {
        "positions": positions,
        "match_rate": matched / positions,
        "matched_precision": correct / matched if matched else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=3, help="the copy draft's n_max")
    parser.add_argument("--gammas", default="2,4")
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=0, help="first N sentences (0: all)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    gammas = [int(g) for g in args.gammas.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]

    target = load(model_resolver.DEFAULT_TARGET, "target")
    drafts = {
        model_resolver.DEFAULT_DRAFT: load(model_resolver.DEFAULT_DRAFT, "draft"),
        f"copy:n={args.n}": load(f"copy:n={args.n}", "draft"),
        f"copy:n={args.n}+{model_resolver.DEFAULT_DRAFT}": load(
            f"copy:n={args.n}+{model_resolver.DEFAULT_DRAFT}", "draft"
        ),
    }
    requests = sample_requests()[: args.limit or None]
    print(f"{len(requests)} sentences of {SAMPLE.relative_to(REPO)}; target {target.name}")
    results: dict = {"sentences": len(requests), "rows": []}

    greedy_settings = DecodeSettings(
        gamma=gammas[0], max_new_tokens=MAX_NEW, batch_size=args.batch, eos_id=EOS
    )
    greedy = run(
        InProcessEngine(target, drafts[model_resolver.DEFAULT_DRAFT], greedy_settings),
        requests,
        args.batch,
        baseline=True,
    )
    copy_config = drafts[f"copy:n={args.n}"].config
    results["lookup"] = copy_lookup_stats(copy_config, requests, greedy)
    print(
        "copy lookup along the target's greedy outputs: "
        f"{results['lookup']['positions']} positions, "
        f"match rate {results['lookup']['match_rate']:.3f}, "
        f"matched proposals right {results['lookup']['matched_precision']:.3f}"
    )
    print(f"{'draft':<28} {'T':>4} {'γ':>2} {'α':>6} {'tokens/iter':>11} {'tests':>6}")
    for temperature in temperatures:
        for gamma in gammas:
            settings = DecodeSettings(
                gamma=gamma,
                sampling=SamplingConfig(temperature=temperature),
                seed=args.seed,
                max_new_tokens=MAX_NEW,
                batch_size=args.batch,
                eos_id=EOS,
            )
            for name, draft in drafts.items():
                generations = run(InProcessEngine(target, draft, settings), requests, args.batch)
                if temperature == 0:
                    same = [g.tokens for g in generations] == [g.tokens for g in greedy]
                    if not same:
                        raise SystemExit(f"{name}: greedy output differs from the target alone")
                row = {"draft": name, "temperature": temperature, "gamma": gamma}
                row |= summary(generations)
                results["rows"].append(row)
                print(
                    f"{name:<28} {temperature:>4g} {gamma:>2} {row['alpha']:>6.3f} "
                    f"{row['tokens_per_iteration']:>11.3f} {row['tests']:>6}",
                    flush=True,
                )
    if args.json:
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
