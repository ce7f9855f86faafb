"""Unigram and bigram drafts: exact counts and probabilities, cached == uncached."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core.models import api, ngram
from tests.test_decoder import assert_cached_matches_uncached

# Two sequences over V=5; tokens 0 and 4 never occur.
CORPUS = [[1, 2, 3, 2], [2, 3]]
VOCAB = 5


def test_unigram_counts_and_add_one_probs():
    np.testing.assert_array_equal(ngram.unigram_counts(CORPUS, VOCAB), [0, 1, 3, 2, 0])
    params = ngram.fit_unigram(CORPUS, VOCAB, k=1.0)
    # (count + 1) / (6 + 5)
    np.testing.assert_allclose(np.exp(params.log_probs), np.array([1, 2, 4, 3, 1]) / 11, rtol=1e-6)


def test_unigram_without_smoothing_gives_zero_to_unseen():
    params = ngram.fit_unigram(CORPUS, VOCAB, k=0.0)
    np.testing.assert_allclose(np.exp(params.log_probs), np.array([0, 1, 3, 2, 0]) / 6, rtol=1e-6)
    assert np.isneginf(params.log_probs[0]) and np.isneginf(params.log_probs[4])


def test_bigram_counts_do_not_cross_sequences():
    counts = ngram.bigram_counts(CORPUS, VOCAB)
    expected = np.zeros((VOCAB, VOCAB), np.int64)
    expected[1, 2] = 1  # 1 -> 2
    expected[2, 3] = 2  # 2 -> 3 in both sequences
    expected[3, 2] = 1  # 3 -> 2; no pair (2, 2) across the boundary
    np.testing.assert_array_equal(counts, expected)


def test_bigram_add_k_probs():
    probs = np.exp(np.asarray(ngram.fit_bigram(CORPUS, VOCAB, k=0.5).log_probs))
    # row 2: counts [0, 0, 0, 2, 0] + 0.5, total 2 + 2.5
    np.testing.assert_allclose(probs[2], np.array([0.5, 0.5, 0.5, 2.5, 0.5]) / 4.5, rtol=1e-6)
    np.testing.assert_allclose(probs[0], np.full(VOCAB, 0.2), rtol=1e-6)  # unseen context
    np.testing.assert_allclose(probs.sum(-1), np.ones(VOCAB), rtol=1e-6)


def test_bigram_k0_backs_off_to_unigram_for_unseen_context():
    probs = np.exp(np.asarray(ngram.fit_bigram(CORPUS, VOCAB, k=0.0).log_probs))
    np.testing.assert_allclose(probs[2], [0, 0, 0, 1, 0], atol=0)
    np.testing.assert_allclose(probs[3], [0, 0, 1, 0, 0], atol=0)
    np.testing.assert_allclose(probs[4], np.array([0, 1, 3, 2, 0]) / 6, rtol=1e-6)


def test_fit_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"\[0, 5\)"):
        ngram.fit_bigram([[1, 5]], VOCAB)
    with pytest.raises(ValueError, match="k must be >= 0"):
        ngram.fit_unigram(CORPUS, VOCAB, k=-1.0)


def test_forward_logits_and_cache_history():
    params = ngram.fit_bigram(CORPUS, VOCAB, k=1.0)
    cache = ngram.init_cache(batch_size=2, max_len=6)
    cache = api.rollback(cache, jnp.array([0, 2], jnp.int32))
    logits, cache = ngram.forward(params, cache, jnp.array([[2, 3], [1, 4]], jnp.int32))
    assert logits.shape == (2, 2, VOCAB)
    np.testing.assert_allclose(
        jax.nn.softmax(logits[0, 0]), np.array([1, 1, 1, 3, 1]) / 7, rtol=1e-6
    )
    np.testing.assert_array_equal(cache.lengths, [2, 4])
    np.testing.assert_array_equal(cache.history, [[2, 3, 0, 0, 0, 0], [0, 0, 1, 4, 0, 0]])


@pytest.mark.parametrize("fit", [ngram.fit_unigram, ngram.fit_bigram])
def test_cached_matches_uncached(fit):
    rng = np.random.default_rng(0)
    vocab = 11
    params = fit([rng.integers(0, vocab, size=40) for _ in range(3)], vocab, k=0.1)
    tokens = rng.integers(0, vocab, size=(3, 17))
    reference = np.asarray(ngram.score(params, jnp.asarray(tokens)))
    compared = assert_cached_matches_uncached(
        functools.partial(ngram.forward, params),
        ngram.init_cache(3, 24),
        tokens,
        reference,
        np.array([3, 7, 1]),
        seed=1,
        vocab_size=vocab,
        atol=0,
        rtol=0,
    )
    assert compared == 3 * 17
