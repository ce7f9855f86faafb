"""T5 1.1 encoder-decoder with T5X's parameter tree and numerics.

Follows ``t5x/examples/t5/network.py``: pre-norm residual blocks with RMS layer norm
(scale only), one relative position bias table per stack (bidirectional in the
encoder, causal in the decoder), no 1/sqrt(head_dim) attention scaling, gated-GELU
MLP ``wi_0``/``wi_1``/``wo``, separate ``decoder/logits_dense`` unless
``logits_via_embedding``. Params are nested dicts with T5X's names, so a checkpoint
read by ``specdec_core.checkpoints.load_t5x`` plugs in as is.

Two entry points:

- ``score(config, params, encoder_input_tokens, decoder_input_tokens,
  decoder_target_tokens) -> logits [B, T, V]``: teacher-forced, uncached, masks from
  tokens > 0, like T5X's ``Transformer.__call__`` (inference: no dropout).
- the model contract of ``specdec_core.models.api``: ``init_cache`` encodes once and
  projects the cross-attention keys/values of every decoder layer; ``forward(config,
  params, cache, tokens [B, K])`` writes K decoder positions per row starting at
  ``cache.lengths``; ``api.rollback`` sets ``lengths``. Bind with
  ``functools.partial(forward, config, params)``; jit with ``config`` static.

The first decoder input of a sequence is token 0 (T5's decoder start id).

**A decoder that reads another model's encoder** (``T5Config.source_encoder``): a draft
with no encoder of its own, whose decoder cross-attends to its target's encoder output
projected to its width (``decoder/source_projection``). The target's token embedder and
encoder sit in its params under ``source``: they are loaded from the target's checkpoint
(``families``), frozen in training, and never exported with the draft. Its cache can be
built from states the target has already encoded (``init_cache(..., source_states=)``),
so the draft's encoder costs nothing where the two share a process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from specdec_core.models import layers

Params = Mapping[str, Any]

NUM_BUCKETS = 32  # T5X network.py: RelativePositionBiases(num_buckets=32, ...)
MAX_DISTANCE = 128  # ... max_distance=128
PAD_ID = 0  # padding (masks come from tokens > 0)
DECODER_START_ID = 0  # the first decoder input of every sequence (= PAD_ID)
EOS_ID = 1  # end of sequence: ends encoder inputs and generations


@dataclasses.dataclass(frozen=True, kw_only=True)
class SourceEncoder:
    """The model whose encoder a decoder reads: its name, config and T5X checkpoint (None:
    params from ``init_seed``, for tests and benchmarks)."""

    name: str
    config: T5Config
    checkpoint: str | None = None
    init_seed: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class T5Config:
    """T5X ``T5Config`` fields (defaults: T5 1.1 small from T5X's gin files)."""

    vocab_size: int = 32128  # embedding rows (SentencePiece 32k + 128 padding ids)
    emb_dim: int = 512  # model width E
    num_heads: int = 6  # attention heads H
    num_encoder_layers: int = 8
    num_decoder_layers: int = 8
    head_dim: int = 64  # per-head width D (H * D need not equal E)
    mlp_dim: int = 1024  # MLP hidden width F
    mlp_activations: tuple[str, ...] = ("gelu", "linear")  # T5 1.1 gated-GELU
    dropout_rate: float = 0.0  # training only (score's dropout_rng); decoding never drops
    logits_via_embedding: bool = False  # T5 1.1: separate decoder/logits_dense
    dtype: str = "float32"  # activation dtype ("float32" or "bfloat16"); params may be f32
    # what a decode's matmuls round their inputs to (float32 sums): "float32" | "bfloat16"
    # (layers.Bfloat16Weight; training and checkpoints are unaffected)
    matmul_dtype: str = "float32"
    # None: the decoder reads this model's own encoder; else the model whose encoder
    # output it reads instead (the target's: module docstring), with no encoder of its own
    source_encoder: SourceEncoder | None = None

    def __post_init__(self):
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        layers.check_matmul_dtype(self.matmul_dtype)
        source = self.source_encoder
        if source is None:
            return
        if self.num_encoder_layers != 0:
            raise ValueError(
                f"a model that reads {source.name!r}'s encoder has none of its own: "
                f"num_encoder_layers must be 0, got {self.num_encoder_layers}"
            )
        if source.config.source_encoder is not None:
            raise ValueError(f"{source.name!r} reads another model's encoder: it has none to share")
        if source.config.vocab_size != self.vocab_size:
            raise ValueError(
                f"a model that reads {source.name!r}'s encoder shares its vocabulary: "
                f"vocab_size {self.vocab_size} != {source.config.vocab_size}"
            )

    @property
    def activation_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)


