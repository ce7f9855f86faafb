"""The speedup bench's cost model inputs (benchmarks/bench_ende_speedup.py): the free
model it times the loops' own work on, and the per-batch step counts."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.sampling import SamplingConfig

BENCH = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_ende_speedup.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_ende_speedup", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_free_model_decodes_to_the_budget_without_eos(bench, temperature):
    forward, new_cache = bench.free_model(64, bench.EOS)
    common = dict(
        prompt_tokens=np.zeros((3, 1), np.int32),
        prompt_lengths=np.ones((3,), np.int32),
        request_ids=np.arange(3),
        max_new_tokens=np.array([5, 9, 2], np.int32),
        sampling_config=SamplingConfig(temperature=temperature),
        eos_id=bench.EOS,
    )
    base = decoding.autoregressive_generate(target=forward, target_cache=new_cache(3), **common)
    spec = decoding.speculative_generate(
        target=forward,
        target_cache=new_cache(3),
        draft=forward,
        draft_cache=new_cache(3),
        gamma=3,
        compiled=True,
        **common,
    )
    for result in (base, spec):
        np.testing.assert_array_equal(result.lengths, [5, 9, 2])
        assert not (result.tokens[result.tokens != 0] == bench.EOS).any()
    # The draft is the target, so every drafted token is accepted.
    np.testing.assert_array_equal(spec.accepted, spec.drafted)


def test_loop_overheads_are_per_unit_and_cover_every_gamma(bench):
    per_token, per_iteration = bench.loop_overheads(
        64, (1, 3), batch=2, temperature=1.0, short=2, long=10, repeats=1
    )
    assert set(per_iteration) == {1, 3}
    for value in (per_token, *per_iteration.values()):
        # seconds per token / iteration; timings, so only their range is asserted
        assert math.isfinite(value) and 0.0 <= value < 1.0


def test_steps_per_batch_counts_the_longest_row(bench):
    class Gen:
        def __init__(self, n):
            self.tokens = [7] * n

    outputs = [Gen(n) for n in (3, 5, 2, 8, 4)]
    assert bench.steps_per_batch(outputs, 1) == pytest.approx(np.mean([3, 5, 2, 8, 4]))
    assert bench.steps_per_batch(outputs, 2) == pytest.approx(np.mean([5, 8, 4]))


def test_decode_cache_len_is_the_engines(bench):
    # prompt bucket 16 + 48 new + γ + 2, rounded up to 32
    assert bench.decode_cache_len(48, 4) == 96
    assert bench.decode_cache_len(10, 1) == 32


@pytest.mark.parametrize("split", ["test", "train"])
def test_full_sentences_come_from_the_named_split(bench, split):
    from pipelines.data import ding

    pairs = bench.full_sentences(5, split)
    assert len(pairs) == 5
    assert all(ding.is_sentence_pair(pair) for pair in pairs)
    other = "train" if split == "test" else "test"
    assert set(pairs) & set(bench.full_sentences(50, other)) == set()
