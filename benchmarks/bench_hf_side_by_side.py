"""HF transformers side by side: the committed pair, exported to
transformers, decoded by HF and by us on the same weights, sentences and settings.

The target and draft are resolved by name (``pipelines.model_resolver``; default the
committed Debian pair ``ende_target_debian`` / ``ende_draft_debian_seq2``) and exported
with ``checkpoints.hf_t5_model`` (float32, eval mode). Sentences: the English column of
``assets/samples/en_de_debian_sample.tsv`` (``--limit N``: the first N), each fed as
the translate job does (``translate English to German: {en}`` + EOS, decoder start 0).
Every method runs at batch 1, T=0 (greedy), at most ``--max-new-tokens`` (64), and its
time is the wall time of one whole request (encoder included):

- ``HF greedy``: ``target.generate(num_beams=1, do_sample=False)``, KV cache on;
- ``HF assisted, constant``: ``assistant_model=draft`` with
  ``num_assistant_tokens_schedule="constant"`` and ``num_assistant_tokens=--gamma`` (our
  fixed γ); ``HF assisted, heuristic``: ``"heuristic"`` from HF's starting count (+2
  after a fully accepted block, -1 otherwise, kept across calls). Both with
  ``assistant_confidence_threshold=0`` so that the schedule alone sets the draft length;
- ``HF assisted, defaults``: what ``assistant_model=`` alone gives in transformers 5.x
  (constant 20 tokens, cut short where the draft's confidence is under a threshold that
  starts at 0.4 and is refitted from the acceptances);
- ``ours target-only``: in-process engine ``generate_baseline`` (the compiled loop);
- ``ours speculative, γ auto`` and ``ours speculative, γ=--gamma``: in-process engine
  ``generate`` (``EngineConfig(kind="inprocess")``, the job's defaults otherwise).

Each variant of HF assisted has its own copy of the draft (HF keeps the heuristic's
count in the assistant's generation config). One untimed pass over every sentence and
method first (JAX compiles, torch warms up, γ auto starts learning), then ``--rounds``
interleaved rounds: in each, every sentence is decoded by every method in turn, the
order of the methods rotated from round to round. **Timing is best-of-rounds**: for each
method and sentence the fastest round counts, and a method's tokens/s is its generated
tokens (EOS included) summed over the sentences over those fastest times summed, which
filters out load from other processes on a shared machine. Tokens per target call and
ours' α (accepted / acceptance tests, the ML α of ``theory.empirical_alpha``) are
totals over all timed rounds. "identical" counts the sentences whose output was, in
every round, token for token our target-only output (HF's ids with the decoder start
stripped, up to and including the first EOS).

Threads: XLA:CPU runs one intra-op thread per core this process may use
(``os.sched_getaffinity``), and torch gets the same count (``torch.set_num_threads``;
``--torch-threads`` to change it). float32 on both sides. Usage (BENCHMARKS.md "HF
transformers side by side" gives the command run):

    .venv/bin/python benchmarks/bench_hf_side_by_side.py [--limit 20] [--rounds 3]
        [--gamma 3] [--max-new-tokens 64] [--json runs/bench/hf_side_by_side.json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import pathlib
import platform
import time
from collections.abc import Callable

import jax
import torch
import transformers

from pipelines import model_resolver, text
from pipelines.cli import enable_compile_cache
from specdec_core import checkpoints, theory
from specdec_core.sampling import GREEDY
from workers.batching import DecodeSettings, Request
from workers.engine import EngineConfig
from workers.engines import build_engine

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = REPO / "assets" / "samples" / "en_de_debian_sample.tsv"
TARGET, DRAFT = "ende_target_debian", "ende_draft_debian_seq2"
CORES = len(os.sched_getaffinity(0))  # XLA:CPU's intra-op threads: one per usable core
HF_GREEDY, HF_CONSTANT, HF_HEURISTIC, HF_DEFAULTS = (
    "HF greedy", "HF assisted, constant", "HF assisted, heuristic", "HF assisted, defaults",
)  # fmt: skip
OURS_TARGET, OURS_AUTO = "ours target-only", "ours speculative, γ auto"
HF_ASSISTED = (HF_CONSTANT, HF_HEURISTIC, HF_DEFAULTS)


@dataclasses.dataclass(frozen=True)
class Run:
    """One method on one sentence."""

    tokens: tuple[int, ...]  # generated ids up to and including the first EOS
    seconds: float  # wall time of the whole request
    target_calls: int  # decoder steps of the target (HF: its forward calls)
    accepted: int = 0  # ours: drafted tokens accepted
    tests: float = 0.0  # ours: acceptance tests (positions after a rejection are not tested)


Method = Callable[[int, tuple[int, ...]], Run]  # (sentence index, encoder tokens) -> Run


def sentences(limit: int | None) -> list[str]:
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0] for line in lines if line.strip()][:limit]


def until_eos(tokens) -> tuple[int, ...]:
    tokens = [int(t) for t in tokens]
    return tuple(tokens[: tokens.index(text.EOS_ID) + 1] if text.EOS_ID in tokens else tokens)


# ------------------------------------------------------------------------------ ours


def our_methods(target, draft, args) -> tuple[dict[str, Method], dict]:
    """Two in-process engines (γ auto, fixed γ) -> methods, and the auto engine."""
    engines = {}
    for gamma in ("auto", args.gamma):
        config = EngineConfig(kind="inprocess", gamma=gamma)
        settings = DecodeSettings(
            gamma=config.max_gamma, sampling=GREEDY, max_new_tokens=args.max_new_tokens
        )
        engines[gamma] = build_engine(config, target=target, draft=draft, settings=settings)

    def method(generate) -> Method:
        def run(index: int, encoder_tokens: tuple[int, ...]) -> Run:
            start_id = (text.DECODER_START_ID,)
            request = Request(id=f"s{index}", prompt_tokens=start_id, encoder_tokens=encoder_tokens)
            start = time.perf_counter()
            (out,) = generate([request])
            seconds = time.perf_counter() - start
            tests = theory.position_tests(out.accepted_by_position, out.iterations)[0]
            tests = float(tests.sum()) if out.drafted else 0.0  # γ = 0: the target alone
            return Run(until_eos(out.tokens), seconds, out.iterations, out.accepted, tests)

        return run

    fixed = engines[args.gamma]
    methods = {
        OURS_TARGET: method(fixed.generate_baseline),
        OURS_AUTO: method(engines["auto"].generate),
        f"ours speculative, γ={args.gamma}": method(fixed.generate),
    }
    return methods, engines


# -------------------------------------------------------------------------------- HF


def hf_methods(target_model, draft_model, args) -> dict[str, Method]:
    """HF greedy and the three assisted variants over the exported models."""
    calls = [0]
    target_model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))

    def assistant(**generation) -> torch.nn.Module:
        model = copy.deepcopy(draft_model)
        for key, value in generation.items():
            setattr(model.generation_config, key, value)
        return model

    def method(helper) -> Method:
        def run(index: int, encoder_tokens: tuple[int, ...]) -> Run:
            del index
            ids = torch.as_tensor([encoder_tokens], dtype=torch.long)
            before = calls[0]
            start = time.perf_counter()
            with torch.inference_mode():
                out = target_model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids),
                    max_new_tokens=args.max_new_tokens, do_sample=False, num_beams=1,
                    assistant_model=helper,
                )  # fmt: skip
            seconds = time.perf_counter() - start
            return Run(until_eos(out[0, 1:].tolist()), seconds, calls[0] - before)

        return run

    no_threshold = {"assistant_confidence_threshold": 0.0}
    return {
        HF_GREEDY: method(None),
        HF_CONSTANT: method(
            assistant(
                num_assistant_tokens_schedule="constant",
                num_assistant_tokens=args.gamma,
                **no_threshold,
            )
        ),
        HF_HEURISTIC: method(assistant(num_assistant_tokens_schedule="heuristic", **no_threshold)),
        HF_DEFAULTS: method(assistant()),
    }


# ------------------------------------------------------------------------- the bench


def run_rounds(methods: dict[str, Method], inputs: list[tuple[int, ...]], rounds: int):
    """An untimed pass, then ``rounds`` interleaved rounds -> {method: [[Run per sentence]
    per round]}."""
    names = list(methods)
    for index, encoder_tokens in enumerate(inputs):  # compile / warm up
        for name in names:
            methods[name](index, encoder_tokens)
    print(f"warm-up done ({time.strftime('%H:%M:%S')})", flush=True)
    runs = {name: [[None] * len(inputs) for _ in range(rounds)] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for index, encoder_tokens in enumerate(inputs):
            for name in order:
                runs[name][r][index] = methods[name](index, encoder_tokens)
        print(f"round {r + 1}/{rounds} done ({time.strftime('%H:%M:%S')})", flush=True)
    return runs


def summarize(runs: dict) -> dict[str, dict]:
    """Per method: tokens/s (best of rounds), tokens per target call, ours' α, and
    how many sentences equal our target-only output in every round."""
    reference = [r.tokens for r in runs[OURS_TARGET][0]]
    rows = {}
    for name, rounds in runs.items():
        best = [min(rnd[i].seconds for rnd in rounds) for i in range(len(reference))]
        tokens = sum(len(r.tokens) for r in rounds[0])
        every = [r for rnd in rounds for r in rnd]
        identical = sum(
            all(rnd[i].tokens == reference[i] for rnd in rounds) for i in range(len(reference))
        )
        tests = sum(r.tests for r in every)
        rows[name] = {
            "tokens": tokens,
            "seconds": sum(best),
            "tokens_per_s": tokens / sum(best),
            "tokens_per_target_call": sum(len(r.tokens) for r in every)
            / sum(r.target_calls for r in every),
            "alpha": sum(r.accepted for r in every) / tests if tests else None,
            "identical": identical,
            "sentences": len(reference),
        }
    for name, row in rows.items():
        base = OURS_TARGET if name.startswith("ours") else HF_GREEDY
        row["speedup"] = row["tokens_per_s"] / rows[base]["tokens_per_s"]
    return rows


def goals(rows: dict) -> list[dict]:
    """Ours speculative against each HF assisted variant: the issue's two goals."""
    out = []
    for ours in (name for name in rows if name.startswith("ours speculative")):
        for hf in HF_ASSISTED:
            out.append({
                "ours": ours,
                "hf": hf,
                "ratio": rows[ours]["tokens_per_s"] / rows[hf]["tokens_per_s"],
                "gap": rows[ours]["speedup"] - rows[hf]["speedup"],
            })  # fmt: skip
    return out


