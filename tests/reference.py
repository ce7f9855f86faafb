"""The target's sampling distribution from the definitions, in plain numpy and float64,
sharing no code with ``specdec_core.sampling``: the reference the exactness tests
compare speculative samples with, so a temperature, top-k or top-p mistake in the
decoder cannot hide in the expected side too.

Definitions (the order HF transformers and gpt-fast apply them):

- temperature T > 0: p ∝ exp(logit / T); T = 0: all mass on the largest logit, the
  lowest token id among equal ones;
- top-k (k > 0): the k tokens with the largest logits keep their mass, the rest get 0
  (ties go to the lower id);
- top-p (p < 1): tokens in descending order of probability (ties: lower id first) are
  kept while the mass before them is below p, so the token that crosses p is kept; the
  kept mass is renormalised.

A continuation's probability is the product of its tokens' probabilities; it ends at
``eos`` (no token follows it) or after ``new_tokens`` tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def token_distribution(
    logits: Sequence[float], temperature: float, top_k: int = 0, top_p: float = 1.0
) -> np.ndarray:
    """Probabilities [V] (float64) of the next token under the settings."""
    logits = np.asarray(logits, np.float64)
    vocab = len(logits)
    # descending by logit, ties to the lower id (Python's sort is stable)
    by_logit = sorted(range(vocab), key=lambda i: -logits[i])
    if temperature == 0:
        probs = np.zeros(vocab)
        probs[by_logit[0]] = 1.0
        return probs
    scaled = logits / temperature
    weights = np.exp(scaled - scaled.max())
    if 0 < top_k < vocab:
        for i in by_logit[top_k:]:
            weights[i] = 0.0
    probs = weights / weights.sum()
    if top_p < 1.0:
        by_prob = sorted(range(vocab), key=lambda i: -probs[i])
        kept, mass = [], 0.0
        for i in by_prob:
            if mass >= top_p:
                break
            kept.append(i)
            mass += probs[i]
        trimmed = np.zeros(vocab)
        trimmed[kept] = probs[kept]
        probs = trimmed / trimmed.sum()
    return probs


def continuation_distribution(
    next_logits: Callable[[list[int]], Sequence[float]],
    vocab: int,
    new_tokens: int,
    *,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    eos: int | None = None,
) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation with nonzero probability.

    ``next_logits(continuation so far)`` gives the logits [V] of the next token. A
    continuation is a tuple of up to ``new_tokens`` ids that ends at ``eos`` or at the
    limit.
    """
    out: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    while frontier:
        prefix, mass = frontier.pop()
        if len(prefix) == new_tokens or (prefix and prefix[-1] == eos):
            out[prefix] = out.get(prefix, 0.0) + mass
            continue
        probs = token_distribution(next_logits(list(prefix)), temperature, top_k, top_p)
        for token in np.flatnonzero(probs):
            frontier.append(((*prefix, int(token)), mass * float(probs[token])))
    return out
