"""The copy draft (prompt lookup): propose what followed the latest match of the suffix.

A draft that costs a lookup, no model. At each position it takes the last n tokens of
the output so far (the token just fed included), for n from ``n_max`` down to
``n_min``, and looks for the same n tokens earlier in the *source* (the encoder
tokens of a T5 request, which :func:`init_cache` receives) and in the *output so far*
(the decoder tokens in the cache). It proposes the token that followed the match:

- the longest match wins (n is capped at ``n_max``);
- among matches of that length the most recent wins: the latest one in the output,
  and only when the output has none, the latest one in the source (the text read as
  source followed by output, the match nearest its end);
- a match needs a continuation: in the output, the token after it must already be
  there (a match may end one token before the current one, so a run ``a a`` proposes
  another ``a``); in the source, a non-pad token must follow it. Source pads
  (``pad_id``) never match.

The draft follows the model contract of :mod:`specdec_core.models.api`: ``forward(cache,
tokens[B, K]) -> (logits[B, K, V], cache)``, where ``logits[:, i]`` is the proposal
after ``tokens[:, i]`` as a **point mass**: 0 at the proposed token, −inf elsewhere.
Under any :class:`~specdec_core.sampling.SamplingConfig` (temperature, top-k, top-p,
greedy) those logits become the one-hot q on the proposed token, so the loop samples
exactly that token and hands the rule that q.

Why a point mass keeps the output exact: the acceptance rule is exact for *any* q the
draft token was drawn from, given the prefix. With q = one-hot(x) the token x is
accepted with probability min(1, p(x)/1) = p(x); on a rejection the next token comes
from norm(max(0, p − q)), which is p with x removed and renormalised, so every
y ≠ x comes out with probability (1 − p(x)) · p(y)/(1 − p(x)) = p(y). The lookup is a
deterministic function of the prefix, so q is a proper conditional distribution and
the rule's guarantee (Leviathan et al., Theorem 1) applies at every temperature.

No match: γ is static for a batch and the loop has no per-row γ, so a position
without a match still proposes a token: a point mass on ``fallback_token`` (T5's EOS
by default). That is exact by the same argument (any token, q = 1): the target accepts
it with probability p(fallback) and otherwise draws its own token from p with the
fallback removed. It costs no extra model call, since the target scores γ+1 positions
either way; it only rarely gains a token. :func:`lookup` returns each proposal's match
length (0: no match), so callers can count matched and unmatched proposals
(:func:`proposals_along` does it along a finished output); the loop's own counters
(``drafted``/``accepted``) do not separate them, since the contract returns no draft
metrics.

Copy first, model when no match (:func:`bind` with a ``backoff`` model): the
composite runs the lookup and the backoff draft on every forward (the model draft
must see every token to keep its KV cache whole, so it saves no draft compute) and
returns the copy's point mass where a match exists and the model's logits elsewhere.
Exact for the same reason: per position q is either the one-hot or the model's
distribution, chosen by a deterministic function of the prefix.

Cache: the token history ``[B, max_len]`` and ``lengths`` as every model's, plus the
source tokens ``[B, S]`` and their mask. Rollback is the contract's O(1)
``api.rollback``: a query at position j reads only history positions ≤ j, so stale
slots past ``lengths`` are never read.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_core.models import api, t5
from specdec_core.models.api import rollback

FAMILY = "copy"  # the ``family`` of a copy draft's ModelSpec / BoundModel


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackoffSpec:
    """The model draft a composite falls back to (what ``bound.load_model`` takes)."""

    name: str
    family: str  # "t5" | "decoder"
    config: Any
    checkpoint: str | None = None
    init_seed: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptLookupConfig:
    """A copy draft; hashable, so it can be part of a static jit argument."""

    vocab_size: int
    n_max: int = 3  # longest suffix looked up
    n_min: int = 1  # shortest suffix that counts as a match
    fallback_token: int = t5.EOS_ID  # proposed (q = 1) where nothing matches
    pad_id: int = t5.PAD_ID  # source tokens equal to it are padding and never match
    backoff: BackoffSpec | None = None  # copy first, this model draft when no match

    def __post_init__(self):
        if self.vocab_size < 1:
            raise ValueError(f"copy draft: vocab_size must be >= 1, got {self.vocab_size}")
        if not 1 <= self.n_min <= self.n_max:
            raise ValueError(
                f"copy draft: need 1 <= n_min <= n_max, got n_min={self.n_min}, n_max={self.n_max}"
            )
        if not 0 <= self.fallback_token < self.vocab_size:
            raise ValueError(
                f"copy draft: fallback_token must lie in [0, {self.vocab_size}), "
                f"got {self.fallback_token}"
            )


@flax.struct.dataclass
class PromptLookupCache:
    history: jax.Array  # [B, max_len] int32: output tokens written so far (stale past lengths)
    lengths: jax.Array  # [B] int32: committed positions per row
    source: jax.Array  # [B, S] int32: source tokens (S may be 0)
    source_mask: jax.Array  # [B, S] bool: real source tokens (False: padding)


@flax.struct.dataclass
class CopyThenModelCache:
    copy: PromptLookupCache
    model: Any  # the backoff draft's cache
    lengths: jax.Array  # [B] int32: the one length both inner caches follow


def init_cache(
    batch_size: int, max_len: int, source=None, *, source_lengths=None, pad_id: int = 0
) -> PromptLookupCache:
    """An empty cache; ``source`` [B, S] int32 (or None: no source). The source mask is
    ``source_lengths`` when given, else ``source != pad_id``."""
    if source is None:
        source = np.zeros((batch_size, 0), np.int32)
    source = jnp.asarray(source, jnp.int32)
    if source.ndim != 2 or source.shape[0] != batch_size:
        raise ValueError(f"copy draft: source must be [B={batch_size}, S], got {source.shape}")
    if source_lengths is None and source.shape[1]:  # padded as models' caches are
        extra = api.source_width(source.shape[1]) - source.shape[1]
        source = jnp.pad(source, ((0, 0), (0, extra)), constant_values=pad_id)
    if source_lengths is None:
        mask = source != pad_id
    else:
        lengths = jnp.asarray(source_lengths, jnp.int32)
        mask = jnp.arange(source.shape[1])[None, :] < lengths[:, None]
    return PromptLookupCache(
        history=jnp.zeros((batch_size, max_len), jnp.int32),
        lengths=jnp.zeros((batch_size,), jnp.int32),
        source=source,
        source_mask=mask,
    )


def _suffix_match_lengths(windows, window_ok, suffix, suffix_ok):
    """Common-suffix lengths. windows [B, E, n] (corpus[e - m]), window_ok [B or 1, E, n],
    suffix [B, K, n] (query[j - m]), suffix_ok [B, K, n] -> int32 [B, K, E]."""
    equal = (windows[:, None] == suffix[:, :, None]) & window_ok[:, None] & suffix_ok[:, :, None]
    return jnp.cumprod(equal.astype(jnp.int32), axis=-1).sum(-1)


def lookup(config: PromptLookupConfig, cache: PromptLookupCache, tokens: jax.Array):
    """tokens [B, K] -> (proposals [B, K] int32, match_lengths [B, K] int32, cache).

    ``proposals[:, i]`` is the copy after ``tokens[:, i]`` (``fallback_token`` where
    ``match_lengths[:, i] == 0``, no match of ``n_min`` tokens or more); the cache
    advances by K as in ``forward``.
    """
    batch, k = tokens.shape
    max_len = cache.history.shape[1]
    n = config.n_max
    m = jnp.arange(n, dtype=jnp.int32)
    rows = jnp.arange(batch)[:, None]
    positions = cache.lengths[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]  # [B, K]
    history = cache.history.at[rows, positions].set(tokens.astype(jnp.int32), mode="drop")

    # The query suffix of position j: history[j - m], m = 0..n-1 (m = 0 is the new token).
    suffix_pos = positions[:, :, None] - m  # [B, K, n]
    suffix_ok = suffix_pos >= 0
    suffix = jnp.take_along_axis(
        history, jnp.clip(suffix_pos, 0, max_len - 1).reshape(batch, k * n), axis=1
    ).reshape(batch, k, n)

    # Output matches: windows ending at e <= j - 1 (the continuation history[e + 1] is known).
    ends = jnp.arange(max_len, dtype=jnp.int32)
    window_pos = ends[:, None] - m[None, :]  # [L, n]
    history_windows = history[:, jnp.clip(window_pos, 0, max_len - 1)]  # [B, L, n]
    history_len = _suffix_match_lengths(history_windows, (window_pos >= 0)[None], suffix, suffix_ok)
    history_len = jnp.where(ends[None, None, :] <= positions[:, :, None] - 1, history_len, 0)
    history_next = jnp.concatenate([history[:, 1:], jnp.zeros((batch, 1), jnp.int32)], 1)

    # Source matches: windows of real tokens followed by a real token.
    src_len = cache.source.shape[1]
    if src_len:
        src_ends = jnp.arange(src_len, dtype=jnp.int32)
        src_pos = src_ends[:, None] - m[None, :]  # [S, n]
        clipped = jnp.clip(src_pos, 0, src_len - 1)
        src_windows = cache.source[:, clipped]  # [B, S, n]
        src_ok = (src_pos >= 0)[None] & cache.source_mask[:, clipped]
        src_match = _suffix_match_lengths(src_windows, src_ok, suffix, suffix_ok)
        has_next = jnp.concatenate([cache.source_mask[:, 1:], jnp.zeros((batch, 1), bool)], 1)
        src_match = jnp.where(has_next[:, None, :], src_match, 0)
        src_next = jnp.concatenate([cache.source[:, 1:], jnp.zeros((batch, 1), jnp.int32)], 1)
        match = jnp.concatenate([src_match, history_len], -1)  # [B, K, S + L]
        following = jnp.concatenate([src_next, history_next], -1)  # [B, S + L]
    else:
        match, following = history_len, history_next

    # Longest first, then the latest (history after source): one argmax over a key.
    match = jnp.where(match >= config.n_min, match, 0)
    width = match.shape[-1]
    best = jnp.argmax(match * width + jnp.arange(width, dtype=jnp.int32), axis=-1)  # [B, K]
    match_lengths = jnp.take_along_axis(match, best[..., None], axis=-1)[..., 0]
    copied = jnp.take_along_axis(following, best, axis=1)
    proposals = jnp.where(match_lengths > 0, copied, config.fallback_token).astype(jnp.int32)
    return proposals, match_lengths, cache.replace(history=history, lengths=cache.lengths + k)


def point_mass_logits(tokens: jax.Array, vocab_size: int) -> jax.Array:
    """tokens [...] -> float32 [..., V]: 0 at the token, −inf elsewhere (q = one-hot)."""
    hot = jax.nn.one_hot(tokens, vocab_size, dtype=jnp.bool_)
    return jnp.where(hot, jnp.float32(0.0), -jnp.inf)


def forward(config: PromptLookupConfig, cache: PromptLookupCache, tokens: jax.Array):
    """tokens [B, K] -> (logits [B, K, V], cache): the model contract's forward."""
    proposals, _, cache = lookup(config, cache, tokens)
    return point_mass_logits(proposals, config.vocab_size), cache


