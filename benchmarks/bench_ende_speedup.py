"""The embedded En→De pair: α, c, best γ and in-process speedups, with the
cost model's prediction beside every measured figure (the paper's Table 2 in miniature).

For the target and each draft, on the first N full sentences of the Ding test split
(`translate English to German: {en}` + EOS; ``--split``: the bars are measured on test,
train is a diagnostic):

- **BLEU** (sacrebleu) of the target's greedy translations, with samples;
- **α** at T=0 and T=1: E[β] along the target's own trajectories (β = Σ min(p, q) at
  every generated position; a bootstrap CI over sentences), the study's measurement;
- **the target's confidence**: its own (T=1) largest next-token probability, averaged
  along the same trajectories — how sure it is of the choices a draft must match;
- **costs**: one target call on k = 1..γ+1 tokens and one draft step, timed on a real
  prefilled cache of the decode's size (the engine's packing: 96 slots for 48 new
  tokens) at batch 1 and 8, as the measured loop makes them (compiled loop: inside one
  jitted loop of calls, no per-call dispatch; host loop: one jitted call from the
  host); c = draft step / target step at k=1;
- **loop work**: the loops' own per-step cost (sampling over V, the acceptance rule,
  commit) timed on a free model with the real vocabulary — per token of the
  target-only loop and per iteration of the speculative loop at each γ — and each
  model's per-request cost (encoder + prefill);
- **predicted speedup** for each γ from α and those costs
  (``specdec_core.theory.predicted_speedup``: γ draft steps + one target call on γ+1
  tokens + the loop work per iteration, E[tokens] = (1 − α^(γ+1))/(1 − α), against the
  target call + its loop work per token, with the per-request costs shared over the
  target's measured decode steps per request), and the best γ;
- **measured speedup**: tokens/s of in-process speculative decoding over tokens/s of
  the same target decoding alone, on the same sentences in the same run, passes
  interleaved round by round (median over rounds), at batch 1 for every γ and at
  batch 8 for each draft's best measured γ. The speculative loop is compiled into one
  call by default, as the target-only loop is (``--loop host``: one host round trip per
  iteration, the loop the Ray coordinator drives).

Usage (each run's command is in BENCHMARKS.md's git history):

    .venv/bin/python benchmarks/bench_ende_speedup.py [--sentences 24] [--rounds 2]
        [--split test|validation|train] [--target ende_target_debian]
        [--drafts ende_draft_debian_seq2]
        [--gammas 1,2,3,5] [--loop compiled|host] [--json runs/bench/ende_speedup.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import time

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from pipelines import model_resolver, study, text
from pipelines.data import ding
from specdec_core import costs, decoding, theory
from specdec_core.sampling import SamplingConfig
from workers.batching import DecodeSettings, Request, pack
from workers.engine import InProcessEngine

REPO = pathlib.Path(__file__).resolve().parents[1]
PREFIX, EOS = text.TRANSLATE_PREFIX, text.EOS_ID  # the ding_ende task's preprocessing
TEMPERATURES = (0.0, 1.0)


def full_sentences(count: int, split: str = "test") -> list[tuple[str, str]]:
    """The first ``count`` full-sentence pairs of a split (``ding.is_sentence_pair``).

    The bars are measured on ``test``; ``train`` is a diagnostic (BENCHMARKS.md's history: the
    same pair on sentences the target was trained on: BLEU 14 there, 4.5 on test)."""
    pairs = ding.read_split(ding.DEFAULT_DATA_DIR, split)
    return [tuple(pair) for pair in pairs if ding.is_sentence_pair(pair)][:count]


def load(name: str, role: str):
    resolved = model_resolver.resolve_model(name, role=role)
    return resolved.spec.load(), resolved


def encode(processor, sentences) -> list[tuple[int, ...]]:
    return [text.encode(processor, PREFIX, en) for en, _ in sentences]


def padded(encoded) -> np.ndarray:
    width = text.padded_length(max(map(len, encoded)))
    out = np.zeros((len(encoded), width), np.int32)
    for row, ids in enumerate(encoded):
        out[row, : len(ids)] = ids
    return out


def alpha_per_draft(
    target,
    drafts,
    encoded,
    *,
    temperature,
    max_new,
    seed,
    batch=8,
):
    """([(α, low, high)] per draft, (top, low, high), [positions per trajectory]).

    β along the target's trajectories (study functions), the target's own mean largest
    next-token probability (T=1) along the same trajectories — how sure it is of the
    choices the drafts must match — and each trajectory's generated positions."""
    sampling = SamplingConfig(temperature=temperature)
    settings = study.MeasureSettings(
        sampling=sampling,
        gammas=(),
        max_new_tokens=max_new,
        seed=seed,
        eos_id=EOS,
        measure_cost=False,
    )
    sums = [[] for _ in drafts]
    counts = [[] for _ in drafts]
    top_sums, top_counts = [], []
    for start in range(0, len(encoded), batch):
        rows = encoded[start : start + batch]
        real = np.arange(batch) < len(rows)
        rows = rows + [rows[0]] * (batch - len(rows))
        prompt_batch = study.PromptBatch(
            ids=np.arange(start, start + batch),
            prompt_tokens=np.zeros((batch, 1), np.int32),
            encoder_tokens=padded(rows),
            max_new=np.where(real, max_new, 0).astype(np.int32),
            real=real,
        )
        tokens, lengths = study.target_trajectories(target, prompt_batch, settings)
        betas = study.betas_along(target, drafts, prompt_batch, tokens, lengths, settings)
        top = study.top_probability_along(target, prompt_batch, tokens, lengths)[real]
        top_sums += np.nansum(top, 1).tolist()
        top_counts += np.isfinite(top).sum(1).tolist()
        for i, beta in enumerate(betas):
            beta = beta[real]
            sums[i] += np.nansum(beta, 1).tolist()
            counts[i] += np.isfinite(beta).sum(1).tolist()
    ci = functools.partial(study.ratio_with_ci, confidence=0.95, resamples=1000, seed=seed)
    alphas = [ci(s, c) for s, c in zip(sums, counts, strict=True)]
    return alphas, ci(top_sums, top_counts), top_counts


