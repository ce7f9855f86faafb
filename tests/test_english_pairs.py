"""The committed English decoder-only pairs (GPT-like, LaMDA-style) of the acceptance study.

They load from their T5X exports through the same resolution the jobs use; greedy
speculative decoding with the trained draft equals greedy target-only decoding token
for token; and, sampling at T=1, the trained draft's proposals are accepted far more
often than a bigram's fit on the same text (the ordering the paper's Table 3 shows),
measured on English test prompts. (At T=0 the LaMDA-style draft is not yet
separable from the bigram: BENCHMARKS.md, "Table 3 in miniature".)
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from pipelines import configs
from pipelines.data import ding
from pipelines.model_resolver import resolve_model
from specdec_core import decoding
from specdec_core.models import ngram
from specdec_core.sampling import GREEDY, SamplingConfig

PAIRS = [
    ("gpt_en_target", "gpt_en_draft"),
    ("gpt_en_target", "gpt_en_draft_large"),
    ("lamda_en_target", "lamda_en_draft"),
    ("lamda_en_target", "lamda_en_draft_large"),
]
PROMPTS = 16
PROMPT_PIECES = 4
MAX_NEW = 16
GAMMA = 4
EOS_ID = 1


@pytest.fixture(scope="module")
def load():
    """Loads a committed model once per module: the two pairs of a family share their
    target, read once (its compiled programs would be shared by structure either way:
    decoding.program_cache)."""
    loaded = {}

    def model(name: str, role: str):
        if name not in loaded:
            loaded[name] = resolve_model(name, role=role).spec.load()
        return loaded[name]

    return model


@pytest.fixture(scope="module")
def processor():
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(configs.resolve("assets/spm/ende.model")))


@pytest.fixture(scope="module")
def prompts(processor):
    """Start id 0 + the first pieces of English test sentences, [B, 1 + PROMPT_PIECES]."""
    sentences = [en for en, _ in ding.read_split(configs.resolve("assets/data/ding"), "test")]
    pieces = [ids for ids in processor.encode(sentences) if len(ids) > PROMPT_PIECES][:PROMPTS]
    return np.asarray([[0, *ids[:PROMPT_PIECES]] for ids in pieces], np.int32)


@pytest.fixture(scope="module")
def bigram_forward(processor):
    """A bigram draft fit on the Ding training English (one for every pair: its dense
    table is vocab² floats, and each copy would be compiled into the loop again)."""
    lines = [en for en, _ in ding.read_split(configs.resolve("assets/data/ding"), "train")]
    corpus = [[0, *ids, EOS_ID] for ids in processor.encode(lines[:50_000])]
    return functools.partial(
        ngram.forward, ngram.fit_bigram(corpus, processor.get_piece_size(), k=1.0)
    )


def _decode_args(target, prompts) -> dict:
    """The arguments both decoding loops share: the target, its cache, the prompts."""
    rows, width = prompts.shape
    return dict(
        target=target.forward,
        target_cache=target.new_cache(None, rows, _max_len(prompts)),
        prompt_tokens=prompts,
        prompt_lengths=np.full((rows,), width, np.int32),
        request_ids=np.arange(rows),
        max_new_tokens=MAX_NEW,
        eos_id=EOS_ID,
    )


def _max_len(prompts) -> int:
    return prompts.shape[1] + MAX_NEW + GAMMA + 2


def _speculative(target, draft_forward, draft_cache, prompts, sampling_config=GREEDY):
    return decoding.speculative_generate(
        **_decode_args(target, prompts),
        draft=draft_forward,
        draft_cache=draft_cache,
        gamma=GAMMA,
        sampling_config=sampling_config,
    )


def _acceptance(result) -> float:
    return float(np.sum(result.accepted) / np.sum(result.drafted))


@pytest.mark.slow
@pytest.mark.parametrize("target_name,draft_name", PAIRS)
def test_committed_pair_is_exact_and_beats_a_bigram(
    target_name, draft_name, prompts, processor, bigram_forward, load
):
    target, draft = load(target_name, "target"), load(draft_name, "draft")
    rows, max_len = prompts.shape[0], _max_len(prompts)
    baseline = decoding.autoregressive_generate(
        **_decode_args(target, prompts), sampling_config=GREEDY
    )
    speculative = _speculative(target, draft.forward, draft.new_cache(None, rows, max_len), prompts)
    np.testing.assert_array_equal(speculative.lengths, baseline.lengths)
    np.testing.assert_array_equal(speculative.tokens, baseline.tokens)
    # The trained target writes English: its continuations decode to words.
    text = processor.decode(baseline.tokens[0, : baseline.lengths[0]].tolist())
    assert any(c.isalpha() for c in text)

    assert bigram_forward.args[0].log_probs.shape[-1] == target.vocab_size
    sampled = SamplingConfig(temperature=1.0)
    model_run = _speculative(
        target, draft.forward, draft.new_cache(None, rows, max_len), prompts, sampled
    )
    bigram_run = _speculative(
        target,
        bigram_forward,
        ngram.init_cache(rows, max_len),
        prompts,
        sampled,
    )
    model_rate, bigram_rate = _acceptance(model_run), _acceptance(bigram_run)
    assert model_rate > bigram_rate + 0.1, (model_rate, bigram_rate)
