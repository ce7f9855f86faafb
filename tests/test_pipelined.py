"""Pipelined speculation: the draft proposes block i+1 while the
target verifies block i, and keeps it only where it stands.

The core steps (:func:`decoding.propose_ahead`, :func:`decoding.settle`,
:func:`decoding.propose_missed`) are driven here by a small host loop over table
models, as the coordinator drives them across processes: the tokens must be the
sequential loop's, bit for bit, at T = 0 and T = 1; with 50,000 rows the samples must
follow the target's distribution (G-test, as in ``test_exactness``), and a loop that
keeps an early block with the previous block's q must be caught. The Ray engine's
pipelined loop is tested in ``test_ray_engine``.
"""

import functools

import jax
import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.models import table
from specdec_core.sampling import SamplingConfig
from tests.stub_models import bound, prompts
from tests.test_exactness import (
    DRAFTS,
    NEW_TOKENS,
    PROMPT,
    SAMPLES,
    TARGET,
    exact_distribution,
    g_test_pvalue,
    speculative_samples,
)


def fixed_prompts(rows):
    return np.tile(np.array(PROMPT, np.int32), (rows, 1)), np.full(rows, len(PROMPT), np.int32)


def pipelined_generate(draft_table, config, gamma, prompts, *, seed=0, stale_q=False):
    """(tokens [B, NEW_TOKENS], rows that kept an early block, rows that did not)."""
    target, draft = bound(table.from_table(TARGET)), bound(table.from_table(draft_table))
    prompt, lengths = prompts
    rows = len(lengths)
    state = decoding.init_state(
        prompt, lengths, np.arange(rows), seed=seed, max_new_tokens=NEW_TOKENS, gamma=gamma
    )
    target_cache = decoding.prefill_fn(target)(table.init_cache(rows, 16), prompt, lengths)
    draft_cache = decoding.prefill_fn(draft)(table.init_cache(rows, 16), prompt, lengths)
    score = jax.jit(decoding.score_and_count(target, config))
    ahead = jax.jit(decoding.propose_ahead(draft, gamma, config, None))
    settle = jax.jit(functools.partial(decoding.settle, eos_id=None, config=config))
    missed = jax.jit(decoding.propose_missed(draft, gamma, config))
    tokens, probs, token_probs, draft_cache = jax.jit(decoding.propose_first(draft, gamma, config))(
        draft_cache, state
    )
    kept = fresh = 0
    while not bool(state.done.all()):
        # The early block first (JAX returns before computing it), then the target.
        guess, early, early_probs, _, draft_cache = ahead(draft_cache, state, tokens)
        n_accepted, target_at_n, target_cache = score(target_cache, state, tokens, token_probs)
        state, hit = settle(state, tokens, probs, n_accepted, target_at_n, guess)
        active = ~np.asarray(state.done)
        kept += int((np.asarray(hit) & active).sum())
        fresh += int((~np.asarray(hit)).sum())
        if stale_q:  # a wrong loop: the early block checked against the previous q
            early_probs = probs
        tokens, probs, token_probs, draft_cache = missed(
            draft_cache, state, hit, early, early_probs
        )
    return np.asarray(state.out_tokens[:, :NEW_TOKENS]), kept, fresh


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("draft, gamma", [("related", 1), ("equal", 1), ("independent", 1)])
def test_pipelined_tokens_are_the_sequential_loops(draft, gamma, temperature):
    # γ = 1: with 3 new tokens a longer block that stands ends the row, and an early
    # block is kept only by a row that goes on.
    config = SamplingConfig(temperature=temperature)
    ragged = prompts(512, 4, TARGET.shape[-1], seed=3)  # rows differ at T = 0 too
    tokens, kept, fresh = pipelined_generate(DRAFTS[draft], config, gamma, ragged, seed=7)
    np.testing.assert_array_equal(
        tokens, speculative_samples(DRAFTS[draft], config, gamma, 7, ragged).tokens
    )
    assert kept > 0, "no row kept an early block: the pipelined path was not exercised"
    if draft == "equal":  # its guess is the target's greedy token, or at T > 0 its
        assert fresh == 0  # drafted bonus, which passes its test as every token of it does
    else:
        assert fresh > 0, "every early block stood: the fresh-proposal path was not exercised"


@pytest.mark.slow
@pytest.mark.parametrize(
    "draft, config, gamma",
    [
        ("related", SamplingConfig(temperature=1.0), 1),
        ("equal", SamplingConfig(temperature=1.0), 1),
        ("related", SamplingConfig(temperature=0.8, top_k=3), 1),
    ],
)
def test_pipelined_samples_follow_target_distribution(draft, config, gamma):
    tokens, kept, _ = pipelined_generate(
        DRAFTS[draft], config, gamma, fixed_prompts(SAMPLES), seed=1234
    )
    assert kept > SAMPLES // 20, f"only {kept} rows kept an early block"
    pvalue = g_test_pvalue(tokens, exact_distribution(TARGET, config))
    assert pvalue > 1e-3, f"G-test rejects pipelined exactness ({draft}, {config}): p={pvalue:.2e}"


@pytest.mark.slow
def test_negative_control_early_block_with_stale_q_is_caught():
    config = SamplingConfig(temperature=1.0)
    tokens, _, _ = pipelined_generate(
        DRAFTS["related"], config, 1, fixed_prompts(SAMPLES), seed=1234, stale_q=True
    )
    pvalue = g_test_pvalue(tokens, exact_distribution(TARGET, config))
    assert pvalue < 1e-6, (
        f"an early block checked against the wrong q went undetected (p={pvalue:.2e})"
    )
