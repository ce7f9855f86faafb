"""The copy draft (prompt lookup): the lookup, its point-mass proposals, greedy identity
with a tiny random T5, distributional exactness at T=1 (G-test, with a negative
control), and its registration as ``--draft copy[:n=N][+MODEL]``."""

from __future__ import annotations

import functools
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipelines import model_resolver
from specdec_core import acceptance, decoding, sampling, theory
from specdec_core.models import api, bound, prompt_lookup, registry, table
from specdec_core.sampling import SamplingConfig
from tests.stub_models import bound as bound_table
from tests.test_exactness import (
    DRAFTS,
    NEW_TOKENS,
    PROMPT,
    SAMPLES,
    TARGET,
    VOCAB,
    _biased_draft_half,
    exact_distribution,
    g_test_pvalue,
)
from workers.batching import DecodeSettings, Request
from workers.engine import InProcessEngine

FALLBACK = 19
CONFIG = prompt_lookup.PromptLookupConfig(vocab_size=20, n_max=3, fallback_token=FALLBACK)


def _along(tokens, source=None, config=CONFIG):
    tokens = np.asarray([tokens], np.int32)
    source = None if source is None else np.asarray([source], np.int32)
    proposals, lengths = prompt_lookup.proposals_along(config, tokens, [tokens.shape[1]], source)
    return proposals[0].tolist(), lengths[0].tolist()


# ---------------------------------------------------------------- the lookup


def test_longest_match_wins_over_a_more_recent_shorter_one():
    # At the end the suffix (1 2 3) occurs at 0..2 (then 7); (2 3) alone more recently (then 8).
    proposals, lengths = _along([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3])
    assert (proposals[-1], lengths[-1]) == (7, 3)
    # Capped at n_max = 2 both are 2-grams: the most recent one wins.
    capped = prompt_lookup.PromptLookupConfig(vocab_size=20, n_max=2, fallback_token=FALLBACK)
    proposals, lengths = _along([1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3], config=capped)
    assert (proposals[-1], lengths[-1]) == (8, 2)


def test_most_recent_match_wins_among_equal_lengths():
    proposals, lengths = _along([5, 6, 1, 5, 6, 2, 5, 6])
    assert (proposals[-1], lengths[-1]) == (2, 2)
    proposals, _ = _along([5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 6])
    assert proposals[-1] == 3


def test_no_match_proposes_the_fallback_with_match_length_zero():
    proposals, lengths = _along([4, 5, 6, 7])
    assert proposals == [FALLBACK] * 4 and lengths == [0] * 4
    # n_min = 2: a lone repeated token is not a match; a repeated pair is.
    pairs = prompt_lookup.PromptLookupConfig(vocab_size=20, n_min=2, fallback_token=FALLBACK)
    proposals, lengths = _along([4, 5, 9, 4, 8, 4, 5], config=pairs)
    assert proposals[3] == FALLBACK and lengths[3] == 0  # "4" seen before, but only 1 token
    assert (proposals[6], lengths[6]) == (9, 2)


def test_every_position_proposes_from_its_own_prefix_only():
    # Output 5 6 7 9 5 6: position t sees tokens[: t + 1] only.
    proposals, lengths = _along([5, 6, 7, 9, 5, 6])
    assert proposals == [FALLBACK, FALLBACK, FALLBACK, FALLBACK, 6, 7]
    assert lengths == [0, 0, 0, 0, 1, 2]
    # A run: the match may end one token back, so "3 3" proposes another 3.
    assert _along([3, 3])[0] == [FALLBACK, 3]


def test_source_matches_and_priorities():
    source = [3, 4, 5, 6, 8, 1, 0, 0]  # 0 = padding
    proposals, lengths = _along([5, 6, 7, 9, 5, 6], source)
    assert proposals[:2] == [6, 8] and lengths[:2] == [1, 2]  # copied from the source
    assert proposals[4] == 6  # "5": output (then 6) and source (then 6)
    assert (proposals[5], lengths[5]) == (7, 2)  # "5 6": the output's match, not the source's 8
    # A longer source match beats a shorter, more recent output match.
    proposals, lengths = _along([9, 4, 5, 2, 3, 4, 5], [3, 4, 5, 6, 1])
    assert (proposals[-1], lengths[-1]) == (6, 3)
    # The source's last real token has no continuation; pads never match or continue.
    proposals, lengths = _along([1], [3, 4, 5, 6, 1, 0, 0])
    assert (proposals[0], lengths[0]) == (FALLBACK, 0)
    proposals, lengths = _along([0, 0], [3, 0, 0, 0])
    assert lengths[1] == 1 and proposals[1] == 0  # the output's own run, not the source pads