def decode_cache_len(max_new: int, gamma: int) -> int:
    """Decoder cache slots of a decode as the engine packs it (prompt bucket included)."""
    request = Request(id="x", prompt_tokens=(text.DECODER_START_ID,), encoder_tokens=(EOS,))
    return pack([request], DecodeSettings(gamma=gamma, max_new_tokens=max_new)).max_len


@flax.struct.dataclass
class _FreeCache:
    lengths: jax.Array  # [B] int32, the model contract's one required field


def free_model(vocab_size: int, eos_id: int):
    """A model that costs (almost) nothing: uniform logits over the real vocabulary with
    EOS ruled out, so a decode runs to its budget and its time is the loop's own work
    (sampling over V, the acceptance rule, commit, rollback, the loop)."""
    base = jnp.zeros((vocab_size,), jnp.float32).at[eos_id].set(-1e9)

    def forward(cache, tokens):
        # + 0·tokens keeps the logits a function of the input, as a real model's are.
        logits = base + 0.0 * tokens[..., None].astype(jnp.float32)
        return logits, cache.replace(lengths=cache.lengths + tokens.shape[1])

    def new_cache(batch):
        return _FreeCache(lengths=jnp.zeros((batch,), jnp.int32))

    return forward, new_cache


def loop_overheads(
    vocab_size: int, gammas, *, batch: int, temperature: float, short=8, long=48, repeats=5
) -> tuple[float, dict[int, float]]:
    """The loops' own work, measured on :func:`free_model`: seconds per token of the
    target-only loop and per iteration of the compiled speculative loop at each γ.

    Two budgets (``short``, ``long`` tokens) and the difference of their median wall
    times over the difference of tokens (iterations) cancel the per-request costs.
    """
    forward, new_cache = free_model(vocab_size, EOS)
    sampling = SamplingConfig(temperature=temperature)
    prompt = np.zeros((batch, 1), np.int32)
    common = dict(
        prompt_tokens=prompt,
        prompt_lengths=np.ones((batch,), np.int32),
        request_ids=np.arange(batch),
        sampling_config=sampling,
        eos_id=EOS,
    )

    def baseline(n):
        return decoding.autoregressive_generate(
            target=forward, target_cache=new_cache(batch), max_new_tokens=n, **common
        )

    def speculative(gamma):
        def run(n):
            return decoding.speculative_generate(
                target=forward,
                target_cache=new_cache(batch),
                draft=forward,
                draft_cache=new_cache(batch),
                max_new_tokens=n,
                gamma=gamma,
                compiled=True,
                **common,
            )

        return run

    def per_unit(run, unit):
        timed = {}
        for n in (short, long):
            run(n)  # compile
            results = [run(n) for _ in range(repeats)]
            timed[n] = (float(np.median([r.total_s for r in results])), unit(results[0]))
        (t_short, u_short), (t_long, u_long) = timed[short], timed[long]
        # Clamped at 0: a loop whose work is below the timer's noise costs nothing.
        return max((t_long - t_short) / max(u_long - u_short, 1), 0.0)

    per_token = per_unit(baseline, lambda r: int(r.lengths.max()))
    per_iteration = {g: per_unit(speculative(g), lambda r: int(r.iterations.max())) for g in gammas}
    return per_token, per_iteration


