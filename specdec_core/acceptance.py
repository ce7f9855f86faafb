"""The accept/reject rule of speculative sampling (Leviathan et al., 2023, Algorithm 1).

Terms, per row of a batch, for one iteration with γ drafted tokens x_1..x_γ:

- ``q_i`` (``draft_probs[:, i]``): the draft's sampling distribution at drafted
  position i, from which x_i was drawn.
- ``p_i`` (``target_probs[:, i]``): the target's sampling distribution at the same
  position; the target also gives ``p_{γ+1}``, the distribution after x_γ.
- **accepted** tokens: x_i is kept when ``u_i < p_i(x_i) / q_i(x_i)`` with
  ``u_i ~ U[0, 1)``, for i = 1.. until the first failure. ``n_accepted`` ∈ [0, γ] is the
  length of that prefix.
- **recovered** token: at the first rejected position n+1, a sample from
  ``norm(max(0, p_{n+1} − q_{n+1}))`` (Algorithm 1, "adjust the distribution").
- **bonus** token: the token at position γ+1 when all γ are accepted.

``next_token`` is the recovered or the bonus token; every iteration emits
``n_accepted + 1`` tokens, and by Theorem 1 of the paper their distribution equals the
target's.

**The bonus position.** In Algorithm 1 the bonus token is a sample from p_{γ+1}. A token
drawn that way differs from one that the same position would give as a drafted one, so a
seeded job's samples would depend on where its blocks happened to end, and so on γ. At a
temperature above 0 (``SamplingConfig.drafts_bonus``) the draft therefore proposes one
token more, x_{γ+1} from q_{γ+1}, and it is tested against p_{γ+1} like the others: every
emitted token is then the same function of its prefix and its position's uniforms (the
draft's draw, the test, the residual draw) on every path. The target still scores the
same γ+1 positions; the draft pays one more step. Writing ``q_{γ+1} = 0`` where it is not
drafted (T = 0, where the bonus token is p's argmax either way) makes both one formula:
the residual at position γ+1 is then p itself.

The rule is split in two halves so that a process boundary between the target and
the draft carries only what is needed:

- :func:`target_half`, run where the target's distributions are: the accepted-prefix
  length (:func:`count_accepted`, two scalars per drafted token) and p at the one
  position where the next token is drawn, ``p_{n+1}`` ([B, V]);
- :func:`draft_half`, run where the draft's distributions are: the recovered or bonus
  token from that p and the draft's own q at the same position
  (:func:`sample_next_token`).

:func:`verdict` is exactly their composition (the in-process loops call it; the Ray
workers call the halves, through :mod:`specdec_core.decoding`), and :func:`accept` is
the same with the uniforms drawn from one key. The uniforms are two arrays [B, γ+1]:
the tests', and the next token's draw at each position (the one at position n+1 is
used). All functions are batched and free of host syncs.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from specdec_core import sampling


@flax.struct.dataclass
class Verdict:
    n_accepted: jax.Array  # [B] int32 in [0, γ]
    next_token: jax.Array  # [B] int32: recovered token (n < γ) or bonus token (n = γ)


def row_uniforms(key: jax.Array, batch_size: int, count: int) -> jax.Array:
    """Uniforms [B, count] in [0, 1): from one key (split per row) or from keys [B]."""
    typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
    single = key.ndim == 0 if typed else key.shape == (2,)
    keys = jax.random.split(key, batch_size) if single else key
    return jax.vmap(lambda k: jax.random.uniform(k, (count,)))(keys)


def count_accepted(
    draft_token_probs: jax.Array,
    target_token_probs: jax.Array,
    uniforms: jax.Array,
    live: jax.Array | None = None,
) -> jax.Array:
    """The accepted-prefix length per row.

    draft_token_probs:  [B, D] q_i(x_i), the draft's probability of each drafted token.
    target_token_probs: [B, D] p_i(x_i), the target's probability of the same token.
    uniforms:           [B, D] u_i ~ U[0, 1).
    live:               [1 or B, D] bool, the slots that hold a proposal (None: all).
    Returns n_accepted [B] int32.
    """
    # u < p/q written without a division: with q = p every token passes (u < 1).
    ok = uniforms * draft_token_probs < target_token_probs  # [B, D]
    if live is not None:
        ok = ok & live
    return jnp.sum(jnp.cumprod(ok.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)


@jax.jit
def sample_next_token(
    target_probs_at_n: jax.Array, draft_probs_at_n: jax.Array, uniforms: jax.Array
) -> jax.Array:
    """The recovered (or, with draft_probs_at_n = 0, bonus) token per row.

    target_probs_at_n: [B, V] p at the first rejected position (or p_{γ+1}).
    draft_probs_at_n:  [B, V] q at that position (zeros where nothing was drafted there).
    uniforms:          [B] u ~ U[0, 1) for inverse-CDF sampling.
    """
    residual = jnp.maximum(target_probs_at_n - draft_probs_at_n, 0.0)  # [B, V]
    mass = residual.sum(axis=-1, keepdims=True)
    # A rejection implies mass > 0 in exact arithmetic; guard rounding with p itself.
    residual = jnp.where(mass > 0, residual, target_probs_at_n)
    return sampling.sample_from_uniform(uniforms, residual)


def token_probs(probs: jax.Array, tokens: jax.Array) -> jax.Array:
    """probs [B, ≥D, V], tokens [B, D] -> probs[b, i, tokens[b, i]] [B, D]: q_i(x_i) or p_i(x_i)."""
    return jnp.take_along_axis(probs[:, : tokens.shape[1]], tokens[..., None], axis=-1)[..., 0]


def _live(slots: int, gamma, bonus_drafted: bool):
    """[1, slots] bool: the slots that hold a proposal, where a traced γ drafts fewer
    than the block's slots; None where every slot does."""
    if gamma is None:
        return None
    return jnp.arange(slots)[None, :] < gamma + bonus_drafted