@flax.struct.dataclass
class T5Cache:
    """Decoder state for cached decoding; one tuple entry per decoder layer."""

    self_keys: tuple[jax.Array, ...]  # [B, H, L, D] each: self-attention keys by position
    self_values: tuple[jax.Array, ...]  # [B, H, L, D] each (heads-major: layers.write_cache)
    cross_keys: tuple[jax.Array, ...]  # [B, H, S, D] each: projected encoder output
    cross_values: tuple[jax.Array, ...]  # [B, H, S, D] each
    encoded: jax.Array  # [B, S, E]: encoder output
    encoder_mask: jax.Array  # [B, S] bool: encoder_input_tokens > 0
    lengths: jax.Array  # [B] int32: decoder positions committed per row


# ------------------------------------------------------------------------------ init

SOURCE = "source"  # the params of the encoder a decoder reads (SourceEncoder)


def init_params(config: T5Config, key: jax.Array) -> dict:
    """Random float32 params in T5X's tree (T5X's initializers, up to the exact RNG).

    A config with a ``source_encoder`` gets no ``encoder``; its ``source`` holds random
    params of the source's embedder and encoder (``families`` loads the real ones)."""
    k_embed, k_enc, k_dec = jax.random.split(key, 3)
    embedding = jax.random.normal(k_embed, (config.vocab_size, config.emb_dim), jnp.float32)
    params = {"token_embedder": {"embedding": embedding}, "decoder": _init_decoder(config, k_dec)}
    source = config.source_encoder
    if source is None:
        params["encoder"] = _init_encoder(config, k_enc)
        return params
    params[SOURCE] = source_params(init_params(source.config, k_enc))
    params["decoder"]["source_projection"] = layers.init_dense(
        jax.random.fold_in(k_dec, 1), source.config.emb_dim, config.emb_dim
    )
    return params


def source_params(params: Params) -> dict:
    """What a reader of this model's encoder takes of its params: embedder and encoder."""
    return {"token_embedder": params["token_embedder"], "encoder": params["encoder"]}


def _init_attention(config: T5Config, key):
    return layers.init_attention(
        key, emb_dim=config.emb_dim, num_heads=config.num_heads, head_dim=config.head_dim
    )


def _init_mlp(config: T5Config, key):
    return layers.init_mlp(
        key, emb_dim=config.emb_dim, mlp_dim=config.mlp_dim, activations=config.mlp_activations
    )


def _norm(config: T5Config):
    return {"scale": jnp.ones((config.emb_dim,), jnp.float32)}


def _init_encoder(config: T5Config, key) -> dict:
    keys = jax.random.split(key, config.num_encoder_layers + 1)
    tree = {"relpos_bias": layers.init_relpos(keys[-1], num_heads=config.num_heads)}
    for i in range(config.num_encoder_layers):
        k_att, k_mlp = jax.random.split(keys[i])
        tree[f"layers_{i}"] = {
            "pre_attention_layer_norm": _norm(config),
            "attention": _init_attention(config, k_att),
            "pre_mlp_layer_norm": _norm(config),
            "mlp": _init_mlp(config, k_mlp),
        }
    tree["encoder_norm"] = _norm(config)
    return tree


def _init_decoder(config: T5Config, key) -> dict:
    keys = jax.random.split(key, config.num_decoder_layers + 2)
    tree = {"relpos_bias": layers.init_relpos(keys[-1], num_heads=config.num_heads)}
    for i in range(config.num_decoder_layers):
        k_self, k_cross, k_mlp = jax.random.split(keys[i], 3)
        tree[f"layers_{i}"] = {
            "pre_self_attention_layer_norm": _norm(config),
            "self_attention": _init_attention(config, k_self),
            "pre_cross_attention_layer_norm": _norm(config),
            "encoder_decoder_attention": _init_attention(config, k_cross),
            "pre_mlp_layer_norm": _norm(config),
            "mlp": _init_mlp(config, k_mlp),
        }
    tree["decoder_norm"] = _norm(config)
    if not config.logits_via_embedding:
        tree["logits_dense"] = layers.init_dense(keys[-2], config.emb_dim, config.vocab_size)
    return tree


