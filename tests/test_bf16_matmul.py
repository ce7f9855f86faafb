"""Matmuls on bfloat16 inputs with float32 sums (a model config's ``matmul_dtype:
bfloat16``, ``layers.Bfloat16Weight``): the logits stay close to float32's, a row's
logits are the same bits however many tokens a call carries, and greedy speculative
decoding equals greedy target-only decoding token for token."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.models import decoder, families, layers, registry, t5
from specdec_core.sampling import GREEDY
from tests.shipped_rows import chunked_logits
from tests.test_real_model_greedy import bigram_draft, target_model

# Wide enough that XLA's kernels for one row and for several differ in how they sum.
CONFIG = t5.T5Config(
    vocab_size=97,
    emb_dim=64,
    num_heads=4,
    head_dim=16,
    mlp_dim=128,
    num_encoder_layers=2,
    num_decoder_layers=2,
    matmul_dtype="bfloat16",
)
FLOAT32 = dataclasses.replace(CONFIG, matmul_dtype="float32")
TOKENS = 9


@pytest.fixture(scope="module")
def bound():
    """(bfloat16, float32) BoundModels of the same random params."""
    params = t5.init_params(CONFIG, jax.random.key(3))
    t5_family = families.get("t5")
    return t5_family.bind("bf16", CONFIG, params), t5_family.bind("f32", FLOAT32, params)


def _inputs(batch: int):
    rng = np.random.default_rng(batch)
    encoder = rng.integers(1, CONFIG.vocab_size, size=(batch, 7)).astype(np.int32)
    tokens = rng.integers(1, CONFIG.vocab_size, size=(batch, TOKENS)).astype(np.int32)
    tokens[:, 0] = 0
    return encoder, tokens


def _chunked_logits(model, encoder, tokens, chunk: int, cache_len: int = TOKENS + 1) -> np.ndarray:
    """Logits of every position, fed ``chunk`` tokens per call through the KV cache."""
    return chunked_logits(model, encoder, tokens, chunk, cache_len)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_rows_logits_are_the_same_bits_for_any_call_length(bound, batch):
    model, _ = bound
    encoder, tokens = _inputs(batch)
    one = _chunked_logits(model, encoder, tokens, 1)
    for chunk in (2, 4, TOKENS):
        np.testing.assert_array_equal(_chunked_logits(model, encoder, tokens, chunk), one)


def test_a_rows_logits_are_the_same_bits_beside_other_rows_and_in_any_cache(bound):
    """Row 0 alone in a short cache, fed one token per call, against row 0 beside rows
    of other sources of the same padded width in longer caches, fed up to every token in
    one call: XLA's CPU reduce orders its sums by the whole array's size, so a plain sum
    in a norm or a softmax failed this at 9 tokens in a 128-slot cache."""
    model, _ = bound
    encoder, tokens = _inputs(1)
    alone = _chunked_logits(model, encoder, tokens, 1)
    for batch in (2, 5):
        others_encoder, others_tokens = _inputs(batch + 4)
        sources = np.concatenate([encoder, others_encoder[1:batch]])
        rows = np.concatenate([tokens, others_tokens[1:batch]])
        for chunk, cache_len in ((1, 128), (TOKENS, 128), (4, 64)):
            got = _chunked_logits(model, sources, rows, chunk, cache_len)[:1]
            np.testing.assert_array_equal(got, alone, err_msg=f"batch {batch} chunk {chunk}")


def test_an_ordered_sum_is_a_rows_own_whatever_the_shape_around_it():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 40, 300)).astype(np.float32)
    total = np.asarray(jax.jit(layers.ordered_sum)(x))
    np.testing.assert_allclose(total, x.astype(np.float64).sum(-1), rtol=0, atol=1e-4)
    for rows, width in ((1, 1), (1, 40), (6, 3), (2, 17)):
        part = np.asarray(jax.jit(layers.ordered_sum)(x[:rows, :width]))
        np.testing.assert_array_equal(part, total[:rows, :width])
    # zeros after a row's elements (a cache's masked slots) leave its sum's bits as they are
    padded = np.concatenate([x, np.zeros((6, 40, 213), np.float32)], axis=-1)
    np.testing.assert_array_equal(np.asarray(jax.jit(layers.ordered_sum)(padded)), total)
    assert layers.ordered_sum(jnp.ones((3, 1)), keepdims=True).shape == (3, 1)
    probs = np.asarray(layers.softmax(jnp.asarray(x)))
    np.testing.assert_allclose(probs, np.asarray(jax.nn.softmax(x, axis=-1)), atol=1e-6)


def test_bfloat16_matmuls_stay_close_to_float32(bound):
    model, reference = bound
    encoder, tokens = _inputs(3)
    got = _chunked_logits(model, encoder, tokens, 3)
    want = _chunked_logits(reference, encoder, tokens, 3)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() < 0.02 * scale
    assert np.abs(got - want).max() > 0  # the bfloat16 path really ran
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9


def test_the_weights_are_held_in_bfloat16(bound):
    model, _ = bound
    kernel = model.forward.args[0]["decoder"]["layers_0"]["mlp"]["wo"]["kernel"]
    assert isinstance(kernel, layers.Bfloat16Weight) and kernel.bf16.dtype == jnp.bfloat16
    assert model.params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"].dtype == jnp.float32


@pytest.mark.parametrize("preset", ["gpt_tiny_test", "lamda_tiny_test"])
def test_greedy_speculative_equals_greedy_target_with_bfloat16_matmuls(preset):
    config, params = target_model(preset)
    config = dataclasses.replace(config, matmul_dtype="bfloat16")
    served = layers.matmul_weights(params, "bfloat16")
    target = functools.partial(decoder.forward, config, served)
    draft, draft_cache = bigram_draft(config, params)
    batch, cache_len, max_new = 2, 32, 12
    prompts = np.random.default_rng(13).integers(0, config.vocab_size, size=(batch, 7))
    common = dict(
        prompt_tokens=prompts,
        prompt_lengths=np.array([3, 7], np.int32),
        request_ids=np.arange(batch),
        max_new_tokens=max_new,
        sampling_config=GREEDY,
    )
    base = decoding.autoregressive_generate(
        target=target, target_cache=decoder.init_cache(config, batch, cache_len), **common
    )
    for gamma in (1, 3):
        spec = decoding.speculative_generate(
            target=target,
            target_cache=decoder.init_cache(config, batch, cache_len),
            draft=draft,
            draft_cache=draft_cache,
            gamma=gamma,
            **common,
        )
        np.testing.assert_array_equal(spec.lengths, base.lengths)
        np.testing.assert_array_equal(spec.tokens, base.tokens)


def test_an_unknown_matmul_dtype_is_named():
    with pytest.raises(ValueError, match="matmul_dtype must be one of"):
        t5.T5Config(matmul_dtype="int8")
    with pytest.raises(ValueError, match="matmul_dtype must be one of"):
        dataclasses.replace(registry.get_config("gpt_tiny_test"), matmul_dtype="int8")


def test_a_decode_step_never_widens_the_embedding_table(bound):
    """A token lookup gathers the table's bit patterns (``Bfloat16Weight.bits``): from
    the bfloat16 table XLA's CPU backend widened (or copied) all of it, once per program
    run, before gathering a row (1-4 ms per decode loop for a 16k x 512 table)."""
    model, _ = bound
    table = model.forward.args[0]["token_embedder"]["embedding"]
    assert table.bits is not None and table.bits.dtype == jnp.uint16
    encoder, tokens = _inputs(1)
    cache = model.new_cache(encoder, 1, TOKENS + 1)
    step = decoding.jit_over(lambda forward: forward, (model.forward,))
    hlo = step.func.lower(step.args[0], cache, jnp.asarray(tokens[:, :1])).compile().as_text()
    shape = f"[{CONFIG.vocab_size},{CONFIG.emb_dim}]"
    # any instruction that makes a whole table: a widened or copied one (the matmul
    # against the tied table reads the parameter itself)
    made = [
        line.strip()
        for line in hlo.splitlines()
        if " = " in line
        and shape in line.split(" = ", 1)[1].split(" ", 1)[0]
        and "parameter(" not in line
    ]
    assert made == []


def test_a_one_token_prompt_is_prefilled_without_a_model_call(bound):
    """An encoder-decoder's prompt is its start token: nothing before it to keep, so no
    call (it cost a decode step per batch); a longer prompt still calls the model."""
    model, _ = bound
    encoder, tokens = _inputs(2)
    calls = []

    def counting(cache, fed):
        calls.append(fed.shape)
        return model.forward(cache, fed)

    prefill = decoding.prefill_fn(counting)
    cache = prefill(model.new_cache(encoder, 2, TOKENS + 1), tokens[:, :4], np.array([1, 1]))
    assert calls == [] and np.asarray(cache.lengths).tolist() == [0, 0]
    cache = prefill(model.new_cache(encoder, 2, TOKENS + 1), tokens[:, :4], np.array([1, 3]))
    assert calls == [(2, 4)] and np.asarray(cache.lengths).tolist() == [0, 2]
