"""The copies XLA puts in a compiled decode loop (where the loop's time
beyond the model calls goes).

Runs ``decoding.autoregressive_generate`` (the target-alone loop, compiled whole) or,
with ``--draft``, ``decoding.speculative_generate(compiled=True)`` (the speculative
loop at ``--gamma``) for a model at a batch size, greedy, with XLA dumping what it
compiles, and lists the
``copy`` and ``transpose`` instructions of the loop's optimized HLO by shape (a
transpose XLA keeps moves its data as a copy does): how many there are, how many are
tagged as the while loop's body (``op_name`` under ``while/body``), and the bytes each
moves. A copy of a whole KV cache per layer and step is memory traffic that the cost
model's "loop per step" figure absorbs.

Usage (BENCHMARKS.md "Attention layout" gives the command run)::

    .venv/bin/python benchmarks/probe_loop_copies.py [--model ende_target_debian]
        [--batch 16] [--encoder-len 32] [--max-new-tokens 20] [--cache-len 96]
        [--draft ende_draft_debian_seq2 --gamma 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_BYTES = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "pred": 1, "f16": 2}


def _nbytes(shape: str) -> int:
    kind, dims = re.match(r"(\w+)\[([^\]]*)\]", shape).groups()
    return _BYTES.get(kind, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))


def _loop_hlo(dump: pathlib.Path) -> str:
    """The optimized HLO XLA dumped for the program holding the decode loop (a while loop
    with the cache writes in its body)."""
    for path in sorted(dump.glob("*after_optimizations.txt")):
        text = path.read_text()
        if "while/body/scatter" in text:
            return text
    raise SystemExit(f"no dumped program in {dump} holds the decode loop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ende_target_debian")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--encoder-len", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=20)
    parser.add_argument("--cache-len", type=int, default=96, help="slots (a job: 32·k)")
    parser.add_argument("--draft", default=None, help="probe the speculative loop with it")
    parser.add_argument("--gamma", type=int, default=3, help="with --draft")
    args = parser.parse_args(argv)
    dump = pathlib.Path(tempfile.mkdtemp(prefix="loop_hlo_"))
    # XLA writes every program it compiles here (set before JAX starts)
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={dump}"
    os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # compile, so that XLA dumps

    from pipelines import model_resolver
    from specdec_core import decoding, sampling

    def load(name, role):
        return model_resolver.resolve_model(name, role=role).spec.load()

    model = load(args.model, "--model")
    rows = args.batch
    encoder = np.full((rows, args.encoder_len), 5, np.int32)
    encoder[:, -1] = 1
    cache_len = args.cache_len
    common = dict(
        target=model.forward,
        target_cache=model.new_cache(encoder, rows, cache_len),
        prompt_tokens=np.zeros((rows, 1), np.int32),
        prompt_lengths=np.ones(rows, np.int32),
        request_ids=np.arange(rows),
        max_new_tokens=args.max_new_tokens,
        sampling_config=sampling.GREEDY,
        eos_id=None,
    )
    if args.draft is None:
        decoding.autoregressive_generate(**common)
    else:
        draft = load(args.draft, "--draft")
        decoding.speculative_generate(
            **common,
            draft=draft.forward,
            draft_cache=draft.new_cache(encoder, rows, cache_len),
            gamma=args.gamma,
            compiled=True,
        )
    hlo = _loop_hlo(dump)
    found = collections.Counter()
    in_body = collections.Counter()
    for line in hlo.splitlines():
        match = re.search(r"= (\w+\[[^\]]*\])\S* (copy|transpose)\(", line)
        if match:
            key = (match.group(2), match.group(1))
            found[key] += 1
            in_body[key] += "while/body" in line
    loop = "target alone" if args.draft is None else f"draft {args.draft}, gamma {args.gamma}"
    print(f"{args.model}, {loop}, batch {rows}, cache {cache_len}, encoder {args.encoder_len}")
    print("| op | shape | count | tagged while/body | bytes each |")
    print("|---|---|---|---|---|")
    for (op, shape), n in found.most_common():
        print(f"| {op} | {shape} | {n} | {in_body[op, shape]} | {_nbytes(shape):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