# --------------------------------------------------------------------------- dropout


class _Dropout:
    """Inverted dropout at ``rate`` with a fresh key per call (``fold_in`` a counter);
    the identity when ``rate`` is 0 or ``key`` is None (inference, evaluation)."""

    def __init__(self, rate: float, key: jax.Array | None):
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout_rate must be in [0, 1), got {rate}")
        self.rate, self.key, self.calls = rate, key, 0

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.key is None or self.rate == 0.0:
            return x
        self.calls += 1
        keep = jax.random.bernoulli(
            jax.random.fold_in(self.key, self.calls), 1.0 - self.rate, x.shape
        )
        return jnp.where(keep, x / (1.0 - self.rate), 0.0).astype(x.dtype)


_NO_DROPOUT = _Dropout(0.0, None)


# --------------------------------------------------------------------------- encoder


def _heads(config: T5Config) -> layers.Heads:
    """T5X's attention: no 1/sqrt(D) on the logits, projections in the params' dtype."""
    return layers.Heads(config.num_heads, pair_single_query=config.matmul_dtype == "bfloat16")


def _position_bias(stack: Params, query_positions, key_positions, *, bidirectional: bool):
    """One stack's (encoder's or decoder's) shared relative-position bias, [H, Q, K] (or
    [B, H, Q, K] for per-row query positions)."""
    return layers.relative_position_bias(
        stack["relpos_bias"]["rel_embedding"],
        query_positions,
        key_positions,
        bidirectional=bidirectional,
        max_distance=MAX_DISTANCE,
    )


def encode(
    config: T5Config,
    params: Params,
    encoder_input_tokens: jax.Array,
    *,
    drop: _Dropout = _NO_DROPOUT,
) -> jax.Array:
    """Encoder stack: tokens int32[B, S] (0 = padding) -> encoded [B, S, E] in config dtype.

    ``drop`` (training only, :func:`score`): T5X's places — the embeddings, each
    sublayer's output before its residual add, and the final norm's output.

    A reader of another model's encoder runs that encoder (frozen: no gradient, no
    dropout) and projects its output to this model's width."""
    if (source := config.source_encoder) is not None:
        states = jax.lax.stop_gradient(encode(source.config, params[SOURCE], encoder_input_tokens))
        return read_source(config, params, states)
    dtype = config.activation_dtype
    enc = params["encoder"]
    valid = encoder_input_tokens > 0  # [B, S]
    positions = jnp.arange(encoder_input_tokens.shape[1])
    bias = _position_bias(enc, positions, positions, bidirectional=True)[None]  # [1, H, S, S]
    bias = bias + layers.mask_to_bias(layers.attention_mask(valid, valid))  # [B, H, S, S]
    x = drop(layers.embed(params["token_embedder"]["embedding"], encoder_input_tokens, dtype=dtype))
    for i in range(config.num_encoder_layers):
        layer = enc[f"layers_{i}"]
        h = layers.rms_norm(layer["pre_attention_layer_norm"], x)
        x = x + drop(layers.multi_head_attention(layer["attention"], h, h, bias, _heads(config)))
        h = layers.rms_norm(layer["pre_mlp_layer_norm"], x)
        x = x + drop(layers.mlp(layer["mlp"], h, activations=config.mlp_activations))
    return drop(layers.rms_norm(enc["encoder_norm"], x))


def read_source(config: T5Config, params: Params, states: jax.Array) -> jax.Array:
    """The source model's encoder output [B, S, E_source] projected to this model's
    width: what its decoder cross-attends to."""
    projection = params["decoder"]["source_projection"]
    return layers.dense(projection, states.astype(config.activation_dtype))


# --------------------------------------------------------------------------- decoder


def _cross_and_mlp(
    config: T5Config,
    layer: Params,
    x: jax.Array,
    cross_key: jax.Array,
    cross_value: jax.Array,
    cross_bias: jax.Array,
    drop: _Dropout = _NO_DROPOUT,
) -> jax.Array:
    """The part of a decoder layer after self-attention: x [B, T, E] -> [B, T, E]."""
    h = layers.rms_norm(layer["pre_cross_attention_layer_norm"], x)
    x = x + drop(
        layers.attention_over(
            layer["encoder_decoder_attention"],
            h,
            cross_key,
            cross_value,
            cross_bias,
            _heads(config),
        )
    )
    h = layers.rms_norm(layer["pre_mlp_layer_norm"], x)
    return x + drop(layers.mlp(layer["mlp"], h, activations=config.mlp_activations))