def markdown(rows: dict, goal_rows: list[dict]) -> str:
    lines = [
        "| method | tokens/s (best of rounds) | speedup over its own greedy | tokens / target "
        "call | α (ML) | identical to ours target-only |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        alpha = "" if row["alpha"] is None else f"{row['alpha']:.3f}"
        lines.append(
            f"| {name} | {row['tokens_per_s']:.1f} | {row['speedup']:.3f} | "
            f"{row['tokens_per_target_call']:.3f} | {alpha} | "
            f"{row['identical']}/{row['sentences']} |"
        )
    lines += [
        "",
        "| ours | against | ours tokens/s ÷ HF's (goal ≥ 3) | our speedup − HF's (goal ≥ 0.5) |",
        "|---|---|---|---|",
    ]
    for g in goal_rows:
        lines.append(f"| {g['ours']} | {g['hf']} | {g['ratio']:.2f} | {g['gap']:+.3f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=TARGET)
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--limit", type=int, default=None, help="first N sentences (all: 50)")
    parser.add_argument("--rounds", type=int, default=3, help="timed interleaved rounds")
    parser.add_argument("--gamma", type=int, default=3, help="fixed γ (and HF constant's)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--torch-threads", type=int, default=CORES)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args()
    enable_compile_cache()  # as the jobs do; compilation is never timed anyway
    torch.set_num_threads(args.torch_threads)
    transformers.logging.set_verbosity_error()

    target = model_resolver.resolve_model(args.target, role="target")
    draft = model_resolver.resolve_model(args.draft, role="draft")
    processor = text.sentencepiece(target.vocab_path)
    inputs = [
        text.encode(processor, text.TRANSLATE_PREFIX, s, text.EOS_ID) for s in sentences(args.limit)
    ]
    methods, engines = our_methods(target.spec, draft.spec, args)
    fixed = engines[args.gamma]
    hf_target = checkpoints.hf_t5_model(fixed.target.params, fixed.target.config)
    hf_draft = checkpoints.hf_t5_model(fixed.draft.params, fixed.draft.config)
    methods = {**hf_methods(hf_target, hf_draft, args), **methods}
    load_start = os.getloadavg()[0]
    runs = run_rounds(methods, inputs, args.rounds)
    rows = summarize(runs)
    goal_rows = goals(rows)
    histogram = engines["auto"].gamma_policy.histogram()
    print(
        f"\n# HF side by side: {platform.processor() or platform.machine()}, {os.cpu_count()} "
        f"CPUs, jax {jax.__version__} ({jax.default_backend()}, {CORES} intra-op threads), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
        f"{transformers.__version__}, float32; {args.target} / {args.draft}, "
        f"{len(inputs)} sentences, batch 1, T=0, ≤ {args.max_new_tokens} new tokens, "
        f"{args.rounds} rounds; γ auto's batches by γ (warm-up included): {histogram}; "
        f"load average (1 min) {load_start:.2f} at the start, "
        f"{os.getloadavg()[0]:.2f} at the end\n"
    )
    print(markdown(rows, goal_rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}
        record.update(goals=goal_rows, gamma_histogram=histogram)
        args.json.write_text(json.dumps(record, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
