"""What drafts of one target can reach on this machine: α against the draft's
size and training, c against its size, and the cost model's best speedup along both
curves, extrapolated past the drafts there are.

For each draft, on the sentences of a TSV file (``english<TAB>german``; by default
`make run`'s 50 held-out test sentences):

- **α** at T=0 and T=1: E[β] along the target's own trajectories, with a bootstrap
  95% interval over sentences (the acceptance study's measurement, as in
  ``bench_ende_speedup.py``);
- **c**: one draft step over one target step at k=1, each timed inside a compiled
  loop of calls on a decode-sized cache at batch 1 (``specdec_core.costs``), with the
  target's k-token calls for k = 1..γ_max+1, the loops' own work per token and per
  iteration (timed on a model that costs nothing) and each model's encoder and prefill
  per request (shared over the target's mean decode steps per sentence) in the same
  costs;
- **the cost model's best speedup** at that α and those costs (``theory``), its γ, and
  the α that the goal needs at the draft's own costs (``--goals``: 1.5× at T=0 and 1.3×
  at T=1, the bars set for `make run`).

Then the **extrapolation**. The drafts named by ``--fit`` (trained the same way, at
different sizes) give α = a + b·log2(parameters) per temperature. Every model draft
and the target itself (timed as if it were a draft) give log c = a' + b'·log
(parameters); a fitted draft's per-request work is the target's times its c. Along
both fitted lines the script reports the size at which α reaches
the goal's α, c at that size, and the best predicted speedup over all sizes from 0.5M
parameters up to the target's. These are extrapolations of two to five points, and
the output says so.

Usage (BENCHMARKS.md, "Acceptance per draft", gives each run's command):

    .venv/bin/python benchmarks/bench_draft_frontier.py [--input TSV] \
        [--target ende_target_debian] [--drafts A,B,...] [--fit A,B] [--gammas 1,2,3,4] \
        [--max-new-tokens 96] [--json runs/bench/draft_frontier.json]
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np
from bench_ende_speedup import (
    alpha_needed,
    alpha_per_draft,
    decode_cache_len,
    fixed_cost,
    loop_overheads,
    write_report,
)

from pipelines import configs, model_resolver, text
from specdec_core import costs, theory
from workers.batching import DecodeSettings, Request

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_INPUT = "assets/samples/en_de_debian_sample.tsv"
# make run's draft and the two sizes that configs/recipes/debian_pair.yaml distils
# (`make models-device` writes their exports; they are not shipped)
DEFAULT_DRAFTS = "ende_draft_debian_seq2,ende_draft_debian,ende_draft_debian_base"
GOALS = {0.0: 1.5, 1.0: 1.3}  # the speedups make run aims at, at T=0 and at T=1


def read_sentences(path: str) -> list[tuple[str, str]]:
    """``english<TAB>german`` lines (blank lines skipped); a clear error for any other."""
    pairs = []
    for number, line in enumerate((REPO / path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2 or not all(f.strip() for f in fields):
            raise SystemExit(f"{path}:{number}: expected 'english<TAB>german', got {line!r}")
        pairs.append((fields[0], fields[1]))
    if not pairs:
        raise SystemExit(f"{path}: no sentence pairs")
    return pairs


def line_fit(x, y) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points."""
    slope, intercept = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return float(intercept), float(slope)


