"""Transformer building blocks as pure functions over explicit param pytrees.

Params are plain nested dicts with T5X's names (``t5x/examples/t5/network.py``):

- a dense layer is ``{"kernel": [in, out]}`` plus an optional ``"bias": [out]`` (T5X has
  no biases; GPT-2 does). Attention projections keep T5X's flattened 2-D kernels:
  ``query/key/value: [embed, heads * head_dim]``, ``out: [heads * head_dim, embed]``.
- an attention block is ``{"query", "key", "value", "out"}`` of dense layers;
- an MLP is ``{"wi_0", "wi_1", ..., "wo"}`` (or ``{"wi", "wo"}`` with one activation);
- an RMS norm is ``{"scale": [embed]}``; a LayerNorm is ``{"scale", "bias"}``.

Numerics follow T5X: norms and softmax run in float32, matmuls in the activation
``dtype`` (params may be float32 and are cast), attention logits are NOT scaled by
1/sqrt(head_dim) unless the caller passes ``query_scale`` (T5X folds that factor into
the query initializer), masks become an additive bias of -1e10.

Shapes: B batch, Q query positions, S key positions, L max cache length, K new tokens,
E embed, H heads, D head_dim, F mlp_dim. Positions are absolute token indices.

KV caches are fixed-size heads-major buffers ``[B, H, L, D]`` written at per-row offsets
``lengths: int32[B]`` (see ``specdec_core.models.api``); slots at or past a row's
``lengths + K`` are stale and masked by ``cache_attention_mask``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Params = Mapping[str, Any]

MASK_VALUE = -1e10  # T5X's additive bias for masked attention logits


# ------------------------------------------------------------------------ reductions


def ordered_sum(x: jax.Array, *, keepdims: bool = False) -> jax.Array:
    """Sum over the last axis in one fixed order: x [..., n] -> [...] (or [..., 1]).

    The elements are added pairwise, first half to second half, after zero padding to a
    power of two. XLA's CPU reduce picks its order of summation from the whole array's
    size, so with a plain ``sum`` a row's norm or softmax changed with the number of
    rows or queries beside it; here every output is the same expression of its own row
    whatever the shape around it, so a row's logits are the same bits at any call
    length and batch size.
    """
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, width - n)])
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x if keepdims else x[..., 0]


def ordered_mean(x: jax.Array) -> jax.Array:
    """Mean over the last axis in :func:`ordered_sum`'s order: [..., n] -> [..., 1]."""
    return ordered_sum(x, keepdims=True) / x.shape[-1]


def softmax(logits: jax.Array) -> jax.Array:
    """Softmax over the last axis, its sum in :func:`ordered_sum`'s order."""
    shifted = jnp.exp(logits - jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True)))
    return shifted / ordered_sum(shifted, keepdims=True)


# ----------------------------------------------------------------------------- norms


def rms_norm(params: Params, x: jax.Array, *, epsilon: float = 1e-6, dtype=None) -> jax.Array:
    """T5 RMS layer norm (scale only, no mean subtraction, no bias).

    x: [..., E] -> [..., E] in ``dtype`` (default: x.dtype). Statistics in float32.
    """
    dtype = dtype or x.dtype
    x32 = x.astype(jnp.float32)
    mean2 = ordered_mean(jnp.square(x32))
    y = (x32 * jax.lax.rsqrt(mean2 + epsilon)).astype(dtype)
    return y * params["scale"].astype(dtype)


def layer_norm(params: Params, x: jax.Array, *, epsilon: float = 1e-5, dtype=None) -> jax.Array:
    """Standard LayerNorm (GPT-2 style) with ``scale`` and optional ``bias``.

    x: [..., E] -> [..., E] in ``dtype`` (default: x.dtype). Statistics in float32.
    """
    dtype = dtype or x.dtype
    x32 = x.astype(jnp.float32)
    mean = ordered_mean(x32)
    var = ordered_mean(jnp.square(x32 - mean))
    y = ((x32 - mean) * jax.lax.rsqrt(var + epsilon)).astype(dtype)
    y = y * params["scale"].astype(dtype)
    if "bias" in params:
        y = y + params["bias"].astype(dtype)
    return y


