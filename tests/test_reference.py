"""The exactness tests' reference (``tests.reference``) against hand-computed cases, and
the decoder's ``sampling.probs_from_logits`` against the reference."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core import sampling
from tests.reference import continuation_distribution, token_distribution

LN = [0.0, math.log(2), math.log(3), math.log(4)]  # weights 1, 2, 3, 4 at T = 1


@pytest.mark.parametrize(
    "logits, settings, want",
    [
        (LN[:3], dict(temperature=1.0), [1 / 6, 2 / 6, 3 / 6]),
        (LN[:3], dict(temperature=0.5), [1 / 14, 4 / 14, 9 / 14]),
        ([1.0, 3.0, 3.0], dict(temperature=0.0), [0, 1, 0]),  # a tie: the lower id
        (LN[:3], dict(temperature=1.0, top_k=2), [0, 2 / 5, 3 / 5]),
        ([0.0, 1.0, 1.0, 1.0], dict(temperature=1.0, top_k=2), [0, 1 / 2, 1 / 2, 0]),
        (LN[:3], dict(temperature=1.0, top_p=0.5), [0, 0, 1]),  # 1/2 reaches 0.5
        (LN[:3], dict(temperature=1.0, top_p=0.6), [0, 2 / 5, 3 / 5]),
        # T, then top-k, then top-p: 1, 4, 9, 16 -> drop 1 -> 16/29 < 0.6 keeps 9/29 too
        (LN, dict(temperature=0.5, top_k=3, top_p=0.6), [0, 0, 9 / 25, 16 / 25]),
    ],
)
def test_token_distribution_by_hand(logits, settings, want):
    np.testing.assert_allclose(token_distribution(logits, **settings), want, atol=1e-12)


def test_a_continuation_ends_at_eos_or_at_the_limit():
    # every step: P(eos=0) = 1/4, P(1) = 1/4, P(2) = 1/2
    got = continuation_distribution(
        lambda prefix: [0.0, 0.0, math.log(2)], 3, 2, temperature=1.0, eos=0
    )
    want = {
        (0,): 1 / 4,
        (1, 0): 1 / 16, (1, 1): 1 / 16, (1, 2): 1 / 8,
        (2, 0): 1 / 8, (2, 1): 1 / 8, (2, 2): 1 / 4,
    }  # fmt: skip
    assert got.keys() == want.keys()
    for seq, p in want.items():
        assert got[seq] == pytest.approx(p, abs=1e-12), seq
    # the next token's logits depend on the prefix: here the step after a 1 is sure
    sure = continuation_distribution(
        lambda prefix: [0.0, 0.0, 50.0] if prefix[-1:] == [1] else [0.0, 0.0, 0.0],
        3, 2, temperature=1.0,
    )  # fmt: skip
    assert sure[(1, 2)] == pytest.approx(1 / 3) and sure[(1, 0)] < 1e-20


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=1.0),
        dict(temperature=0.7),
        dict(temperature=0.0),
        dict(temperature=1.0, top_k=3),
        dict(temperature=1.3, top_p=0.8),
        dict(temperature=0.8, top_k=5, top_p=0.5),
    ],
)
def test_the_decoders_probabilities_are_the_references(settings):
    rng = np.random.default_rng(7)
    # rounded logits make ties, which top-k, top-p and T = 0 must break to the lower id
    logits = np.round(rng.standard_normal((200, 9)) * 2, 1).astype(np.float32)
    got = np.asarray(
        sampling.probs_from_logits(jnp.asarray(logits), sampling.SamplingConfig(**settings))
    )
    want = np.stack([token_distribution(row, **settings) for row in logits])
    np.testing.assert_allclose(got, want, atol=2e-6)
