"""Table-model pairs (specdec_core.models.table) and request sets for decoding tests."""

from __future__ import annotations

import jax
import numpy as np

from specdec_core.models import table


def bound(params: table.TableParams):
    """The model contract's forward with params bound, as a trained model's is: a
    ``jax.tree_util.Partial``, so that compiled steps take the table as an input and
    every table of one shape shares them (decoding.program_cache), as models of one
    config do."""
    return jax.tree_util.Partial(table.forward, params)


def random_table(seed: int, vocab: int, *, period: int = 2, scale: float = 2.0) -> np.ndarray:
    return np.asarray(
        table.init_params(jax.random.key(seed), vocab_size=vocab, period=period, scale=scale).table
    )


def draft_tables(target: np.ndarray, seed: int) -> dict[str, np.ndarray]:
    """Named drafts for ``target``: related, independent, adversarial, uniform, equal."""
    other = random_table(seed, target.shape[-1], period=target.shape[2])
    return {
        "related": 0.6 * target + 0.4 * other,
        "independent": other,
        # Peaks where the target is low: near-disjoint support after sharpening.
        "adversarial": -3.0 * target,
        "uniform": np.zeros_like(target),
        "equal": target.copy(),
    }


def prompts(batch: int, max_len: int, vocab: int, seed: int = 0):
    """Ragged prompts: tokens [B, max_len] and lengths [B] in [1, max_len]."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch, max_len)).astype(np.int32)
    lengths = (np.arange(batch) % max_len + 1).astype(np.int32)
    return tokens, lengths


def encoder_requests(n: int, vocab: int, offset: int = 0) -> list:
    """``n`` encoder-decoder requests of 3-11 random source tokens in [3, vocab) and EOS,
    ids ``r{offset}``...; a pure function of ``offset``."""
    from workers.batching import Request

    rng = np.random.default_rng(offset)
    return [
        Request(
            id=f"r{offset + i}",
            prompt_tokens=(0,),
            encoder_tokens=(*rng.integers(3, vocab, 3 + (i * 5) % 9).tolist(), 1),
        )
        for i in range(n)
    ]