def fixed_cost(model, requests, settings: DecodeSettings) -> float:
    """Per-request seconds of one model before decoding: the encoder (a new cache) and
    the prompt's prefill, on the first ``settings.batch_size`` requests packed as the
    engine packs them."""
    packed = pack(requests[: settings.batch_size], settings)
    rows = packed.prompt_tokens.shape[0]
    prefill = decoding.prefill_fn(model.forward)
    return costs.median_seconds(
        lambda: prefill(
            model.new_cache(packed.encoder_tokens, rows, packed.max_len),
            packed.prompt_tokens,
            packed.prompt_lengths,
        )
    )


def alpha_needed(
    costs: theory.StepCosts, speedup: float, tokens_per_request: float | None = None
) -> tuple[float, int] | None:
    """The smallest α (and its γ) whose predicted speedup at the best measured γ reaches
    ``speedup``; None if even α = 1 does not (the costs alone rule it out)."""

    def best(alpha):
        gamma = theory.best_gamma(alpha, costs, tokens_per_request)
        return theory.predicted_speedup(alpha, gamma, costs, tokens_per_request), gamma

    if best(1.0)[0] < speedup:
        return None
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        if best(mid)[0] >= speedup:
            high = mid
        else:
            low = mid
    return high, best(high)[1]


def write_report(path: pathlib.Path, report: dict) -> None:
    """The run's figures as JSON (floats from numpy included), its path printed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=float) + "\n")
    print(f"\nwrote {path}")


def steps_per_batch(outputs, batch: int) -> float:
    """Mean decode steps of the target alone per batch of ``batch`` requests: its longest
    row's tokens (the loop runs until every row is done)."""
    lengths = [len(g.tokens) for g in outputs]
    return float(np.mean([max(lengths[i : i + batch]) for i in range(0, len(lengths), batch)]))


def passes(engines: dict, requests, batch: int, rounds: int) -> dict:
    """tokens/s per engine key, per round (passes interleaved), and the last outputs."""

    def one(engine, baseline):
        out = []
        for i in range(0, len(requests), batch):
            chunk = requests[i : i + batch]
            out += engine.generate_baseline(chunk) if baseline else engine.generate(chunk)
        return out

    for (_, baseline), engine in engines.items():
        one(engine, baseline)  # compile every shape
    rates = {key: [] for key in engines}
    outputs = {}
    for _ in range(rounds):
        for key, engine in engines.items():
            start = time.perf_counter()
            outputs[key] = one(engine, key[1])
            rates[key].append(
                sum(len(g.tokens) for g in outputs[key]) / (time.perf_counter() - start)
            )
    return {"rates": rates, "outputs": outputs}


