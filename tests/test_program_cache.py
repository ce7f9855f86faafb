"""decoding.program_cache: compiled steps are shared by models of one structure (another
load of a config, other weights), each call computing with its own model's params."""

from __future__ import annotations

import gc
import weakref

import jax
import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.models import bound, registry, table
from specdec_core.sampling import GREEDY
from tests.stub_models import bound as bound_table
from tests.stub_models import random_table

ENCODER = np.array([[5, 6, 7, 1], [9, 4, 3, 1]], np.int32)
VOCAB = 16


@pytest.fixture
def compiles():
    """The XLA compilations made while the test runs (JAX's monitoring events)."""
    seen: list[str] = []

    def listen(event: str, duration: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            seen.append(event)

    decoding.clear_compiled()
    jax.clear_caches()
    jax.monitoring.register_event_duration_secs_listener(listen)
    yield seen
    jax.monitoring.unregister_event_duration_listener(listen)


def _tiny_t5(seed: int):
    config = registry.get_config("t5_tiny_test", vocab_size=512)
    return bound.load_model(f"tiny{seed}", "t5", config, init_seed=seed)


def _prompts(target) -> dict:
    """The arguments both loops take: ``target`` and its cache, start-token prompts."""
    rows = ENCODER.shape[0]
    return dict(
        target=target.forward,
        target_cache=target.new_cache(ENCODER, rows, 32),
        prompt_tokens=np.zeros((rows, 1), np.int32),
        prompt_lengths=np.ones((rows,), np.int32),
        request_ids=np.arange(rows),
        max_new_tokens=10,
        sampling_config=GREEDY,
    )


def _speculative(target, draft, gamma=2):
    return decoding.speculative_generate(
        **_prompts(target),
        draft=draft.forward,
        draft_cache=draft.new_cache(ENCODER, ENCODER.shape[0], 32),
        gamma=gamma,
    )


def _baseline(model):
    return decoding.autoregressive_generate(**_prompts(model))


def test_a_model_of_the_same_config_compiles_nothing_and_decodes_with_its_own_weights(
    compiles,
):
    first, second = _tiny_t5(0), _tiny_t5(1)
    first_out = _baseline(first)
    compiled_once = len(compiles)
    assert compiled_once > 0
    second_out = _baseline(second)
    assert len(compiles) == compiled_once  # the second model compiled nothing
    # its own weights decoded: other tokens than the first model's, and the tokens a
    # process that never saw the first model gives
    assert (first_out.tokens != second_out.tokens).any()
    decoding.clear_compiled()
    jax.clear_caches()
    np.testing.assert_array_equal(_baseline(second).tokens, second_out.tokens)


def test_a_model_that_is_dropped_is_not_kept_alive_by_the_programs_it_shared(compiles):
    first, second = _tiny_t5(0), _tiny_t5(1)
    _baseline(first)
    _baseline(second)  # the entries now hold the second model's params
    gone = weakref.ref(first.forward)
    del first
    gc.collect()
    assert gone() is None


def test_a_speculative_pair_swapped_for_one_of_the_same_configs_gives_its_own_tokens(compiles):
    target, draft, other_target = _tiny_t5(0), _tiny_t5(1), _tiny_t5(2)
    _speculative(target, draft)
    compiled_once = len(compiles)
    swapped = _speculative(other_target, target)  # roles and weights change, shapes do not
    assert len(compiles) == compiled_once
    # greedy speculative decoding gives the target's own tokens: the swapped target's
    np.testing.assert_array_equal(swapped.tokens, _baseline(other_target).tokens)


def test_tables_of_one_shape_share_programs_and_keep_their_values(compiles):
    tables = [random_table(seed, VOCAB, scale=3.0) for seed in (0, 1)]
    prompts = np.array([[3, 4, 5], [6, 7, 8]], np.int32)

    def greedy(values):
        return decoding.autoregressive_generate(
            target=bound_table(table.from_table(values)),
            target_cache=table.init_cache(2, 32),
            prompt_tokens=prompts,
            prompt_lengths=np.full((2,), 3, np.int32),
            request_ids=np.arange(2),
            max_new_tokens=8,
            sampling_config=GREEDY,
        ).tokens

    outputs = [greedy(tables[0])]
    compiled_once = len(compiles)
    outputs.append(greedy(tables[1]))
    assert len(compiles) == compiled_once
    assert (outputs[0] != outputs[1]).any()
    for values, tokens in zip(tables, outputs, strict=True):  # each table's own argmax chain
        for row, prompt in enumerate(prompts.tolist()):
            seq = list(prompt)
            for _ in range(8):
                logits = table.sequence_logits(values, seq[:1], [*seq[1:], 0])[-1]
                seq.append(int(np.argmax(logits)))
            assert tokens[row].tolist() == seq[3:]


def test_the_cache_keeps_at_most_its_size_and_a_builder_must_return_jit_over():
    calls = []

    @decoding.program_cache
    def builder(forward, n: int):
        calls.append(n)
        return decoding.jit_over(lambda f: lambda x: f(x) + n, (forward,))

    model = jax.tree_util.Partial(lambda params, x: params * x, np.float32(2.0))
    other = jax.tree_util.Partial(model.func, np.float32(3.0))  # same function, other params
    assert float(builder(model, 1)(np.float32(5.0))) == 11.0
    assert float(builder(other, 1)(np.float32(5.0))) == 16.0  # the same program, its params
    assert calls == [1]
    for n in range(decoding.COMPILED_CACHE_SIZE + 4):
        builder(model, n + 2)
    assert builder.cache_len() == decoding.COMPILED_CACHE_SIZE
    builder.cache_clear()
    assert builder.cache_len() == 0

    @decoding.program_cache
    def wrong(forward):
        return jax.jit(forward)  # the forward closed over: it could not be rebound

    with pytest.raises(TypeError, match="must return jit_over"):
        wrong(model)
