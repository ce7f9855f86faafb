"""A row's logits as the same bits whatever the call around it, and what that costs:
the default target's call time on k tokens (batch 1 and 4) and whether a row's logits
are the same bits fed 1, 2, 4, 8 or 16 tokens per call, and beside 2, 3 or 15 other
rows: copies of its own sentence (one padded source width), or other sentences (the
source padded to the longest), for this checkout and, with ``--against REV``, for
another revision of the code.

Each checkout runs in its own processes (its own code, this interpreter's packages), in
interleaved rounds: round 1 runs every checkout once, then round 2, and so on. A figure
is the median over rounds of the medians inside a process
(``specdec_core.costs.interleaved_seconds``).

Usage (BENCHMARKS.md, "Same bits for every call" gives the command run)::

    .venv/bin/python benchmarks/bench_row_invariance.py [--rounds 3] [--against REV]
        [--json runs/bench/row_invariance.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
from bench_startup import worktree  # (this folder)

REPO = pathlib.Path(__file__).resolve().parents[1]
KS = (1, 2, 4, 8, 16)
BATCHES = (1, 4)
SENTENCES = (
    "This package installs a shared library for the new program.",
    "Hello world.",
    "The quick brown fox jumps over the lazy dog and then runs into the forest to hide.",
    "Configure the network interface.",
)


def measure() -> dict:
    """In this process (the checkout on ``sys.path``): T(k) in seconds per call for
    each batch size, and the same-bits checks."""
    from pipelines import model_resolver, text
    from specdec_core import costs

    target = model_resolver.resolve_model(model_resolver.DEFAULT_TARGET, role="target")
    model = target.spec.load()
    sp = text.sentencepiece(str(REPO / "assets/spm/ende_debian.model"))
    ids = [list(text.encode(sp, text.TRANSLATE_PREFIX, s)) for s in SENTENCES]
    out: dict = {"seconds": {}}
    for batch in BATCHES:
        enc = np.array([ids[0]] * batch, np.int32)
        timers = {k: costs.call_timer(model, enc, k=k, cache_len=128) for k in KS}
        seconds = costs.interleaved_seconds(timers, rounds=5)
        out["seconds"][str(batch)] = {str(k): s for k, s in seconds.items()}
    out.update(same_bits(model, ids))
    return out


def same_bits(model, ids: list[list[int]]) -> dict:
    """Row 0's logits over 16 decoder positions: fed k tokens per call against one per
    call (batch 1), and at batch B against batch 1 (one token per call)."""
    import jax
    import jax.numpy as jnp

    step = jax.jit(model.forward)
    tokens = np.array([0] + [5 + i for i in range(15)], np.int32)

    def row0(batch: int, chunk: int, *, same_source: bool = False) -> np.ndarray:
        rows = [ids[0 if same_source else i % len(ids)] for i in range(batch)]
        width = max(map(len, rows))
        enc = np.array([r + [0] * (width - len(r)) for r in rows], np.int32)
        cache = model.new_cache(enc, batch, 128)
        fed = np.repeat(tokens[None], batch, 0)
        parts = []
        for start in range(0, len(tokens), chunk):
            logits, cache = step(cache, jnp.asarray(fed[:, start : start + chunk]))
            parts.append(np.asarray(logits)[0])
        return np.concatenate(parts, 0)

    one = row0(1, 1)
    return {
        "call_length": {str(k): bool(np.array_equal(row0(1, k), one)) for k in (2, 4, 8, 16)},
        "batch": {str(b): bool(np.array_equal(row0(b, 1), one)) for b in (3, 4, 16)},
        "batch_same_width": {
            str(b): bool(np.array_equal(row0(b, 1, same_source=True), one)) for b in (3, 4, 16)
        },
    }


def run_child(checkout: pathlib.Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / pathlib.Path(__file__).name), "--child"],
        cwd=checkout, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the probe failed in {checkout}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(results: list[dict]) -> dict:
    return {
        "ms": {
            b: {
                k: 1e3 * float(np.median([r["seconds"][b][k] for r in results]))
                for k in map(str, KS)
            }
            for b in map(str, BATCHES)
        },
        "same_bits": {
            kind: {key: all(r[kind][key] for r in results) for key in results[0][kind]}
            for kind in ("call_length", "batch", "batch_same_width")
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--against", default=None, help="a git revision to alternate with")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path.insert(0, os.environ.get("PYTHONPATH", str(REPO)))
        print(json.dumps(measure()))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_rows_") as tmp:
        checkouts = {"this checkout": REPO}
        if args.against:
            checkouts[args.against] = worktree(args.against, pathlib.Path(tmp))
        runs: dict[str, list[dict]] = {name: [] for name in checkouts}
        try:
            for round_ in range(args.rounds):
                for name, path in checkouts.items():
                    runs[name].append(run_child(path))
                    print(f"round {round_ + 1}: {name} done", file=sys.stderr, flush=True)
        finally:
            if args.against:
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(checkouts[args.against])],
                    cwd=REPO, check=False,
                )  # fmt: skip
    sys.path.insert(0, str(REPO))
    from tests.machine import describe

    summary = {"cpu": describe(pathlib.Path("/proc/cpuinfo").read_text()), "rounds": args.rounds}
    summary["code"] = {name: summarize(results) for name, results in runs.items()}
    print(f"CPU: {summary['cpu']}, {args.rounds} rounds")
    print("| code | batch | " + " | ".join(f"T({k}) ms" for k in KS) + " | same bits |")
    print("|---|---|" + "---|" * (len(KS) + 1))
    for name, row in summary["code"].items():
        bits = row["same_bits"]
        bad = [f"k={k}" for k, ok in bits["call_length"].items() if not ok]
        bad += [f"batch {b}" for b, ok in bits["batch"].items() if not ok]
        bad += [f"batch {b} (one width)" for b, ok in bits["batch_same_width"].items() if not ok]
        for b in map(str, BATCHES):
            cells = " | ".join(f"{row['ms'][b][str(k)]:.2f}" for k in KS)
            verdict = "yes" if not bad else "no: " + ", ".join(bad)
            print(f"| {name} | {b} | {cells} | {verdict} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