def measure(
    target, draft, requests, *, temperature, gammas, batch, rounds, max_new, seed, compiled
):
    """{γ: (median speedup, per-round speedups, tokens/iteration)} and baseline outputs."""
    sampling = SamplingConfig(temperature=temperature)
    engines = {}
    for gamma in (*gammas, None):
        settings = DecodeSettings(
            gamma=gamma or 1,
            sampling=sampling,
            seed=seed,
            max_new_tokens=max_new,
            batch_size=batch,
        )
        engines[gamma, gamma is None] = InProcessEngine(target, draft, settings, compiled=compiled)
    result = passes(engines, requests, batch, rounds)
    base = result["rates"][None, True]
    out = {}
    for gamma in gammas:
        ratios = [s / b for s, b in zip(result["rates"][gamma, False], base, strict=True)]
        gens = result["outputs"][gamma, False]
        iterations = sum(g.iterations for g in gens)
        out[gamma] = {
            "speedup": float(np.median(ratios)),
            "rounds": ratios,
            "tokens_per_iteration": sum(len(g.tokens) for g in gens) / max(iterations, 1),
            "identical_to_baseline": [g.tokens for g in gens]
            == [g.tokens for g in result["outputs"][None, True]],
        }
    return out, result["outputs"][None, True], float(np.median(base))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=24)
    parser.add_argument(
        "--split",
        choices=ding.SPLITS,
        default="test",
        help="Ding split the sentences come from (the bars: test; train is a diagnostic)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--target", default="ende_target_debian")
    parser.add_argument("--drafts", default="ende_draft_debian_seq2")
    parser.add_argument("--gammas", default="1,2,3,5")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loop", choices=("compiled", "host"), default="compiled")
    parser.add_argument("--json", default="runs/bench/ende_speedup.json")
    args = parser.parse_args()
    import sacrebleu

    gammas = tuple(int(g) for g in args.gammas.split(","))
    target, target_resolved = load(args.target, "target")
    processor = text.sentencepiece(str(target_resolved.vocab_path or model_resolver.DEFAULT_VOCAB))
    sentences = full_sentences(args.sentences, args.split)
    encoded = encode(processor, sentences)
    requests = [
        Request(id=f"{args.split}-{i}", prompt_tokens=(text.DECODER_START_ID,), encoder_tokens=ids)
        for i, ids in enumerate(encoded)
    ]
    drafts = [load(name, "draft")[0] for name in args.drafts.split(",")]
    print(
        f"target {target.name} {target.param_count() / 1e6:.2f}M "
        f"({target_resolved.spec.checkpoint}); drafts "
        + ", ".join(f"{d.name} {d.param_count() / 1e6:.2f}M" for d in drafts)
        + f"; {len(sentences)} {args.split} sentences, batch 1 unless noted, {args.rounds} rounds, "
        f"{args.loop} loop"
    )
    report: dict = {
        "sentences": len(sentences),
        "split": args.split,
        "target": target.name,
        "loop": args.loop,
        "drafts": {},
    }

    alphas, confidence = {}, {}
    for t in TEMPERATURES:
        alphas[t], confidence[t], _ = alpha_per_draft(
            target,
            drafts,
            encoded,
            temperature=t,
            max_new=args.max_new_tokens,
            seed=args.seed,
        )
        top, low, high = confidence[t]
        print(
            f"target's mean top-1 probability along its T={t:g} trajectories: "
            f"{top:.3f} [{low:.3f}, {high:.3f}]",
            flush=True,
        )
    report["target_top_probability"] = {t: list(confidence[t]) for t in TEMPERATURES}
    in_loop = args.loop == "compiled"  # time calls as the measured loop makes them
    max_k = max(*gammas, 8) + 1
    cache_len = decode_cache_len(args.max_new_tokens, max(gammas))

    def encoder(b):  # the sentences repeated to b rows
        return padded((encoded * b)[:b])

    measured = {
        b: costs.step_costs(
            target,
            drafts[0],
            encoder(b),
            ks=range(1, max_k + 1),
            cache_len=cache_len,
            in_loop=in_loop,
        )
        for b in (1, 8)
    }
    draft_costs = {
        (d.name, b): costs.call_seconds(d, encoder(b), k=1, cache_len=cache_len, in_loop=in_loop)
        for d in drafts
        for b in (1, 8)
    }
    fixed = {
        (m.name, b): fixed_cost(
            m,
            requests,
            DecodeSettings(gamma=max(gammas), max_new_tokens=args.max_new_tokens, batch_size=b),
        )
        for m in (target, *drafts)
        for b in (1, 8)
    }
    # The loops' own work (compiled loop only: the host loop's split is measured by the
    # loop itself), per temperature and batch, on the free model.
    overheads = {
        (t, b): loop_overheads(target.vocab_size, gammas, batch=b, temperature=t)
        if in_loop
        else (0.0, dict.fromkeys(gammas, 0.0))
        for t in TEMPERATURES
        for b in (1, 8)
    }

    def full_costs(draft, t, b) -> theory.StepCosts:
        base_overhead, iteration_overhead = overheads[t, b]
        return theory.StepCosts(
            target_s=measured[b].target_s,
            draft_step_s=draft_costs[draft.name, b],
            overhead_s=iteration_overhead,
            baseline_overhead_s=base_overhead,
            target_fixed_s=fixed[target.name, b],
            draft_fixed_s=fixed[draft.name, b],
        )

    rows = []
    baseline_out = None
    for i, draft in enumerate(drafts):
        entry = report["drafts"][draft.name] = {"params": draft.param_count(), "by_t": {}}
        for t in TEMPERATURES:
            alpha, low, high = alphas[t][i]
            alpha_c = min(max(alpha, 0.0), 1.0)
            cost = {b: full_costs(draft, t, b) for b in (1, 8)}
            measured, base_out, base_tps = measure(
                target,
                draft,
                requests,
                temperature=t,
                gammas=gammas,
                batch=1,
                rounds=args.rounds,
                max_new=args.max_new_tokens,
                seed=args.seed,
                compiled=args.loop == "compiled",
            )
            if t == 0.0 and baseline_out is None:
                baseline_out = base_out
            best_measured = max(gammas, key=lambda g: measured[g]["speedup"])
            batch8, base8_out, base8 = measure(
                target,
                draft,
                requests,
                temperature=t,
                gammas=(best_measured,),
                batch=8,
                rounds=args.rounds,
                max_new=args.max_new_tokens,
                seed=args.seed,
                compiled=args.loop == "compiled",
            )
            # Decode steps per request (batch 1) and per batch of 8 (its longest row) of the
            # target alone: how many per-token costs the per-request costs share with.
            steps = {1: steps_per_batch(base_out, 1), 8: steps_per_batch(base8_out, 8)}
            cell = {
                "alpha": alpha,
                "steps_per_request": steps,
                "loop_overhead_ms": {
                    "baseline_per_token": {b: 1e3 * cost[b].baseline_overhead_s for b in (1, 8)},
                    "per_iteration": {
                        b: {g: 1e3 * v for g, v in cost[b].overhead_s.items()} for b in (1, 8)
                    },
                },
                "fixed_ms": {
                    b: {
                        "target": 1e3 * cost[b].target_fixed_s,
                        "draft": 1e3 * cost[b].draft_fixed_s,
                    }
                    for b in (1, 8)
                },
                "alpha_ci": [low, high],
                "c": cost[1].c,
                "best_gamma_predicted": theory.best_gamma(alpha_c, cost[1], steps[1]),
                "best_gamma_measured": best_measured,
                "baseline_tokens_per_s": base_tps,
                "by_gamma": {
                    g: {
                        **measured[g],
                        "predicted": theory.predicted_speedup(alpha_c, g, cost[1], steps[1]),
                        "predicted_steps_only": theory.predicted_speedup(alpha_c, g, cost[1]),
                        "predicted_tokens_per_iteration": theory.expected_tokens(alpha_c, g),
                    }
                    for g in gammas
                },
                "batch8": {
                    "gamma": best_measured,
                    **batch8[best_measured],
                    "predicted": theory.predicted_speedup(
                        alpha_c, best_measured, cost[8], steps[8]
                    ),
                    "baseline_tokens_per_s": base8,
                },
            }
            entry["by_t"][t] = cell
            for g in gammas:
                m = cell["by_gamma"][g]
                rows.append(
                    f"| {draft.name} | {t:g} | {alpha:.3f} [{low:.3f}, {high:.3f}] | "
                    f"{cost[1].c:.3f} | 1 | {g} | {m['predicted_tokens_per_iteration']:.2f} / "
                    f"{m['tokens_per_iteration']:.2f} | {m['predicted']:.2f} | "
                    f"**{m['speedup']:.2f}** ({', '.join(f'{r:.2f}' for r in m['rounds'])}) | "
                    f"{m['identical_to_baseline'] if t == 0 else '—'} |"
                )
            b8 = cell["batch8"]
            rows.append(
                f"| {draft.name} | {t:g} | | {cost[8].c:.3f} | 8 | {best_measured} | — / "
                f"{b8['tokens_per_iteration']:.2f} | {b8['predicted']:.2f} | "
                f"**{b8['speedup']:.2f}** ({', '.join(f'{r:.2f}' for r in b8['rounds'])}) | "
                f"{b8['identical_to_baseline'] if t == 0 else '—'} |"
            )
            print(
                f"  {draft.name} T={t:g}: α {alpha:.3f}, c {cost[1].c:.3f}, best γ predicted "
                f"{cell['best_gamma_predicted']} / measured {best_measured}",
                flush=True,
            )
    hypotheses = [processor.decode([x for x in g.tokens if x != EOS]) for g in baseline_out]
    bleu = sacrebleu.corpus_bleu(hypotheses, [[de for _, de in sentences]]).score
    report["bleu"] = bleu
    report["costs_ms"] = {
        b: {"target_k": {k: 1e3 * v for k, v in measured[b].target_s.items()}} for b in (1, 8)
    }
    report["draft_step_ms"] = {f"{n}@{b}": 1e3 * v for (n, b), v in draft_costs.items()}
    print(f"\ntarget BLEU (greedy, {len(sentences)} {args.split} sentences): {bleu:.2f}")
    for (en, de), hyp in list(zip(sentences, hypotheses, strict=True))[:3]:
        print(f"  EN  {en}\n  REF {de}\n  OUT {hyp}")
    for b in (1, 8):
        ks = ", ".join(f"k={k} {1e3 * v:.2f}" for k, v in measured[b].target_s.items())
        print(f"target call ms at batch {b}: {ks}")
    print(
        "draft step ms: "
        + ", ".join(f"{n} b{b} {1e3 * v:.2f}" for (n, b), v in draft_costs.items())
    )
    report["alpha_needed"] = {}
    for draft in drafts:
        for t in TEMPERATURES:
            cell = report["drafts"][draft.name]["by_t"][t]
            for b in (1, 8):
                cost, steps = full_costs(draft, t, b), cell["steps_per_request"][b]
                for goal in (2.0, 1.6):
                    need = alpha_needed(cost, goal, steps)
                    report["alpha_needed"][f"{draft.name}@{b}:T={t:g}:{goal}"] = need
                    needs = (
                        f"α ≥ {need[0]:.3f} (γ={need[1]})"
                        if need
                        else f"unreachable for γ ≤ {max(gammas)} even at α = 1"
                    )
                    print(f"cost model, {draft.name}, T={t:g}, batch {b}: {goal}x needs {needs}")
    for (t, b), (per_token, per_iteration) in overheads.items():
        its = ", ".join(f"γ={g} {1e3 * v:.2f}" for g, v in per_iteration.items())
        print(f"loop work ms, T={t:g} batch {b}: target-only {1e3 * per_token:.2f}/token; {its}")
    print(
        "per-request ms (encoder + prefill): "
        + ", ".join(f"{n} b{b} {1e3 * v:.1f}" for (n, b), v in fixed.items())
    )
    print(
        "\n| draft | T | α [95% CI] | c | batch | γ | tokens/iteration predicted / measured "
        "| predicted speedup | measured speedup (median; rounds) | identical to target |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    write_report(REPO / args.json, report)


if __name__ == "__main__":
    main()