def copy_then_model_forward(
    config: PromptLookupConfig, backoff_forward, cache: CopyThenModelCache, tokens: jax.Array
):
    """The composite's forward: the copy's point mass where a match exists, else the
    backoff draft's logits. Both inner caches follow the composite's ``lengths``."""
    copy_cache = rollback(cache.copy, cache.lengths)
    model_cache = rollback(cache.model, cache.lengths)
    proposals, match_lengths, copy_cache = lookup(config, copy_cache, tokens)
    model_logits, model_cache = backoff_forward(model_cache, tokens)
    logits = jnp.where(
        (match_lengths > 0)[..., None],
        point_mass_logits(proposals, config.vocab_size),
        model_logits.astype(jnp.float32),
    )
    return logits, CopyThenModelCache(
        copy=copy_cache, model=model_cache, lengths=copy_cache.lengths
    )


def proposals_along(
    config: PromptLookupConfig, tokens, lengths, source=None, *, source_lengths=None
) -> tuple[np.ndarray, np.ndarray]:
    """The copy draft's proposal after every position of finished sequences, in one call.

    tokens [B, T] int32 (decoder tokens from position 0, T5's start token included),
    lengths [B]: valid tokens per row; source [B, S] or None. Returns (proposals [B, T],
    match_lengths [B, T]); entry t is the proposal for token t + 1 given tokens[: t + 1],
    as the draft makes it during decoding. Entries at t ≥ lengths are meaningless.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    batch, width = tokens.shape
    cache = init_cache(batch, width, source, source_lengths=source_lengths, pad_id=config.pad_id)
    proposals, match_lengths, _ = jax.jit(functools.partial(lookup, config))(cache, tokens)
    del lengths  # positions at or past a row's length are the caller's to ignore
    return np.asarray(proposals), np.asarray(match_lengths)


def bound_forward(config: PromptLookupConfig, backoff=None):
    """The forward of the copy draft of ``config``; with ``backoff`` (a BoundModel), the
    composite's."""
    if backoff is None:
        return functools.partial(forward, config)
    return functools.partial(copy_then_model_forward, config, backoff.forward)


def cache_constructor(name: str, config: PromptLookupConfig, backoff=None):
    """``new_cache(encoder_tokens, batch_size, max_len)`` of the copy draft (the encoder
    tokens are its source); with ``backoff``, of the composite, whose vocabulary must be
    the backoff draft's."""
    if backoff is None:

        def new_cache(encoder_tokens, batch_size, max_len):
            return init_cache(batch_size, max_len, encoder_tokens, pad_id=config.pad_id)

        return new_cache
    if backoff.vocab_size != config.vocab_size:
        raise ValueError(
            f"copy draft {name!r}: vocab_size {config.vocab_size} but its backoff draft "
            f"{backoff.name!r} has {backoff.vocab_size}"
        )

    def new_composite_cache(encoder_tokens, batch_size, max_len):
        copy = init_cache(batch_size, max_len, encoder_tokens, pad_id=config.pad_id)
        model = backoff.new_cache(encoder_tokens, batch_size, max_len)
        return CopyThenModelCache(copy=copy, model=model, lengths=copy.lengths)

    return new_composite_cache
