"""Exactness on every decoding path a job runs, with negative controls that must fail.

Each path decodes ``SAMPLES`` rows (two ragged prompts, alternating), up to ``NEW``
tokens each with EOS in the vocabulary, so rows end early, run several iterations and
finish at different ones:

- ``compiled``: the in-process loop as one compiled call (jobs' in-process engine and
  ``--draft-placement target``);
- ``shared``: the compiled loop of 4 draft slots run at γ = 2, the one program every γ
  shares at a few rows under ``--gamma auto`` (``DecodeSettings.slots``);
- ``host``: the in-process loop, one compiled call per step;
- ``split``: the target's ``score_and_count`` and the draft's ``propose_first`` /
  ``recover_and_propose``, with only their outputs between them, as the Ray workers
  run them (``target_half`` / ``draft_half`` of the rule);
- ``pipelined``: the split steps with the draft's early block (``propose_ahead``,
  ``settle``, ``propose_missed``), as ``--pipelined`` runs them.

γ differs between paths (``--gamma auto`` only chooses among fixed γ per batch). The
samples are compared with the target's distribution over whole continuations from
``tests.reference`` (numpy from the definitions) by a G-test per prompt, pooled: a
correct path passes at p > 1e-3, and each negative control must fail at p < 1e-6.

**Power.** With N samples and d degrees of freedom, a sampling distribution at total
variation δ from the target's gives the G statistic a noncentrality of at least 4Nδ²
(χ² divergence ≥ 4 TV², summed over the prompts). :func:`detectable_tv` is the
smallest δ detected with probability 0.9 at the test's significance level (1e-3); every
case asserts it is at most ``MAX_DETECTABLE_TV`` (2%). BENCHMARKS.md's test section
gives the figures.

The negative controls break the rule where a job runs it (the split halves every Ray
job runs, and the in-process rule):

- resample from p instead of the residual norm(max(0, p − q)) at a rejection;
- reuse a position's test uniform for the recovered token's draw there;
- leave the target's p unfiltered while the draft's q is filtered (top-k). The reverse,
  p filtered and q not, is exact: any q is a valid proposal when the test uses it;
- test the bonus position's draft against p_γ instead of p_{γ+1};
- score with a stale target cache after a rejection (no rollback);
- under the drafter-invariant rule, one Gumbel noise for every position of a row.

Both rules are driven on every path: the paper's and the drafter-invariant one
(``SamplingConfig(rule="invariant")``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, stats

from specdec_core import acceptance, decoding, sampling
from specdec_core.models import table
from specdec_core.sampling import SamplingConfig
from tests import reference
from tests.stub_models import bound, draft_tables, random_table

VOCAB, EOS, NEW = 5, 4, 4
PROMPTS = ([1], [2, 0, 3])  # ragged: rows alternate between them
SAMPLES = 100_000
CACHE = 16
ALPHA, CONTROL_P = 1e-3, 1e-6
MAX_DETECTABLE_TV = 0.02
TARGET = random_table(31, VOCAB, period=2, scale=1.5)
DRAFTS = draft_tables(TARGET, seed=32)

SETTINGS = {
    "T=1": SamplingConfig(temperature=1.0),
    "T=0.7 top-k 3": SamplingConfig(temperature=0.7, top_k=3),
    "T=1 top-p 0.8": SamplingConfig(temperature=1.0, top_p=0.8),
    "T=0.7 top-k 4 top-p 0.7": SamplingConfig(temperature=0.7, top_k=4, top_p=0.7),
    "invariant T=1": SamplingConfig(temperature=1.0, rule="invariant"),
    "invariant T=0.7 top-k 4 top-p 0.7": SamplingConfig(
        temperature=0.7, top_k=4, top_p=0.7, rule="invariant"
    ),
}
PATHS = {"compiled": 4, "shared": 2, "host": 2, "split": 3, "pipelined": 2}  # path: γ
SHARED_SLOTS = 4  # the shared path's draft slots


# ------------------------------------------------------------------- the reference


@functools.cache
def expected(config: SamplingConfig) -> tuple[dict[tuple, float], ...]:
    """P(continuation) per prompt, from the uncached table through ``tests.reference``
    (the same for either rule: each must sample the target's distribution)."""
    return tuple(
        reference.continuation_distribution(
            lambda prefix, prompt=prompt: table.sequence_logits(TARGET, prompt, [*prefix, 0])[-1],
            VOCAB,
            NEW,
            temperature=config.temperature,
            top_k=config.top_k,
            top_p=config.top_p,
            eos=EOS,
        )
        for prompt in PROMPTS
    )


def degrees_of_freedom(expected_by_prompt, rows_per_prompt) -> int:
    """The G-test's degrees of freedom for ``rows_per_prompt`` [prompts] rows: cells of
    expected count ≥ 5, one pooled cell per prompt, less one per prompt."""
    cells = 0
    for distribution, rows in zip(expected_by_prompt, rows_per_prompt, strict=True):
        want = np.array(list(distribution.values())) * rows
        cells += int((want >= 5).sum()) + int(want[want < 5].sum() > 0)
    return cells - len(expected_by_prompt)


def _cells(
    samples: list[tuple[int, tuple]], expected_by_prompt
) -> tuple[np.ndarray, np.ndarray, int]:
    """(observed, expected) counts over every prompt's cells, cells of expected count
    < 5 pooled within their prompt, and the number of prompts; None when a sample is a
    sequence the target gives probability 0."""
    observed_all, expected_all = [], []
    for index, distribution in enumerate(expected_by_prompt):
        mine = [seq for prompt, seq in samples if prompt == index]
        if set(mine) - distribution.keys():
            return None  # a sequence of probability 0
        order = {seq: i for i, seq in enumerate(distribution)}
        observed = np.bincount([order[s] for s in mine], minlength=len(order)).astype(float)
        want = np.array(list(distribution.values())) * len(mine)
        small = want < 5
        observed_all += [*observed[~small], observed[small].sum()]
        expected_all += [*want[~small], want[small].sum()]
    observed, want = np.array(observed_all), np.array(expected_all)
    keep = want > 0
    return observed[keep], want[keep], len(expected_by_prompt)


def g_test(samples: list[tuple[int, tuple]], expected_by_prompt) -> tuple[float, int]:
    """(p-value, degrees of freedom) of the samples against the expected distributions;
    a sequence of probability 0 among them rejects at once (p = 0)."""
    cells = _cells(samples, expected_by_prompt)
    if cells is None:
        return 0.0, 0
    observed, want, groups = cells
    seen = observed > 0
    statistic = 2.0 * float(np.sum(observed[seen] * np.log(observed[seen] / want[seen])))
    dof = len(observed) - groups
    return float(stats.chi2.sf(statistic, dof)), dof


def detectable_tv(samples: int, dof: int, alpha: float = ALPHA, power: float = 0.9) -> float:
    """The smallest total-variation distance a G-test of ``samples`` rows and ``dof``
    degrees of freedom rejects with probability ``power`` at level ``alpha``: the
    noncentrality λ that gives that power, and δ with 4·N·δ² = λ."""
    critical = stats.chi2.isf(alpha, dof)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(critical, dof, x) - power, 1e-6, 1e5)
    return float(np.sqrt(lam / (4 * samples)))


