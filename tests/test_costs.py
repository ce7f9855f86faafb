"""The cost probe (``specdec_core.costs``): model calls timed on decode-sized caches, with a
trained model's params passed to the program as inputs, not baked into it."""

from __future__ import annotations

import jax
import numpy as np

from specdec_core import costs
from specdec_core.models import bound, registry


def _tiny_t5():
    config = registry.get_config("t5_tiny_test", vocab_size=512)
    return bound.load_model("tiny", "t5", config)  # random params from init_seed 0


def test_probe_times_every_k_and_a_draft_step():
    model = _tiny_t5()
    encoder = np.array([[5, 6, 7, 1]], np.int32)
    measured = costs.step_costs(model, model, encoder, ks=(1, 2, 3), cache_len=32, repeats=2)
    assert sorted(measured.target_s) == [1, 2, 3]
    assert all(s > 0 for s in measured.target_s.values()) and measured.draft_step_s > 0
    host = costs.call_seconds(model, encoder, k=2, cache_len=32, in_loop=False)
    assert host > 0


def test_timers_run_once_untimed_then_once_per_round_in_turn():
    """A busy spell must fall on every k alike: all programs run (compile) before any is
    timed, and the rounds alternate between them (the first k timed was the one a
    job's Ray shutdown slowed, which made k = 1 dearer than k = 2)."""
    calls = []

    def timer(key, model_calls):
        return (lambda: calls.append(key)), model_calls

    seconds = costs.interleaved_seconds({1: timer(1, 4), 2: timer(2, 4), "d": timer("d", 1)}, 3)
    assert calls == [1, 2, "d"] * 4
    assert set(seconds) == {1, 2, "d"} and all(s >= 0 for s in seconds.values())


def test_probe_passes_the_params_as_inputs_not_constants():
    from specdec_core import decoding

    model = _tiny_t5()
    assert isinstance(model.forward, jax.tree_util.Partial)  # the params travel with it
    cache = model.new_cache(np.array([[5, 6, 7, 1]], np.int32), 1, 32)
    tokens = np.zeros((1, 1), np.int32)
    step = decoding.jit_over(lambda forward: forward, (model.forward,))  # as the probe

    def constants(closed) -> int:  # numbers a program holds as constants, nested ones too
        inner = [v for e in closed.jaxpr.eqns for v in e.params.values()]
        nested = [constants(v) for v in inner if isinstance(v, jax.extend.core.ClosedJaxpr)]
        return sum(np.size(c) for c in closed.consts) + sum(nested)

    def constant_values(fn, *args) -> int:
        return constants(jax.make_jaxpr(fn)(*args))

    weights = model.param_count()
    # closed over, the decoder's weights (most of them: the encoder ran in new_cache) are
    # constants of the program; the probe's holds none (only small index tables)
    assert constant_values(model.forward, cache, tokens) > weights / 2
    # the program jit_over compiles, called with the forward among its arguments as
    # jit_over calls it (the jitted program is nested in the trace: counted too)
    assert constant_values(step.func, *step.args, cache, tokens) < weights / 20
    logits_a, _ = step(cache, tokens)
    logits_b, _ = jax.jit(model.forward)(cache, tokens)
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), rtol=1e-5, atol=1e-5)


def test_probe_keeps_the_forward_of_a_model_without_checkpoint_params():
    from specdec_core.models import families, ngram

    params = ngram.fit_unigram([[3, 4, 4, 5]], vocab_size=16)
    model = families.get("unigram").bind("uni", ngram.NGramConfig.of(params), params)
    assert not isinstance(model.forward, jax.tree_util.Partial)  # closed over, as a table
    seconds = costs.call_seconds(model, None, k=1, cache_len=16, batch=2, repeats=2)
    assert seconds > 0
