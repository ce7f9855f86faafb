"""Logits → the probabilities actually sampled from.

One function, :func:`probs_from_logits`, applied identically to draft and target, so
the speculative rule compares like with like and keeps the target's *sampling*
distribution exact (temperature, top-k and top-p included). T=0 is the one-hot
argmax with ties broken to the lowest token id, which makes greedy decoding a special
case of sampling rather than a separate code path.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

RULES = ("paper", "invariant")  # SamplingConfig.rule


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How a token is drawn from logits. Hashable, so it can be a static jit argument."""

    temperature: float = 1.0  # 0 = greedy (one-hot argmax, ties to the lowest id)
    top_k: int = 0  # keep the k most likely tokens; 0 = off
    top_p: float = 1.0  # keep the smallest set whose mass reaches top_p; 1.0 = off
    # "paper": Leviathan et al.'s accept/reject rule (acceptance.accept), the most
    # accepted drafts; "invariant": every token is the Gumbel-max sample argmax(log p + g)
    # with g keyed by (seed, request, position), and a draft is accepted iff it is that
    # token (acceptance.accept_invariant), so outputs are the target alone's whatever
    # the draft, γ, batch or placement
    rule: str = "paper"

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"the sampling rule must be one of {RULES}, got {self.rule!r}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def invariant(self) -> bool:
        """Tokens are Gumbel-max samples keyed by position (``rule="invariant"`` at a
        temperature above 0). At T = 0 both rules are the target's argmax, drawn without
        noise."""
        return self.rule == "invariant" and not self.greedy

    @property
    def drafts_bonus(self) -> bool:
        """The paper's rule at a temperature above 0: the position after a block's γ drafts
        is drafted and tested too, like the others, instead of drawn from p, so that every
        emitted token is drawn the same way from its position's keys whatever the γ path
        (:mod:`specdec_core.acceptance`). At T = 0 that token is the target's argmax either
        way, and the invariant rule draws it from p by its position's noise."""
        return self.rule == "paper" and not self.greedy


GREEDY = SamplingConfig(temperature=0.0)


def _descending_ranks(values: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Stable descending order (ties: lowest id first) and each token's rank."""
    order = jnp.argsort(-values, axis=-1, stable=True)  # [..., V]
    ranks = jnp.argsort(order, axis=-1, stable=True)  # [..., V]
    return order, ranks


def _top_k_mask(logits: jax.Array, k: int) -> jax.Array:
    _, ranks = _descending_ranks(logits)
    return ranks < k


def _top_p_mask(probs: jax.Array, top_p: float) -> jax.Array:
    order, ranks = _descending_ranks(probs)
    sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
    mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs  # [..., V]
    keep_sorted = mass_before < top_p  # the token that crosses top_p is kept
    return jnp.take_along_axis(keep_sorted, ranks, axis=-1)


def probs_from_logits(logits: jax.Array, config: SamplingConfig) -> jax.Array:
    """logits [..., V] -> float32 probabilities [..., V] under ``config``.

    Order of operations (as in HF and gpt-fast): temperature, then top-k, then top-p.
    """
    logits = logits.astype(jnp.float32)
    if config.greedy:
        return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    logits = logits / config.temperature
    if 0 < config.top_k < logits.shape[-1]:
        logits = jnp.where(_top_k_mask(logits, config.top_k), logits, -jnp.inf)
    probs = jax.nn.softmax(logits, axis=-1)
    if config.top_p < 1.0:
        probs = jnp.where(_top_p_mask(probs, config.top_p), probs, 0.0)
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return probs


def sample_from_uniform(uniform: jax.Array, probs: jax.Array) -> jax.Array:
    """Inverse-CDF sampling: u [...] in [0, 1), probs [..., V] -> int32 tokens [...].

    Token i is chosen when cdf[i-1] <= u·total < cdf[i], which has probability p[i];
    zero-mass ids never win. One uniform per token keeps the random draws cheap (a
    Gumbel draw would need V of them).
    """
    cdf = jnp.cumsum(probs.astype(jnp.float32), axis=-1)  # [..., V]
    threshold = uniform[..., None] * cdf[..., -1:]
    token = jnp.sum(cdf <= threshold, axis=-1)
    # Rounding can push u·total onto the last plateau: take the last id with mass.
    last_with_mass = probs.shape[-1] - 1 - jnp.argmax((probs > 0)[..., ::-1], axis=-1)
    return jnp.minimum(token, last_with_mass).astype(jnp.int32)


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """Tokens int32 [...] from probabilities [..., V], one shared key."""
    return sample_from_uniform(jax.random.uniform(key, probs.shape[:-1]), probs)


def sample_rows(keys: jax.Array, probs: jax.Array) -> jax.Array:
    """keys [B] (one per row), probs [B, V] -> tokens int32 [B]."""
    return sample_from_uniform(jax.vmap(lambda k: jax.random.uniform(k))(keys), probs)


def draw(uniform: jax.Array, probs: jax.Array, config: SamplingConfig) -> jax.Array:
    """:func:`sample_from_uniform` for probabilities made under ``config``. At T=0 they
    are one-hot, and the inverse-CDF draw is the one token with mass for any u in [0, 1):
    its argmax, taken directly (the cumulative sum over the vocabulary cost a third of a
    draft step inside the decode loop)."""
    if config.greedy:
        return jnp.argmax(probs, axis=-1).astype(jnp.int32)
    return sample_from_uniform(uniform, probs)


def draw_rows(keys: jax.Array, probs: jax.Array, config: SamplingConfig) -> jax.Array:
    """:func:`sample_rows` for probabilities made under ``config`` (see :func:`draw`)."""
    if config.greedy:
        return jnp.argmax(probs, axis=-1).astype(jnp.int32)
    return sample_rows(keys, probs)


def gumbel_argmax(probs: jax.Array, noise: jax.Array) -> jax.Array:
    """argmax(log p + g): probs [..., V], noise [..., V] -> int32 tokens [...].

    With g standard Gumbel noise the token is a sample from p (the Gumbel-max trick); a
    token of zero mass never wins, and a one-hot p (T=0) gives its token whatever g."""
    log_probs = jnp.where(probs > 0, jnp.log(jnp.maximum(probs, 1e-38)), -jnp.inf)
    return jnp.argmax(log_probs + noise, axis=-1).astype(jnp.int32)
