"""Decoder-only transformers (GPT-like, LaMDA-style): cached decoding equals uncached score."""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core.models import api, decoder, layers, registry


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


def tiny_config(variant: str = "gpt", **overrides) -> decoder.DecoderConfig:
    """H·D (3·5) differs from E (16) and relpos buckets saturate within the test lengths."""
    fields = dict(
        vocab_size=37,
        emb_dim=16,
        num_heads=3,
        num_layers=2,
        head_dim=5,
        mlp_dim=24,
        variant=variant,
        max_len=40,
        relpos_num_buckets=8,
        relpos_max_distance=12,
    )
    return decoder.DecoderConfig(**(fields | overrides))


def random_params(config: decoder.DecoderConfig, seed: int = 0, *, noise: float = 0.1):
    """init_params with N(0, noise²) added to every leaf, so zero biases and unit norms are
    exercised (and, with more noise, a random model's greedy output stops repeating)."""
    params = decoder.init_params(config, jax.random.key(seed))
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [x + noise * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys, strict=True)]
    return jax.tree_util.tree_unflatten(treedef, leaves)


@pytest.mark.parametrize("variant", decoder.VARIANTS)
@pytest.mark.parametrize("block_sizes", [(1,), (2, 3, 5)], ids=["k1", "blocks"])
def test_cached_matches_uncached_float32(variant, block_sizes):
    config = tiny_config(variant)
    params = random_params(config)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(3, 21))
    reference = np.asarray(decoder.score(config, params, jnp.asarray(tokens)))
    forward = jax.jit(functools.partial(decoder.forward, config, params))
    compared = assert_cached_matches_uncached(
        forward,
        decoder.init_cache(config, 3, 26),
        tokens,
        reference,
        np.array([4, 1, 9]),
        seed=2,
        vocab_size=config.vocab_size,
        block_sizes=block_sizes,
        atol=2e-5,
        rtol=2e-5,
    )
    assert compared == 3 * 21


@pytest.mark.parametrize("variant", decoder.VARIANTS)
def test_cached_matches_uncached_bfloat16(variant):
    config = tiny_config(variant, dtype="bfloat16")
    params = random_params(config)
    tokens = np.random.default_rng(3).integers(0, config.vocab_size, size=(2, 13))
    reference = np.asarray(decoder.score(config, params, jnp.asarray(tokens)))
    forward = jax.jit(functools.partial(decoder.forward, config, params))
    assert_cached_matches_uncached(
        forward,
        decoder.init_cache(config, 2, 18),
        tokens,
        reference,
        np.array([2, 6]),
        seed=4,
        vocab_size=config.vocab_size,
        block_sizes=(1, 4),
        atol=0.1,
        rtol=0.05,
    )
    f32_reference = decoder.score(tiny_config(variant), params, jnp.asarray(tokens))
    np.testing.assert_allclose(reference, f32_reference, atol=0.15, rtol=0.05)
    assert decoder.init_cache(config, 1, 4).keys[0].dtype == jnp.bfloat16


@pytest.mark.parametrize("variant", decoder.VARIANTS)
def test_score_matches_numpy_reference(variant):
    config = tiny_config(variant)
    params = random_params(config, seed=5)
    tokens = np.random.default_rng(6).integers(0, config.vocab_size, size=(2, 17))
    logits = decoder.score(config, params, jnp.asarray(tokens))
    expected = np.stack([numpy_reference(config, params, row) for row in tokens])
    np.testing.assert_allclose(logits, expected, atol=2e-5, rtol=2e-5)


def test_lamda_untied_logits_use_logits_dense():
    config = tiny_config("lamda", logits_via_embedding=False)
    params = random_params(config, seed=7)
    assert params["decoder"]["logits_dense"]["kernel"].shape == (16, 37)
    tokens = np.random.default_rng(8).integers(0, config.vocab_size, size=(1, 9))
    np.testing.assert_allclose(
        decoder.score(config, params, jnp.asarray(tokens))[0],
        numpy_reference(config, params, tokens[0]),
        atol=2e-5,
        rtol=2e-5,
    )


