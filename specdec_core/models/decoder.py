"""Decoder-only transformers for the acceptance studies: GPT-like and LaMDA-style.

Both variants follow the model contract of ``specdec_core.models.api``::

    forward(config, params, cache, tokens[B, K]) -> (logits[B, K, V], cache)

(bind ``config`` and ``params`` with ``functools.partial`` before handing it to
decoding), and ``score(config, params, tokens[B, L]) -> logits[B, L, V]`` is the
uncached causal pass used for training and as the reference of the cache tests.

Variants (``DecoderConfig.variant``):

- ``"gpt"`` — GPT-2: learned absolute position embeddings (``max_len`` of them),
  pre-LayerNorm with bias (eps 1e-5), attention and MLP with biases, GELU MLP (tanh
  approximation, GPT-2's ``gelu_new``), attention logits scaled by 1/sqrt(head_dim),
  output logits via the tied token embedding (no extra scaling).
- ``"lamda"`` — LaMDA-style, numerics of T5X's decoder-only example network: RMS norm
  (scale only, eps 1e-6), no biases, gated-GELU MLP (``wi_0`` gelu × ``wi_1`` linear),
  a T5 relative position bias shared by all layers (causal buckets), no attention
  scaling (T5X folds 1/sqrt(head_dim) into the query init), logits via the tied
  embedding divided by sqrt(emb_dim) (T5X's shared-embedding case) or a separate
  ``logits_dense`` when ``logits_via_embedding=False``.

Param tree: plain nested dicts with T5X's decoder-only names (``layers.py`` describes
the leaves). E = emb_dim, H = num_heads, D = head_dim, F = mlp_dim, V = vocab_size,
P = max_len, N = num_layers, "[gpt]" marks leaves only the GPT variant has::

    decoder/
      token_embedder/embedding                 [V, E]
      position_embedder/embedding              [P, E]      gpt only
      relpos_bias/rel_embedding                [H, 32]     lamda only
      layers_{i}/  (i = 0 .. N-1)
        pre_self_attention_layer_norm/scale    [E]         (+ bias [E] gpt)
        self_attention/{query,key,value}/kernel [E, H*D]   (+ bias [H*D] gpt)
        self_attention/out/kernel              [H*D, E]    (+ bias [E] gpt)
        pre_mlp_layer_norm/scale               [E]         (+ bias [E] gpt)
        mlp/wi/kernel                          [E, F]      gpt (+ bias [F])
        mlp/wi_0/kernel, mlp/wi_1/kernel       [E, F]      lamda
        mlp/wo/kernel                          [F, E]      (+ bias [E] gpt)
      decoder_norm/scale                       [E]         (+ bias [E] gpt)
      logits_dense/kernel                      [E, V]      only if not logits_via_embedding

HF GPT-2 (``GPT2LMHeadModel``, ``transformer.`` prefix) maps onto the gpt tree as:
``wte.weight`` → token_embedder/embedding; ``wpe.weight`` → position_embedder/embedding;
``h.{i}.ln_1.{weight,bias}`` → layers_{i}/pre_self_attention_layer_norm/{scale,bias};
``h.{i}.attn.c_attn.{weight [E, 3E], bias [3E]}`` split in three along the last axis →
self_attention/{query,key,value}/{kernel,bias} (HF's Conv1D weight is already
[in, out]); ``h.{i}.attn.c_proj`` → self_attention/out; ``h.{i}.ln_2`` →
pre_mlp_layer_norm; ``h.{i}.mlp.c_fc`` → mlp/wi; ``h.{i}.mlp.c_proj`` → mlp/wo;
``ln_f`` → decoder_norm. ``lm_head`` is tied to ``wte``. Config: n_embd = emb_dim,
n_head = num_heads, head_dim = n_embd / n_head, n_inner = mlp_dim (default 4·n_embd),
n_positions = max_len, layer_norm_epsilon 1e-5.

Cache: per-layer K/V buffers ``[B, H, max_len, D]`` (heads-major) in the activation dtype and
``lengths: int32[B]``. For the gpt variant the cache's ``max_len`` must not exceed
``config.max_len`` (positions past it have no embedding).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_core.models import layers

VARIANTS = ("gpt", "lamda")
DTYPES = ("float32", "bfloat16")
GPT_INIT_STDDEV = 0.02  # GPT-2's initializer_range


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    vocab_size: int  # V: token ids 0..V-1
    emb_dim: int  # E: residual stream width (d_model)
    num_heads: int  # H
    num_layers: int  # N: decoder blocks
    head_dim: int  # D: per-head width (H·D need not equal E)
    mlp_dim: int  # F: MLP hidden width
    variant: str = "gpt"  # "gpt" | "lamda" (see the module docstring)
    dtype: str = "float32"  # activations and KV cache: "float32" | "bfloat16"
    max_len: int = 1024  # gpt: number of learned absolute positions; unused by lamda
    logits_via_embedding: bool = True  # tied output embedding (gpt requires True)
    relpos_num_buckets: int = 32  # lamda: T5 relative position buckets
    relpos_max_distance: int = 128  # lamda: distance of the last bucket
    matmul_dtype: str = "float32"  # a decode's matmul inputs (T5Config.matmul_dtype)

    def __post_init__(self):
        layers.check_matmul_dtype(self.matmul_dtype)
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.variant == "gpt" and not self.logits_via_embedding:
            raise ValueError("the gpt variant ties its output embedding (logits_via_embedding)")

    @property
    def activation_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def mlp_activations(self) -> tuple[str, ...]:
        return ("gelu",) if self.variant == "gpt" else ("gelu", "linear")

    @property
    def query_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim) if self.variant == "gpt" else 1.0


@flax.struct.dataclass
class DecoderCache:
    keys: tuple[
        jax.Array, ...
    ]  # num_layers × [B, H, max_len, D]: keys per slot (stale past lengths)
    values: tuple[jax.Array, ...]  # num_layers × [B, H, max_len, D]
    lengths: jax.Array  # [B] int32: committed positions per row


# ------------------------------------------------------------------------------ init


def init_params(config: DecoderConfig, key: jax.Array) -> dict[str, Any]:
    """Random params (float32) in the tree of the module docstring."""
    k_embed, k_extra, k_logits, *k_layers = jax.random.split(key, 3 + config.num_layers)
    if config.variant == "gpt":
        tree = _init_gpt(config, k_embed, k_extra, k_layers)
    else:
        tree = _init_lamda(config, k_embed, k_extra, k_layers)
    if not config.logits_via_embedding:
        tree["logits_dense"] = layers.init_dense(k_logits, config.emb_dim, config.vocab_size)
    return {"decoder": tree}


def _normal(key, shape, stddev=GPT_INIT_STDDEV):
    return stddev * jax.random.normal(key, shape, jnp.float32)


def _gpt_dense(key, in_dim, out_dim, *, stddev=GPT_INIT_STDDEV):
    return {
        "kernel": _normal(key, (in_dim, out_dim), stddev),
        "bias": jnp.zeros((out_dim,), jnp.float32),
    }


def _gpt_layer_norm(dim):
    return {"scale": jnp.ones((dim,), jnp.float32), "bias": jnp.zeros((dim,), jnp.float32)}


def _init_gpt(config, k_embed, k_pos, k_layers):
    """GPT-2 init: N(0, 0.02²), residual output projections scaled by 1/sqrt(2N)."""
    emb, inner = config.emb_dim, config.num_heads * config.head_dim
    out_stddev = GPT_INIT_STDDEV / math.sqrt(2 * config.num_layers)
    tree = {
        "token_embedder": {"embedding": _normal(k_embed, (config.vocab_size, emb))},
        "position_embedder": {"embedding": _normal(k_pos, (config.max_len, emb))},
    }
    for i, k in enumerate(k_layers):
        kq, kk, kv, ko, kwi, kwo = jax.random.split(k, 6)
        tree[f"layers_{i}"] = {
            "pre_self_attention_layer_norm": _gpt_layer_norm(emb),
            "self_attention": {
                "query": _gpt_dense(kq, emb, inner),
                "key": _gpt_dense(kk, emb, inner),
                "value": _gpt_dense(kv, emb, inner),
                "out": _gpt_dense(ko, inner, emb, stddev=out_stddev),
            },
            "pre_mlp_layer_norm": _gpt_layer_norm(emb),
            "mlp": {
                "wi": _gpt_dense(kwi, emb, config.mlp_dim),
                "wo": _gpt_dense(kwo, config.mlp_dim, emb, stddev=out_stddev),
            },
        }
    tree["decoder_norm"] = _gpt_layer_norm(emb)
    return tree


def _init_lamda(config, k_embed, k_relpos, k_layers):
    """T5X init: embedding N(0, 1), variance-scaling kernels, unit RMS-norm scales."""
    emb = config.emb_dim
    tree = {
        "token_embedder": {"embedding": jax.random.normal(k_embed, (config.vocab_size, emb))},
        "relpos_bias": layers.init_relpos(
            k_relpos, num_heads=config.num_heads, num_buckets=config.relpos_num_buckets
        ),
    }
    for i, k in enumerate(k_layers):
        k_attn, k_mlp = jax.random.split(k)
        tree[f"layers_{i}"] = {
            "pre_self_attention_layer_norm": {"scale": jnp.ones((emb,), jnp.float32)},
            "self_attention": layers.init_attention(
                k_attn, emb_dim=emb, num_heads=config.num_heads, head_dim=config.head_dim
            ),
            "pre_mlp_layer_norm": {"scale": jnp.ones((emb,), jnp.float32)},
            "mlp": layers.init_mlp(
                k_mlp, emb_dim=emb, mlp_dim=config.mlp_dim, activations=config.mlp_activations
            ),
        }
    tree["decoder_norm"] = {"scale": jnp.ones((emb,), jnp.float32)}
    return tree


def init_cache(config: DecoderConfig, batch_size: int, max_len: int) -> DecoderCache:
    """An empty cache: zero K/V buffers [B, H, max_len, D] per layer (heads-major:
    layers.write_cache), every row at length 0."""
    if config.variant == "gpt" and max_len > config.max_len:
        raise ValueError(f"cache max_len {max_len} exceeds the model's {config.max_len} positions")
    shape = (batch_size, config.num_heads, max_len, config.head_dim)
    buffers = tuple(jnp.zeros(shape, config.activation_dtype) for _ in range(config.num_layers))
    return DecoderCache(keys=buffers, values=buffers, lengths=jnp.zeros((batch_size,), jnp.int32))


# --------------------------------------------------------------------------- forward


def _heads(config: DecoderConfig) -> layers.Heads:
    return layers.Heads(
        config.num_heads,
        config.query_scale,
        config.activation_dtype,
        pair_single_query=config.matmul_dtype == "bfloat16",
    )


def _norm(config: DecoderConfig, params, x):
    """Pre-norm: LayerNorm (gpt) or RMS norm (lamda). x: [B, K, E] -> [B, K, E]."""
    if config.variant == "gpt":
        return layers.layer_norm(params, x, epsilon=1e-5)
    return layers.rms_norm(params, x, epsilon=1e-6)


def _embed(config: DecoderConfig, params, tokens, positions):
    """tokens, positions: int32 [B, K] -> [B, K, E] in the activation dtype."""
    x = layers.embed(params["token_embedder"]["embedding"], tokens, dtype=config.activation_dtype)
    if config.variant == "gpt":
        x = x + layers.embed(
            params["position_embedder"]["embedding"], positions, dtype=config.activation_dtype
        )
    return x


def _attention_bias(config: DecoderConfig, params, mask, query_positions, key_positions):
    """Additive bias [B, H|1, Q, S]: the mask (bool [B, 1, Q, S]) plus lamda's relpos bias.

    query_positions: int32 [B, Q]; key_positions: int32 [S].
    """
    bias = layers.mask_to_bias(mask)
    if config.variant == "lamda":
        bias = bias + layers.relative_position_bias(
            params["relpos_bias"]["rel_embedding"],
            query_positions,
            key_positions,
            bidirectional=False,
            max_distance=config.relpos_max_distance,
        )
    return bias


def _block(config: DecoderConfig, params, x, self_attention: Callable):
    """One pre-norm block. x: [B, K, E]; ``self_attention(attn_params, h) -> (out, aux)``.

    Returns (x [B, K, E], aux) where aux is whatever the attention returned with its output.
    """
    h = _norm(config, params["pre_self_attention_layer_norm"], x)
    attended, aux = self_attention(params["self_attention"], h)
    x = x + attended
    h = _norm(config, params["pre_mlp_layer_norm"], x)
    x = x + layers.mlp(
        params["mlp"], h, activations=config.mlp_activations, dtype=config.activation_dtype
    )
    return x, aux


def _logits(config: DecoderConfig, params, x):
    """Final norm and output projection: x [B, K, E] -> float32 logits [B, K, V]."""
    x = _norm(config, params["decoder_norm"], x)
    if not config.logits_via_embedding:
        return layers.dense(params["logits_dense"], x.astype(jnp.float32), dtype=jnp.float32)
    logits = layers.attend(params["token_embedder"]["embedding"], x)
    if config.variant == "lamda":
        logits = logits / jnp.sqrt(jnp.float32(config.emb_dim))
    return logits


def score(config: DecoderConfig, params, tokens: jax.Array) -> jax.Array:
    """Uncached causal pass: tokens int32 [B, L] -> float32 logits [B, L, V].

    Row t of the output predicts token t + 1 from tokens 0..t.
    """
    params = params["decoder"]
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))  # [B, L]
    mask = layers.causal_mask(positions, positions[0])  # [B, 1, L, L]
    bias = _attention_bias(config, params, mask, positions, positions[0])
    attention = lambda p, h: (
        layers.multi_head_attention(
            p,
            h,
            h,
            bias,
            _heads(config),
        ),
        None,
    )
    x = _embed(config, params, tokens, positions)
    for i in range(config.num_layers):
        x, _ = _block(config, params[f"layers_{i}"], x, attention)
    return _logits(config, params, x)


def forward(config: DecoderConfig, params, cache: DecoderCache, tokens: jax.Array):
    """tokens int32 [B, K] -> (float32 logits [B, K, V], cache); the model contract's forward.

    Writes row b's K tokens at positions lengths[b] .. lengths[b]+K-1 (callers keep
    lengths + K <= max_len), attends causally over the committed and new slots, and
    advances lengths by K.
    """
    params = params["decoder"]
    k = tokens.shape[1]
    max_len = cache.keys[0].shape[2] if cache.keys else 0
    positions = cache.lengths[:, None] + jnp.arange(k, dtype=jnp.int32)  # [B, K]
    slots = jnp.arange(max_len, dtype=jnp.int32)  # [L]
    mask = layers.cache_attention_mask(cache.lengths, k, max_len)  # [B, 1, K, L]
    bias = _attention_bias(config, params, mask, positions, slots)
    x = _embed(config, params, tokens, positions)
    keys, values = [], []
    for i in range(config.num_layers):
        attention = functools.partial(
            _cached_attention,
            config,
            key_cache=cache.keys[i],
            value_cache=cache.values[i],
            lengths=cache.lengths,
            bias=bias,
        )
        x, (key_cache, value_cache) = _block(config, params[f"layers_{i}"], x, attention)
        keys.append(key_cache)
        values.append(value_cache)
    cache = DecoderCache(keys=tuple(keys), values=tuple(values), lengths=cache.lengths + k)
    return _logits(config, params, x), cache


def _cached_attention(config: DecoderConfig, params, h, *, key_cache, value_cache, lengths, bias):
    """h [B, K, E] -> (out [B, K, E], (key_cache, value_cache)): caches [B, H, L, D], K written."""
    out, key_cache, value_cache = layers.cached_self_attention(
        params,
        h,
        key_cache,
        value_cache,
        lengths,
        bias,
        _heads(config),
    )
    return out, (key_cache, value_cache)