def target_half(
    draft_tokens: jax.Array,
    draft_token_probs: jax.Array,
    target_probs: jax.Array,
    tests: jax.Array,
    gamma: jax.Array | None = None,
    *,
    bonus_drafted: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """The target's half of Algorithm 1: how many drafts pass, and p where the next token is drawn.

    draft_tokens:      [B, D] int32, x_1..x_γ, and x_{γ+1} where ``bonus_drafted``.
    draft_token_probs: [B, D] q_i(x_i) (the draft sends these scalars, not q).
    target_probs:      [B, γ+1, V] p at each of the γ+1 positions.
    tests:             [B, ≥D] the tests' uniforms.
    gamma:             a traced γ where the block has more slots than it drafts (the
                       slots after γ, or γ+1 with the bonus drafted, hold no proposal).
    Returns (n [B] int32, p_{n+1} [B, V]): n ∈ [0, D] drafts passed, and p at the first
    rejected position, or p_{γ+1} when all γ passed — the input of :func:`draft_half`.
    """
    n = count_accepted(
        draft_token_probs,
        token_probs(target_probs, draft_tokens),
        tests[:, : draft_tokens.shape[1]],
        _live(draft_tokens.shape[1], gamma, bonus_drafted),
    )
    at = jnp.minimum(n, target_probs.shape[1] - 1)  # (n = γ+1 needs no p: the bonus passed)
    return n, target_probs[jnp.arange(draft_tokens.shape[0]), at]


def draft_half(
    draft_tokens: jax.Array,
    draft_probs: jax.Array,
    n: jax.Array,
    target_probs_at_n: jax.Array,
    draws: jax.Array,
    gamma: jax.Array | None = None,
    *,
    bonus_drafted: bool = False,
) -> Verdict:
    """The draft's half of Algorithm 1: the recovered or bonus token.

    draft_tokens, draft_probs: [B, D], [B, D, V] the block's drafts and their q (kept by
                       the draft).
    n:                 [B] int32, from :func:`target_half`.
    target_probs_at_n: [B, V] p_{n+1}, from :func:`target_half`.
    draws:             [B, ≥γ+1] the uniform of the next token's draw at each position.
    gamma:             as in :func:`target_half`; by default the block's drafts.
    Returns Verdict(min(n, γ), the token at position n+1): x_{γ+1} where it was drafted
    and passed, else a draw from norm(max(0, p_{n+1} − q_{n+1})) with q_{γ+1} = 0 where
    it was not drafted (the bonus token from p_{γ+1}).
    """
    batch, slots = draft_tokens.shape
    rows = jnp.arange(batch)
    if gamma is None:
        gamma = slots - bonus_drafted
    at = jnp.minimum(n, slots - 1)
    drafted = n < gamma + bonus_drafted  # a proposal stands at position n+1
    q_at_n = jnp.where(drafted[:, None], draft_probs[rows, at], 0.0)
    draw = draws[rows, jnp.minimum(n, draws.shape[1] - 1)]
    recovered = sample_next_token(target_probs_at_n, q_at_n, draw)
    bonus = draft_tokens[rows, jnp.clip(n - 1, 0, slots - 1)]  # x_{γ+1}, where n = γ+1
    next_token = jnp.where(n > gamma, bonus, recovered)
    return Verdict(n_accepted=jnp.minimum(n, gamma).astype(jnp.int32), next_token=next_token)


def verdict(
    draft_tokens: jax.Array,
    draft_probs: jax.Array,
    target_probs: jax.Array,
    tests: jax.Array,
    draws: jax.Array,
    gamma: jax.Array | None = None,
    *,
    bonus_drafted: bool = False,
) -> Verdict:
    """Algorithm 1 over a batch of proposals: :func:`target_half` then
    :func:`draft_half` on the same inputs (as :func:`target_half`'s, with ``draft_probs``
    [B, D, V] the draft's q and ``draws`` its uniforms [B, ≥γ+1])."""
    options = {"bonus_drafted": bonus_drafted}
    n, target_at_n = target_half(
        draft_tokens, token_probs(draft_probs, draft_tokens), target_probs, tests, gamma, **options
    )
    return draft_half(draft_tokens, draft_probs, n, target_at_n, draws, gamma, **options)


@jax.jit
def accept(
    draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array, key: jax.Array
) -> Verdict:
    """Algorithm 1 of Leviathan et al. (2023) with uniforms from one key.

    draft_tokens: [B, D] int32, the drafted tokens x_1..x_γ, and x_{γ+1} where D = γ+1.
    draft_probs:  [B, D, V] q at each drafted position.
    target_probs: [B, γ+1, V] p at each of the γ+1 positions.
    key:          one PRNG key (rows draw independently) or one key per row [B].
    Returns Verdict(n_accepted [B], next_token [B]): :func:`verdict` on the row
    uniforms drawn from ``key`` (the tests first, then the draws).
    """
    width = target_probs.shape[1]
    uniforms = row_uniforms(key, draft_tokens.shape[0], 2 * width)  # [B, 2(γ+1)]
    return verdict(
        draft_tokens,
        draft_probs,
        target_probs,
        uniforms[:, :width],
        uniforms[:, width:],
        bonus_drafted=draft_tokens.shape[1] == width,
    )


# ------------------------------------------------------ the drafter-invariant rule
#
# With ``SamplingConfig.rule == "invariant"`` the token at output position t is the
# Gumbel-max sample argmax(log p_t + g_t), g_t standard Gumbel noise keyed by (seed,
# request, t), and the draft proposes argmax(log q_t + g_t) with the same g_t. A draft is
# accepted iff it equals the target's token, and the iteration's next token is the
# target's token at the first mismatch (or after the last draft). Every committed token
# is then the target's own seeded sample at its position, so the output is the target
# alone's whatever the draft, γ, batch or placement (Daliri, Musco, Suresh 2024,
# "Coupling without communication and drafter-invariant speculative decoding"); a draft
# is accepted with probability at least (1 − TV)/(1 + TV), against 1 − TV for the rule
# above.


def _invariant_verdict(
    draft_tokens: jax.Array, target_probs: jax.Array, noise: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """(n_accepted [B], the target's token at position n+1 [B]) under the invariant rule
    (inputs as :func:`invariant_target_half`)."""
    batch, gamma = draft_tokens.shape
    tokens = sampling.gumbel_argmax(target_probs, noise)  # [B, γ+1]
    same = (draft_tokens == tokens[:, :gamma]).astype(jnp.int32)
    n_accepted = jnp.sum(jnp.cumprod(same, axis=1), axis=1).astype(jnp.int32)
    return n_accepted, tokens[jnp.arange(batch), n_accepted]


@jax.jit
def invariant_target_half(
    draft_tokens: jax.Array, target_probs: jax.Array, noise: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The target's half of the invariant rule, in :func:`target_half`'s terms.

    draft_tokens: [B, γ] int32; target_probs: [B, γ+1, V]; noise: [B, γ+1, V] the
    Gumbel noise of the γ+1 positions. Returns (n_accepted [B], p_{n+1} [B, V]) where
    p_{n+1} is one-hot at the target's token there: :func:`draft_half` then draws that
    token (the residual one-hot minus q has mass only there, since the draft proposed
    another token where it had one).
    """
    n_accepted, chosen = _invariant_verdict(draft_tokens, target_probs, noise)
    return n_accepted, jax.nn.one_hot(chosen, target_probs.shape[-1], dtype=target_probs.dtype)


@jax.jit
def accept_invariant(draft_tokens: jax.Array, target_probs: jax.Array, noise: jax.Array) -> Verdict:
    """The invariant rule over a batch of γ-token proposals (inputs as
    :func:`invariant_target_half`): Verdict(n_accepted, the target's token at n+1)."""
    n_accepted, chosen = _invariant_verdict(draft_tokens, target_probs, noise)
    return Verdict(n_accepted=n_accepted, next_token=chosen)


def accept_invariant_first(
    draft_tokens: jax.Array, target_probs: jax.Array, noise: jax.Array, gamma: jax.Array
) -> Verdict:
    """:func:`accept_invariant` on the first ``gamma`` of a block's draft slots (as
    :func:`verdict` with a traced γ): the target's token at every position is its own Gumbel-max
    sample, so the slots after γ only need to count as mismatches."""
    batch, slots = draft_tokens.shape
    tokens = sampling.gumbel_argmax(target_probs, noise)  # [B, S+1]
    same = (draft_tokens == tokens[:, :slots]) & (jnp.arange(slots)[None, :] < gamma)
    n_accepted = jnp.sum(jnp.cumprod(same.astype(jnp.int32), axis=1), axis=1).astype(jnp.int32)
    return Verdict(n_accepted=n_accepted, next_token=tokens[jnp.arange(batch), n_accepted])