def test_param_counts_of_tiny_configs():
    # gpt: wte 37·16 + wpe 40·16 + per layer (2 LN 4·16, qkv 3·(16·15+15), out 15·16+16,
    #      wi 16·24+24, wo 24·16+16) + final LN 2·16
    gpt_layer = 4 * 16 + 3 * (16 * 15 + 15) + 15 * 16 + 16 + 16 * 24 + 24 + 24 * 16 + 16
    assert (
        registry.count_params(decoder.init_params, tiny_config("gpt"))
        == 37 * 16 + 40 * 16 + 2 * gpt_layer + 32
    )
    # lamda: embedding + relpos 3·8 + per layer (2 norms, 4 projections, 3 MLP kernels) + norm
    lamda_layer = 2 * 16 + 4 * 16 * 15 + 3 * 16 * 24
    assert (
        registry.count_params(decoder.init_params, tiny_config("lamda"))
        == 37 * 16 + 3 * 8 + 2 * lamda_layer + 16
    )


def test_gpt_cache_longer_than_positions_is_rejected():
    with pytest.raises(ValueError, match="exceeds the model's 40 positions"):
        decoder.init_cache(tiny_config("gpt"), 1, 41)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("variant", "bert", "variant must be one of"),
        ("dtype", "float16", "dtype must be one of"),
        ("logits_via_embedding", False, "ties its output embedding"),
    ],
)
def test_config_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{field: value})


# --------------------------------------------------------------- numpy reference


def _np_norm(config, p, x):
    if config.variant == "gpt":
        centered = x - x.mean(-1, keepdims=True)
        y = centered / np.sqrt((centered**2).mean(-1, keepdims=True) + 1e-5)
        return y * p["scale"] + p["bias"]
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6) * p["scale"]


def _np_dense(p, x):
    return x @ p["kernel"] + (p["bias"] if "bias" in p else 0.0)


def _np_gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def numpy_reference(config, params, tokens: np.ndarray) -> np.ndarray:
    """float64 logits [L, V] of one sequence, written out independently of the JAX code."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)["decoder"]
    length, heads, head_dim = len(tokens), config.num_heads, config.head_dim
    x = p["token_embedder"]["embedding"][tokens]
    if config.variant == "gpt":
        x = x + p["position_embedder"]["embedding"][:length]
    rel = np.arange(length)[None, :] - np.arange(length)[:, None]  # [Q, S]: key - query
    bias = np.where(rel <= 0, 0.0, -np.inf)[None]  # [1, Q, S]
    if config.variant == "lamda":
        buckets = layers.relative_position_bucket(
            rel,
            bidirectional=False,
            num_buckets=config.relpos_num_buckets,
            max_distance=config.relpos_max_distance,
        )
        bias = bias + p["relpos_bias"]["rel_embedding"][:, buckets]  # [H, Q, S]
    scale = 1 / np.sqrt(head_dim) if config.variant == "gpt" else 1.0
    for i in range(config.num_layers):
        layer = p[f"layers_{i}"]
        h = _np_norm(config, layer["pre_self_attention_layer_norm"], x)
        attn = layer["self_attention"]
        q, k, v = (
            _np_dense(attn[n], h).reshape(length, heads, head_dim)
            for n in ("query", "key", "value")
        )
        logits = np.einsum("qhd,shd->hqs", q, k) * scale + bias
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = np.einsum("hqs,shd->qhd", weights, v).reshape(length, heads * head_dim)
        x = x + _np_dense(attn["out"], out)
        h = _np_norm(config, layer["pre_mlp_layer_norm"], x)
        mlp = layer["mlp"]
        if config.variant == "gpt":
            hidden = _np_gelu(_np_dense(mlp["wi"], h))
        else:
            hidden = _np_gelu(_np_dense(mlp["wi_0"], h)) * _np_dense(mlp["wi_1"], h)
        x = x + _np_dense(mlp["wo"], hidden)
    x = _np_norm(config, p["decoder_norm"], x)
    if not config.logits_via_embedding:
        return x @ p["logits_dense"]["kernel"]
    logits = x @ p["token_embedder"]["embedding"].T
    return logits / np.sqrt(config.emb_dim) if config.variant == "lamda" else logits