# ------------------------------------------------------------------- dense, embed, MLP


MATMUL_DTYPES = ("float32", "bfloat16")  # a model config's ``matmul_dtype``


def check_matmul_dtype(value: str) -> None:
    """Raises ValueError naming the field unless ``value`` is in :data:`MATMUL_DTYPES`."""
    if value not in MATMUL_DTYPES:
        raise ValueError(f"matmul_dtype must be one of {MATMUL_DTYPES}, got {value!r}")


# The fewest rows a bfloat16 matmul is computed on (:meth:`Bfloat16Weight.contract`):
# XLA's CPU kernels for one row (all CPUs) and for two rows (CPUs with AMX) sum in
# another order than the kernel every larger call runs; four leaves a margin.
MIN_MATMUL_ROWS = 4


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Bfloat16Weight:
    """A weight matrix for matmuls on bfloat16 inputs with float32 sums (a config's
    ``matmul_dtype: bfloat16``; TPU's default precision for float32 matmuls).

    On a CPU, XLA's bfloat16 matrix kernels make a call on a few tokens cost about
    what one token's does (BENCHMARKS.md, "bfloat16 matmuls"). XLA picks the kernel by
    the number of rows: one row becomes a float32 matrix-vector product, and on CPUs
    with AMX the library kernel for two rows sums in another order than the one for
    three or more. So a call on fewer than :data:`MIN_MATMUL_ROWS` rows is padded with
    zero rows up to it, and every call runs the same kernel: a row's result is then the
    same bits whatever the number of rows beside it (with
    :attr:`Heads.pair_single_query`), and a decode's one-token and γ+1-token calls agree
    exactly. Otherwise the kernels' different orders of summation give logit
    differences large enough to flip a greedy near-tie.
    """

    bf16: jax.Array
    # A token embedding's rows as their 16-bit patterns, for lookups (:func:`embed`).
    # XLA's CPU backend gathers no bfloat16: from ``bf16`` it widened (or, bitcast
    # inside the program, copied) the whole table once per program run, on every batch
    # and decode loop.
    bits: jax.Array | None = None

    @classmethod
    def of(cls, weight: jax.Array, *, table: bool = False) -> Bfloat16Weight:
        """``weight`` rounded to bfloat16; ``table``: also its rows' bit patterns."""
        bf16 = jnp.asarray(weight).astype(jnp.bfloat16)
        bits = jax.lax.bitcast_convert_type(bf16, jnp.uint16) if table else None
        return cls(bf16=bf16, bits=bits)

    def contract(self, x: jax.Array, axis: int) -> jax.Array:
        """x [..., n] contracted with this weight's dimension ``axis`` (of size n),
        float32 out."""
        lead = x.shape[:-1]
        rows = x.astype(jnp.float32).astype(jnp.bfloat16).reshape(-1, x.shape[-1])
        count = rows.shape[0]
        if count < MIN_MATMUL_ROWS:
            rows = jnp.pad(rows, ((0, MIN_MATMUL_ROWS - count), (0, 0)))
        dims = (((1,), (axis,)), ((), ()))
        out = jax.lax.dot_general(rows, self.bf16, dims, preferred_element_type=jnp.float32)
        return out[:count].reshape(*lead, out.shape[-1])


def matmul_weights(params: Params, matmul_dtype: str) -> Params:
    """``params`` as a model's forward takes them for ``matmul_dtype`` (a config's
    field, :data:`MATMUL_DTYPES`): as they are for float32; every dense ``kernel`` and
    token ``embedding`` as a :class:`Bfloat16Weight` for bfloat16."""
    check_matmul_dtype(matmul_dtype)
    if matmul_dtype == "float32":
        return params

    def convert(tree):
        if not isinstance(tree, Mapping):
            return tree
        return {
            key: Bfloat16Weight.of(value, table=key == "embedding")
            if key in ("kernel", "embedding")
            else convert(value)
            for key, value in tree.items()
        }

    return convert(params)


