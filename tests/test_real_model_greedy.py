"""Greedy speculative decoding with real model families equals greedy target-only decoding.

Targets are the tiny GPT-like and LaMDA-style presets with random weights; drafts are
a bigram fit on the target's greedy continuations of other prompts and a one-layer
decoder that shares the target's embeddings and first block (an early-exit draft).
Batch 2 with prompts of different lengths.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.models import decoder, ngram, registry
from specdec_core.sampling import GREEDY
from tests.test_decoder import random_params

GAMMA = 3
MAX_NEW = 12
CACHE_LEN = 32  # prompt (≤ 7) + MAX_NEW + GAMMA + 1 fits
PROMPT_LENGTHS = np.array([3, 7], np.int32)


# Noise added to the init: enough that greedy output of the random model is not one
# repeated token (tied embeddings make a fresh init echo its input).
NOISE = {"gpt_tiny_test": 0.2, "lamda_tiny_test": 0.3}


def target_model(preset: str):
    config = registry.get_config(preset)
    return config, random_params(config, seed=1, noise=NOISE[preset])


def bigram_draft(config, params):
    """Bigram fit on the target's greedy continuations of 32 random prompts."""
    prompts = np.random.default_rng(12).integers(0, config.vocab_size, size=(32, 4))
    lengths = np.full((32,), 4, np.int32)
    corpus = reference_greedy(config, params, prompts, lengths, MAX_NEW)  # [32, MAX_NEW]
    bigram = ngram.fit_bigram(corpus, config.vocab_size, k=0.01)
    return functools.partial(ngram.forward, bigram), ngram.init_cache(2, CACHE_LEN)


def early_exit_draft(config, params):
    """A one-layer decoder made of the target's embeddings, first block and final norm."""
    draft_config = dataclasses.replace(config, num_layers=1)
    draft_params = {
        "decoder": {
            k: v
            for k, v in params["decoder"].items()
            if not k.startswith("layers_") or k == "layers_0"
        }
    }
    forward = functools.partial(decoder.forward, draft_config, draft_params)
    return forward, decoder.init_cache(draft_config, 2, CACHE_LEN)


def reference_greedy(config, params, prompt_tokens, prompt_lengths, max_new: int):
    """Greedy continuations [B, max_new] from the uncached ``score`` (no cache, no
    decoding module). Rows are right-padded to one length; ``score`` is causal, so the
    padding never affects the position read."""
    batch = len(prompt_lengths)
    seqs = np.zeros((batch, prompt_tokens.shape[1] + max_new), np.int32)
    seqs[:, : prompt_tokens.shape[1]] = prompt_tokens
    score = jax.jit(functools.partial(decoder.score, config))
    rows, ends = np.arange(batch), prompt_lengths.copy()
    for _ in range(max_new):
        logits = np.asarray(score(params, jnp.asarray(seqs)))  # [B, P + max_new, V]
        seqs[rows, ends] = logits[rows, ends - 1].argmax(-1)
        ends += 1
    return np.stack([seqs[b, prompt_lengths[b] : ends[b]] for b in rows])


@pytest.mark.parametrize("preset", ["gpt_tiny_test", "lamda_tiny_test"])
@pytest.mark.parametrize(
    "make_draft", [bigram_draft, early_exit_draft], ids=["bigram", "early_exit"]
)
def test_greedy_speculative_equals_greedy_target(preset, make_draft):
    config, params = target_model(preset)
    target = functools.partial(decoder.forward, config, params)
    draft, draft_cache = make_draft(config, params)
    prompt_tokens = np.random.default_rng(13).integers(0, config.vocab_size, size=(2, 7))
    common = dict(
        prompt_tokens=prompt_tokens,
        prompt_lengths=PROMPT_LENGTHS,
        request_ids=np.arange(2),
        max_new_tokens=MAX_NEW,
        sampling_config=GREEDY,
    )

    base = decoding.autoregressive_generate(
        target=target, target_cache=decoder.init_cache(config, 2, CACHE_LEN), **common
    )
    spec = decoding.speculative_generate(
        target=target,
        target_cache=decoder.init_cache(config, 2, CACHE_LEN),
        draft=draft,
        draft_cache=draft_cache,
        gamma=GAMMA,
        **common,
    )

    np.testing.assert_array_equal(spec.lengths, [MAX_NEW, MAX_NEW])
    np.testing.assert_array_equal(spec.tokens, base.tokens)
    np.testing.assert_array_equal(
        spec.tokens, reference_greedy(config, params, prompt_tokens, PROMPT_LENGTHS, MAX_NEW)
    )
    # Some drafts were rejected, and the early-exit draft also had some accepted (the
    # bigram of a random context-heavy target may accept none: α is low, as in the paper).
    assert spec.accepted.sum() < spec.drafted.sum()
    if make_draft is early_exit_draft:
        assert spec.accepted.sum() > 0
