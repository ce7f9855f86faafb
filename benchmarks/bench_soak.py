"""Soak: many short records through the Ray engine, watching throughput and memory.

Pushes ``--records`` short English sentences (the Ding training split's shortest,
cycled with distinct ids when there are too few) through :class:`RayEngine` with the
embedded pair at ``--batch-size``, batch after batch, and samples after every batch:

- records done and tokens generated, and the throughput of each window of batches;
- the resident memory (RSS) of every Ray model-worker process (the target's and the
  coordinator's, which hosts the draft by default), from ``/proc`` via psutil.

It fails (exit 1) when a record is missing or duplicated in the results, or when a
worker's RSS grows by more than ``--max-growth`` (default 5 %) between the end of the
warm-up (``--warmup`` batches) and the end of the run. Output: a table per window, and
``--json`` the whole series. Usage:

    .venv/bin/python benchmarks/bench_soak.py [--records 5000] [--batch-size 16]
        [--max-new-tokens 16] [--warmup 20] [--window 25] [--json FILE]
"""

from __future__ import annotations

import argparse
import gzip
import json
import pathlib
import random
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workers.coordinator import RayEngine, ensure_ray  # noqa: E402

ensure_ray()  # before JAX starts threads

import psutil  # noqa: E402  (a dependency of ray)

from pipelines import model_resolver  # noqa: E402
from pipelines.translate import encode, sentencepiece  # noqa: E402
from workers.batching import DecodeSettings, Request  # noqa: E402

PREFIX = "translate English to German: "


def short_sentences(n: int, *, max_words: int) -> list[str]:
    """The ``n`` shortest distinct English sentences of 3+ words of the Ding training split."""
    with gzip.open(REPO / "assets" / "data" / "ding" / "train.tsv.gz", "rt") as lines:
        english = {line.split("\t", 1)[0].strip() for line in lines}
    ranked = sorted((s for s in english if 3 <= len(s.split()) <= max_words), key=len)
    if not ranked:
        raise SystemExit(f"no Ding training sentence has at most {max_words} words")
    return ranked[:n]


def worker_processes(engine: RayEngine) -> dict[str, psutil.Process]:
    """The engine's actor processes by role (each actor reports its own pid)."""
    import os

    import ray

    roles = {r: getattr(engine, r, None) for r in ("target", "draft", "coordinator")}
    pids = {
        role: ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        for role, actor in roles.items()
        if actor is not None
    }
    return {role: psutil.Process(pid) for role, pid in pids.items()}


def rss_mb(processes: dict[str, psutil.Process]) -> dict[str, float]:
    sizes = {}
    for role, process in processes.items():
        try:
            sizes[role] = process.memory_info().rss / 2**20
        except psutil.Error:
            sizes[role] = float("nan")  # gone: a restarted worker
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--max-words", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=20, help="batches before RSS is baselined")
    parser.add_argument("--window", type=int, default=25, help="batches per reported window")
    parser.add_argument("--max-growth", type=float, default=0.05)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()

    target = model_resolver.resolve_model(model_resolver.DEFAULT_TARGET, role="target")
    draft = model_resolver.resolve_model(model_resolver.DEFAULT_DRAFT, role="draft")
    processor = sentencepiece(target.vocab_path or str(model_resolver.DEFAULT_VOCAB))
    pool = short_sentences(args.records, max_words=args.max_words)
    # Shuffled (seeded): every length bucket, hence every compiled shape, occurs during
    # the warm-up; sorted by length, the first longer bucket compiled late and its
    # programs read as growth (measured: +16% RSS at batch 260 of 313, then flat).
    texts = [pool[i % len(pool)] for i in range(args.records)]
    random.Random(0).shuffle(texts)
    requests = [
        Request(id=f"soak-{i}", prompt_tokens=(0,), encoder_tokens=encode(processor, PREFIX, t, 1))
        for i, t in enumerate(texts)
    ]
    settings = DecodeSettings(
        gamma=args.gamma, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size
    )
    engine = RayEngine(target.spec, draft.spec, settings)
    processes = worker_processes(engine)
    print(f"{len(requests)} records, batch {args.batch_size}, {len(processes)} worker processes")
    seen: dict[str, int] = {}
    series, window_tokens, window_start = [], 0, time.perf_counter()
    baseline_rss = None
    batches = [requests[i : i + args.batch_size] for i in range(0, len(requests), args.batch_size)]
    start = time.perf_counter()
    for index, batch in enumerate(batches, 1):
        for generation in engine.generate(batch):
            seen[generation.id] = seen.get(generation.id, 0) + 1
            window_tokens += len(generation.tokens)
        if index == args.warmup:
            baseline_rss = rss_mb(processes)
        last_full = index == len(requests) // args.batch_size
        if index % args.window == 0 or index == len(batches) or last_full:
            now = time.perf_counter()
            point = {
                "batches": index,
                "records": sum(seen.values()),
                "elapsed_s": round(now - start, 2),
                "tokens_per_s": round(window_tokens / (now - window_start), 1),
                "rss_mb": {role: round(mb, 1) for role, mb in rss_mb(processes).items()},
            }
            series.append(point)
            rss = ", ".join(f"{role} {mb:.0f}" for role, mb in point["rss_mb"].items())
            print(
                f"batch {index:4d}  records {point['records']:5d}  {point['elapsed_s']:7.1f} s  "
                f"{point['tokens_per_s']:7.1f} tok/s  RSS MB [{rss}]",
                flush=True,
            )
            window_tokens, window_start = 0, now
    restarts = engine.restarts() if hasattr(engine, "restarts") else None
    engine.close()

    missing = [r.id for r in requests if r.id not in seen]
    duplicated = [rid for rid, count in seen.items() if count != 1]
    # A short last batch (records not a multiple of the batch size) is a new compiled
    # shape: its programs are not growth, so the check reads the last full batch's sample.
    full = [p for p in series if p["batches"] * args.batch_size <= len(requests)]
    final_rss = (full or series)[-1]["rss_mb"]
    growth = {
        role: (final_rss[role] - mb) / mb
        for role, mb in (baseline_rss or {}).items()
        if role in final_rss and mb == mb
    }
    report = {
        "records": len(requests),
        "batch_size": args.batch_size,
        "max_new_tokens": args.max_new_tokens,
        "gamma": args.gamma,
        "missing": len(missing),
        "duplicated": len(duplicated),
        "worker_restarts": restarts,
        "rss_growth_after_warmup": {role: round(g, 4) for role, g in growth.items()},
        "series": series,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "series"}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    failed = missing or duplicated or any(g > args.max_growth for g in growth.values())
    if failed:
        print(f"SOAK FAILED: missing {len(missing)}, duplicated {len(duplicated)}, growth {growth}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