def dense(params: Params, x: jax.Array, *, dtype=None) -> jax.Array:
    """x: [..., in] @ kernel [in, out] (+ bias [out]) -> [..., out] in ``dtype``."""
    dtype = dtype or x.dtype
    kernel = params["kernel"]
    if isinstance(kernel, Bfloat16Weight):
        y = kernel.contract(x, 0).astype(dtype)
    else:
        y = jnp.dot(x.astype(dtype), kernel.astype(dtype))
    if "bias" in params:
        y = y + params["bias"].astype(dtype)
    return y


def embed(embedding: jax.Array | Bfloat16Weight, tokens: jax.Array, *, dtype) -> jax.Array:
    """Token lookup: embedding [V, E], tokens int [...] -> [..., E] in ``dtype``."""
    if isinstance(embedding, Bfloat16Weight) and embedding.bits is not None:
        rows = jnp.take(embedding.bits, tokens, axis=0)  # see Bfloat16Weight.bits
        return jax.lax.bitcast_convert_type(rows, jnp.bfloat16).astype(dtype)
    if isinstance(embedding, Bfloat16Weight):
        embedding = embedding.bf16
    return jnp.take(embedding, tokens, axis=0).astype(dtype)


def attend(embedding: jax.Array | Bfloat16Weight, x: jax.Array) -> jax.Array:
    """Logits via the (tied) embedding, float32: x [..., E] @ embedding.T -> [..., V]."""
    if isinstance(embedding, Bfloat16Weight):
        return embedding.contract(x, 1)
    return jnp.dot(x.astype(jnp.float32), embedding.astype(jnp.float32).T)


def activation_fn(name: str):
    """T5X activation names: 'gelu' (tanh approximation, as flax's ``nn.gelu``),
    'gelu_exact', 'relu', 'silu'/'swish', 'linear'."""
    table = {
        "gelu": lambda x: jax.nn.gelu(x, approximate=True),
        "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
        "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
        "relu": jax.nn.relu,
        "silu": jax.nn.silu,
        "swish": jax.nn.silu,
        "linear": lambda x: x,
    }
    if name not in table:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(table)}")
    return table[name]


def mlp_input_names(activations: Sequence[str]) -> list[str]:
    """T5X names of the input projections: ``wi`` for one activation, else ``wi_0..``."""
    if len(activations) == 1:
        return ["wi"]
    return [f"wi_{i}" for i in range(len(activations))]


def mlp(params: Params, x: jax.Array, *, activations: Sequence[str], dtype=None) -> jax.Array:
    """T5X MlpBlock: prod_i act_i(x @ wi_i) @ wo.

    ``activations=("gelu", "linear")`` is T5 1.1's gated-GELU; ``("gelu",)`` is GPT's
    plain MLP (params ``wi``, ``wo``). x: [..., E] -> [..., E].
    """
    dtype = dtype or x.dtype
    hidden = None
    for name, act in zip(mlp_input_names(activations), activations, strict=True):
        h = activation_fn(act)(dense(params[name], x, dtype=dtype))  # [..., F]
        hidden = h if hidden is None else hidden * h
    return dense(params["wo"], hidden, dtype=dtype)


# --------------------------------------------------------- relative position bias


