"""Tokens/s of the compiled target-alone loop, this checkout against another revision.

Each side is a new process (``--worker``) that loads the embedded target, decodes the
first ``--records`` sentences of the shipped Debian sample at each batch size with
``decoding.autoregressive_generate`` (greedy, at most 64 new tokens, the job's padding),
once untimed and then ``--repeats`` times, and prints the median tokens/s. The two
sides alternate for ``--rounds`` rounds; the table gives each side's median and the
ratio per batch size, and whether both decoded the same tokens.

Usage (BENCHMARKS.md gives the command run)::

    .venv/bin/python benchmarks/bench_target_loop.py --against REV [--rounds 3]
        [--batch-sizes 1,16]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SAMPLE = "assets/samples/en_de_debian_sample.tsv"


def sample_requests(vocab_path: str, records: int) -> list:
    """The first ``records`` sentences of the shipped Debian sample as translation
    requests (``workers.batching.Request``), tokenised as the job does."""
    from pipelines import text
    from workers.batching import Request

    processor = text.sentencepiece(vocab_path)
    lines = (REPO / SAMPLE).read_text().splitlines()[:records]
    return [
        Request(
            id=str(i),
            prompt_tokens=(text.DECODER_START_ID,),
            encoder_tokens=text.encode(
                processor, text.TRANSLATE_PREFIX, line.split("\t")[0], text.EOS_ID
            ),
        )
        for i, line in enumerate(lines)
    ]


def debian_pair(draft_name: str = "ende_draft_debian_seq2"):
    """(target, draft, vocab path): the embedded Debian target and ``draft_name``,
    loaded as the jobs resolve them."""
    from pipelines import model_resolver

    target = model_resolver.resolve_model("ende_target_debian", role="--target")
    draft = model_resolver.resolve_model(draft_name, role="--draft")
    return target.spec.load(), draft.spec.load(), target.vocab_path


def greedy_decode_args(model, packed) -> dict:
    """``decoding.autoregressive_generate``'s arguments for the target alone on one packed
    batch, greedy (``speculative_generate`` takes them too, with a draft's)."""
    from pipelines import text
    from specdec_core import sampling

    rows = packed.prompt_tokens.shape[0]
    return dict(
        target=model.forward,
        target_cache=model.new_cache(packed.encoder_tokens, rows, packed.max_len),
        prompt_tokens=packed.prompt_tokens,
        prompt_lengths=packed.prompt_lengths,
        request_ids=packed.request_keys,
        max_new_tokens=packed.max_new_tokens,
        sampling_config=sampling.GREEDY,
        eos_id=text.EOS_ID,
    )


def worker(batch_sizes: list[int], records: int, repeats: int) -> dict:
    """In the checkout on ``sys.path``: {batch: {"tokens_per_s", "digest"}}."""
    import numpy as np

    from pipelines import model_resolver
    from specdec_core import decoding
    from workers.batching import DecodeSettings, pack

    resolved = model_resolver.resolve_model("ende_target_debian", role="--target")
    model = resolved.spec.load()
    requests = sample_requests(resolved.vocab_path, records)
    results = {}
    for batch in batch_sizes:
        settings = DecodeSettings(gamma=1, max_new_tokens=64, batch_size=batch)
        packed = [pack(requests[i : i + batch], settings) for i in range(0, len(requests), batch)]

        def run(packed=packed):
            outs = []
            for p in packed:
                outs.append(decoding.autoregressive_generate(**greedy_decode_args(model, p)))
            return outs

        run()  # compiles every shape
        rates, digest = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            outs = run()
            seconds = time.perf_counter() - start
            tokens = sum(int(np.sum(o.lengths)) for o in outs)
            rates.append(tokens / seconds)
            digest = hashlib.sha256(
                b"".join(np.asarray(o.tokens).tobytes() for o in outs)
            ).hexdigest()[:16]
        results[str(batch)] = {"tokens_per_s": statistics.median(rates), "digest": digest}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="a git revision")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--records", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.worker:
        print(json.dumps(worker(sizes, args.records, args.repeats)))
        return 0
    from bench_startup import worktree  # a sibling script

    with tempfile.TemporaryDirectory(prefix="bench_loop_") as tmp:
        sides = {"this checkout": REPO, args.against: worktree(args.against, pathlib.Path(tmp))}
        runs: dict[str, list[dict]] = {name: [] for name in sides}
        try:
            for round_ in range(1, args.rounds + 1):
                for name, path in sides.items():
                    command = [
                        sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
                        "--batch-sizes", args.batch_sizes, "--records", str(args.records),
                        "--repeats", str(args.repeats), "--against", args.against,
                    ]  # fmt: skip
                    env = {**os.environ, "PYTHONPATH": str(path)}
                    done = subprocess.run(
                        command, cwd=path, env=env, capture_output=True, text=True, check=False
                    )
                    if done.returncode != 0:
                        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    runs[name].append(result)
                    rates = ", ".join(
                        f"batch {b}: {r['tokens_per_s']:.1f}" for b, r in result.items()
                    )
                    print(f"round {round_} {name}: {rates} tokens/s", flush=True)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(sides[args.against])],
                cwd=REPO,
                check=False,
            )
    mine, theirs = runs["this checkout"], runs[args.against]
    print(
        f"\n| batch | this checkout (tokens/s) | {args.against} (tokens/s) | ratio | same tokens |"
    )
    print("|---|---|---|---|---|")
    for b in map(str, sizes):
        a = statistics.median(r[b]["tokens_per_s"] for r in mine)
        o = statistics.median(r[b]["tokens_per_s"] for r in theirs)
        same = {r[b]["digest"] for r in mine} == {r[b]["digest"] for r in theirs}
        print(f"| {b} | {a:.1f} | {o:.1f} | {a / o:.3f} | {same} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
