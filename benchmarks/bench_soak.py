"""Soak: many short records through the Ray engine, watching throughput and memory.

Pushes ``--records`` short English sentences (the Ding training split's shortest,
cycled with distinct ids when there are too few) through :class:`RayEngine` with the
embedded pair at ``--batch-size``, batch after batch, and samples after every batch:

- records done and tokens generated, and the throughput of each window of batches;
- the resident memory (RSS) of every Ray model-worker process (the target's and the
  coordinator's, which hosts the draft by default), from ``/proc`` via psutil.

Warm-up: first one batch of every padded shape that the run will use (so every program
is compiled: a shape first met late compiles there and its programs would read as
growth), then ``--warmup`` batches of the run. It fails (exit 1) when a record is missing
or duplicated in the results, or when a worker's RSS grows by more than
``--max-growth`` (default 5 %) between the end of the warm-up and the end of the run.
Output: a table per window, and ``--json`` the whole series. Usage:

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

from workers.ray_engine import RayEngine, ensure_ray  # noqa: E402

ensure_ray()  # before JAX starts threads

import psutil  # noqa: E402  (a dependency of ray)

from pipelines import model_resolver, text  # noqa: E402
from workers.batching import DecodeSettings, Request, pack  # noqa: E402

PREFIX = text.TRANSLATE_PREFIX


def short_sentences(n: int, *, max_words: int) -> list[str]:
    """The ``n`` shortest distinct English sentences of 3+ words of the Ding training split."""
    with gzip.open(REPO / "assets" / "data" / "ding" / "train.tsv.gz", "rt") as lines:
        english = {line.split("\t", 1)[0].strip() for line in lines}
    # Ties broken by the text: a set's order changes with each process's hash seed, and so
    # did the records (and their padded shapes) from one run to the next.
    ranked = sorted(
        (s for s in english if 3 <= len(s.split()) <= max_words), key=lambda s: (len(s), s)
    )
    if not ranked:
        raise SystemExit(f"no Ding training sentence has at most {max_words} words")
    return ranked[:n]


def worker_actors(engine: RayEngine) -> dict:
    """The engine's actors by role (a draft hosted by the coordinator has none)."""
    roles = {r: getattr(engine, r, None) for r in ("target", "draft", "coordinator")}
    return {role: actor for role, actor in roles.items() if actor is not None}


def ray_get(refs):
    import ray

    return ray.get(refs)


def worker_processes(actors: dict) -> dict[str, psutil.Process]:
    """The actors' processes by role (each actor reports its own pid)."""
    import os

    pids = ray_get(
        [actor.__ray_call__.remote(lambda self: os.getpid()) for actor in actors.values()]
    )
    return {role: psutil.Process(pid) for role, pid in zip(actors, pids, strict=True)}


def sample(actors: dict, processes: dict, previous: dict | None = None, *, trim=False) -> dict:
    """Per role: RSS, threads, glibc heap in use and free, compilations so far and the
    ones since ``previous`` (texts)."""
    since = {role: (previous or {}).get(role, {}).get("compiles", 0) for role in actors}
    probes = ray_get(
        [
            actor.__ray_call__.remote(_read_probe, since[role], trim)
            for role, actor in actors.items()
        ]
    )
    points = {}
    for (role, process), probe in zip(processes.items(), probes, strict=True):
        try:
            rss, threads = process.memory_info().rss / 2**20, process.num_threads()
        except psutil.Error:
            rss, threads = float("nan"), 0  # gone: a restarted worker
        points[role] = {"rss_mb": round(rss, 1), "threads": threads, **probe}
    return points


def report_jumps(index: int, previous: dict, now: dict, *, min_mb: float) -> None:
    """Prints a line for a batch in which a process grew by ``min_mb`` or compiled."""
    changes = []
    for role, point in now.items():
        before = previous[role]
        grew = point["rss_mb"] - before["rss_mb"]
        if abs(grew) >= min_mb or point["new_compiles"]:
            changes.append(
                f"{role} RSS {grew:+.0f} MB (heap used "
                f"{point['malloc_in_use_mb'] - before['malloc_in_use_mb']:+.0f}, free "
                f"{point['malloc_free_mb'] - before['malloc_free_mb']:+.0f}, threads "
                f"{point['threads'] - before['threads']:+d}), "
                f"{len(point['new_compiles'])} compiles"
                + "".join(f"\n      {text[:240]}" for text in point["new_compiles"])
            )
    if changes:
        print(f"  batch {index}: " + "; ".join(changes), flush=True)