def test_incremental_decoding_with_rollbacks_equals_the_lookup_along_the_sequence():
    """Feeding one or two tokens at a time, with junk written past the committed length
    and rolled back (as the loop does after a rejection), gives the lookup along the clean
    sequence: stale slots are never read."""
    rng = np.random.default_rng(0)
    seq = rng.integers(0, 6, size=24).astype(np.int32)
    source = rng.integers(1, 6, size=(1, 10)).astype(np.int32)
    expected, expected_len = _along(seq, source[0])
    cache = prompt_lookup.init_cache(1, 32, source)
    forward = jax.jit(lambda c, t: prompt_lookup.lookup(CONFIG, c, t))
    got, got_len, pos = [], [], 0
    while pos < len(seq):
        _, _, junk = forward(cache, jnp.asarray(rng.integers(0, 6, (1, 3)), jnp.int32))
        cache = api.rollback(junk, jnp.array([pos], jnp.int32))
        step = 1 + pos % 2
        proposals, lengths, cache = forward(cache, jnp.asarray(seq[None, pos : pos + step]))
        got += np.asarray(proposals[0]).tolist()
        got_len += np.asarray(lengths[0]).tolist()
        pos += step
    assert got == expected[: len(got)] and got_len == expected_len[: len(got)]
    assert int(cache.lengths[0]) == len(seq)


def test_forward_is_a_point_mass_under_every_sampling_setting():
    cache = prompt_lookup.init_cache(2, 8, np.array([[4, 7, 2, 0], [1, 1, 1, 1]]))
    logits, cache = prompt_lookup.forward(CONFIG, cache, jnp.array([[4], [9]], jnp.int32))
    assert logits.shape == (2, 1, 20) and cache.lengths.tolist() == [1, 1]
    expected = np.zeros((2, 20), np.float32)
    expected[0, 7] = expected[1, FALLBACK] = 1.0
    for config in (
        SamplingConfig(temperature=0.0),
        SamplingConfig(temperature=1.0),
        SamplingConfig(temperature=0.3, top_k=3),
        SamplingConfig(temperature=1.7, top_p=0.5),
    ):
        probs = sampling.probs_from_logits(logits[:, 0], config)
        np.testing.assert_array_equal(np.asarray(probs), expected)


def test_composite_copies_where_a_match_exists_and_defers_to_the_model_elsewhere():
    vocab = 6
    config = prompt_lookup.PromptLookupConfig(vocab_size=vocab, n_max=2, fallback_token=3)
    params = table.from_table(DRAFTS["independent"])
    source = np.array([[2, 5, 0, 0]], np.int32)
    cache = prompt_lookup.CopyThenModelCache(
        copy=prompt_lookup.init_cache(1, 8, source),
        model=table.init_cache(1, 8),
        lengths=jnp.zeros((1,), jnp.int32),
    )
    forward = functools.partial(prompt_lookup.copy_then_model_forward, config, bound_table(params))
    tokens = jnp.array([[4, 2, 1, 4]], jnp.int32)  # 2 matches the source (then 5); 4 repeats
    logits, cache = forward(cache, tokens)
    model_logits, _ = table.forward(params, table.init_cache(1, 8), tokens)
    copied = np.asarray(prompt_lookup.point_mass_logits(jnp.array([5, 2]), vocab))
    np.testing.assert_array_equal(np.asarray(logits[0, [1, 3]]), copied)  # 2 -> 5, 4 -> 2
    np.testing.assert_array_equal(
        np.asarray(logits[0, [0, 2]]), np.asarray(model_logits[0, [0, 2]])
    )
    # A rollback of the composite is a rollback of both inner caches on the next forward:
    # 4 2 | 4 proposes 2 (a stale 4 2 1 4 | 4 would propose 4).
    cache = api.rollback(cache, jnp.array([2], jnp.int32))
    logits, cache = forward(cache, jnp.array([[4]], jnp.int32))
    np.testing.assert_array_equal(
        np.asarray(logits[0, 0]), np.asarray(prompt_lookup.point_mass_logits(jnp.array(2), vocab))
    )
    assert cache.lengths.tolist() == [3] and cache.copy.lengths.tolist() == [3]
    assert cache.model.lengths.tolist() == [3]


