"""Unit tests for specdec_core.sampling on hand-made logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core import sampling
from specdec_core.sampling import (
    GREEDY,
    SamplingConfig,
    probs_from_logits,
    sample,
    sample_from_uniform,
    sample_rows,
)


def test_greedy_is_one_hot_argmax_with_ties_to_lowest_id():
    logits = jnp.array([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(probs_from_logits(logits, GREEDY), [[0, 1, 0, 0], [1, 0, 0, 0]])


def test_temperature_scales_logits():
    logits = jnp.log(jnp.array([0.5, 0.25, 0.25]))
    probs = probs_from_logits(logits, SamplingConfig(temperature=0.5))
    expected = np.array([0.25, 0.0625, 0.0625]) / 0.375  # p^(1/T), renormalised
    np.testing.assert_allclose(probs, expected, rtol=1e-6)


def test_top_k_keeps_k_most_likely_ties_to_lowest_id():
    logits = jnp.array([1.0, 2.0, 2.0, 0.0, 2.0])
    probs = probs_from_logits(logits, SamplingConfig(top_k=2))
    np.testing.assert_allclose(probs, [0, 0.5, 0.5, 0, 0], atol=1e-7)


def test_top_p_keeps_token_that_crosses_threshold():
    probs_in = jnp.array([0.1, 0.5, 0.3, 0.1])
    probs = probs_from_logits(jnp.log(probs_in), SamplingConfig(top_p=0.7))
    # 0.5 < 0.7, 0.5 + 0.3 >= 0.7: keep {1, 2}.
    np.testing.assert_allclose(probs, [0, 0.625, 0.375, 0], atol=1e-6)


def test_top_k_then_top_p_compose():
    probs_in = jnp.array([0.4, 0.3, 0.2, 0.1])
    probs = probs_from_logits(jnp.log(probs_in), SamplingConfig(top_k=3, top_p=0.5))
    # top-3 renormalised: [4/9, 3/9, 2/9, 0]; 4/9 < 0.5 so token 1 is kept too.
    np.testing.assert_allclose(probs, [4 / 7, 3 / 7, 0, 0], atol=1e-6)


def test_sample_never_picks_zero_mass_and_follows_probs():
    probs = jnp.array([0.0, 0.2, 0.0, 0.8])
    keys = jax.random.split(jax.random.key(0), 20_000)
    tokens = np.asarray(jax.vmap(lambda k: sample(k, probs))(keys))
    assert set(np.unique(tokens)) == {1, 3}
    assert abs((tokens == 3).mean() - 0.8) < 0.015  # 5 sigma at n=20k is 0.014


def test_inverse_cdf_boundaries():
    probs = jnp.array([[0.0, 0.25, 0.0, 0.75, 0.0]] * 5)
    u = jnp.array([0.0, 0.2499, 0.25, 0.9999, 1.0 - 2**-24])
    np.testing.assert_array_equal(sample_from_uniform(u, probs), [1, 1, 3, 3, 3])
    one_hot = jnp.array([[0.0, 0.0, 1.0]] * 2)
    np.testing.assert_array_equal(sample_from_uniform(jnp.array([0.0, 0.999999]), one_hot), [2, 2])


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_bad_settings_name_the_setting(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingConfig(**kwargs)


def test_a_greedy_draw_is_the_inverse_cdf_draw_of_the_one_hot():
    """sampling.draw at T=0 takes the argmax directly: the same token as the inverse-CDF
    draw for every u in [0, 1), ties in the logits included (to the lowest id)."""
    rng = np.random.default_rng(4)
    logits = jnp.asarray(rng.integers(0, 3, size=(64, 50)).astype(np.float32))  # many ties
    probs = probs_from_logits(logits, GREEDY)
    for u in (0.0, 0.5, 0.999999, *rng.random(5)):
        uniform = jnp.full((64,), u, jnp.float32)
        want = sample_from_uniform(uniform, probs)
        np.testing.assert_array_equal(sampling.draw(uniform, probs, GREEDY), want)
    keys = jax.random.split(jax.random.key(0), 64)
    np.testing.assert_array_equal(sampling.draw_rows(keys, probs, GREEDY), sample_rows(keys, probs))
    warm = SamplingConfig(temperature=1.0)  # any other setting draws as before
    soft = probs_from_logits(logits, warm)
    np.testing.assert_array_equal(
        sampling.draw(uniform, soft, warm), sample_from_uniform(uniform, soft)
    )