def relative_position_bucket(
    relative_position: np.ndarray,
    *,
    bidirectional: bool,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> np.ndarray:
    """T5's bucketing of ``memory_position - query_position`` (numpy, int32).

    Half the buckets are exact small distances, the rest logarithmic up to
    ``max_distance``; bidirectional uses separate halves for keys after the query.
    Computed in numpy with T5X's float32 expression so bucket edges match T5X.
    """
    n = -np.asarray(relative_position, dtype=np.int32)
    ret = np.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0).astype(np.int32) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    log_ratio = np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
    val_if_large = max_exact + (
        log_ratio / np.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(np.int32)
    val_if_large = np.minimum(val_if_large, num_buckets - 1)
    return (ret + np.where(is_small, n, val_if_large)).astype(np.int32)


def _bucket_table(*, bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
    """Bucket of every relative position in [-max_distance, max_distance]: int32[2M+1].

    Buckets are constant beyond ``max_distance``, so clipping to this range is exact.
    """
    rel = np.arange(-max_distance, max_distance + 1, dtype=np.int32)
    return relative_position_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )


def relative_position_bias(
    rel_embedding: jax.Array,
    query_positions: jax.Array,
    key_positions: jax.Array,
    *,
    bidirectional: bool,
    max_distance: int = 128,
    dtype=jnp.float32,
) -> jax.Array:
    """T5 relative position bias for arbitrary absolute positions.

    rel_embedding: [H, num_buckets]; query_positions: int [..., Q]; key_positions:
    int [..., S] (leading dims broadcast, e.g. [B, K] against [L]) -> [..., H, Q, S].
    Positions may be traced values (decode offsets); the bucketing is a constant table.
    """
    num_buckets = rel_embedding.shape[-1]
    table = jnp.asarray(
        _bucket_table(
            bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
    )
    rel = key_positions[..., None, :] - query_positions[..., :, None]  # [..., Q, S]
    buckets = table[jnp.clip(rel, -max_distance, max_distance) + max_distance]  # [..., Q, S]
    bias = jnp.take(rel_embedding.astype(dtype), buckets, axis=-1)  # [H, ..., Q, S]
    return jnp.moveaxis(bias, 0, -3)  # [..., H, Q, S]


# ----------------------------------------------------------------------- attention


def mask_to_bias(mask: jax.Array, dtype=jnp.float32) -> jax.Array:
    """Boolean mask (True = attend) -> additive bias (0 or -1e10), same shape."""
    return jnp.where(mask, jnp.zeros((), dtype), jnp.full((), MASK_VALUE, dtype))


def attention_mask(query_valid: jax.Array, key_valid: jax.Array) -> jax.Array:
    """Padding mask as T5X's ``make_attention_mask``: [B, Q], [B, S] -> bool [B, 1, Q, S]."""
    return (query_valid[:, :, None] & key_valid[:, None, :])[:, None]


def causal_mask(query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
    """Key position <= query position: [..., Q], [..., S] -> bool [..., 1, Q, S]."""
    return (key_positions[..., None, :] <= query_positions[..., :, None])[..., None, :, :]


def cache_attention_mask(lengths: jax.Array, num_new: int, max_len: int) -> jax.Array:
    """Self-attention mask over a KV cache after writing ``num_new`` tokens per row.

    Query t of row b sits at position lengths[b] + t and attends to slots <= that
    position, which also masks every stale slot (>= lengths[b] + num_new).
    lengths: int32[B] -> bool [B, 1, K, L].
    """
    query_positions = lengths[:, None] + jnp.arange(num_new, dtype=lengths.dtype)  # [B, K]
    return causal_mask(query_positions, jnp.arange(max_len, dtype=lengths.dtype))


@dataclasses.dataclass(frozen=True)
class Heads:
    """How a model's attention blocks split and scale (the same for all of its blocks)."""

    num: int  # H
    query_scale: float = 1.0  # on the logits; T5X: 1 (no 1/sqrt(D): folded into the init)
    dtype: Any = None  # the projections' compute dtype; None: the params'
    # A one-query call attends as a two-query one (the query twice): XLA's CPU kernels
    # for one query sum in another order, and bfloat16 matmuls (Bfloat16Weight) need
    # every call's rows to come out the same bits whatever the call's length.
    pair_single_query: bool = False


def split_heads(x: jax.Array, num_heads: int) -> jax.Array:
    """[..., H * D] -> [..., H, D]."""
    return x.reshape(*x.shape[:-1], num_heads, x.shape[-1] // num_heads)


def project_kv(params: Params, x: jax.Array, heads: Heads) -> tuple[jax.Array, jax.Array]:
    """Keys and values of an attention block: x [B, S, E] -> ([B, S, H, D], [B, S, H, D])."""
    key = split_heads(dense(params["key"], x, dtype=heads.dtype), heads.num)
    value = split_heads(dense(params["value"], x, dtype=heads.dtype), heads.num)
    return key, value


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None,
    *,
    query_scale: float = 1.0,
    kv_heads_major: bool = False,
    pair_single_query: bool = False,
) -> jax.Array:
    """softmax(q·k * query_scale + bias) · v, logits and softmax in float32.

    query: [B, Q, H, D]; key, value: [B, S, H, D] ([B, H, S, D] with ``kv_heads_major``,
    a cache's layout); bias: broadcastable to [B, H, Q, S] -> [B, Q, H, D] in query's
    dtype. T5X uses ``query_scale=1`` (no 1/sqrt(D)).
    """
    # Every operand goes in heads-major ([B, H, ·, D]) and the result comes out so, then
    # back to [B, Q, H, D]: XLA's CPU dots take the head as a batch dimension only in
    # that layout. Mixed layouts ("bqhd,bhsd->bhqs") cost several times as much, in
    # decoding and in a training forward (BENCHMARKS.md, "Attention layout").
    if not kv_heads_major:
        key, value = key.transpose(0, 2, 1, 3), value.transpose(0, 2, 1, 3)
    single = pair_single_query and query.shape[1] == 1
    if single:
        query = jnp.concatenate([query, query], axis=1)
    query = query.transpose(0, 2, 1, 3)  # [B, H, Q, D]
    logits = jnp.einsum("bhqd,bhsd->bhqs", query, key, preferred_element_type=jnp.float32)
    if query_scale != 1.0:
        logits = logits * query_scale
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)
    weights = softmax(logits).astype(value.dtype)  # [B, H, Q, S]
    out = jnp.einsum("bhqs,bhsd->bhqd", weights, value).transpose(0, 2, 1, 3)
    return out[:, :1] if single else out


def attention_over(
    params: Params,
    x: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None,
    heads: Heads,
    *,
    kv_heads_major: bool = True,
) -> jax.Array:
    """An attention block's queries from x [B, Q, E] over given keys and values
    ([B, H, S, D], a cache's layout; [B, S, H, D] unless ``kv_heads_major``), merged and
    projected out -> [B, Q, E]. T5's cross-attention over its encoder's keys and values,
    and the last half of the two self-attentions below."""
    query = split_heads(dense(params["query"], x, dtype=heads.dtype), heads.num)
    attended = dot_product_attention(
        query,
        key.astype(query.dtype),
        value.astype(query.dtype),
        bias,
        query_scale=heads.query_scale,
        kv_heads_major=kv_heads_major,
        pair_single_query=heads.pair_single_query,
    )
    merged = attended.reshape(*attended.shape[:-2], -1)  # [B, Q, H·D]
    return dense(params["out"], merged, dtype=heads.dtype)


def multi_head_attention(
    params: Params, inputs_q: jax.Array, inputs_kv: jax.Array, bias: jax.Array | None, heads: Heads
) -> jax.Array:
    """Uncached attention (T5X ``MultiHeadDotProductAttention``).

    inputs_q: [B, Q, E]; inputs_kv: [B, S, E]; bias: additive, broadcastable to
    [B, H, Q, S] (masks via ``mask_to_bias`` plus any position bias) -> [B, Q, E].
    """
    key, value = project_kv(params, inputs_kv, heads)
    return attention_over(params, inputs_q, key, value, bias, heads, kv_heads_major=False)


def write_cache(buffer: jax.Array, new: jax.Array, lengths: jax.Array) -> jax.Array:
    """Writes new [B, K, H, D] into a cache buffer [B, H, L, D] at slots lengths[b] ..
    lengths[b]+K-1.

    The cache is heads-major, the layout the attention's dot reads: a [B, L, H, D] cache
    made XLA rewrite every layer's whole keys and values into it on every decode step.
    Writes past L are dropped (callers keep lengths + K <= L).
    """
    positions = lengths[:, None] + jnp.arange(new.shape[1], dtype=lengths.dtype)  # [B, K]
    rows = jnp.arange(new.shape[0])[:, None]
    # the advanced indices (rows, positions) are split by a slice: their [B, K] comes first
    return buffer.at[rows, :, positions].set(new.astype(buffer.dtype), mode="drop")


def cached_self_attention(
    params: Params,
    x: jax.Array,
    key_cache: jax.Array,
    value_cache: jax.Array,
    lengths: jax.Array,
    bias: jax.Array | None,
    heads: Heads,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Self-attention of K new tokens per row over a fixed-size KV cache.

    x: [B, K, E] new tokens at positions lengths[b] + t; key_cache, value_cache:
    [B, H, L, D] (heads-major, :func:`write_cache`); lengths: int32[B] (positions held
    before this call); bias: additive, broadcastable to [B, H, K, L], which MUST include
    the ``cache_attention_mask``
    (as ``mask_to_bias``) plus any relative position bias.
    Returns (out [B, K, E], key_cache, value_cache) with the K new slots written.
    """
    key, value = project_kv(params, x, heads)  # [B, K, H, D]
    key_cache = write_cache(key_cache, key, lengths)
    value_cache = write_cache(value_cache, value, lengths)
    return attention_over(params, x, key_cache, value_cache, bias, heads), key_cache, value_cache


# ------------------------------------------------------------------------ init helpers


def variance_scaling(key, shape, *, fan_in: int, scale: float = 1.0, dtype=jnp.float32):
    """Truncated-normal init with variance scale/fan_in (T5X's kernel init)."""
    stddev = np.sqrt(scale / fan_in) / 0.87962566103423978  # truncated-normal correction
    return (stddev * jax.random.truncated_normal(key, -2.0, 2.0, shape)).astype(dtype)


def init_dense(key, in_dim: int, out_dim: int, *, scale: float = 1.0, bias: bool = False):
    """{'kernel': [in, out]} (+ zero 'bias' [out])."""
    params = {"kernel": variance_scaling(key, (in_dim, out_dim), fan_in=in_dim, scale=scale)}
    if bias:
        params["bias"] = jnp.zeros((out_dim,), jnp.float32)
    return params


def init_attention(key, *, emb_dim: int, num_heads: int, head_dim: int, bias: bool = False):
    """T5X attention params; the query init carries T5X's 1/sqrt(head_dim) factor."""
    kq, kk, kv, ko = jax.random.split(key, 4)
    inner = num_heads * head_dim
    return {
        "query": init_dense(kq, emb_dim, inner, scale=1.0 / head_dim, bias=bias),
        "key": init_dense(kk, emb_dim, inner, bias=bias),
        "value": init_dense(kv, emb_dim, inner, bias=bias),
        "out": init_dense(ko, inner, emb_dim, bias=bias),
    }


def init_mlp(key, *, emb_dim: int, mlp_dim: int, activations: Sequence[str], bias: bool = False):
    """T5X MlpBlock params: ``wi``/``wi_i`` [E, F] and ``wo`` [F, E]."""
    names = mlp_input_names(activations)
    keys = jax.random.split(key, len(names) + 1)
    params = {
        n: init_dense(k, emb_dim, mlp_dim, bias=bias) for n, k in zip(names, keys, strict=False)
    }
    params["wo"] = init_dense(keys[-1], mlp_dim, emb_dim, bias=bias)
    return params


def init_relpos(key, *, num_heads: int, num_buckets: int = 32):
    """{'rel_embedding': [H, num_buckets]} (fan-avg uniform, as T5X)."""
    limit = np.sqrt(3.0 * 2.0 / (num_heads + num_buckets))
    table = jax.random.uniform(key, (num_heads, num_buckets), minval=-limit, maxval=limit)
    return {"rel_embedding": table}