def test_bad_configs_are_named():
    with pytest.raises(ValueError, match="n_min <= n_max"):
        prompt_lookup.PromptLookupConfig(vocab_size=10, n_max=2, n_min=3)
    with pytest.raises(ValueError, match="n_min <= n_max"):
        prompt_lookup.PromptLookupConfig(vocab_size=10, n_min=0)
    with pytest.raises(ValueError, match=r"fallback_token must lie in \[0, 10\)"):
        prompt_lookup.PromptLookupConfig(vocab_size=10, fallback_token=10)
    with pytest.raises(ValueError, match=r"source must be \[B=2, S\]"):
        prompt_lookup.init_cache(2, 8, np.zeros((3, 4), np.int32))


# ---------------------------------------------------------------- greedy identity (tiny T5)

T5_VOCAB = 24  # small, so a random T5's greedy output repeats itself and the source
T5_CONFIG = registry.get_config("t5_tiny_test", vocab_size=T5_VOCAB)


def _t5_requests(n: int) -> list[Request]:
    rng = np.random.default_rng(3)
    return [
        Request(
            id=f"r{i}",
            prompt_tokens=(0,),
            encoder_tokens=(*rng.integers(3, T5_VOCAB, 6 + (i * 5) % 11).tolist(), 1),
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def t5_target():
    return bound.load_model("target", "t5", T5_CONFIG, init_seed=0)


@pytest.mark.parametrize(
    "backoff, compiled",
    [
        pytest.param(False, True, id="copy-compiled"),
        pytest.param(False, False, id="copy-host", marks=pytest.mark.slow),
        pytest.param(True, True, id="copy+model-compiled", marks=pytest.mark.slow),
        pytest.param(True, False, id="copy+model-host", marks=pytest.mark.slow),
    ],
)
def test_greedy_output_equals_the_target_alone(t5_target, backoff, compiled):
    config = prompt_lookup.PromptLookupConfig(vocab_size=T5_VOCAB, n_max=3)
    model = (
        bound.load_model("draft", "t5", T5_CONFIG, init_seed=1) if backoff else None
    )  # a random draft: it rarely agrees, so the copy's share of acceptances shows
    draft = bound.bind("copy", prompt_lookup.FAMILY, config, model)
    settings = DecodeSettings(gamma=3, max_new_tokens=24, batch_size=4, eos_id=1)
    engine = InProcessEngine(t5_target, draft, settings, compiled=compiled)
    requests = _t5_requests(4)
    spec = engine.generate(requests)
    base = engine.generate_baseline(requests)
    assert [g.tokens for g in spec] == [g.tokens for g in base]
    accepted = sum(g.accepted for g in spec)
    iterations = sum(g.iterations for g in spec)
    fully = sum(g.accepted_by_position[-1] for g in spec)
    # The copies are accepted sometimes and rejected sometimes: both paths ran.
    assert 0 < accepted < theory.acceptance_tests(accepted, iterations, fully)
    # At T=0 a copy is accepted iff it is the target's next token: count along the outputs.
    tokens = np.zeros((4, 26), np.int32)
    for row, g in enumerate(base):
        tokens[row, 1 : 1 + len(g.tokens)] = g.tokens
    source = np.zeros((4, 32), np.int32)
    for row, r in enumerate(requests):
        source[row, : len(r.encoder_tokens)] = r.encoder_tokens
    proposals, lengths = prompt_lookup.proposals_along(config, tokens, None, source)
    hits = [
        int(((proposals[row, :n] == tokens[row, 1 : n + 1]) & (lengths[row, :n] > 0)).sum())
        for row, n in enumerate(len(g.tokens) for g in base)
    ]
    assert sum(hits) > 0  # the lookup predicts some of the target's tokens


# ---------------------------------------------------------------- exactness at T=1

EXACT_SOURCE = np.array([2, 4, 1, 3, 5, 2, 4, 4, 0, 0], np.int32)  # 0: padding
EXACT_COPY = prompt_lookup.PromptLookupConfig(vocab_size=VOCAB, n_max=3, fallback_token=3)
# One forward object per model, so the compiled loop is built once per case.
TARGET_FORWARD = bound_table(table.from_table(TARGET))
COPY_FORWARD = functools.partial(prompt_lookup.forward, EXACT_COPY)
COMPOSITE_FORWARD = functools.partial(
    prompt_lookup.copy_then_model_forward,
    EXACT_COPY,
    bound_table(table.from_table(DRAFTS["independent"])),
)


def _copy_samples(config: SamplingConfig, gamma: int, *, composite: bool, seed: int):
    """SAMPLES speculative continuations of PROMPT (test_exactness's table target) with
    the copy draft reading EXACT_SOURCE (or copy, then a table draft where nothing
    matches), the whole loop compiled."""
    copy_cache = prompt_lookup.init_cache(SAMPLES, 16, np.tile(EXACT_SOURCE, (SAMPLES, 1)))
    draft_cache = copy_cache
    if composite:
        draft_cache = prompt_lookup.CopyThenModelCache(
            copy=copy_cache, model=table.init_cache(SAMPLES, 16), lengths=copy_cache.lengths
        )
    result = decoding.speculative_generate(
        target=TARGET_FORWARD,
        target_cache=table.init_cache(SAMPLES, 16),
        draft=COMPOSITE_FORWARD if composite else COPY_FORWARD,
        draft_cache=draft_cache,
        prompt_tokens=np.tile(np.array(PROMPT, np.int32), (SAMPLES, 1)),
        prompt_lengths=np.full(SAMPLES, len(PROMPT)),
        request_ids=np.arange(SAMPLES),
        max_new_tokens=NEW_TOKENS,
        gamma=gamma,
        sampling_config=config,
        seed=seed,
        compiled=True,
    )
    assert (result.lengths == NEW_TOKENS).all()
    return result


def _tests_and_accepted(result) -> tuple[int, int]:
    accepted = int(result.accepted.sum())
    fully = int(result.accepted_by_position[:, -1].sum())
    return theory.acceptance_tests(accepted, int(result.iterations.sum()), fully), accepted


EXACT_CASES = [  # (sampling settings, γ, composite)
    (SamplingConfig(temperature=1.0), 3, False),
    (SamplingConfig(temperature=1.0), 2, True),
    (SamplingConfig(temperature=0.7, top_k=3), 3, False),
]


@pytest.mark.slow
@pytest.mark.parametrize("config, gamma, composite", EXACT_CASES)
def test_copy_draft_samples_follow_the_target_distribution(config, gamma, composite):
    result = _copy_samples(config, gamma, composite=composite, seed=1234)
    tests, accepted = _tests_and_accepted(result)
    # The copies are tested often and both accepted and rejected, so the G-test sees
    # both branches of the rule with point-mass q.
    assert 0.05 * tests < accepted < 0.95 * tests
    pvalue = g_test_pvalue(result.tokens, exact_distribution(TARGET, config))
    assert pvalue > 1e-3, f"G-test rejects exactness for the copy draft {config}: p={pvalue:.2e}"


@pytest.mark.slow
def test_negative_control_biased_rule_is_caught_with_the_copy_draft(monkeypatch):
    """Resampling from p (not norm(max(0, p − q))) after a rejected copy gives the copied
    token twice its chance: the same test on the same data sizes must catch it."""
    config = SamplingConfig(temperature=1.0)
    monkeypatch.setattr(acceptance, "draft_half", _biased_draft_half)
    decoding.clear_compiled()
    try:
        result = _copy_samples(config, 3, composite=False, seed=1234)
    finally:
        monkeypatch.undo()
        decoding.clear_compiled()
    pvalue = g_test_pvalue(result.tokens, exact_distribution(TARGET, config))
    assert pvalue < 1e-6, f"the biased rule went undetected (p={pvalue:.2e})"


# ---------------------------------------------------------------- registration


def test_copy_references_resolve_to_copy_specs():
    plain = model_resolver.resolve_model("copy", role="draft")
    assert plain.spec.family == prompt_lookup.FAMILY and plain.spec.name == "copy"
    default_target = model_resolver.resolve_model(model_resolver.DEFAULT_TARGET, role="target")
    # without a target given, the default target's vocabulary (ende_target_debian: 16k)
    assert plain.spec.config == prompt_lookup.PromptLookupConfig(
        vocab_size=default_target.spec.config.vocab_size
    )
    assert plain.spec.config.vocab_size == 16000
    assert not plain.random_init and plain.vocab_path is None
    tuned = model_resolver.resolve_model("copy:n=4,n_min=2,fallback=5,vocab_size=64", role="draft")
    assert tuned.spec.config == prompt_lookup.PromptLookupConfig(
        vocab_size=64, n_max=4, n_min=2, fallback_token=5
    )
    both = model_resolver.resolve_model(
        "copy:n=2+t5_tiny_test:vocab_size=24,init_seed=3", role="draft", allow_random_init=True
    )
    assert both.spec.name == "copy+t5_tiny_test" and both.random_init
    backoff = both.spec.config.backoff
    assert (backoff.family, backoff.config, backoff.init_seed) == ("t5", T5_CONFIG, 3)
    assert both.spec.config.vocab_size == 24 and both.spec.config.n_max == 2
    # The spec crosses to a Ray worker (pickled) and loads there as any model does.
    spec = pickle.loads(pickle.dumps(both.spec))
    model = spec.load()
    assert model.family == "copy" and model.vocab_size == 24
    assert model.param_count() == bound.load_model("d", "t5", T5_CONFIG).param_count()
    target = model_resolver.resolve_model(
        "t5_tiny_test:vocab_size=24", role="target", allow_random_init=True
    )
    model_resolver.check_pair(target, both, vocab_size=20)
    with pytest.raises(model_resolver.ModelResolutionError, match=r"give copy:vocab_size=24"):
        model_resolver.check_pair(target, plain, vocab_size=20)


def test_a_plain_copy_draft_takes_the_jobs_target_vocabulary(tmp_path):
    """``--draft copy`` with a 16k-vocabulary target needs no vocab_size option: make_job
    hands the draft the target's; an explicit option or a backoff model still wins."""
    from pipelines import job_config

    sized = model_resolver.resolve_model("copy", role="draft", vocab_size=16000)
    assert sized.spec.config.vocab_size == 16000
    explicit = model_resolver.resolve_model("copy:vocab_size=24", role="draft", vocab_size=16000)
    assert explicit.spec.config.vocab_size == 24
    job = job_config.make_job(
        job_config.SUMMARIZE,
        input="x.jsonl",
        output=str(tmp_path / "out.jsonl"),
        target="summ_target",  # the Debian 16k vocabulary: not the default target's 8k
        draft="copy",
    )
    assert job.draft.spec.config.vocab_size == job.target.spec.config.vocab_size == 16000


@pytest.mark.parametrize(
    "ref, role, message",
    [
        ("copy", "target", "can only be given as --draft"),
        ("copy:m=3", "draft", "unknown copy draft option 'm'"),
        ("copy:n=three", "draft", "n='three' must be an integer"),
        ("copy:n=1,n_min=2", "draft", "n_min <= n_max"),
        ("copy+", "draft", "name the model draft after it"),
        ("copy+copy:n=2", "draft", "cannot back off to a copy draft"),
        ("copy+nope", "draft", "unknown model 'nope'"),
        ("copy+t5_tiny_test", "draft", "--allow-random-init"),
    ],
)
def test_bad_copy_references_are_named(ref, role, message):
    with pytest.raises(model_resolver.ModelResolutionError, match=message):
        model_resolver.resolve_model(ref, role=role)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ray_workers_run_the_copy_draft_as_in_process(ray_local, t5_target, temperature):
    """The composite draft's spec crosses to a Ray worker, loads there, and its tokens
    and acceptances equal the in-process engine's."""
    from workers.ray_engine import RayEngine
    from workers.spec import ModelSpec

    draft = model_resolver.resolve_model(
        "copy:n=3+t5_tiny_test:vocab_size=24,init_seed=1", role="draft", allow_random_init=True
    ).spec
    settings = DecodeSettings(
        gamma=3,
        sampling=SamplingConfig(temperature=temperature),
        seed=5,
        max_new_tokens=16,
        batch_size=2,
    )
    requests = _t5_requests(2)
    local = InProcessEngine(
        t5_target, bound.load_model(draft.name, draft.family, draft.config), settings
    ).generate(requests)
    engine = RayEngine(
        ModelSpec(name="target", family="t5", config=T5_CONFIG, init_seed=0), draft, settings
    )
    try:
        remote = engine.generate(requests)
    finally:
        engine.close()
    assert [g.tokens for g in remote] == [g.tokens for g in local]
    assert [g.accepted for g in remote] == [g.accepted for g in local]


@pytest.mark.slow
def test_translate_job_runs_with_the_copy_draft(tmp_path, capsys):
    """``specdec translate --draft copy`` end to end (random tiny target): every record
    out, the outputs equal to the target alone at T=0. A copy draft as --target fails."""
    import json

    from pipelines import record_io
    from pipelines.cli import main

    (tmp_path / "in.tsv").write_text("The house is red.\tDas Haus ist rot.\nA dog.\tEin Hund.\n")
    output = tmp_path / "out.jsonl"
    args = ["translate", "--input", str(tmp_path / "in.tsv"), "--output", str(output)]
    args += ["--target", "t5_tiny_test:vocab_size=8000", "--workers", "inprocess"]
    args += ["--temperature", "0", "--max-new-tokens", "8", "--allow-random-init", "--quiet"]
    args += ["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    args += ["--summary-json", str(tmp_path / "summary.json"), "--compare-baseline"]
    assert main([*args, "--draft", "copy:n=2"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["records_out"] == 2 and summary["identical_to_baseline"] is True
    assert len(record_io.read_jsonl(str(output))) == 2
    capsys.readouterr()
    assert main([*args, "--draft", "copy", "--target", "copy"]) == 2
    assert "it can only be given as --draft" in capsys.readouterr().err
