"""The drafter-invariant rule (``SamplingConfig(rule="invariant")``): every token is the
target's Gumbel-max sample at its position, so speculative outputs equal the target
alone's, token for token, at any temperature, whatever the draft, γ, batch or loop; and
the samples follow the target's distribution (G-tests in ``tests/test_exactness_paths.py``).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from specdec_core import acceptance, decoding, sampling
from specdec_core.models import table
from specdec_core.sampling import SamplingConfig
from tests.stub_models import bound, draft_tables, prompts, random_table

VOCAB, EOS = 7, 3
TARGET = random_table(41, VOCAB, period=3, scale=1.5)
DRAFTS = draft_tables(TARGET, seed=42)
SETTINGS = [
    SamplingConfig(temperature=1.0, rule="invariant"),
    SamplingConfig(temperature=0.7, top_k=4, rule="invariant"),
    SamplingConfig(temperature=1.0, top_p=0.8, rule="invariant"),
    SamplingConfig(temperature=0.0, rule="invariant"),
]


def _common(batch: int, config: SamplingConfig, seed: int = 5):
    tokens, lengths = prompts(batch, 5, VOCAB, seed=3)
    return dict(
        prompt_tokens=tokens,
        prompt_lengths=lengths,
        request_ids=np.arange(100, 100 + batch),
        max_new_tokens=np.array([20, 3, 14, 20, 9, 17, 20, 1])[:batch],
        sampling_config=config,
        seed=seed,
        eos_id=EOS,
    )


def _alone(batch, config, **kw):
    return decoding.autoregressive_generate(
        target=bound(table.from_table(TARGET)),
        target_cache=table.init_cache(batch, 48),
        **_common(batch, config, **kw),
    )


def _speculative(batch, config, draft, gamma, *, compiled, **kw):
    return decoding.speculative_generate(
        target=bound(table.from_table(TARGET)),
        target_cache=table.init_cache(batch, 48),
        draft=bound(table.from_table(DRAFTS[draft])),
        draft_cache=table.init_cache(batch, 48),
        gamma=gamma,
        compiled=compiled,
        **_common(batch, config, **kw),
    )


def _rows(result) -> list[list[int]]:
    return [result.row_tokens(row) for row in range(len(result.lengths))]


@pytest.mark.parametrize(
    "config", SETTINGS, ids=lambda c: f"T{c.temperature}-k{c.top_k}-p{c.top_p}"
)
def test_speculative_outputs_are_the_target_alones_for_every_draft_gamma_and_loop(config):
    alone = _rows(_alone(8, config))
    for draft in ("related", "independent"):
        for gamma, compiled in ((1, True), (2, False), (3, True), (5, False)):
            got = _speculative(8, config, draft, gamma, compiled=compiled)
            assert _rows(got) == alone, (draft, gamma, compiled)
    if config.temperature:  # a sampled job: other seeds, other tokens
        assert _rows(_alone(8, config, seed=6)) != alone


def test_a_rows_tokens_do_not_depend_on_its_batch():
    config = SETTINGS[0]
    whole = _rows(_speculative(8, config, "related", 3, compiled=True))
    alone = _rows(_speculative(3, config, "related", 2, compiled=False))
    assert whole[:3] == alone


def test_the_split_halves_give_the_in_process_tokens():
    """The target's invariant half and the draft's half across a (simulated) process
    boundary, as the Ray workers run them (decoding.score_and_count and
    recover_and_propose), give the in-process loop's tokens."""
    config = SETTINGS[1]
    batch, gamma = 8, 3
    common = _common(batch, config)
    target, draft = bound(table.from_table(TARGET)), bound(table.from_table(DRAFTS["independent"]))
    state = decoding.init_state(
        common["prompt_tokens"], common["prompt_lengths"], common["request_ids"],
        seed=common["seed"], max_new_tokens=common["max_new_tokens"], gamma=gamma,
    )  # fmt: skip
    tokens, lengths = common["prompt_tokens"], common["prompt_lengths"]
    target_cache = decoding.prefill_fn(target)(table.init_cache(batch, 48), tokens, lengths)
    draft_cache = decoding.prefill_fn(draft)(table.init_cache(batch, 48), tokens, lengths)
    score = jax.jit(decoding.score_and_count(target, config))
    step = jax.jit(decoding.recover_and_propose(draft, gamma, config, EOS))
    x, q, q_tok, draft_cache = jax.jit(decoding.propose_first(draft, gamma, config))(
        draft_cache, state
    )
    while not bool(np.all(state.done)):
        n, p_at_n, target_cache = score(target_cache, state, x, q_tok)
        state, x, q, q_tok, draft_cache = step(draft_cache, state, x, q, n, p_at_n)
    split = decoding.result_from_state(
        state, common["max_new_tokens"], 0, draft_s=0.0, target_s=0.0, overhead_s=0.0, total_s=0.0
    )
    assert _rows(split) == _rows(_alone(batch, config))
    assert 0 < split.accepted.sum() < split.drafted.sum()  # both accepts and rejections


def test_the_rule_accepts_the_drafts_that_are_the_targets_tokens():
    probs = np.array([[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]], np.float32)
    noise = np.array([[[0.0, 1.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 9.0]]], np.float32)
    # the target's tokens: 1 (0.5 vs 0.5, noise decides), 1 (one-hot), 0 (mass beats noise)
    verdict = acceptance.accept_invariant(np.array([[1, 2]]), probs, noise)
    assert (int(verdict.n_accepted[0]), int(verdict.next_token[0])) == (1, 1)
    verdict = acceptance.accept_invariant(np.array([[1, 1]]), probs, noise)
    assert (int(verdict.n_accepted[0]), int(verdict.next_token[0])) == (2, 0)
    with pytest.raises(ValueError, match="sampling rule must be one of"):
        dataclasses.replace(SETTINGS[0], rule="gumbel")
    assert sampling.SamplingConfig().rule == "paper"


def test_the_cli_names_the_same_rules_as_the_core():
    from pipelines import cli

    assert cli.SAMPLING_RULES == sampling.RULES
