"""The in-process speculative loop and the target-only baseline with stub models."""

import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.models import table
from specdec_core.sampling import GREEDY, SamplingConfig
from tests.stub_models import bound, draft_tables, prompts, random_table

VOCAB = 16
TARGET = random_table(0, VOCAB, scale=3.0)
DRAFTS = draft_tables(TARGET, seed=1)
TARGET_FWD = bound(table.from_table(TARGET))
DRAFT_FWD = {name: bound(table.from_table(t)) for name, t in DRAFTS.items()}


def _loop_args(prompt_tokens, prompt_lengths, max_new, sampling, eos_id, seed, request_ids):
    """The keywords both decoding loops take, over the stub target."""
    batch = prompt_tokens.shape[0]
    return dict(
        target=TARGET_FWD,
        target_cache=table.init_cache(batch, 64),
        prompt_tokens=prompt_tokens,
        prompt_lengths=prompt_lengths,
        request_ids=np.arange(batch) if request_ids is None else request_ids,
        max_new_tokens=max_new,
        sampling_config=sampling,
        seed=seed,
        eos_id=eos_id,
    )


def _baseline(
    prompt_tokens,
    prompt_lengths,
    *,
    max_new,
    sampling=GREEDY,
    eos_id=None,
    seed=0,
    request_ids=None,
):
    return decoding.autoregressive_generate(
        **_loop_args(prompt_tokens, prompt_lengths, max_new, sampling, eos_id, seed, request_ids)
    )


def _speculative(
    prompt_tokens,
    prompt_lengths,
    *,
    gamma,
    max_new,
    draft="related",
    sampling=GREEDY,
    eos_id=None,
    seed=0,
    request_ids=None,
    compiled=False,
    slots=None,
):
    return decoding.speculative_generate(
        **_loop_args(prompt_tokens, prompt_lengths, max_new, sampling, eos_id, seed, request_ids),
        draft=DRAFT_FWD[draft],
        draft_cache=table.init_cache(prompt_tokens.shape[0], 64),
        gamma=gamma,
        compiled=compiled,
        slots=slots,
    )


def _reference_greedy(prompt: list[int], max_new: int) -> list[int]:
    """Uncached greedy decoding straight from the table."""
    seq = list(prompt)
    for _ in range(max_new):
        logits = table.sequence_logits(TARGET, seq[:1], [*seq[1:], 0])[-1]
        seq.append(int(np.argmax(logits)))
    return seq[len(prompt) :]


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("draft", ["related", "adversarial"])
def test_greedy_speculative_equals_greedy_target(batch, gamma, draft):
    tokens, lengths = prompts(batch, 6, VOCAB, seed=batch)
    base = _baseline(tokens, lengths, max_new=24)
    spec = _speculative(tokens, lengths, gamma=gamma, max_new=24, draft=draft)
    np.testing.assert_array_equal(spec.tokens, base.tokens)
    np.testing.assert_array_equal(spec.lengths, 24)
    for row in range(batch):  # and both equal uncached decoding from the table itself
        assert base.row_tokens(row) == _reference_greedy(list(tokens[row, : lengths[row]]), 24)


def test_draft_equal_to_target_accepts_every_token_and_takes_fewest_iterations():
    tokens, lengths = prompts(4, 5, VOCAB)
    spec = _speculative(tokens, lengths, gamma=4, max_new=20, draft="equal")
    np.testing.assert_array_equal(spec.accepted, spec.drafted)
    np.testing.assert_array_equal(spec.iterations, 4)  # 5 tokens per iteration
    np.testing.assert_array_equal(spec.accepted_by_position, 4)


def test_statistics_are_consistent():
    tokens, lengths = prompts(8, 6, VOCAB, seed=3)
    spec = _speculative(
        tokens,
        lengths,
        gamma=3,
        max_new=30,
        draft="independent",
        sampling=SamplingConfig(temperature=1.0),
    )
    np.testing.assert_array_equal(spec.drafted, 3 * spec.iterations)
    np.testing.assert_array_equal(spec.accepted_by_position.sum(1), spec.accepted)
    # Acceptance counts can only fall with position (prefix acceptance).
    assert (np.diff(spec.accepted_by_position, axis=1) <= 0).all()
    # Each iteration emits accepted + 1 tokens (the last may be cut at max_new).
    assert (spec.accepted + spec.iterations >= spec.lengths).all()
    assert (spec.accepted + spec.iterations - spec.lengths < 4).all()
    assert spec.total_s >= spec.draft_s + spec.target_s > 0 and spec.overhead_s >= 0


