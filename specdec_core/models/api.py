"""The model contract every family implements (docs/ARCHITECTURE.md, "Contracts").

A model, as decoding sees it, is a pure function over an explicit cache pytree::

    forward(cache, tokens[B, K]) -> (logits[B, K, V], cache)

``forward`` writes the K new positions of every row starting at that row's
``cache.lengths`` (so rows are ragged), attends causally to everything before them,
returns the logits of all K positions, and advances ``lengths`` by K. K=1 is an
ordinary decode step, K=γ+1 is verification, a large K is prefill.

``rollback(cache, lengths)`` only sets ``lengths``: slots at or past a row's length
are stale, masked out by attention and overwritten by the next ``forward``. So
rejecting drafted tokens is O(1).

Params are bound before decoding sees a model (``functools.partial`` or a closure),
as in T5X's ``tokens_to_logits``: decoding takes callables, never model classes.
Every cache is a ``flax.struct.dataclass`` with at least a field
``lengths: int32[B]``; K/V buffers have a fixed size ``[B, max_len, ...]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import jax
import numpy as np

Cache = TypeVar("Cache")


class Forward(Protocol):
    """``(cache, tokens[B, K]) -> (logits[B, K, V], cache)``; see the module docstring."""

    def __call__(self, cache: Any, tokens: jax.Array) -> tuple[jax.Array, Any]: ...


def rollback(cache: Cache, lengths: jax.Array) -> Cache:
    """Sets every row's committed length (int32[B]); K/V slots past it become stale."""
    return cache.replace(lengths=lengths.astype(cache.lengths.dtype))  # type: ignore[attr-defined]


# A cache's source side (an encoder's output and its cross-attention keys/values, a copy
# draft's source tokens) is padded, masked, to source_width(S) positions.
SOURCE_WIDTH_MIN = 64


def source_width(length: int) -> int:
    """The source positions a decoder cache holds for a source of ``length`` tokens: the
    next power of two, at least :data:`SOURCE_WIDTH_MIN`.

    A decode loop is compiled per cache shape. Inputs are padded to multiples of 16
    tokens (``workers.batching.LENGTH_BUCKET``) for the encoder, which costs in
    proportion to its width; if the loops' caches kept that width, every γ would compile
    once per 16 tokens of input length (the shipped sample's inputs span 4 such widths).
    Padded here, they span one. A masked source position costs the decoder one
    cross-attention term per step: small next to a step's matmuls.
    """
    if length < 0:
        raise ValueError(f"a source length is >= 0, got {length}")
    return max(SOURCE_WIDTH_MIN, 1 << max(length - 1, 0).bit_length())


# ----------------------------------------------------------------- a bound model


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class BoundModel:
    """A model with its params bound, as decoding loops and workers hold it: ``forward``
    (the contract above) and ``new_cache`` (an empty cache for a batch, running the
    encoder once for encoder-decoder models). It compares and hashes by identity, and so
    does its ``forward``: compiled steps are cached per model object, so keep one per
    model for the life of a job. :mod:`specdec_core.models.bound` builds them."""

    name: str
    family: str  # a name in specdec_core.models.families
    config: Any  # the family's config class (T5Config, DecoderConfig, ...)
    params: Any
    forward: Forward  # (cache, tokens [B, K]) -> (logits [B, K, V], cache)
    # (encoder_tokens [B, S] int32 or None, batch_size, max_len) -> empty cache
    new_cache: Callable[[Any, int, int], Any]
    is_encoder_decoder: bool  # its family's: the cache is built by an encoder

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def param_count(self) -> int:
        return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.params))
