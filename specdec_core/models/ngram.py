"""Unigram and bigram language models fit from token counts (the paper's Table 3 drafts).

Both follow the model contract of ``specdec_core.models.api``::

    forward(params, cache, tokens[B, K]) -> (logits[B, K, V], cache)

where ``logits[:, i]`` predicts the token *after* ``tokens[:, i]``. The logits are
log-probabilities (already normalized), so ``softmax(logits) == probs`` exactly.

Fitting (add-k, a.k.a. Lidstone smoothing, ``k = 1`` is Laplace)::

    unigram:  P(x)     = (count(x) + k)     / (N + k·V)
    bigram:   P(y | x) = (count(x, y) + k)  / (count(x, ·) + k·V)

``count(x)`` counts every token of every sequence, ``N`` is their total;
``count(x, y)`` counts adjacent pairs inside a sequence (no pair crosses a sequence
boundary) and ``count(x, ·) = Σ_y count(x, y)``. With ``k = 0`` a bigram context
never seen as a left token backs off to the unigram distribution (a 0/0 row has no
other meaning); a token never seen gets probability 0 (logit ``-inf``).

Cache: a token history buffer ``[B, max_len]`` and ``lengths: int32[B]``, like every
model's. The bigram conditions on the token *at* each position, which is the input
token itself, so neither model reads the history to compute logits; the history is
kept so the cache matches the contract (and a caller can read a row's committed
tokens back), and so a rollback is the contract's O(1) ``api.rollback``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True, kw_only=True)
class NGramConfig:
    """What a bound n-gram model's ``config`` says about it."""

    kind: str  # "unigram" | "bigram"
    vocab_size: int

    @classmethod
    def of(cls, params: NGramParams) -> NGramConfig:
        """The config of fit params: a [V] table is a unigram, a [V, V] one a bigram."""
        kind = "unigram" if params.log_probs.ndim == 1 else "bigram"
        return cls(kind=kind, vocab_size=int(params.log_probs.shape[-1]))


@flax.struct.dataclass
class NGramParams:
    # [V] (unigram) or [V, V] (bigram, indexed [previous token, next token]) float32
    log_probs: jax.Array


@flax.struct.dataclass
class NGramCache:
    history: jax.Array  # [B, max_len] int32: tokens written so far (stale past lengths)
    lengths: jax.Array  # [B] int32: committed positions per row


def unigram_counts(token_sequences: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
    """int64[V]: how often each token id occurs in all sequences."""
    counts = np.zeros((vocab_size,), np.int64)
    for seq in token_sequences:
        ids = _as_ids(seq, vocab_size)
        np.add.at(counts, ids, 1)
    return counts


def bigram_counts(token_sequences: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
    """int64[V, V]: ``counts[x, y]`` = adjacent pairs (x then y) inside any sequence."""
    counts = np.zeros((vocab_size, vocab_size), np.int64)
    for seq in token_sequences:
        ids = _as_ids(seq, vocab_size)
        np.add.at(counts, (ids[:-1], ids[1:]), 1)
    return counts


def _as_ids(seq: Sequence[int], vocab_size: int) -> np.ndarray:
    ids = np.asarray(seq, np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
    return ids


def smoothed_probs(counts: np.ndarray, *, k: float) -> np.ndarray:
    """float64[..., V]: add-k smoothing along the last axis; rows summing to 0 stay 0."""
    if k < 0:
        raise ValueError(f"smoothing k must be >= 0, got {k}")
    smoothed = counts.astype(np.float64) + k
    totals = smoothed.sum(-1, keepdims=True)
    return np.divide(smoothed, totals, out=np.zeros_like(smoothed), where=totals > 0)


def _to_params(probs: np.ndarray) -> NGramParams:
    with np.errstate(divide="ignore"):
        log_probs = np.log(probs)
    return NGramParams(log_probs=jnp.asarray(log_probs, jnp.float32))


def fit_unigram(
    token_sequences: Iterable[Sequence[int]], vocab_size: int, *, k: float = 1.0
) -> NGramParams:
    """Unigram log-probs [V] with add-k smoothing (see the module docstring)."""
    counts = unigram_counts(token_sequences, vocab_size)
    if counts.sum() == 0 and k == 0:
        raise ValueError("no tokens to fit and k=0: the unigram distribution is undefined")
    return _to_params(smoothed_probs(counts, k=k))


def fit_bigram(
    token_sequences: Iterable[Sequence[int]], vocab_size: int, *, k: float = 1.0
) -> NGramParams:
    """Bigram log-probs [V, V] (row = previous token) with add-k smoothing.

    With ``k == 0`` a row with no counts backs off to the (unsmoothed) unigram.
    """
    token_sequences = [np.asarray(s) for s in token_sequences]
    probs = smoothed_probs(bigram_counts(token_sequences, vocab_size), k=k)  # [V, V]
    if k == 0:
        unseen_rows = probs.sum(-1) == 0  # [V]
        unigram = smoothed_probs(unigram_counts(token_sequences, vocab_size), k=0.0)  # [V]
        probs[unseen_rows] = unigram
    return _to_params(probs)


def init_cache(batch_size: int, max_len: int) -> NGramCache:
    """An empty cache: every row at length 0."""
    return NGramCache(
        history=jnp.zeros((batch_size, max_len), jnp.int32),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )


def score(params: NGramParams, tokens: jax.Array) -> jax.Array:
    """Uncached: tokens [B, L] int32 -> logits [B, L, V]; row i predicts token i + 1."""
    log_probs = params.log_probs
    if log_probs.ndim == 1:
        return jnp.broadcast_to(log_probs, (*tokens.shape, log_probs.shape[0]))
    return log_probs[tokens]


def forward(params: NGramParams, cache: NGramCache, tokens: jax.Array):
    """tokens [B, K] int32 -> (logits [B, K, V], cache); the model contract's forward."""
    batch, k = tokens.shape
    positions = cache.lengths[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]  # [B, K]
    rows = jnp.arange(batch)[:, None]  # [B, 1]
    history = cache.history.at[rows, positions].set(tokens.astype(jnp.int32), mode="drop")
    logits = score(params, tokens)  # [B, K, V]
    return logits, NGramCache(history=history, lengths=cache.lengths + k)