def _install_probe(actor) -> None:
    """Runs in an actor: lists its XLA compilations (``jax_log_compiles``) on it."""
    import logging

    import jax

    if hasattr(actor, "_soak_compiles"):
        return
    compiles: list[str] = []

    class Compiles(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Compiling "):
                name, avals = record.args[:2]  # "Compiling %s with global shapes and types %s"
                compiles.append(f"{name} {avals}")

    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax").addHandler(Compiles(logging.WARNING))
    actor._soak_compiles = compiles


def _read_probe(actor, since: int = 0, trim: bool = False) -> dict:
    """Runs in an actor: its compilations (the count, and the texts of those after the
    first ``since``) and glibc malloc's account of its heap (all arenas). ``trim``:
    first hand free heap pages back to the system (``malloc_trim(0)``)."""
    import ctypes

    class Mallinfo2(ctypes.Structure):
        _fields_ = [
            (field, ctypes.c_size_t)
            for field in (
                *("arena", "ordblks", "smblks", "hblks", "hblkhd"),
                *("usmblks", "fsmblks", "uordblks", "fordblks", "keepcost"),
            )
        ]

    libc = ctypes.CDLL("libc.so.6")
    if trim:
        libc.malloc_trim(0)
    libc.mallinfo2.restype = Mallinfo2
    info = libc.mallinfo2()
    return {
        "compiles": len(actor._soak_compiles),
        "new_compiles": actor._soak_compiles[since:],
        "malloc_in_use_mb": round((info.uordblks + info.hblkhd) / 2**20, 1),
        "malloc_free_mb": round(info.fordblks / 2**20, 1),
    }


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
    parser.add_argument(
        "--jump-mb", type=float, default=20, help="report a batch that grows a process this much"
    )
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()

    target = model_resolver.resolve_model(model_resolver.DEFAULT_TARGET, role="target")
    draft = model_resolver.resolve_model(model_resolver.DEFAULT_DRAFT, role="draft")
    processor = text.sentencepiece(target.vocab_path or str(model_resolver.DEFAULT_VOCAB))
    pool = short_sentences(args.records, max_words=args.max_words)
    # Shuffled (seeded). A length bucket that first occurs late compiles there; its
    # programs read as growth (measured: +15% RSS in one step at batch 144 of 313, the
    # step's 3 + 4 compilations named by the probe, then flat), so every shape is
    # compiled before the run (below).
    texts = [pool[i % len(pool)] for i in range(args.records)]
    random.Random(0).shuffle(texts)
    requests = [
        Request(
            id=f"soak-{i}",
            prompt_tokens=(text.DECODER_START_ID,),
            encoder_tokens=text.encode(processor, PREFIX, line),
        )
        for i, line in enumerate(texts)
    ]
    settings = DecodeSettings(
        gamma=args.gamma, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size
    )
    engine = RayEngine(target.spec, draft.spec, settings)
    actors = worker_actors(engine)
    processes = worker_processes(actors)
    ray_get([actor.__ray_call__.remote(_install_probe) for actor in actors.values()])
    print(f"{len(requests)} records, batch {args.batch_size}, {len(processes)} worker processes")
    seen: dict[str, int] = {}
    series, trace, window_tokens, window_start = [], [], 0, time.perf_counter()
    baseline_rss = None
    batches = [requests[i : i + args.batch_size] for i in range(0, len(requests), args.batch_size)]
    shapes: dict[tuple, list[Request]] = {}
    for batch in batches:
        packed = pack(batch, settings)
        widths = (packed.prompt_tokens.shape, getattr(packed.encoder_tokens, "shape", None))
        shapes.setdefault((*widths, packed.max_len), batch)
    print(f"warm-up: one batch of each of the run's {len(shapes)} padded shapes", flush=True)
    for batch in shapes.values():
        engine.generate(batch)  # compiles; these decodes are not counted
    previous = sample(actors, processes)
    start = time.perf_counter()
    for index, batch in enumerate(batches, 1):
        for generation in engine.generate(batch):
            seen[generation.id] = seen.get(generation.id, 0) + 1
            window_tokens += len(generation.tokens)
        now = sample(actors, processes, previous)
        trace.append({"batch": index, **now})
        report_jumps(index, previous, now, min_mb=args.jump_mb)
        previous = now
        if index == args.warmup:
            baseline_rss = {role: s["rss_mb"] for role, s in now.items()}
        last_full = index == len(requests) // args.batch_size
        if index % args.window == 0 or index == len(batches) or last_full:
            t = time.perf_counter()
            point = {
                "batches": index,
                "records": sum(seen.values()),
                "elapsed_s": round(t - start, 2),
                "tokens_per_s": round(window_tokens / (t - window_start), 1),
                "rss_mb": {role: s["rss_mb"] for role, s in now.items()},
                "compiles": {role: s["compiles"] for role, s in now.items()},
            }
            series.append(point)
            rss = ", ".join(
                f"{role} {s['rss_mb']:.0f} (heap {s['malloc_in_use_mb']:.0f} used "
                f"{s['malloc_free_mb']:.0f} free, {s['compiles']} compiles)"
                for role, s in now.items()
            )
            print(
                f"batch {index:4d}  records {point['records']:5d}  {point['elapsed_s']:7.1f} s  "
                f"{point['tokens_per_s']:7.1f} tok/s  RSS MB [{rss}]",
                flush=True,
            )
            window_tokens, window_start = 0, t
    trimmed = sample(actors, processes, trim=True)
    print(
        "after malloc_trim(0): "
        + ", ".join(
            f"{role} RSS {s['rss_mb']:.0f} MB (heap {s['malloc_free_mb']:.0f} MB free)"
            for role, s in trimmed.items()
        )
    )
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
        "padded_shapes": len(shapes),
        "rss_growth_after_warmup": {role: round(g, 4) for role, g in growth.items()},
        "after_malloc_trim": {role: s["rss_mb"] for role, s in trimmed.items()},
        "series": series,
        "trace": trace,
    }
    print(json.dumps({k: v for k, v in report.items() if k not in ("series", "trace")}, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    failed = missing or duplicated or any(g > args.max_growth for g in growth.values())
    if failed:
        print(f"SOAK FAILED: missing {len(missing)}, duplicated {len(duplicated)}, growth {growth}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
