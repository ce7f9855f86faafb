"""Text and token ids for the T5-style jobs: each convention defined once.

- The SentencePiece vocabulary: :func:`sentencepiece` loads a model file (cached per
  process); :func:`encode` turns ``prefix + text`` into piece ids with EOS appended
  (what seqio's tasks feed T5), :func:`decode` turns generated ids back into text.
- T5's task prefixes: :data:`TRANSLATE_PREFIX`, :data:`SUMMARIZE_PREFIX`
  (:data:`TASK_PREFIXES`, removed again by :func:`strip_task_prefix`).
- The special ids: :data:`EOS_ID` ends inputs and generations, :data:`DECODER_START_ID`
  is the first decoder input, :data:`PAD_ID` pads. The core stops at EOS, so they are
  defined in :mod:`specdec_core.models.t5` and re-exported here.
- Length buckets: prompt and encoder widths pad to multiples of :data:`LENGTH_BUCKET`
  (:func:`padded_length`), so a job compiles a handful of shapes. :mod:`workers.batching`
  pads, so it defines them; re-exported here. The pipeline batches records of one
  :func:`length_bucket` together.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence

from specdec_core.models.t5 import DECODER_START_ID, EOS_ID, PAD_ID
from workers.batching import LENGTH_BUCKET, padded_length

__all__ = [
    "DECODER_START_ID",
    "EOS_ID",
    "LENGTH_BUCKET",
    "PAD_ID",
    "SUMMARIZE_PREFIX",
    "TASK_PREFIXES",
    "TRANSLATE_PREFIX",
    "decode",
    "encode",
    "length_bucket",
    "padded_length",
    "sentencepiece",
    "strip_task_prefix",
]


def length_bucket(encoder_tokens: int) -> int:
    """The bucket of a record with ``encoder_tokens`` input tokens: records of one bucket
    pad to the same encoder width, and the pipeline batches them together."""
    return -(-encoder_tokens // LENGTH_BUCKET)


TRANSLATE_PREFIX = "translate English to German: "
SUMMARIZE_PREFIX = "summarize: "
TASK_PREFIXES = (TRANSLATE_PREFIX, SUMMARIZE_PREFIX)


@functools.lru_cache(maxsize=4)
def sentencepiece(path: str):
    """The SentencePiece processor at ``path`` (cached per process)."""
    import sentencepiece as spm

    if not pathlib.Path(path).is_file():
        raise FileNotFoundError(f"SentencePiece model not found: {path}")
    return spm.SentencePieceProcessor(model_file=path)


def encode(processor, prefix: str, text: str, eos_id: int = EOS_ID) -> tuple[int, ...]:
    """``prefix + text`` as piece ids with EOS appended (what seqio's task feeds T5)."""
    return (*processor.encode(prefix + text), eos_id)


def decode(processor, tokens: Sequence[int], eos_id: int | None) -> str:
    """Generated ids up to (not including) EOS as text; ids beyond the pieces are dropped."""
    if eos_id is not None and eos_id in tokens:
        tokens = tokens[: list(tokens).index(eos_id)]
    size = processor.get_piece_size()
    return processor.decode([int(t) for t in tokens if 0 <= t < size])


def strip_task_prefix(text: str) -> str:
    """``translate English to German: X`` -> ``X`` (likewise ``summarize: X``)."""
    for prefix in TASK_PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text
