"""A tiny table-lookup language model that follows the model contract.

Used as the stub model of fast tests and loop benchmarks (like gemma's ``DummyGemma``):
the next-token logits at position t are a table lookup on (token at t-1, token at t,
t mod period). Reading the token at t-1 back from the cache makes a broken rollback or
a stale slot visible in the output, and the table makes the exact sequence
distribution computable by enumeration (``sequence_logits``).

``work_dim``/``work_layers`` add a dense computation of tunable cost to every forward
(its result enters the logits multiplied by 0.0, which XLA cannot fold away), so a
benchmark can give the stub the step time of a real model. The work does not grow
with K: the stub models the paper's assumption that verifying γ+1 tokens costs about
one step.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class TableCache:
    history: jax.Array  # [B, max_len] int32: tokens written so far (stale past lengths)
    lengths: jax.Array  # [B] int32: committed positions per row


@flax.struct.dataclass
class TableParams:
    table: (
        jax.Array
    )  # [V + 1, V, P, V] float32: logits by (previous token or V=start, token, t mod P)
    work: jax.Array  # [work_layers, work_dim, work_dim] float32: cost-only weights


def init_params(
    key,
    *,
    vocab_size: int,
    period: int = 2,
    scale: float = 2.0,
    work_dim: int = 0,
    work_layers: int = 0,
) -> TableParams:
    """Random logits table ~ N(0, scale²); ``scale`` sets how peaked the model is."""
    k_table, k_work = jax.random.split(key)
    table = scale * jax.random.normal(k_table, (vocab_size + 1, vocab_size, period, vocab_size))
    work = jax.random.normal(k_work, (work_layers, work_dim, work_dim)) / max(work_dim, 1) ** 0.5
    return TableParams(table=table.astype(jnp.float32), work=work.astype(jnp.float32))


def from_table(table) -> TableParams:
    """Params for a given logits table ``[V + 1, V, P, V]`` with no extra work."""
    return TableParams(
        table=jnp.asarray(table, jnp.float32), work=jnp.zeros((0, 0, 0), jnp.float32)
    )


def init_cache(batch_size: int, max_len: int) -> TableCache:
    return TableCache(
        history=jnp.zeros((batch_size, max_len), jnp.int32),
        lengths=jnp.zeros((batch_size,), jnp.int32),
    )


def forward(params: TableParams, cache: TableCache, tokens: jax.Array):
    """tokens [B, K] int32 -> (logits [B, K, V], cache); the model contract's forward."""
    vocab_plus_1, _, period, _ = params.table.shape
    batch, k = tokens.shape
    positions = cache.lengths[:, None] + jnp.arange(k, dtype=jnp.int32)[None, :]  # [B, K]
    rows = jnp.arange(batch)[:, None]
    history = cache.history.at[rows, positions].set(tokens, mode="drop")
    prev = jnp.where(positions > 0, history[rows, jnp.maximum(positions - 1, 0)], vocab_plus_1 - 1)
    logits = params.table[prev, tokens, positions % period]  # [B, K, V]
    if params.work.shape[0]:
        # [B, D]: pooled over the K positions, so the work costs about the same at any K,
        # like a memory-bound step of a real model.
        x = jnp.broadcast_to(tokens.mean(1, keepdims=True), (batch, params.work.shape[1]))
        for layer in range(params.work.shape[0]):
            x = jnp.tanh(x @ params.work[layer])
        logits = logits + 0.0 * x.sum(-1)[:, None, None]
    return logits, TableCache(history=history, lengths=cache.lengths + k)


def sequence_logits(table: np.ndarray, prefix: list[int], continuation: list[int]) -> np.ndarray:
    """Uncached reference: logits [len(continuation), V] predicting each continuation token.

    ``prefix`` is the prompt (at least one token); row i predicts ``continuation[i]``.
    """
    seq = list(prefix) + list(continuation)
    vocab_size, period = table.shape[1], table.shape[2]
    out = []
    for t in range(len(prefix) - 1, len(seq) - 1):
        prev = seq[t - 1] if t > 0 else vocab_size
        out.append(table[prev, seq[t], t % period])
    return np.stack(out)