def _logits(
    config: T5Config, params: Params, x: jax.Array, drop: _Dropout = _NO_DROPOUT
) -> jax.Array:
    """Final norm and vocabulary projection: x [B, T, E] -> float32 logits [B, T, V]."""
    y = drop(layers.rms_norm(params["decoder"]["decoder_norm"], x))
    if config.logits_via_embedding:
        logits = layers.attend(params["token_embedder"]["embedding"], y)
        return logits / jnp.sqrt(jnp.float32(y.shape[-1]))
    return layers.dense(params["decoder"]["logits_dense"], y, dtype=jnp.float32)


def _cross_kv(config: T5Config, params: Params, encoded: jax.Array):
    """Per decoder layer (key, value) [B, H, S, D] of the encoder output (heads-major, the
    layout the attention's dot reads: a decode step then never rewrites them)."""
    dec = params["decoder"]
    pairs = [
        layers.project_kv(dec[f"layers_{i}"]["encoder_decoder_attention"], encoded, _heads(config))
        for i in range(config.num_decoder_layers)
    ]
    return tuple(k.swapaxes(1, 2) for k, _ in pairs), tuple(v.swapaxes(1, 2) for _, v in pairs)


def score(
    config: T5Config,
    params: Params,
    encoder_input_tokens: jax.Array,
    decoder_input_tokens: jax.Array,
    decoder_target_tokens: jax.Array,
    *,
    dropout_rng: jax.Array | None = None,
) -> jax.Array:
    """Teacher-forced logits, as T5X's ``Transformer.__call__``.

    encoder_input_tokens int32[B, S]; decoder_input_tokens, decoder_target_tokens
    int32[B, T] (0 = padding; masks come from tokens > 0) -> float32 logits [B, T, V].
    Logits at padded target positions are meaningless. With ``dropout_rng`` (training)
    and ``config.dropout_rate > 0``, dropout at T5X's places (embeddings, every
    sublayer's output, the final norms; not inside the MLP); without it, deterministic.
    """
    dtype = config.activation_dtype
    dec = params["decoder"]
    drop = _Dropout(config.dropout_rate, dropout_rng)
    encoded = encode(config, params, encoder_input_tokens, drop=drop)
    target_valid = decoder_target_tokens > 0  # [B, T]
    positions = jnp.arange(decoder_input_tokens.shape[1])
    self_bias = _position_bias(dec, positions, positions, bidirectional=False)[None]  # [1, H, T, T]
    self_mask = layers.causal_mask(positions, positions) & layers.attention_mask(
        target_valid, target_valid
    )
    self_bias = self_bias + layers.mask_to_bias(self_mask)  # [B, H, T, T]
    cross_bias = layers.mask_to_bias(
        layers.attention_mask(target_valid, encoder_input_tokens > 0)
    )  # [B, 1, T, S]
    cross_keys, cross_values = _cross_kv(config, params, encoded)
    x = drop(layers.embed(params["token_embedder"]["embedding"], decoder_input_tokens, dtype=dtype))
    for i in range(config.num_decoder_layers):
        layer = dec[f"layers_{i}"]
        h = layers.rms_norm(layer["pre_self_attention_layer_norm"], x)
        x = x + drop(
            layers.multi_head_attention(layer["self_attention"], h, h, self_bias, _heads(config))
        )
        x = _cross_and_mlp(config, layer, x, cross_keys[i], cross_values[i], cross_bias, drop)
    return _logits(config, params, x, drop)


# ------------------------------------------------------------------- cached decoding


