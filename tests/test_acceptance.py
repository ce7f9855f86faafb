"""The accept/reject rule on hand-made distributions (one iteration)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
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


def _reference_accept(draft_tokens, draft_probs, target_probs, key):
    """Algorithm 1 written out in one piece (the rule before it was split in halves),
    with the bonus position drafted and tested where the draft proposed it (D = γ + 1)."""
    from specdec_core import acceptance, sampling

    batch, drafted = draft_tokens.shape
    width = target_probs.shape[1]  # γ + 1
    gamma = width - 1
    uniforms = acceptance.row_uniforms(key, batch, 2 * width)
    tests, draws = uniforms[:, :width], uniforms[:, width:]
    idx = draft_tokens[..., None]
    q_tok = jnp.take_along_axis(draft_probs, idx, axis=-1)[..., 0]
    p_tok = jnp.take_along_axis(target_probs[:, :drafted], idx, axis=-1)[..., 0]
    ok = tests[:, :drafted] * q_tok < p_tok
    n = jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1)
    rows = jnp.arange(batch)
    q_ext = jnp.concatenate([draft_probs, jnp.zeros_like(draft_probs[:, :1])], axis=1)
    at = jnp.minimum(n, gamma)
    residual = jnp.maximum(target_probs[rows, at] - q_ext[rows, at], 0.0)
    residual = jnp.where(residual.sum(-1, keepdims=True) > 0, residual, target_probs[rows, at])
    recovered = sampling.sample_from_uniform(draws[rows, at], residual)
    bonus = draft_tokens[rows, min(gamma, drafted - 1)]
    return at, jnp.where(n > gamma, bonus, recovered)  # n > γ only with the bonus drafted


@pytest.mark.parametrize("bonus_drafted", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("gamma", [1, 4])
def test_accept_is_the_composition_of_the_target_and_draft_halves(
    temperature, gamma, bonus_drafted
):
    """The halves the workers run, composed across a (simulated) process boundary that
    carries only q_i(x_i) one way and (n, p_{n+1}) the other, give accept's verdict, and
    both equal the rule written out in one piece; T=0 is one-hot p and q. With the bonus
    position drafted, the draft's x_{γ+1} is kept where it passes its test."""
    from specdec_core import acceptance, sampling

    batch, vocab = 512, 6
    drafted = gamma + bonus_drafted
    key_q, key_p, key_x, key_u = jax.random.split(jax.random.key(gamma), 4)
    config = sampling.SamplingConfig(temperature=temperature)
    q = sampling.probs_from_logits(2 * jax.random.normal(key_q, (batch, drafted, vocab)), config)
    # The target agrees with the draft in some rows and positions, so every n occurs.
    p_logits = 2 * jax.random.normal(key_p, (batch, gamma + 1, vocab))
    p_logits = p_logits.at[: batch // 2, :drafted].set(jnp.log(q[: batch // 2] + 1e-9) * 3)
    p = sampling.probs_from_logits(p_logits, config)
    x = jax.random.categorical(key_x, jnp.log(q + 1e-30)).astype(jnp.int32)  # [B, D]
    keys = jax.random.split(key_u, batch)

    verdict = accept(x, q, p, keys)
    uniforms = acceptance.row_uniforms(keys, batch, 2 * (gamma + 1))
    tests, draws = uniforms[:, : gamma + 1], uniforms[:, gamma + 1 :]
    options = {"bonus_drafted": bonus_drafted}
    n, p_at_n = acceptance.target_half(x, acceptance.token_probs(q, x), p, tests, **options)
    halves = acceptance.draft_half(x, q, n, np.asarray(p_at_n), draws, **options)
    ref_n, ref_next = _reference_accept(x, q, p, keys)

    np.testing.assert_array_equal(halves.n_accepted, verdict.n_accepted)
    np.testing.assert_array_equal(halves.next_token, verdict.next_token)
    np.testing.assert_array_equal(verdict.n_accepted, ref_n)
    np.testing.assert_array_equal(verdict.next_token, ref_next)
    seen = set(np.unique(n).tolist())  # every draft rejected, the first, all (the bonus too)
    assert {0, 1, drafted} <= seen and seen <= set(range(drafted + 1))
    assert p_at_n.shape == (batch, vocab)
    if bonus_drafted:  # a passed bonus is the draft's own token
        passed = np.asarray(n) == gamma + 1
        np.testing.assert_array_equal(np.asarray(verdict.next_token)[passed], x[passed, gamma])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_drafted_bonus_gives_the_token_a_drafted_position_would(temperature):
    """A position's token is one function of its uniforms wherever it falls in a block:
    as the drafted bonus (position γ+1 of a block of γ) and as the last drafted token of
    a block of γ+1 with the bonus after it, every row's first γ+1 tokens agree."""
    from specdec_core import acceptance, sampling

    batch, vocab, gamma = 2048, 5, 2
    config = sampling.SamplingConfig(temperature=temperature)
    key_q, key_p, key_x, key_u = jax.random.split(jax.random.key(7), 4)
    q = sampling.probs_from_logits(jax.random.normal(key_q, (batch, gamma + 2, vocab)), config)
    p = sampling.probs_from_logits(jax.random.normal(key_p, (batch, gamma + 2, vocab)), config)
    x = jax.random.categorical(key_x, jnp.log(q + 1e-30)).astype(jnp.int32)  # [B, γ+2]
    u = jax.random.uniform(key_u, (2, batch, gamma + 2))
    short = acceptance.verdict(
        x[:, : gamma + 1], q[:, : gamma + 1], p[:, : gamma + 1], u[0], u[1], bonus_drafted=True
    )
    long = acceptance.verdict(x, q, p, u[0], u[1], bonus_drafted=True)

    def tokens(v, width):
        n, nxt = np.asarray(v.n_accepted), np.asarray(v.next_token)
        out = np.where(np.arange(width)[None] < n[:, None], np.asarray(x[:, :width]), -1)
        out[np.arange(batch), n] = nxt
        return out, n + 1

    a, a_len = tokens(short, gamma + 1)
    b, b_len = tokens(long, gamma + 2)
    both = np.minimum(a_len, b_len)
    mask = np.arange(gamma + 1)[None] < both[:, None]
    np.testing.assert_array_equal(np.where(mask, a, 0), np.where(mask, b[:, : gamma + 1], 0))
    assert (a_len == gamma + 1).any() and (b_len == gamma + 2).any()
