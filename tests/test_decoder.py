"""Decoder-only transformers (GPT-like, LaMDA-style): cached decoding equals uncached score."""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from specdec_core.models import api


def assert_cached_matches_uncached(
    forward: Callable,
    cache,
    tokens: np.ndarray,
    reference_logits: np.ndarray,
    prompt_lengths: np.ndarray,
    *,
    seed: int,
    vocab_size: int,
    block_sizes=(1, 2, 3, 5),
    atol: float = 1e-5,
    rtol: float = 1e-5,
) -> int:
    """Decodes ``tokens`` [B, L] through ``forward`` and checks every logit against
    ``reference_logits`` [B, L, V] (the uncached model on the same tokens).

    Prefill writes the longest prompt in every row, then rolls each row back to its own
    ``prompt_lengths`` (ragged rows). Each later block writes K tokens per row starting
    at that row's length: a random n ∈ [1, K] true tokens, then K − n random ("rejected
    draft") tokens; only the n true positions are compared, and the row is rolled back
    to length + n. So stale slots always hold wrong tokens, and a cache that attends to
    them, or writes at the wrong position, fails. Returns the number of positions
    compared.
    """
    rng = np.random.default_rng(seed)
    batch, total_len = tokens.shape
    rows = np.arange(batch)
    max_prompt = int(prompt_lengths.max())
    logits, cache = forward(cache, jnp.asarray(tokens[:, :max_prompt]))
    compared = 0
    for b in rows:
        np.testing.assert_allclose(
            np.asarray(logits[b, : prompt_lengths[b]], np.float32),
            reference_logits[b, : prompt_lengths[b]],
            atol=atol,
            rtol=rtol,
            err_msg=f"prefill row {b}",
        )
        compared += int(prompt_lengths[b])
    cache = api.rollback(cache, jnp.asarray(prompt_lengths, jnp.int32))
    lengths = prompt_lengths.astype(np.int64).copy()
    while lengths.min() < total_len:
        k = int(rng.choice(block_sizes))
        n_true = rng.integers(1, k + 1, size=batch)
        n_true = np.minimum(n_true, np.maximum(total_len - lengths, 0))  # [B]; 0 once done
        positions = lengths[:, None] + np.arange(k)[None, :]  # [B, K]
        block = rng.integers(0, vocab_size, size=(batch, k))
        true_part = np.arange(k)[None, :] < n_true[:, None]
        block = np.where(
            true_part, tokens[rows[:, None], np.minimum(positions, total_len - 1)], block
        )
        logits, cache = forward(cache, jnp.asarray(block, jnp.int32))
        for b in rows:
            n = int(n_true[b])
            np.testing.assert_allclose(
                np.asarray(logits[b, :n], np.float32),
                reference_logits[b, lengths[b] : lengths[b] + n],
                atol=atol,
                rtol=rtol,
                err_msg=f"row {b} positions {lengths[b]}..{lengths[b] + n} (block {k})",
            )
            compared += n
        lengths = lengths + n_true
        cache = api.rollback(cache, jnp.asarray(lengths, jnp.int32))
    return compared