def best_over_gammas(
    alpha: float, step_costs: theory.StepCosts, tokens_per_request: float
) -> tuple[float, int]:
    """(the best predicted speedup over the timed γ, that γ) at ``alpha``."""
    alpha = min(max(alpha, 0.0), 1.0)
    gamma = theory.best_gamma(alpha, step_costs, tokens_per_request)
    return theory.predicted_speedup(alpha, gamma, step_costs, tokens_per_request), gamma


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", default=DEFAULT_INPUT)
    parser.add_argument("--target", default="ende_target_debian")
    parser.add_argument("--drafts", default=DEFAULT_DRAFTS)
    parser.add_argument(
        "--fit",
        default="ende_draft_debian,ende_draft_debian_base",
        help="drafts trained alike at different sizes: the α-against-size line "
        '("": no extrapolation, the measured drafts only)',
    )
    parser.add_argument("--gammas", default="1,2,3,4")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="runs/bench/draft_frontier.json")
    args = parser.parse_args()

    names = [n for n in args.drafts.split(",") if n]
    fit_names = [n for n in args.fit.split(",") if n]
    if missing := [n for n in fit_names if n not in names]:
        raise SystemExit(f"--fit names drafts that --drafts does not: {', '.join(missing)}")
    if len(fit_names) == 1:
        raise SystemExit("--fit needs at least two drafts (a line through one point is no fit)")
    gammas = sorted({int(g) for g in args.gammas.split(",")})
    target_resolved = model_resolver.resolve_model(args.target, role="target")
    target = target_resolved.spec.load()
    drafts = [model_resolver.resolve_model(n, role="draft").spec.load() for n in names]
    processor = text.sentencepiece(target_resolved.vocab_path)
    sentences = read_sentences(args.input)
    encoded = [text.encode(processor, text.TRANSLATE_PREFIX, en) for en, _ in sentences]
    # a model's own parameters (a draft that reads the target's encoder: not the encoder)
    params = {m.name: configs.param_count(m.config) for m in (*drafts, target)}
    print(
        f"target {target.name} {params[target.name] / 1e6:.2f}M; {len(sentences)} sentences "
        f"of {args.input}; batch 1; up to {args.max_new_tokens} new tokens",
        flush=True,
    )

    alphas, steps = {}, {}
    for t in GOALS:
        alphas[t], _, lengths = alpha_per_draft(
            target,
            drafts,
            encoded,
            temperature=t,
            max_new=args.max_new_tokens,
            seed=args.seed,
        )
        # the target's decode steps per sentence: what its per-request costs are shared over
        steps[t] = float(np.mean(lengths))
    # one sentence of median length, as the job's cost probe picks it: every cost below
    median = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))[len(encoded) // 2]
    encoder = np.asarray([encoded[median]], np.int32)
    cache_len = decode_cache_len(args.max_new_tokens, max(gammas))
    timed = dict(cache_len=cache_len, in_loop=True)
    timers = {k: costs.call_timer(target, encoder, k=k, **timed) for k in range(1, max(gammas) + 2)}
    timers |= {d.name: costs.call_timer(d, encoder, k=1, **timed) for d in drafts}
    seconds = costs.interleaved_seconds(timers)
    target_s = {k: seconds[k] for k in range(1, max(gammas) + 2)}
    # the target's own step, timed as a draft's: the top end of the c-against-size line
    step_s = {d.name: seconds[d.name] for d in drafts} | {target.name: target_s[1]}
    overheads = {
        t: loop_overheads(target.vocab_size, gammas, batch=1, temperature=t) for t in GOALS
    }
    # each model's encoder and prefill per request (batch 1, as the engine packs it)
    request = Request(
        id="median", prompt_tokens=(text.DECODER_START_ID,), encoder_tokens=encoded[median]
    )
    settings = DecodeSettings(gamma=max(gammas), max_new_tokens=args.max_new_tokens)
    fixed_s = {m.name: fixed_cost(m, [request], settings) for m in (target, *drafts)}

    def step_costs(draft_step_s: float, draft_fixed_s: float, t: float) -> theory.StepCosts:
        per_token, per_iteration = overheads[t]
        return theory.StepCosts(
            target_s=target_s,
            draft_step_s=draft_step_s,
            overhead_s=per_iteration,
            baseline_overhead_s=per_token,
            target_fixed_s=fixed_s[target.name],
            draft_fixed_s=draft_fixed_s,
        )

    report: dict = {
        "input": args.input,
        "sentences": len(sentences),
        "target": target.name,
        "params": params,
        "target_ms": {k: 1e3 * v for k, v in target_s.items()},
        "step_ms": {n: 1e3 * v for n, v in step_s.items()},
        "fixed_ms": {n: 1e3 * v for n, v in fixed_s.items()},
        "target_steps_per_sentence": steps,
        "loop_ms": {
            t: {"per_token": 1e3 * o[0], "per_iteration": {g: 1e3 * v for g, v in o[1].items()}}
            for t, o in overheads.items()
        },
        "drafts": {},
    }
    print(
        "\n| draft | parameters | c | T | α [95% CI] | best predicted (γ) | α the goal needs (γ) |"
    )
    print("|---|---|---|---|---|---|---|")
    for i, draft in enumerate(drafts):
        entry = report["drafts"][draft.name] = {
            "params": params[draft.name],
            "c": step_s[draft.name] / target_s[1],
            "by_t": {},
        }
        for t, goal in GOALS.items():
            alpha, low, high = alphas[t][i]
            cost = step_costs(step_s[draft.name], fixed_s[draft.name], t)
            best, gamma = best_over_gammas(alpha, cost, steps[t])
            need = alpha_needed(cost, goal, steps[t])
            entry["by_t"][t] = {
                "alpha": alpha,
                "alpha_ci": [low, high],
                "best_predicted": best,
                "best_gamma": gamma,
                "goal": goal,
                "alpha_needed": need,
            }
            needs = f"{need[0]:.3f} (γ={need[1]})" if need else "none reaches it"
            print(
                f"| {draft.name} | {params[draft.name] / 1e6:.2f}M | {cost.c:.3f} | {t:g} | "
                f"{alpha:.3f} [{low:.3f}, {high:.3f}] | {best:.3f} (γ={gamma}) | "
                f"{goal}×: {needs} |"
            )

    if not fit_names:  # --fit "": the measured drafts only
        write_report(REPO / args.json, report)
        return
    # the extrapolation
    sizes = np.log([params[n] for n in step_s])
    c_line = line_fit(sizes, np.log([step_s[n] / target_s[1] for n in step_s]))
    report["c_fit"] = {"log_c_intercept": c_line[0], "log_c_slope": c_line[1], "points": len(sizes)}

    def c_at(n_params: float) -> float:
        return float(np.exp(c_line[0] + c_line[1] * np.log(n_params)))

    def sized(n_params: float, t: float) -> theory.StepCosts:
        """A draft of ``n_params`` on the fitted line: its step and its per-request work
        scale with the target's by c (parameters)."""
        c = c_at(n_params)
        return step_costs(c * target_s[1], c * fixed_s[target.name], t)

    print(
        f"\nc against size (log-log fit over {len(sizes)} points, the target's own step "
        f"included): c ∝ parameters^{c_line[1]:.2f}"
    )
    report["extrapolation"] = {}
    grid = np.geomspace(5e5, params[target.name], 200)
    for t, goal in GOALS.items():
        points = [(params[n], alphas[t][names.index(n)][0]) for n in fit_names]
        a_line = line_fit(np.log2([p for p, _ in points]), [a for _, a in points])

        def alpha_at(n_params: float, line=a_line) -> float:
            return min(max(line[0] + line[1] * np.log2(n_params), 0.0), 1.0)

        along = [(n, *best_over_gammas(alpha_at(n), sized(n, t), steps[t])) for n in grid]
        top = max(along, key=lambda x: x[1])
        # the α the goal needs at the costs of the smallest fitted draft, and the size the
        # α line gives it (None where no α reaches the goal at those costs)
        smallest = min(fit_names, key=params.get)
        need = alpha_needed(step_costs(step_s[smallest], fixed_s[smallest], t), goal, steps[t])
        size_for_need = (
            float(2 ** ((need[0] - a_line[0]) / a_line[1])) if need and a_line[1] > 0 else None
        )
        report["extrapolation"][t] = {
            "alpha_per_doubling": a_line[1],
            "alpha_fit_points": points,
            "best_predicted_along_fit": top[1],
            "at_params": top[0],
            "at_gamma": top[2],
            "alpha_there": alpha_at(top[0]),
            "c_there": c_at(top[0]),
            "goal": goal,
            "alpha_needed_at_smallest_costs": need,
            "params_for_that_alpha": size_for_need,
            "c_at_that_size": c_at(size_for_need) if size_for_need else None,
        }
        print(
            f"T={t:g}: α rises {a_line[1]:+.3f} per doubling of the draft "
            f"({', '.join(f'{p / 1e6:.1f}M: {a:.3f}' for p, a in points)}); along the fitted "
            f"α and c the best predicted speedup is {top[1]:.3f}× (γ={top[2]}, a "
            f"{top[0] / 1e6:.1f}M draft: α {alpha_at(top[0]):.3f}, c {c_at(top[0]):.3f}); "
            f"goal {goal}×"
        )
        if need and size_for_need:
            print(
                f"  at {smallest}'s c the goal needs α {need[0]:.3f}; the α line reaches "
                f"it at {size_for_need / 1e6:.1f}M parameters, where c would be "
                f"{c_at(size_for_need):.3f}"
            )
        else:
            print(f"  at {smallest}'s costs no α reaches {goal}× for γ ≤ {max(gammas)}")
    print(
        "(extrapolations of a line through the --fit drafts and a log-log line through "
        "every model's step: a reading of the measured points, not a measurement)"
    )
    write_report(REPO / args.json, report)


if __name__ == "__main__":
    main()
