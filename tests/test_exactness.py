"""Distributional exactness of speculative sampling (Theorem 1 of Leviathan et al.).

With a vocabulary of 6 and 3 new tokens there are 216 possible outputs. For each
draft/target pair and sampling setting, ≥ 50,000 speculative samples (one request id
each, all in one batch) are compared with the exact target sequence distribution,
computed by enumeration from the target's table through ``tests.reference`` (numpy from
the definitions, not the decoder's ``specdec_core.sampling``), by a G-test with cells of expected
count < 5 pooled. A correct rule passes at p > 1e-3 (fixed seeds, so the outcome is
reproducible); the negative control, a rule that resamples from p instead of
norm(max(0, p − q)) at a rejection, must fail at p < 1e-6 on the same data sizes.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from specdec_core import acceptance, decoding
from specdec_core.models import table
from specdec_core.sampling import SamplingConfig
from tests import reference
from tests.stub_models import bound, draft_tables, random_table

VOCAB, NEW_TOKENS, SAMPLES = 6, 3, 50_000
PROMPT = [2, 4]
TARGET = random_table(10, VOCAB, scale=1.5)
DRAFTS = draft_tables(TARGET, seed=11)


def exact_distribution(target: np.ndarray, config: SamplingConfig) -> dict[tuple, float]:
    """P(sequence) for every continuation of PROMPT with nonzero probability: the
    uncached table's logits through ``tests.reference`` (numpy, from the definitions;
    nothing of ``specdec_core.sampling``)."""
    return reference.continuation_distribution(
        lambda prefix: table.sequence_logits(target, PROMPT, [*prefix, 0])[-1],
        VOCAB,
        NEW_TOKENS,
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
    )


def speculative_samples(
    draft: np.ndarray, config: SamplingConfig, gamma: int, seed: int, prompts=None
):
    """The in-process loop's result for SAMPLES rows of PROMPT, or for ``prompts``
    (tokens [B, P], lengths [B])."""
    tokens, lengths = prompts or (
        np.tile(np.array(PROMPT, np.int32), (SAMPLES, 1)),
        np.full(SAMPLES, len(PROMPT)),
    )
    rows = len(lengths)
    result = decoding.speculative_generate(
        target=bound(table.from_table(TARGET)),
        target_cache=table.init_cache(rows, 16),
        draft=bound(table.from_table(draft)),
        draft_cache=table.init_cache(rows, 16),
        prompt_tokens=tokens,
        prompt_lengths=lengths,
        request_ids=np.arange(rows),
        max_new_tokens=NEW_TOKENS,
        gamma=gamma,
        sampling_config=config,
        seed=seed,
    )
    assert (result.lengths == NEW_TOKENS).all()
    return result


def g_test_pvalue(samples: np.ndarray, expected: dict[tuple, float]) -> float:
    """G-test of sample rows [N, T] against expected sequence probabilities."""
    index = {seq: i for i, seq in enumerate(expected)}
    impossible = {tuple(row) for row in samples.tolist()} - index.keys()
    assert not impossible, f"sampled sequences the target gives probability 0: {impossible}"
    observed = np.bincount([index[tuple(row)] for row in samples.tolist()], minlength=len(index))
    exp = np.array(list(expected.values())) * len(samples)
    small = exp < 5
    obs_cells = np.append(observed[~small], observed[small].sum())
    exp_cells = np.append(exp[~small], exp[small].sum())
    keep = exp_cells > 0
    exp_cells = exp_cells * obs_cells.sum() / exp_cells[keep].sum()  # float32 probs sum to 1 ± ε
    return float(
        stats.power_divergence(obs_cells[keep], exp_cells[keep], lambda_="log-likelihood").pvalue
    )


CASES = [  # (draft, sampling settings, γ)
    ("related", SamplingConfig(temperature=1.0), 3),
    ("independent", SamplingConfig(temperature=1.0), 2),
    ("adversarial", SamplingConfig(temperature=1.0), 3),
    ("uniform", SamplingConfig(temperature=1.0), 4),
    ("equal", SamplingConfig(temperature=1.0), 3),
    ("adversarial", SamplingConfig(temperature=0.8, top_k=3), 3),
    ("independent", SamplingConfig(temperature=1.0, top_k=2), 1),
    ("related", SamplingConfig(temperature=1.2, top_p=0.7), 3),
    ("adversarial", SamplingConfig(temperature=1.0, top_p=0.6), 5),
]


@pytest.mark.slow
@pytest.mark.parametrize("draft, config, gamma", CASES)
def test_speculative_samples_follow_target_distribution(draft, config, gamma):
    result = speculative_samples(DRAFTS[draft], config, gamma, seed=1234)
    pvalue = g_test_pvalue(result.tokens, exact_distribution(TARGET, config))
    assert pvalue > 1e-3, f"G-test rejects exactness for draft={draft} {config}: p={pvalue:.2e}"


_draft_half = acceptance.draft_half


def _biased_draft_half(draft_tokens, draft_probs, *rest, **options):
    """A wrong rule: after a rejection, resample from p instead of norm(max(0, p - q))."""
    return _draft_half(draft_tokens, jnp.zeros_like(draft_probs), *rest, **options)


@pytest.mark.slow
def test_negative_control_biased_rule_is_caught(monkeypatch):
    config = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(acceptance, "draft_half", _biased_draft_half)
    decoding.clear_compiled()
    try:
        result = speculative_samples(DRAFTS["independent"], config, 3, seed=1234)
    finally:
        monkeypatch.undo()
        decoding.clear_compiled()
    pvalue = g_test_pvalue(result.tokens, exact_distribution(TARGET, config))
    assert pvalue < 1e-6, f"the biased rule went undetected (p={pvalue:.2e})"


@pytest.mark.slow
def test_baseline_samples_follow_target_distribution():
    config = SamplingConfig(temperature=1.0, top_k=4)
    tokens = np.tile(np.array(PROMPT, np.int32), (SAMPLES, 1))
    result = decoding.autoregressive_generate(
        target=bound(table.from_table(TARGET)),
        target_cache=table.init_cache(SAMPLES, 16),
        prompt_tokens=tokens,
        prompt_lengths=np.full(SAMPLES, len(PROMPT)),
        request_ids=np.arange(SAMPLES),
        max_new_tokens=NEW_TOKENS,
        sampling_config=config,
        seed=99,
    )
    assert g_test_pvalue(result.tokens, exact_distribution(TARGET, config)) > 1e-3
