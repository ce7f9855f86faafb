"""T5 1.1 model: cached decoding equals teacher-forced scoring; masks; bfloat16."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core.models import api, layers, t5

TINY = t5.T5Config(
    vocab_size=41,
    emb_dim=16,
    num_heads=2,
    num_encoder_layers=2,
    num_decoder_layers=2,
    head_dim=4,
    mlp_dim=24,
)


# jitted once per shape: eager op-by-op dispatch is slow on a 2-core machine
score = jax.jit(t5.score, static_argnums=0)
forward = jax.jit(t5.forward, static_argnums=0)
init_cache = jax.jit(t5.init_cache, static_argnums=0, static_argnames="max_decode_len")


@pytest.fixture(scope="module")
def params():
    return t5.init_params(TINY, jax.random.key(0))


def _encoder_tokens(rng: np.random.Generator, batch: int, length: int, valid: list[int]):
    """Random ids in [1, V) with row b padded (0) after ``valid[b]`` tokens."""
    tokens = rng.integers(1, TINY.vocab_size, size=(batch, length))
    for row, n in enumerate(valid):
        tokens[row, n:] = 0
    return jnp.asarray(tokens, jnp.int32)


def _reference(config, params, encoder_tokens, decoder_tokens):
    """Uncached logits of every decoder position (all targets valid)."""
    targets = jnp.ones_like(decoder_tokens)
    return np.asarray(score(config, params, encoder_tokens, decoder_tokens, targets))


def test_init_params_has_t5x_tree(params):
    names = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
    assert "['decoder']['layers_1']['encoder_decoder_attention']['query']['kernel']" in names
    assert "['decoder']['logits_dense']['kernel']" in names
    assert "['encoder']['relpos_bias']['rel_embedding']" in names
    assert params["decoder"]["layers_0"]["mlp"]["wi_1"]["kernel"].shape == (16, 24)
    assert params["encoder"]["layers_0"]["attention"]["out"]["kernel"].shape == (8, 16)
    assert params["decoder"]["relpos_bias"]["rel_embedding"].shape == (2, 32)


def test_relative_position_buckets_exact_then_log_then_saturate():
    distance = np.arange(0, 300)
    causal = layers.relative_position_bucket(-distance, bidirectional=False)
    np.testing.assert_array_equal(causal[:16], np.arange(16))  # exact half
    assert np.all(np.diff(causal) >= 0) and causal[127] == 31 and np.all(causal[128:] == 31)
    np.testing.assert_array_equal(
        layers.relative_position_bucket(distance[:20], bidirectional=False), 0
    )
    both = layers.relative_position_bucket(np.array([-3, 0, 3, 200]), bidirectional=True)
    np.testing.assert_array_equal(both, [3, 0, 19, 31])  # keys after the query use buckets 16..


def test_padding_does_not_change_logits(params):
    rng = np.random.default_rng(1)
    encoder_tokens = _encoder_tokens(rng, 2, 6, [6, 4])
    decoder_tokens = jnp.asarray(rng.integers(1, TINY.vocab_size, size=(2, 5)), jnp.int32)
    base = _reference(TINY, params, encoder_tokens, decoder_tokens)
    padded_enc = jnp.pad(encoder_tokens, ((0, 0), (0, 3)))
    padded_dec = jnp.pad(decoder_tokens, ((0, 0), (0, 2)))
    targets = jnp.pad(jnp.ones_like(decoder_tokens), ((0, 0), (0, 2)))
    padded = np.asarray(score(TINY, params, padded_enc, padded_dec, targets))
    np.testing.assert_allclose(padded[:, :5], base, atol=1e-5)
    # and the encoder padding really is masked: changing a real token changes logits
    changed = _reference(TINY, params, encoder_tokens.at[1, 0].set(7), decoder_tokens)
    assert np.abs(changed[1] - base[1]).max() > 1e-3


def _speculative_walk(config, params, encoder_tokens, sequences, *, max_len, seed, forward):
    """Drives ``forward`` like speculative decoding on known sequences.

    Each step feeds every row a block of K tokens from its own offset; tokens after a
    random per-row number of "accepted" ones are replaced by garbage, the block's
    logits are kept only where the block prefix is all true tokens, and the row is
    rolled back to its committed length. Returns {(row, position): logits}.
    """
    rng = np.random.default_rng(seed)
    batch, total = sequences.shape
    cache = init_cache(config, params, encoder_tokens, max_decode_len=max_len)
    lengths = np.zeros(batch, np.int64)
    seen = {}
    while lengths.min() < total - 4:
        k = int(rng.choice([1, 4]))
        block = np.zeros((batch, k), np.int32)
        n_true = rng.integers(1, k + 1, size=batch)  # >= 1 so every row advances
        for row in range(batch):
            block[row] = sequences[row, lengths[row] : lengths[row] + k]
            block[row, n_true[row] :] = rng.integers(1, config.vocab_size, k - n_true[row])
        logits, cache = forward(cache, jnp.asarray(block))
        np.testing.assert_array_equal(np.asarray(cache.lengths), lengths + k)
        for row in range(batch):
            for t in range(n_true[row]):
                seen[(row, lengths[row] + t)] = np.asarray(logits[row, t])
        lengths = lengths + n_true
        cache = api.rollback(cache, jnp.asarray(lengths, jnp.int32))
    return seen


def test_cached_forward_with_rollbacks_equals_score(params):
    rng = np.random.default_rng(2)
    batch, total = 3, 14
    encoder_tokens = _encoder_tokens(rng, batch, 7, [7, 3, 5])
    sequences = rng.integers(1, TINY.vocab_size, size=(batch, total)).astype(np.int32)
    sequences[:, 0] = 0  # decoder start token
    reference = _reference(TINY, params, encoder_tokens, jnp.asarray(sequences))
    seen = _speculative_walk(
        TINY,
        params,
        encoder_tokens,
        sequences,
        max_len=total + 2,
        seed=3,
        forward=jax.jit(functools.partial(t5.forward, TINY, params)),
    )
    assert len(seen) >= batch * (total - 4)
    lengths_differ = {pos for (_, pos) in seen}
    assert len(lengths_differ) > 8
    for (row, position), logits in seen.items():
        np.testing.assert_allclose(logits, reference[row, position], atol=2e-5, rtol=1e-5)


def test_cached_k1_steps_equal_score(params):
    rng = np.random.default_rng(4)
    encoder_tokens = _encoder_tokens(rng, 2, 5, [5, 2])
    tokens = rng.integers(1, TINY.vocab_size, size=(2, 6))
    tokens[:, 0] = 0  # decoder start token
    tokens = jnp.asarray(tokens, jnp.int32)
    reference = _reference(TINY, params, encoder_tokens, tokens)
    cache = init_cache(TINY, params, encoder_tokens, max_decode_len=8)
    step = jax.jit(functools.partial(t5.forward, TINY, params))
    for position in range(6):
        logits, cache = step(cache, tokens[:, position : position + 1])
        np.testing.assert_allclose(logits[:, 0], reference[:, position], atol=2e-5, rtol=1e-5)
    np.testing.assert_array_equal(cache.lengths, [6, 6])


def test_stale_slots_are_masked(params):
    """Garbage written past a rolled-back length must not leak into later logits."""
    rng = np.random.default_rng(5)
    encoder_tokens = _encoder_tokens(rng, 1, 4, [4])
    tokens = jnp.asarray([[0, 5, 9, 11]], jnp.int32)
    reference = _reference(TINY, params, encoder_tokens, tokens)
    cache = init_cache(TINY, params, encoder_tokens, max_decode_len=8)
    _, cache = forward(TINY, params, cache, jnp.asarray([[0, 5, 30, 31, 32, 33]], jnp.int32))
    cache = api.rollback(cache, jnp.asarray([2]))
    logits, cache = forward(TINY, params, cache, tokens[:, 2:3])  # slots 3..5 are stale
    np.testing.assert_allclose(logits[0, 0], reference[0, 2], atol=2e-5, rtol=1e-5)


def test_bfloat16_runs_and_is_close(params):
    config16 = t5.T5Config(**{**TINY.__dict__, "dtype": "bfloat16"})
    rng = np.random.default_rng(6)
    encoder_tokens = _encoder_tokens(rng, 2, 6, [6, 3])
    tokens = jnp.asarray(rng.integers(1, TINY.vocab_size, size=(2, 6)), jnp.int32)
    reference = _reference(TINY, params, encoder_tokens, tokens)
    cache = init_cache(config16, params, encoder_tokens, max_decode_len=8)
    assert cache.self_keys[0].dtype == jnp.bfloat16
    prefill, cache = forward(config16, params, cache, tokens[:, :4])
    step, cache = forward(config16, params, cache, tokens[:, 4:])
    logits = np.concatenate([prefill, step], axis=1)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    scale = np.abs(reference).max()
    assert np.abs(logits - reference).max() < 0.05 * scale
    assert np.abs(logits - reference).max() > 0  # really ran in bfloat16
    agree = (logits.argmax(-1) == reference.argmax(-1)).mean()
    assert agree >= 0.9


def test_source_width_is_a_power_of_two_of_at_least_the_minimum():
    assert [api.source_width(n) for n in (0, 1, 16, 48, 64, 65, 200, 1024)] == [
        64, 64, 64, 64, 64, 128, 256, 1024,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="source length"):
        api.source_width(-1)


def test_a_cache_padded_to_its_source_width_gives_the_same_logits(params):
    """pad_source: masked source positions leave every decode step's logits as they were
    (the decode loops then compile once per source width, not per input width)."""
    rng = np.random.default_rng(7)
    encoder_tokens = _encoder_tokens(rng, 2, 6, [6, 3])
    tokens = jnp.asarray([[0, 5, 9, 11], [0, 7, 7, 2]], jnp.int32)
    reference = _reference(TINY, params, encoder_tokens, tokens)
    cache = t5.pad_source(init_cache(TINY, params, encoder_tokens, max_decode_len=8), 64)
    assert cache.cross_keys[0].shape[2] == 64 and cache.encoder_mask.shape == (2, 64)
    assert not np.asarray(cache.encoder_mask[:, 6:]).any()
    logits, _ = forward(TINY, params, cache, tokens)
    np.testing.assert_allclose(logits, reference, atol=2e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="cannot pad 64 source positions to 32"):
        t5.pad_source(cache, 32)
