"""The copies XLA puts in the compiled target-alone loop (issue 20 item 2: where the
loop's time beyond the model call goes).

Compiles ``decoding``'s target-alone loop for a model at a batch size, as a job does
(prefilled cache, greedy), and lists the ``copy`` instructions of the optimized HLO by
shape, with how many sit in the while loop's body (``op_name`` under ``while/body``) and
the bytes they move per step. A copy of a whole KV cache per layer and step is memory
traffic that the cost model's "loop per step" figure absorbs.

Usage (BENCHMARKS.md "Automatic γ", batch 16, gives the command run)::

    .venv/bin/python benchmarks/probe_loop_copies.py [--model ende_target_debian]
        [--batch 16] [--encoder-len 32] [--cache-len 96]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipelines import model_resolver  # noqa: E402
from specdec_core import decoding, sampling  # noqa: E402
from specdec_core.models import bound  # noqa: E402

_BYTES = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "pred": 1, "f16": 2}


def _nbytes(shape: str) -> int:
    kind, dims = re.match(r"(\w+)\[([^\]]*)\]", shape).groups()
    return _BYTES.get(kind, 4) * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ende_target_debian")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--encoder-len", type=int, default=32)
    parser.add_argument("--cache-len", type=int, default=96)
    args = parser.parse_args(argv)
    spec = model_resolver.resolve_model(args.model, role="--model").spec
    model = bound.load_model(spec.name, spec.family, spec.config, checkpoint=spec.checkpoint)
    rows = args.batch
    encoder = np.full((rows, args.encoder_len), 5, np.int32)
    encoder[:, -1] = 1
    cache = model.new_cache(encoder, rows, args.cache_len)
    prompt, lengths = np.zeros((rows, 1), np.int32), np.ones(rows, np.int32)
    _, _, state, _ = decoding._begin(prompt, lengths, np.arange(rows), 0, 20, gamma=0)
    cache = decoding.prefill_fn(model.forward)(cache, prompt, lengths)
    loop = decoding._autoregressive_fn(model.forward, sampling.GREEDY, 1)
    hlo = loop.func.lower(*loop.args, state, cache).compile().as_text()
    found = collections.Counter()
    in_body = collections.Counter()
    for line in hlo.splitlines():
        match = re.search(r"= (\w+\[[^\]]*\])\S* copy\(", line)
        if match:
            found[match.group(1)] += 1
            in_body[match.group(1)] += "while/body" in line
    print(f"{args.model}, batch {rows}, cache {args.cache_len}, encoder {args.encoder_len}")
    print("| shape | copies | tagged while/body | bytes each |")
    print("|---|---|---|---|")
    for shape, n in found.most_common():
        print(f"| {shape} | {n} | {in_body[shape]} | {_nbytes(shape):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
