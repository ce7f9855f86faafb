"""A job's programs compiled ahead of its batches (workers.warmup): a dry run generates
nothing and leaves every program a batch of its shape needs compiled; the warm-up runs
the target alone's programs first, lets a batch wait only for a program it needs, and
a failure costs nothing but the warm-up; the engines give the same tokens with it."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.models import bound, registry
from tests.test_gamma_auto import _stub_result as stub_result
from workers import warmup
from workers.batching import DecodeSettings, Request, pack
from workers.engine import InProcessEngine, decode_baseline, decode_speculative
from workers.gamma import AdaptiveGamma, GammaPrior, at_gamma
from workers.target_alone import TargetAlone

CONFIG = registry.get_config("t5_tiny_test", vocab_size=512)


@pytest.fixture(scope="module")
def models():
    target = bound.load_model("warm_target", "t5", CONFIG, init_seed=0)
    draft = bound.load_model("warm_draft", "t5", CONFIG, init_seed=1)
    return target, draft


def _requests(lengths, offset=0):
    return [
        Request(id=f"r{offset + i}", prompt_tokens=(0,), encoder_tokens=(5 + i,) * n)
        for i, n in enumerate(lengths)
    ]


def test_a_dry_run_generates_nothing_and_leaves_its_programs_compiled(models):
    target, draft = models
    decoding.clear_compiled()
    settings = DecodeSettings(gamma=3, max_new_tokens=7, batch_size=1)
    batch = pack(_requests([9]), settings)
    loop = at_gamma(settings, 3, rows=1)  # the program every γ shares at one row
    dry = decode_speculative(target, draft, batch, loop, compiled=True, dry_run=True)
    alone = decode_baseline(target, batch, settings, dry_run=True)
    assert dry.lengths.tolist() == alone.lengths.tolist() == [0]
    assert dry.compile_s > 0 and alone.compile_s > 0
    for gamma in (1, 2, 3):  # each γ runs the warm program: nothing compiles
        real = decode_speculative(
            target, draft, batch, at_gamma(settings, gamma, rows=1), compiled=True
        )
        assert real.compile_s == 0.0 and real.lengths[0] > 0
        assert real.accepted_by_position.shape == (1, gamma)
    real_alone = decode_baseline(target, batch, settings)
    assert real_alone.compile_s == 0.0 and real_alone.row_tokens(0) == real.row_tokens(0)
    # the negative control: a batch of a shape not warmed compiles
    other = pack(_requests([40]), settings)
    assert decode_baseline(target, other, settings).compile_s > 0


def test_shape_requests_stand_for_each_width_bucket_first_seen_first():
    requests = warmup.shape_requests([40, 3, 12, 47, 16, 33], (0,))
    assert [len(r.encoder_tokens) for r in requests] == [48, 16]  # 40, 47 -> 48; 3..16 -> 16
    assert requests[0].prompt_tokens == (0,) and requests[0].id.startswith(warmup.WARMUP_ID)
    assert warmup.shape_requests([], (0,)) == []


def test_the_loops_warmed_follow_the_policy_and_the_rows():
    settings = DecodeSettings(gamma=3, max_new_tokens=8, batch_size=1)
    assert warmup.loop_settings(settings, None, 1) == [settings]  # a fixed γ
    assert warmup.loop_settings(settings, TargetAlone(), 1) == []  # --gamma 0
    shared = warmup.loop_settings(settings, AdaptiveGamma(3), 1)
    assert [(s.gamma, s.slots) for s in shared] == [(3, 3)]  # one program for every γ
    wide = warmup.loop_settings(settings, AdaptiveGamma(3), 16)
    assert [(s.gamma, s.slots) for s in wide] == [(1, None), (2, None), (3, None)]
    assert warmup.loop_settings(settings, AdaptiveGamma(0), 1) == []


class _Gated:
    """Fake programs that wait for the test to let them finish, recording the order."""

    def __init__(self):
        self.ran: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.started: dict[str, threading.Event] = {}

    def program(self, name: str, shape: tuple, loop: bool, fail: bool = False):
        self.gates[name], self.started[name] = threading.Event(), threading.Event()

        def run():
            self.started[name].set()
            assert self.gates[name].wait(30)
            self.ran.append(name)
            if fail:
                raise RuntimeError(f"{name} failed")
            return decoding.DecodeResult(
                tokens=np.zeros((1, 1), np.int32), lengths=np.zeros(1, np.int32),
                iterations=np.zeros(1, np.int32), drafted=np.zeros(1, np.int32),
                accepted=np.zeros(1, np.int32),
                accepted_by_position=np.zeros((1, 0), np.int32),
                draft_s=0.0, target_s=0.0, overhead_s=0.0, total_s=0.0, compile_s=0.5,
            )  # fmt: skip

        return warmup.Program(shape, shape, run, loop)


def test_a_batch_waits_only_for_the_program_it_needs_and_loops_are_ready_once_warm():
    gated = _Gated()
    a, b = ("a",), ("b",)
    work = [
        gated.program("a-alone", a, False),
        gated.program("a-loop", a, True),
        gated.program("b-loop", b, True),
    ]
    warm = warmup.Warmup(work)
    assert gated.started["a-alone"].wait(30)
    waiter = threading.Thread(target=warm.settle, args=(a,), kwargs={"loop": False})
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # the target alone's program of its shape is in flight
    warm.settle(("a", "another encoder width"), loop=True)  # another batch shape: no wait
    gated.gates["a-alone"].set()
    waiter.join(30)
    assert not waiter.is_alive()
    warm.first()  # the first program is warm
    assert gated.started["a-loop"].wait(30)
    warm.settle(a, loop=False)  # a loop in flight holds up no batch at γ = 0
    warm.settle(b, loop=True)  # nor one of another shape
    assert warm.loop_ready(a) is False and warm.loop_ready(("c",)) is None
    policy = AdaptiveGamma(2, prior=GammaPrior(alpha=0.9, draft_c=0.05, loop_compile_s=5.0))
    policy.ahead = warm
    assert policy.choose(shape=a) == 0  # not warm yet, and not worth buying
    gated.gates["a-loop"].set()
    gated.gates["b-loop"].set()
    warm.join(30)
    assert warm.done() and warm.loop_ready(a) is True and warm.loop_ready(b) is True
    assert policy.choose(shape=a) >= 1  # warm: the draft pays, and compiling is done
    assert gated.ran == ["a-alone", "a-loop", "b-loop"]
    assert warm.report() == {
        "programs": 3, "of": 3, "compile_s": 1.5, "seconds": pytest.approx(warm.seconds),
        "errors": [],
    }  # fmt: skip


def test_a_failed_program_gives_its_shape_back_to_the_policy_and_a_stop_ends_the_warmup():
    gated = _Gated()
    a, b = ("a",), ("b",)
    work = [
        gated.program("a-alone", a, False, fail=True),
        gated.program("a-loop", a, True),
        gated.program("b-alone", b, False),
        gated.program("b-loop", b, True),
    ]
    warm = warmup.Warmup(work)
    gated.gates["a-alone"].set()
    warm.first()
    assert gated.started["b-alone"].wait(30)
    assert warm.loop_ready(a) is None  # failed: the policy prices its loop as without one
    assert warm.report(stop=True)["errors"] == ["RuntimeError: a-alone failed"]
    gated.gates["b-alone"].set()
    warm.join(30)
    assert gated.ran == ["a-alone", "b-alone"]  # a-loop skipped, b-loop not begun
    assert warm.loop_ready(b) is None and warm.done()  # stopped before its loop
    dear = AdaptiveGamma(2, prior=GammaPrior(alpha=0.9, draft_c=0.05, loop_compile_s=5.0))
    free = AdaptiveGamma(2, prior=GammaPrior(alpha=0.9, draft_c=0.05, loop_compile_s=0.0))
    dear.ahead = free.ahead = warm
    # not warm (failed, or stopped): a loop is bought as without a warm-up
    assert dear.choose(shape=a) == dear.choose(shape=b) == 0
    assert free.choose(shape=a) >= 1 and free.choose(shape=b) >= 1


def _batches(lengths, batch_size):
    return [
        _requests(lengths[start : start + batch_size], offset=start)
        for start in range(0, len(lengths), batch_size)
    ]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_an_engine_warms_its_job_and_auto_gamma_buys_a_loop_off_the_batches_path(
    models, batch_size
):
    target, draft = models
    decoding.clear_compiled()
    settings = DecodeSettings(gamma=2, max_new_tokens=6, batch_size=batch_size)
    lengths = [9, 20, 11, 30, 18, 5]
    batches = _batches(lengths, batch_size)
    plain = InProcessEngine(target, draft, settings)
    expected = [g.tokens for requests in batches for g in plain.generate_baseline(requests)]
    decoding.clear_compiled()
    # compiling priced free: the policy buys a shape's loop at its first batch
    policy = AdaptiveGamma(2, prior=GammaPrior(alpha=0.9, draft_c=0.05, loop_compile_s=0.0))
    engine = InProcessEngine(target, draft, settings, gamma_policy=policy)
    engine.warm(lengths, (0,))
    engine.warmup.join(120)
    report = engine.warmup.report()
    assert report["errors"] == [] and report["programs"] == report["of"] == 2  # two widths
    shape = pack(batches[0], settings).program_shape()
    assert engine.warmup.loop_ready(shape) is None  # the loops wait to be bought
    got, compiled = [], []
    for number, requests in enumerate(batches):
        speculative = engine.generate(requests)
        got += [g.tokens for g in speculative]
        compiled += [g.batch_compile_ms for g in speculative + engine.generate_baseline(requests)]
        if number == 0:  # bought: the warm-up compiles it while the batch ran at γ = 0
            assert policy.history == [0] and engine.warmup.loop_ready(shape) is not None
            engine.warmup.join(120)
    assert got == expected
    assert compiled and all(ms == 0.0 for ms in compiled)  # nothing on the batches' path
    # warm: the next batch speculates (the draft pays, as the prior has it)
    assert policy.history[1] >= 1 and engine.warmup.report()["programs"] > 2
    engine.close()


def test_an_engine_at_a_fixed_gamma_warms_its_loops_at_once(models):
    target, draft = models
    decoding.clear_compiled()
    settings = DecodeSettings(gamma=2, max_new_tokens=6, batch_size=1)
    lengths = [9, 30]
    engine = InProcessEngine(target, draft, settings)
    engine.warm(lengths, (0,))
    engine.warmup.join(120)
    assert engine.warmup.report()["programs"] == 4  # each width: the target alone, a loop
    generations = [g for requests in _batches(lengths, 1) for g in engine.generate(requests)]
    assert all(g.batch_compile_ms == 0.0 for g in generations)
    alone = [g for requests in _batches(lengths, 1) for g in engine.generate_baseline(requests)]
    assert [g.tokens for g in generations] == [g.tokens for g in alone]


def test_an_engine_marks_the_batches_its_warmup_compiled_beside():
    gate, started = threading.Event(), threading.Event()

    def slow():
        started.set()
        gate.wait(30)
        return stub_result(0.1, compile_s=0.5)

    warm = warmup.Warmup([warmup.Program(key=("k",), shape=("s",), loop=False, run=slow)])
    assert started.wait(30)
    assert warmup.beside(warm, lambda: stub_result(0.2)).contended  # compiling now
    mark = warm.mark()
    gate.set()
    warm.join(30)
    assert warm.overlapped(mark)  # a program ended since the mark
    assert not warmup.beside(warm, lambda: stub_result(0.2)).contended  # idle
    assert not warmup.beside(None, lambda: stub_result(0.2)).contended


def test_the_warmup_compiles_at_the_lowest_cpu_priority():
    def nice():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen, before = [], nice()
    program = warmup.Program(key=("k",), shape=("s",), loop=False, run=lambda: seen.append(nice()))
    warmup.Warmup([program]).join(30)
    assert seen == [19] and nice() == before  # its own thread's, not the caller's
