"""specdec_core.training: exact losses on hand-made logits, schedules, memorization, KD."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core import training
from specdec_core.models import decoder, t5

LN = math.log

TINY_T5 = t5.T5Config(
    vocab_size=16,
    emb_dim=32,
    num_heads=2,
    head_dim=8,
    mlp_dim=32,
    num_encoder_layers=1,
    num_decoder_layers=1,
)
TINY_LM = decoder.DecoderConfig(
    vocab_size=16, emb_dim=32, num_heads=2, head_dim=8, mlp_dim=32, num_layers=1, max_len=16
)


def _hand_made_logits():
    """[1, 3, 4] logits: target probabilities 2/5 and 1/2, then a padded position."""
    logits = np.zeros((1, 3, 4), np.float32)
    logits[0, 0, 2] = LN(2.0)  # p(2) = 2 / (3 + 2)
    logits[0, 1, 1] = LN(3.0)  # p(1) = 3 / (3 + 3)
    logits[0, 2, 3] = 100.0  # padding: would cost ~100 if it counted
    return jnp.asarray(logits)


def test_cross_entropy_ignores_padding_exactly():
    batch = {"decoder_target_tokens": jnp.array([[2, 1, 0]])}
    loss, metrics = training.loss_and_metrics(_hand_made_logits(), batch)
    expected = (LN(5 / 2) + LN(2.0)) / 2
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["cross_entropy"]), expected, rtol=1e-6)
    assert float(metrics["accuracy"]) == 1.0
    assert float(metrics["tokens"]) == 2.0
    np.testing.assert_allclose(float(metrics["loss_sum"]), LN(5.0), rtol=1e-6)


def test_loss_weights_drop_prompt_positions():
    batch = {
        "decoder_target_tokens": jnp.array([[2, 1, 0]]),
        "decoder_loss_weights": jnp.array([[0.0, 1.0, 1.0]]),
    }
    loss, metrics = training.loss_and_metrics(_hand_made_logits(), batch)
    np.testing.assert_allclose(float(loss), LN(2.0), rtol=1e-6)
    assert float(metrics["tokens"]) == 1.0


def test_z_loss_and_label_smoothing_values():
    logits = jnp.zeros((1, 1, 4))  # uniform: log Z = ln 4, every log p = -ln 4
    targets = jnp.array([[3]])
    loss, z = training.token_cross_entropy(logits, targets, z_loss=1e-2)
    np.testing.assert_allclose(float(z[0, 0]), LN(4.0) ** 2, rtol=1e-6)
    np.testing.assert_allclose(float(loss[0, 0]), LN(4.0) + 1e-2 * LN(4.0) ** 2, rtol=1e-6)
    smoothed, _ = training.token_cross_entropy(
        _hand_made_logits()[:, :1], jnp.array([[2]]), label_smoothing=0.5
    )
    log_probs = [LN(1 / 5)] * 3 + [LN(2 / 5)]
    expected = 0.5 * LN(5 / 2) - 0.5 * np.mean(log_probs)
    np.testing.assert_allclose(float(smoothed[0, 0]), expected, rtol=1e-6)


def test_distillation_kl_is_zero_for_identical_and_exact_otherwise():
    logits = jax.random.normal(jax.random.key(0), (2, 3, 16))
    np.testing.assert_allclose(training.token_kl(logits, logits), 0.0, atol=1e-6)
    teacher = jnp.array([[[LN(3.0), 0.0]]])  # p = [3/4, 1/4]
    student = jnp.zeros((1, 1, 2))  # q = [1/2, 1/2]
    expected = 0.75 * LN(1.5) + 0.25 * LN(0.5)
    np.testing.assert_allclose(
        float(training.token_kl(student, teacher)[0, 0]), expected, rtol=1e-6
    )
    batch = {"decoder_target_tokens": jnp.array([[1, 2, 0], [3, 0, 0]])}
    config = training.LossConfig(distill_weight=1.0)
    loss, metrics = training.loss_and_metrics(
        logits, batch, loss_config=config, teacher_logits=logits
    )
    np.testing.assert_allclose(float(loss), 0.0, atol=1e-6)
    assert float(metrics["kl"]) == pytest.approx(0.0, abs=1e-6)


def test_schedules_warm_up_then_decay():
    rsqrt = training.make_schedule(learning_rate=1e-3, warmup_steps=10, schedule="rsqrt")
    np.testing.assert_allclose(
        [rsqrt(0), rsqrt(5), rsqrt(10), rsqrt(40)], [0, 5e-4, 1e-3, 5e-4], rtol=1e-5
    )
    cosine = training.make_schedule(
        learning_rate=1e-3, warmup_steps=10, schedule="cosine", total_steps=110
    )
    np.testing.assert_allclose([cosine(10), cosine(60), cosine(110)], [1e-3, 5e-4, 0.0], atol=1e-9)
    wsd = training.make_schedule(
        learning_rate=1e-3, warmup_steps=10, schedule="wsd", total_steps=110, decay_steps=40
    )
    np.testing.assert_allclose(
        [wsd(5), wsd(10), wsd(70), wsd(90), wsd(110), wsd(200)],
        [5e-4, 1e-3, 1e-3, 5e-4, 0.0, 0.0],
        atol=1e-9,
    )
    with pytest.raises(ValueError, match="schedule must be one of"):
        training.make_schedule(learning_rate=1e-3, warmup_steps=1, schedule="linear")
    with pytest.raises(ValueError, match="wsd needs 0 < decay_steps"):
        training.make_schedule(
            learning_rate=1e-3, warmup_steps=10, schedule="wsd", total_steps=40, decay_steps=40
        )


def _copy_batch():
    """Four fixed pairs: targets are the inputs reversed (ids 3..12, EOS = 1)."""
    inputs = np.array([[3, 4, 5, 1], [6, 7, 1, 0], [8, 9, 10, 1], [11, 12, 1, 0]], np.int32)
    targets = np.zeros_like(inputs)
    for row, seq in enumerate(inputs):
        body = [t for t in seq if t > 1][::-1]
        targets[row, : len(body) + 1] = [*body, 1]
    decoder_inputs = np.zeros_like(targets)
    decoder_inputs[:, 1:] = targets[:, :-1]
    return {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": decoder_inputs * (targets > 0),
        "decoder_target_tokens": targets,
    }


def _fit(config, params, batch, *, steps: int, **step_kwargs):
    optimizer = training.make_optimizer(learning_rate=1e-2, warmup_steps=5, schedule="constant")
    step = training.make_train_step(training.logits_fn_for(config), optimizer, **step_kwargs)
    opt_state = optimizer.init(params)
    history = []
    for _ in range(steps):
        params, opt_state, metrics = step(params, opt_state, batch)
        history.append(jax.device_get(metrics))
    return params, history


def test_t5_memorizes_and_greedy_decodes_the_targets():
    batch = _copy_batch()
    params = t5.init_params(TINY_T5, jax.random.key(0))
    params, history = _fit(TINY_T5, params, batch, steps=80)
    assert history[0]["loss"] > 2.0
    assert history[-1]["loss"] < 0.05
    assert history[-1]["accuracy"] == 1.0
    decode = training.t5_greedy_decoder(TINY_T5, max_decode_len=5)
    decoded = np.asarray(decode(params, batch["encoder_input_tokens"]))
    expected = np.zeros((4, 5), np.int32)
    expected[:, :4] = batch["decoder_target_tokens"]
    np.testing.assert_array_equal(decoded, expected)
    evaluated = training.make_eval_step(training.logits_fn_for(TINY_T5))(params, batch)
    combined = training.combine_eval_metrics([evaluated, evaluated])
    assert combined["tokens"] == 2 * 14.0
    assert combined["accuracy"] == 1.0


def test_decoder_only_memorizes_with_prompt_weights():
    tokens = np.array([[2, 3, 4, 5, 6, 1], [2, 7, 8, 9, 10, 1]], np.int32)
    inputs = np.zeros_like(tokens)
    inputs[:, 1:] = tokens[:, :-1]
    weights = np.array([[0, 0, 1, 1, 1, 1]] * 2, np.float32)  # the first two are the prompt
    batch = {
        "decoder_input_tokens": inputs,
        "decoder_target_tokens": tokens,
        "decoder_loss_weights": weights,
    }
    params = decoder.init_params(TINY_LM, jax.random.key(1))
    _, history = _fit(TINY_LM, params, batch, steps=60)
    assert history[0]["tokens"] == 8.0
    assert history[-1]["loss"] < 0.05 < 1.0 < history[0]["loss"]


def test_distillation_pulls_the_student_to_the_teacher():
    batch = _copy_batch()
    teacher = t5.init_params(TINY_T5, jax.random.key(7))
    student = t5.init_params(TINY_T5, jax.random.key(8))
    logits_fn = training.logits_fn_for(TINY_T5)
    _, history = _fit(
        TINY_T5,
        student,
        batch,
        steps=40,
        loss_config=training.LossConfig(distill_weight=1.0, distill_temperature=2.0),
        teacher_logits_fn=logits_fn,
        teacher_params=teacher,
    )
    assert history[0]["kl"] > 0.5
    assert history[-1]["kl"] < 0.1 * history[0]["kl"]
    with pytest.raises(ValueError, match="needs teacher_logits_fn"):
        training.make_train_step(
            logits_fn,
            training.make_optimizer(),
            loss_config=training.LossConfig(distill_weight=0.5),
        )


def test_dropout_is_training_only_reproducible_and_keeps_the_expected_fraction():
    batch = _copy_batch()
    config = dataclasses.replace(TINY_T5, dropout_rate=0.3)
    params = t5.init_params(TINY_T5, jax.random.key(0))
    logits = jax.jit(training.logits_fn_for(config))
    plain = jax.jit(training.logits_fn_for(TINY_T5))(params, batch)
    # no key (evaluation, and every decode): the rate changes nothing
    np.testing.assert_array_equal(logits(params, batch), plain)
    key = jax.random.key(3)
    dropped = logits(params, batch, key)
    np.testing.assert_array_equal(dropped, logits(params, batch, key))  # same key, same mask
    assert not np.allclose(dropped, plain)
    assert not np.allclose(dropped, logits(params, batch, jax.random.key(4)))
    # the cached decoder never drops, whatever the rate
    cache = t5.init_cache(config, params, batch["encoder_input_tokens"], max_decode_len=4)
    cache_plain = t5.init_cache(TINY_T5, params, batch["encoder_input_tokens"], max_decode_len=4)
    step_tokens = jnp.asarray(batch["decoder_input_tokens"][:, :1])
    np.testing.assert_array_equal(
        t5.forward(config, params, cache, step_tokens)[0],
        t5.forward(TINY_T5, params, cache_plain, step_tokens)[0],
    )
    # inverted dropout: the kept fraction is 1 - rate and the mean is preserved
    ones = jnp.ones((200, 500), jnp.float32)
    out = np.asarray(t5._Dropout(0.3, jax.random.key(5))(ones))
    assert abs((out == 0).mean() - 0.3) < 0.01
    assert abs(out.mean() - 1.0) < 0.02
    with pytest.raises(ValueError, match="dropout_rate"):
        t5._Dropout(1.0, key)


def test_train_step_with_dropout_still_learns_and_depends_on_the_key():
    batch = _copy_batch()
    config = dataclasses.replace(TINY_T5, dropout_rate=0.1)
    optimizer = training.make_optimizer(learning_rate=1e-2, warmup_steps=5, schedule="constant")
    step = training.make_train_step(training.logits_fn_for(config), optimizer)
    params = t5.init_params(config, jax.random.key(0))
    opt_state = optimizer.init(params)
    losses = []
    for i in range(120):
        params, opt_state, metrics = step(params, opt_state, batch, jax.random.key(i))
        losses.append(float(metrics["loss"]))
    assert losses[0] > 2.0 and np.mean(losses[-10:]) < 0.5
    evaluated = training.make_eval_step(training.logits_fn_for(config))(params, batch)
    assert float(evaluated["accuracy"]) == 1.0  # evaluation is deterministic (no key)
    copy = jax.tree.map(jnp.copy, params)
    state_copy = jax.tree.map(jnp.copy, opt_state)
    _, _, a = step(params, opt_state, batch, jax.random.key(1000))
    _, _, b = step(copy, state_copy, batch, jax.random.key(1001))
    assert float(a["loss"]) != float(b["loss"])