# --------------------------------------------------------------------------- paths


def _prompts(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [rows, P], lengths [rows], prompt index [rows]): the prompts alternating."""
    which = np.arange(rows) % len(PROMPTS)
    width = max(map(len, PROMPTS))
    tokens = np.zeros((rows, width), np.int32)
    for index, prompt in enumerate(PROMPTS):
        tokens[which == index, : len(prompt)] = prompt
    lengths = np.array([len(PROMPTS[i]) for i in which], np.int32)
    return tokens, lengths, which


def _samples(result_tokens, result_lengths, which) -> list[tuple[int, tuple]]:
    return [
        (int(w), tuple(int(t) for t in row[:n]))
        for w, row, n in zip(
            which, np.asarray(result_tokens), np.asarray(result_lengths), strict=True
        )
    ]


def _in_process(path, draft, config, gamma, seed):
    tokens, lengths, which = _prompts(SAMPLES)
    result = decoding.speculative_generate(
        target=bound(table.from_table(TARGET)),
        target_cache=table.init_cache(SAMPLES, CACHE),
        draft=bound(table.from_table(draft)),
        draft_cache=table.init_cache(SAMPLES, CACHE),
        prompt_tokens=tokens,
        prompt_lengths=lengths,
        request_ids=np.arange(SAMPLES),
        max_new_tokens=NEW,
        gamma=gamma,
        sampling_config=config,
        seed=seed,
        eos_id=EOS,
        compiled=path in ("compiled", "shared"),
        slots=SHARED_SLOTS if path == "shared" else None,
    )
    return _samples(result.tokens, result.lengths, which)


def _stale_score_and_count(target, config):
    """A wrong target step: scores from where the last call left the cache, without
    the rollback to the committed length (stale after every rejection)."""

    def step(cache, state, draft_tokens, draft_token_probs):
        fed = jnp.concatenate([state.pending[:, None], decoding.chain(draft_tokens, config)], 1)
        logits, cache = target(cache, fed)
        target_probs = sampling.probs_from_logits(logits, config)
        tests, _ = decoding.verify_uniforms(state, fed.shape[1] - 1)
        n_accepted, at_n = acceptance.target_half(
            draft_tokens, draft_token_probs, target_probs, tests, bonus_drafted=config.drafts_bonus
        )
        return n_accepted, at_n, cache

    return step


def _split(path, draft, config, gamma, seed, *, target_config=None, stale_target=False):
    """The split steps driven as the coordinator drives the workers."""
    target, draft = bound(table.from_table(TARGET)), bound(table.from_table(draft))
    tokens, lengths, which = _prompts(SAMPLES)
    state = decoding.init_state(
        tokens, lengths, np.arange(SAMPLES), seed=seed, max_new_tokens=NEW, gamma=gamma
    )
    target_cache = decoding.prefill_fn(target)(table.init_cache(SAMPLES, CACHE), tokens, lengths)
    draft_cache = decoding.prefill_fn(draft)(table.init_cache(SAMPLES, CACHE), tokens, lengths)
    scoring = _stale_score_and_count if stale_target else decoding.score_and_count
    score = jax.jit(scoring(target, target_config or config))
    first = jax.jit(decoding.propose_first(draft, gamma, config))
    x, q, q_tok, draft_cache = first(draft_cache, state)
    if path == "split":
        step = jax.jit(decoding.recover_and_propose(draft, gamma, config, EOS))
        while not bool(np.all(state.done)):
            n, p_at_n, target_cache = score(target_cache, state, x, q_tok)
            state, x, q, q_tok, draft_cache = step(draft_cache, state, x, q, n, p_at_n)
    else:  # pipelined: the early block proposed before the target's call
        ahead = jax.jit(decoding.propose_ahead(draft, gamma, config, EOS))
        settle = jax.jit(functools.partial(decoding.settle, eos_id=EOS, config=config))
        missed = jax.jit(decoding.propose_missed(draft, gamma, config))
        while not bool(np.all(state.done)):
            guess, early, early_q, _, draft_cache = ahead(draft_cache, state, x)
            n, p_at_n, target_cache = score(target_cache, state, x, q_tok)
            state, hit = settle(state, x, q, n, p_at_n, guess)
            x, q, q_tok, draft_cache = missed(draft_cache, state, hit, early, early_q)
    host = jax.device_get(state)
    return _samples(host.out_tokens, host.n_generated, which)


def decode(path: str, draft: np.ndarray, config: SamplingConfig, gamma: int, seed: int, **wrong):
    """(prompt index, continuation) per row of ``path``; ``wrong``: a broken split loop."""
    if path in ("compiled", "shared", "host"):
        return _in_process(path, draft, config, gamma, seed)
    return _split(path, draft, config, gamma, seed, **wrong)


# --------------------------------------------------------------------------- tests


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("path", list(PATHS))
def test_every_path_samples_the_targets_distribution(path, setting):
    config = SETTINGS[setting]
    samples = decode(path, DRAFTS["related"], config, PATHS[path], seed=101)
    assert len(samples) == SAMPLES
    lengths = {len(seq) for _, seq in samples}
    assert min(lengths) < NEW and max(lengths) == NEW  # EOS ends some rows early
    pvalue, dof = g_test(samples, expected(config))
    assert dof > 0, f"{path} {setting}: sampled a sequence of probability 0"
    assert detectable_tv(SAMPLES, dof) <= MAX_DETECTABLE_TV
    assert pvalue > ALPHA, f"{path} {setting}: G-test rejects exactness (p={pvalue:.2e})"


def test_the_power_is_as_stated():
    """The docstring's figures: at the harness's sample size every setting's degrees of
    freedom leave a detectable δ under 2%, which a tenth as many samples would not."""
    rows = np.bincount(_prompts(SAMPLES)[2])
    dofs = [degrees_of_freedom(expected(config), rows) for config in SETTINGS.values()]
    assert min(dofs) > 10  # the continuations spread over many cells in every setting
    assert detectable_tv(SAMPLES, max(dofs)) <= MAX_DETECTABLE_TV
    assert detectable_tv(SAMPLES // 10, max(dofs)) > MAX_DETECTABLE_TV


_target_half, _draft_half = acceptance.target_half, acceptance.draft_half
_verify_uniforms = decoding.verify_uniforms


def _resample_from_p(draft_tokens, draft_probs, *rest, **options):
    """The next token from p at a rejection, not from the residual (q taken as 0)."""
    return _draft_half(draft_tokens, jnp.zeros_like(draft_probs), *rest, **options)


def _reused_uniform(state, gamma):
    """The next token drawn with the uniform of its position's test (the one that
    failed at a rejection), not a draw of its own."""
    tests, _ = _verify_uniforms(state, gamma)
    return tests, tests


def _bonus_against_p_gamma(draft_tokens, draft_token_probs, target_probs, *rest, **options):
    """The bonus position (drafted at T > 0) tested against p_γ instead of p_{γ+1}."""
    wrong = target_probs.at[:, -1].set(target_probs[:, -2])
    return _target_half(draft_tokens, draft_token_probs, wrong, *rest, **options)


# name: (patches of specdec_core.acceptance or .decoding, split-loop options, setting,
# draft): the draft makes the broken case common (rejections, or for the bonus token
# every draft accepted)
CONTROLS = {
    "resample from p": ({"draft_half": _resample_from_p}, {}, "T=1", "independent"),
    "reused uniform": ({"verify_uniforms": _reused_uniform}, {}, "T=1", "independent"),
    "target's p unfiltered": (
        {}, {"target_config": SETTINGS["T=1"]}, "T=0.7 top-k 3", "independent"
    ),
    "bonus against p_γ": ({"target_half": _bonus_against_p_gamma}, {}, "T=1", "equal"),
    "stale target cache": ({}, {"stale_target": True}, "T=1", "independent"),
}  # fmt: skip


@pytest.fixture
def patched_rule(monkeypatch):
    """Replaces functions of ``specdec_core.acceptance`` (or ``decoding``, where it
    defines the name) for one test; every compiled step is dropped before and after, so
    that the loops are traced with the replacements."""

    def patch(replacements: dict):
        for name, function in replacements.items():
            module = decoding if hasattr(decoding, name) else acceptance
            monkeypatch.setattr(module, name, function)
        decoding.clear_compiled()

    yield patch
    monkeypatch.undo()
    decoding.clear_compiled()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONTROLS))
def test_each_negative_control_fails_on_the_split_path(name, patched_rule):
    replacements, wrong, setting, draft = CONTROLS[name]
    patched_rule(replacements)
    config = SETTINGS[setting]
    samples = decode("split", DRAFTS[draft], config, 3, seed=202, **wrong)
    pvalue, _ = g_test(samples, expected(config))
    assert pvalue < CONTROL_P, f"{name} went undetected on the split path (p={pvalue:.2e})"


@pytest.mark.slow
@pytest.mark.parametrize("path", ["compiled", "split"])
def test_the_invariant_rules_negative_control_fails(path, monkeypatch):
    """One noise for every position (the noise of a row's first position, reused): each
    token is still a Gumbel-max sample from its p, but the tokens of a row are coupled."""
    noise = decoding.position_noise

    def first_position_only(state, offset, vocab):
        return noise(state.replace(n_generated=state.n_generated * 0), 0, vocab)

    monkeypatch.setattr(decoding, "position_noise", first_position_only)
    decoding.clear_compiled()
    try:
        config = SETTINGS["invariant T=1"]
        samples = decode(path, DRAFTS["independent"], config, 3, seed=202)
    finally:
        monkeypatch.undo()
        decoding.clear_compiled()
    pvalue, _ = g_test(samples, expected(config))
    assert pvalue < CONTROL_P, f"one noise for all positions went undetected (p={pvalue:.2e})"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resample from p", "reused uniform", "bonus against p_γ"])
def test_the_rules_negative_controls_fail_in_the_compiled_loop(name, patched_rule):
    replacements, _, setting, draft = CONTROLS[name]
    patched_rule(replacements)
    config = SETTINGS[setting]
    samples = decode("compiled", DRAFTS[draft], config, 3, seed=202)
    pvalue, _ = g_test(samples, expected(config))
    assert pvalue < CONTROL_P, f"{name} went undetected in the compiled loop (p={pvalue:.2e})"


def _gamma_ignored(slots, gamma, bonus_drafted):
    """Every slot tested, as if the batch's γ were the program's slot count."""
    return None


def _residual_ignored(target_probs_at_n, draft_probs_at_n, uniforms):
    """The next token from p, not from the residual norm(max(0, p − q))."""
    return _sample_next_token(target_probs_at_n, jnp.zeros_like(draft_probs_at_n), uniforms)


_sample_next_token = acceptance.sample_next_token


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "replacement"),
    [("_live", _gamma_ignored), ("sample_next_token", _residual_ignored)],
)
def test_the_shared_loops_negative_controls_fail(name, replacement, monkeypatch):
    """The shared loop runs the rule masked to the batch's γ (``acceptance._live``):
    testing the slots after γ, or drawing the next token from p, must fail."""
    monkeypatch.setattr(acceptance, name, replacement)
    decoding.clear_compiled()
    try:
        config = SETTINGS["T=1"]
        samples = decode("shared", DRAFTS["independent"], config, PATHS["shared"], seed=202)
    finally:
        monkeypatch.undo()
        decoding.clear_compiled()
    pvalue, _ = g_test(samples, expected(config))
    assert pvalue < CONTROL_P, f"{name} broken went undetected (p={pvalue:.2e})"
