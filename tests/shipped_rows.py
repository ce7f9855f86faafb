"""Run as ``python -m tests.shipped_rows``: the shipped target's logits for a sentence,
alone, against the same sentence beside other sentences of its length bucket (every
bucket of the sample with two sentences or more), as a job
batches them (``workers.batching.pack``: every row padded to the bucket's width, padding
rows a lone EOS), fed one token per call or many, in caches of other lengths. Prints one
line per comparison, ``same`` or ``DIFFERENT`` with the largest difference, and exits 1
if any differs. ``tests/test_batch_invariance.py`` runs it in a fresh process compiled
as a job compiles (XLA's default optimisation), since kernels are chosen per program.
"""

from __future__ import annotations

import collections
import sys

import jax
import jax.numpy as jnp
import numpy as np

from pipelines import model_resolver, text
from pipelines.cli import REPO_ROOT
from workers.batching import DecodeSettings, Request, pack

# make run's sample, and sixteen test-split sentences a job batched together, the first
# of which once got other bits from the encoder beside the others than alone
SOURCES = (
    REPO_ROOT / "assets" / "samples" / "en_de_debian_sample.tsv",
    REPO_ROOT / "tests" / "data" / "test_split_bucket16.tsv",
)
TARGET = "ende_target_debian"
FED = 12  # teacher-forced decoder tokens (the reference's first pieces)


def _buckets(processor) -> list[list[tuple[tuple[int, ...], list[int]]]]:
    """(encoder tokens, decoder tokens) of each source file's sentences, one list per
    length bucket with at least two: sources of different lengths that a job puts in one
    batch. The decoder is fed the reference's pieces (EOS after them)."""
    found = []
    for path in SOURCES:
        buckets = collections.defaultdict(list)
        for line in path.read_text(encoding="utf-8").splitlines():
            english, german = line.split("\t")[:2]
            source = text.encode(processor, text.TRANSLATE_PREFIX, english)
            decoder = ([0, *processor.encode(german)] + [text.EOS_ID] * FED)[:FED]
            buckets[-(-len(source) // 16)].append((source, decoder))
        found += [rows for _, rows in sorted(buckets.items()) if len(rows) >= 2]
    return found


def chunked_logits(model, encoder, tokens, chunk: int, cache_len: int) -> np.ndarray:
    """Logits [B, T, V] of every position of ``tokens`` [B, T], fed ``chunk`` tokens per
    call through a ``cache_len``-slot cache over the sources ``encoder`` [B, S]."""
    cache = model.new_cache(encoder, encoder.shape[0], cache_len)
    step = jax.jit(model.forward)
    out = []
    for start in range(0, tokens.shape[1], chunk):
        logits, cache = step(cache, jnp.asarray(tokens[:, start : start + chunk]))
        out.append(np.asarray(logits))
    return np.concatenate(out, axis=1)


def _logits(model, rows, batch_size: int, chunk: int, cache_len: int) -> np.ndarray:
    """Row 0's logits [FED, V]: ``rows`` packed as the job packs them, fed ``chunk``
    decoder tokens per call through a ``cache_len``-slot cache."""
    requests = [
        Request(id=str(i), prompt_tokens=(0,), encoder_tokens=s) for i, (s, _) in enumerate(rows)
    ]
    packed = pack(requests, DecodeSettings(batch_size=batch_size))
    decoder = np.zeros((batch_size, FED), np.int32)
    decoder[: len(rows)] = [tokens for _, tokens in rows]
    return chunked_logits(model, packed.encoder_tokens, decoder, chunk, cache_len)[0]


def main() -> int:
    resolved = model_resolver.resolve_model(TARGET, role="target")
    model = resolved.spec.load()
    different = 0
    for rows in _buckets(text.sentencepiece(resolved.vocab_path)):
        for first in range(min(2, len(rows))):
            ordered = [rows[first], *rows[:first], *rows[first + 1 :]]
            alone = _logits(model, ordered[:1], 1, 1, 128)
            for batch, chunk, cache_len in ((4, FED, 128), (16, 4, 64), (16, 1, 128)):
                got = _logits(model, ordered[:batch], batch, chunk, cache_len)
                same = np.array_equal(got, alone)
                different += not same
                gap = float(np.max(np.abs(got - alone)))
                print(
                    f"row of {len(ordered[0][0])} source tokens beside "
                    f"{min(batch, len(ordered)) - 1} (batch {batch}, {chunk} per call, "
                    f"cache {cache_len}): " + ("same" if same else f"DIFFERENT (max |Δ| {gap:.3g})")
                )
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