def test_eos_stops_each_row_and_matches_baseline():
    tokens, lengths = prompts(8, 4, VOCAB, seed=5)
    free = _baseline(tokens, lengths, max_new=30)
    eos = int(np.bincount(free.tokens.ravel(), minlength=VOCAB).argmax())
    base = _baseline(tokens, lengths, max_new=30, eos_id=eos)
    spec = _speculative(tokens, lengths, gamma=3, max_new=30, eos_id=eos)
    np.testing.assert_array_equal(spec.lengths, base.lengths)
    np.testing.assert_array_equal(spec.tokens, base.tokens)
    for row in range(8):
        out = free.row_tokens(row)
        expected = out[: out.index(eos) + 1] if eos in out else out
        assert spec.row_tokens(row) == expected
    assert (spec.lengths < 30).any()


def test_per_row_max_new_tokens():
    tokens, lengths = prompts(3, 4, VOCAB)
    spec = _speculative(tokens, lengths, gamma=5, max_new=np.array([1, 7, 12]))
    base = _baseline(tokens, lengths, max_new=12)
    np.testing.assert_array_equal(spec.lengths, [1, 7, 12])
    for row, n in enumerate([1, 7, 12]):
        assert spec.row_tokens(row) == base.row_tokens(row)[:n]
    assert spec.tokens[0, 1:].tolist() == [0] * 11  # padded past the row's length


@pytest.mark.parametrize("gamma", [2, 5])
def test_sampled_output_does_not_depend_on_batch(gamma):
    config = SamplingConfig(temperature=1.0, top_k=10)
    tokens, lengths = prompts(8, 6, VOCAB, seed=9)
    ids = np.array([11, 12, 13, 14, 15, 16, 17, 18])
    full = _speculative(
        tokens,
        lengths,
        gamma=gamma,
        max_new=20,
        sampling=config,
        seed=7,
        request_ids=ids,
        draft="independent",
    )
    order = np.array([5, 2, 7, 0])
    part = _speculative(
        tokens[order],
        lengths[order],
        gamma=gamma,
        max_new=20,
        sampling=config,
        seed=7,
        request_ids=ids[order],
        draft="independent",
    )
    np.testing.assert_array_equal(part.tokens, full.tokens[order])
    single = _speculative(
        tokens[3:4],
        lengths[3:4],
        gamma=gamma,
        max_new=20,
        sampling=config,
        seed=7,
        request_ids=ids[3:4],
        draft="independent",
    )
    np.testing.assert_array_equal(single.tokens[0], full.tokens[3])
    other_seed = _speculative(
        tokens,
        lengths,
        gamma=gamma,
        max_new=20,
        sampling=config,
        seed=8,
        request_ids=ids,
        draft="independent",
    )
    assert (other_seed.tokens != full.tokens).any()


def test_baseline_sampling_does_not_depend_on_batch():
    config = SamplingConfig(temperature=1.0)
    tokens, lengths = prompts(6, 5, VOCAB, seed=2)
    full = _baseline(tokens, lengths, max_new=15, sampling=config, request_ids=np.arange(6) + 40)
    part = _baseline(
        tokens[4:], lengths[4:], max_new=15, sampling=config, request_ids=np.arange(4, 6) + 40
    )
    np.testing.assert_array_equal(part.tokens, full.tokens[4:])


