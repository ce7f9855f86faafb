"""The accept/reject rule on hand-made distributions (one iteration)."""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from specdec_core.acceptance import accept


def _one_hot(ids, vocab):
    return jax.nn.one_hot(jnp.asarray(ids), vocab, dtype=jnp.float32)


def test_greedy_accepts_matching_prefix_and_recovers_target_argmax():
    vocab = 5
    target_argmax = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]])  # [B, γ+1]
    draft = np.array([[1, 2, 3], [1, 0, 3], [0, 2, 3]])  # [B, γ]
    verdict = accept(
        jnp.asarray(draft),
        _one_hot(draft, vocab),
        _one_hot(target_argmax, vocab),
        jax.random.key(0),
    )
    np.testing.assert_array_equal(verdict.n_accepted, [3, 1, 0])
    np.testing.assert_array_equal(verdict.next_token, [4, 2, 1])  # bonus, recovered, recovered


def test_draft_equal_to_target_accepts_everything():
    key = jax.random.key(1)
    probs = jax.nn.softmax(jax.random.normal(key, (64, 4, 7)))
    draft = jax.random.categorical(key, jnp.log(probs[:, :3]))
    verdict = accept(draft, probs[:, :3], probs, key)
    np.testing.assert_array_equal(verdict.n_accepted, 3)


def test_zero_target_mass_is_always_rejected_and_never_recovered():
    # q puts mass on token 0 where p has none: token 0 must be rejected, and the
    # recovered token must come from norm(max(0, p - q)) = p restricted to {1, 2}.
    q = jnp.array([[[1.0, 0.0, 0.0]]]).repeat(2000, 0)  # [B, 1, V]
    p = jnp.array([[[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]]]).repeat(2000, 0)
    verdict = accept(jnp.zeros((2000, 1), jnp.int32), q, p, jax.random.key(2))
    np.testing.assert_array_equal(verdict.n_accepted, 0)
    tokens = np.asarray(verdict.next_token)
    assert set(np.unique(tokens)) == {1, 2}
    assert abs((tokens == 2).mean() - 0.75) < 0.05


def test_draft_zero_where_target_positive_still_emits_target_distribution():
    # q = one-hot on token 0 (zeros elsewhere), p uniform over 4: first token must be ~p.
    n = 40_000
    q = jnp.broadcast_to(jnp.array([1.0, 0, 0, 0]), (n, 1, 4))
    p = jnp.broadcast_to(jnp.full((2, 4), 0.25), (n, 2, 4))
    verdict = accept(jnp.zeros((n, 1), jnp.int32), q, p, jax.random.key(3))
    first = np.where(verdict.n_accepted == 1, 0, verdict.next_token)
    counts = np.bincount(first, minlength=4)
    assert stats.chisquare(counts, np.full(4, n / 4)).pvalue > 1e-3
    assert abs(np.mean(verdict.n_accepted) - 0.25) < 0.02  # P(accept) = p(0)/q(0) = 0.25


def test_one_key_per_row_equals_split_key():
    key = jax.random.key(4)
    probs = jax.nn.softmax(3 * jax.random.normal(key, (8, 3, 6)))
    draft = jax.random.categorical(key, jnp.log(probs[:, :2]))
    target = jax.nn.softmax(3 * jax.random.normal(jax.random.key(5), (8, 3, 6)))
    a = accept(draft, probs[:, :2], target, key)
    b = accept(draft, probs[:, :2], target, jax.random.split(key, 8))
    np.testing.assert_array_equal(a.n_accepted, b.n_accepted)
    np.testing.assert_array_equal(a.next_token, b.next_token)
    assert a.n_accepted.dtype == jnp.int32 and a.next_token.dtype == jnp.int32
    assert a.n_accepted.shape == (8,) and a.next_token.shape == (8,)


def test_rows_draw_independently():
    key = jax.random.key(6)
    probs = jnp.full((1000, 2, 4), 0.25)
    target = jax.nn.softmax(jnp.arange(4.0)).reshape(1, 1, 4).repeat(3, 1).repeat(1000, 0)
    draft = jnp.zeros((1000, 2), jnp.int32)
    verdict = accept(draft, probs, target, key)
    # Identical inputs in every row: outcomes must still vary across rows.
    assert len(np.unique(verdict.next_token)) > 1
    assert len(np.unique(verdict.n_accepted)) > 1
