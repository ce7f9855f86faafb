"""Where a speculative iteration's time goes, against what the cost model charges it
(measured / predicted at fixed γ).

Loads the embedded Debian pair, decodes the first ``--records`` sentences of the shipped
sample at ``--batch`` rows and ``--gamma`` (greedy, the job's padding) three ways, each
once untimed and then timed:

- ``decoding.speculative_generate(compiled=True)``: the in-process engine's loop;
- the same with ``compiled=False``: the host loop, which times its draft calls, its
  target calls and the rest (acceptance, commit, the host's round trips) apart;
- ``decoding.autoregressive_generate``: the target alone.

Beside them, the cost probe's figures on the same shape (``specdec_core.costs``: the
target on 1 and γ+1 tokens, one draft step), so each part of an iteration can be set
against its charge: γ draft steps, one T(γ+1), the loop's own work.

Usage (BENCHMARKS.md gives the command run)::

    .venv/bin/python benchmarks/probe_iteration.py [--batch 1] [--gamma 3] [--records 16]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_target_loop import (  # noqa: E402  (this folder)
    debian_pair,
    greedy_decode_args,
    sample_requests,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--records", type=int, default=16)
    parser.add_argument("--draft", default="ende_draft_debian_seq2")
    args = parser.parse_args(argv)

    from specdec_core import costs, decoding
    from workers.batching import DecodeSettings, pack

    target, draft, vocab = debian_pair(args.draft)
    requests = sample_requests(vocab, args.records)
    settings = DecodeSettings(gamma=args.gamma, max_new_tokens=64, batch_size=args.batch)
    batches = [
        pack(requests[i : i + args.batch], settings) for i in range(0, len(requests), args.batch)
    ]

    def common(p):
        return greedy_decode_args(target, p)

    def speculative(p, compiled):
        rows = p.prompt_tokens.shape[0]
        return decoding.speculative_generate(
            **common(p),
            draft=draft.forward,
            draft_cache=draft.new_cache(p.encoder_tokens, rows, p.max_len),
            gamma=args.gamma,
            compiled=compiled,
        )

    runs = {
        "compiled loop": lambda p: speculative(p, True),
        "host loop": lambda p: speculative(p, False),
        "target alone": lambda p: decoding.autoregressive_generate(**common(p)),
    }
    totals = {}
    for name, run in runs.items():
        for p in batches:
            run(p)  # compiles every shape
        parts = {"total": 0.0, "draft": 0.0, "target": 0.0, "rest": 0.0, "steps": 0}
        for p in batches:
            start = time.perf_counter()
            result = run(p)
            parts["total"] += time.perf_counter() - start
            parts["steps"] += int(np.max(result.iterations))
            if name == "host loop":
                parts["draft"] += result.draft_s
                parts["target"] += result.target_s
                parts["rest"] += result.overhead_s
        totals[name] = parts

    median = batches[len(batches) // 2]
    probe = costs.step_costs(
        target,
        draft,
        median.encoder_tokens,
        ks=(1, args.gamma + 1),
        cache_len=median.max_len,
        batch=median.size,
    )
    ms = 1e3
    print(f"batch {args.batch}, gamma {args.gamma}, {len(batches)} batches, draft {args.draft}")
    print("| loop | ms per step | draft ms | target ms | rest ms |")
    print("|---|---|---|---|---|")
    for name, parts in totals.items():
        steps = parts["steps"]
        split = (
            f"{parts['draft'] / steps * ms:.2f} | {parts['target'] / steps * ms:.2f} | "
            f"{parts['rest'] / steps * ms:.2f}"
            if name == "host loop"
            else "— | — | —"
        )
        print(f"| {name} | {parts['total'] / steps * ms:.2f} | {split} |")
    print(
        f"cost probe: T(1) {probe.target_s[1] * ms:.2f} ms, T({args.gamma + 1}) "
        f"{probe.target_s[args.gamma + 1] * ms:.2f} ms, "
        f"draft step {probe.draft_step_s * ms:.3f} ms; "
        f"charged per iteration without the loop's work: "
        f"{(args.gamma * probe.draft_step_s + probe.target_s[args.gamma + 1]) * ms:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