def test_bad_prompts_and_gamma_are_rejected():
    tokens, lengths = prompts(2, 4, VOCAB)
    with pytest.raises(ValueError, match="gamma"):
        _speculative(tokens, lengths, gamma=0, max_new=4)
    with pytest.raises(ValueError, match="prompt_lengths"):
        _speculative(tokens, np.array([0, 2]), gamma=2, max_new=4)
    with pytest.raises(ValueError, match="prompt_tokens"):
        _baseline(tokens[0], lengths, max_new=4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("gamma", [1, 4])
def test_compiled_loop_equals_host_loop(temperature, gamma):
    """The one-call loop runs the same steps: same tokens, stops and statistics per row,
    ragged rows (EOS, per-row max_new) included; its time split is unknown (NaN)."""
    tokens, lengths = prompts(6, 6, VOCAB, seed=11)
    max_new = np.array([30, 1, 17, 30, 8, 25])
    common = dict(
        gamma=gamma,
        max_new=max_new,
        draft="independent",
        sampling=SamplingConfig(temperature=temperature),
        eos_id=3,
        seed=5,
    )
    host = _speculative(tokens, lengths, **common)
    fused = _speculative(tokens, lengths, compiled=True, **common)
    for field in ("tokens", "lengths", "iterations", "drafted", "accepted"):
        np.testing.assert_array_equal(getattr(fused, field), getattr(host, field), err_msg=field)
    np.testing.assert_array_equal(fused.accepted_by_position, host.accepted_by_position)
    assert (host.lengths < max_new).any() and (host.lengths == max_new).any()  # both stops
    assert fused.total_s > 0 and np.isnan(fused.draft_s) and np.isnan(fused.overhead_s)
    if temperature == 0.0:
        base = _baseline(tokens, lengths, max_new=max_new, eos_id=3)
        np.testing.assert_array_equal(fused.tokens, base.tokens)


@pytest.mark.parametrize(
    ("temperature", "rule"), [(0.0, "paper"), (1.0, "paper"), (1.0, "invariant")]
)
def test_one_compiled_loop_for_every_gamma_gives_each_gammas_tokens(temperature, rule):
    """The loop compiled for 4 draft slots, run at γ = 1..4 (``slots``), decodes what
    the host loop at that γ decodes: the same tokens, stops and statistics per row (the
    same draws: uniforms and noise agree on their first entries whatever their count),
    with acceptance counts for γ positions only."""
    tokens, lengths = prompts(6, 6, VOCAB, seed=11)
    max_new = np.array([30, 1, 17, 30, 8, 25])
    sampling_config = SamplingConfig(temperature=temperature, rule=rule)
    for gamma in (1, 2, 3, 4):
        common = dict(
            gamma=gamma, max_new=max_new, draft="independent", sampling=sampling_config,
            eos_id=3, seed=5,
        )  # fmt: skip
        host = _speculative(tokens, lengths, **common)
        shared = _speculative(tokens, lengths, compiled=True, slots=4, **common)
        for field in ("tokens", "lengths", "iterations", "drafted", "accepted"):
            np.testing.assert_array_equal(
                getattr(shared, field), getattr(host, field), err_msg=f"γ={gamma}: {field}"
            )
        assert shared.accepted_by_position.shape == (6, gamma)
        np.testing.assert_array_equal(shared.accepted_by_position, host.accepted_by_position)
        assert (host.drafted > 0).all() and (host.accepted < host.drafted).any()
    with pytest.raises(ValueError, match="slots"):
        _speculative(tokens, lengths, compiled=True, slots=2, **{**common, "gamma": 3})


def test_compiled_loop_with_every_row_done_at_start_returns_nothing():
    tokens, lengths = prompts(2, 4, VOCAB)
    spec = _speculative(tokens, lengths, gamma=2, max_new=np.array([0, 0]), compiled=True)
    np.testing.assert_array_equal(spec.lengths, 0)
    np.testing.assert_array_equal(spec.iterations, 0)


def _split_generate(tokens, lengths, *, gamma, max_new, draft, sampling, eos_id, seed):
    """The loop as the Ray workers run it: the target's score_and_count and the draft's
    recover_and_propose (decoding's split steps), with only their outputs between them."""
    import jax

    batch = tokens.shape[0]
    state = decoding.init_state(
        tokens, lengths, np.arange(batch), seed=seed, max_new_tokens=max_new, gamma=gamma
    )
    target_cache = decoding.prefill_fn(TARGET_FWD)(table.init_cache(batch, 64), tokens, lengths)
    draft_cache = decoding.prefill_fn(DRAFT_FWD[draft])(
        table.init_cache(batch, 64), tokens, lengths
    )
    score = jax.jit(decoding.score_and_count(TARGET_FWD, sampling))
    first = jax.jit(decoding.propose_first(DRAFT_FWD[draft], gamma, sampling))
    step = jax.jit(decoding.recover_and_propose(DRAFT_FWD[draft], gamma, sampling, eos_id))
    x, q, q_tok, draft_cache = first(draft_cache, state)
    while not bool(np.all(state.done)):
        n, p_at_n, target_cache = score(target_cache, state, x, q_tok)
        state, x, q, q_tok, draft_cache = step(draft_cache, state, x, q, n, np.asarray(p_at_n))
    return decoding.result_from_state(
        state, max_new, 0, draft_s=0.0, target_s=0.0, overhead_s=0.0, total_s=0.0
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_split_steps_equal_the_in_process_loop(temperature):
    """decoding.score_and_count + recover_and_propose (what the two workers run) give the
    in-process loop's tokens and statistics row for row, EOS and ragged budgets included."""
    tokens, lengths = prompts(6, 6, VOCAB, seed=3)
    max_new = np.array([30, 2, 17, 30, 9, 25])
    common = dict(
        gamma=3,
        max_new=max_new,
        draft="independent",
        sampling=SamplingConfig(temperature=temperature),
        eos_id=3,
        seed=7,
    )
    host = _speculative(tokens, lengths, **common)
    split = _split_generate(tokens, lengths, **common)
    for field in ("tokens", "lengths", "iterations", "drafted", "accepted"):
        np.testing.assert_array_equal(getattr(split, field), getattr(host, field), err_msg=field)
    np.testing.assert_array_equal(split.accepted_by_position, host.accepted_by_position)
    assert 0 < host.accepted.sum() < host.drafted.sum()  # both accepts and rejections