def init_cache(
    config: T5Config,
    params: Params,
    encoder_input_tokens: jax.Array,
    *,
    max_decode_len: int,
    source_states: jax.Array | None = None,
) -> T5Cache:
    """Encodes once and returns an empty decoder cache of ``max_decode_len`` slots.

    encoder_input_tokens int32[B, S] (0 = padding). Cross-attention keys/values of
    every decoder layer are projected here, so ``forward`` never recomputes them.
    ``source_states`` [B, S, E_source]: for a reader of another model's encoder, that
    model's output for these tokens (its cache's ``encoded``), so it is not run again.
    """
    dtype = config.activation_dtype
    if source_states is not None:
        if config.source_encoder is None:
            raise ValueError("source_states are for a model that reads another's encoder")
        encoded = read_source(config, params, source_states)
    else:
        encoded = encode(config, params, encoder_input_tokens)
    cross_keys, cross_values = _cross_kv(config, params, encoded)
    batch = encoder_input_tokens.shape[0]
    shape = (batch, config.num_heads, max_decode_len, config.head_dim)
    empty = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_decoder_layers))
    return T5Cache(
        self_keys=empty,
        self_values=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_decoder_layers)),
        cross_keys=cross_keys,
        cross_values=cross_values,
        encoded=encoded,
        encoder_mask=encoder_input_tokens > 0,
        lengths=jnp.zeros((batch,), jnp.int32),
    )


def pad_source(cache: T5Cache, width: int) -> T5Cache:
    """``cache`` with its encoder side (encoder output, cross-attention keys and values,
    encoder mask) padded to ``width`` positions. The new positions are masked out, so
    every logit is as without them (``api.source_width`` says why caches are padded)."""
    extra = width - cache.encoder_mask.shape[1]
    if extra < 0:
        raise ValueError(f"cannot pad {cache.encoder_mask.shape[1]} source positions to {width}")
    if extra == 0:
        return cache

    def kv(a):
        return jnp.pad(a, ((0, 0), (0, 0), (0, extra), (0, 0)))

    return cache.replace(
        cross_keys=tuple(map(kv, cache.cross_keys)),
        cross_values=tuple(map(kv, cache.cross_values)),
        encoded=jnp.pad(cache.encoded, ((0, 0), (0, extra), (0, 0))),
        encoder_mask=jnp.pad(cache.encoder_mask, ((0, 0), (0, extra))),
    )


def _self_attention_bias(config: T5Config, params: Params, cache: T5Cache, num_new: int):
    """Relative position bias plus causal/stale-slot mask: float32 [B, H, K, L]."""
    max_len = cache.self_keys[0].shape[2]
    positions = cache.lengths[:, None] + jnp.arange(num_new, dtype=jnp.int32)  # [B, K]
    bias = _position_bias(
        params["decoder"], positions, jnp.arange(max_len, dtype=jnp.int32), bidirectional=False
    )  # [B, H, K, L]
    mask = layers.cache_attention_mask(cache.lengths, num_new, max_len)  # [B, 1, K, L]
    return bias + layers.mask_to_bias(mask)


def forward(
    config: T5Config, params: Params, cache: T5Cache, tokens: jax.Array
) -> tuple[jax.Array, T5Cache]:
    """The model contract's forward: tokens int32[B, K] -> (float32 logits [B, K, V], cache).

    Token t of row b sits at decoder position ``cache.lengths[b] + t``; its K/V are
    written there and it attends to positions <= its own (stale slots are masked).
    Callers keep ``lengths + K <= max_decode_len``.
    """
    dtype = config.activation_dtype
    dec = params["decoder"]
    num_new = tokens.shape[1]
    self_bias = _self_attention_bias(config, params, cache, num_new)
    cross_bias = layers.mask_to_bias(cache.encoder_mask[:, None, None, :])  # [B, 1, 1, S]
    x = layers.embed(params["token_embedder"]["embedding"], tokens, dtype=dtype)
    new_keys, new_values = [], []
    for i in range(config.num_decoder_layers):
        layer = dec[f"layers_{i}"]
        h = layers.rms_norm(layer["pre_self_attention_layer_norm"], x)
        attended, keys, values = layers.cached_self_attention(
            layer["self_attention"],
            h,
            cache.self_keys[i],
            cache.self_values[i],
            cache.lengths,
            self_bias,
            _heads(config),
        )
        new_keys.append(keys)
        new_values.append(values)
        x = _cross_and_mlp(
            config, layer, x + attended, cache.cross_keys[i], cache.cross_values[i], cross_bias
        )
    cache = cache.replace(
        self_keys=tuple(new_keys), self_values=tuple(new_values), lengths=cache.lengths + num_new
    )
    return _logits(config, params, x), cache
