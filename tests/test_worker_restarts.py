"""Workers that come back: a model worker or the coordinator SIGKILLed mid-batch is
restarted by Ray, the batch resumes from its committed tokens, and every output is
the one an uninterrupted run gives (T=0 and T=1, same seed); a worker that keeps
dying fails its batch with a clear error after a bound.

The kills are deterministic: ``kill_after(k)`` makes the actor SIGKILL its own
process at its k-th next step (a worker's k-th wire call, the coordinator's k-th
iteration), i.e. with k − 1 iterations of the batch committed.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from specdec_core.models import bound, registry
from specdec_core.sampling import SamplingConfig
from workers import recovery
from workers.batching import DecodeSettings, Request
from workers.channel import ChannelClosed
from workers.engine import EngineConfig, InProcessEngine
from workers.spec import ModelSpec

VOCAB = 512
CONFIG = registry.get_config("t5_tiny_test", vocab_size=VOCAB)
TARGET = ModelSpec(name="target", family="t5", config=CONFIG, init_seed=0)
DRAFT = ModelSpec(name="draft", family="t5", config=CONFIG, init_seed=1)
BATCH, BATCHES = 2, 3


def _settings(temperature: float) -> DecodeSettings:
    # 16 new tokens at γ = 3: at least 4 iterations per batch, so a kill at the 3rd
    # step of a batch lands mid-batch with tokens committed.
    return DecodeSettings(
        gamma=3,
        sampling=SamplingConfig(temperature=temperature),
        seed=5,
        max_new_tokens=16,
        batch_size=BATCH,
        eos_id=None,
    )


def _requests() -> list[Request]:
    rng = np.random.default_rng(7)
    return [
        Request(
            id=f"r{i}",
            prompt_tokens=(0,),
            encoder_tokens=(*rng.integers(3, VOCAB, 3 + (i * 5) % 9).tolist(), 1),
        )
        for i in range(BATCH * BATCHES)
    ]


def _batches(engine, requests, before_batch=None) -> list:
    """The job's batches through ``engine``; ``before_batch(i)`` runs before batch i."""
    out = []
    for i in range(0, len(requests), BATCH):
        if before_batch is not None:
            before_batch(i // BATCH)
        out += engine.generate(requests[i : i + BATCH])
    return out


@functools.lru_cache(maxsize=4)
def _uninterrupted(temperature: float) -> tuple:
    """What an uninterrupted run gives (the in-process engine equals the Ray engine,
    tests/test_workers.py)."""
    engine = InProcessEngine(
        bound.load_model("target", "t5", CONFIG, init_seed=0),
        bound.load_model("draft", "t5", CONFIG, init_seed=1),
        _settings(temperature),
    )
    return tuple(_batches(engine, _requests()))


def _same_generations(got, expected) -> None:
    assert [g.id for g in got] == [g.id for g in expected]
    assert [g.tokens for g in got] == [g.tokens for g in expected]
    # The counters are part of the committed state too: a resumed batch keeps them.
    for field in ("iterations", "drafted", "accepted", "accepted_by_position"):
        assert [getattr(g, field) for g in got] == [getattr(g, field) for g in expected], field


def _decode_with_kills(ray, engine, watched, kill):
    """Decodes ``_requests()`` with ``kill(index)`` before each batch, then closes the
    engine: (generations, whether ``watched`` is a new process now, engine.restarts())."""
    before = ray.get(watched.pid.remote())
    try:
        got = _batches(engine, _requests(), kill)
        after = ray.get(watched.pid.remote())
        restarts = engine.restarts()
    finally:
        engine.close()
    return got, before != after, restarts


def _engine(
    temperature, *, draft_placement="coordinator", transport="socket", pipelined=False, **options
):
    from workers.ray_engine import RayEngine

    config = EngineConfig(
        kind="ray", draft_placement=draft_placement, transport=transport, pipelined=pipelined
    )
    return RayEngine(TARGET, DRAFT, _settings(temperature), config=config, **options)


@pytest.mark.slow
@pytest.mark.parametrize(
    "temperature,role,placement,transport,pipelined",
    [
        (0.0, "target", "coordinator", "socket", False),
        (1.0, "target", "coordinator", "socket", False),
        (1.0, "target", "worker", "ray", False),
        (0.0, "draft", "worker", "socket", False),
        (1.0, "draft", "worker", "socket", False),
        (1.0, "draft", "worker", "ray", False),
        # pipelined: a death while the draft proposes ahead or the target verifies
        (1.0, "target", "coordinator", "socket", True),
        (1.0, "draft", "worker", "ray", True),
    ],
)
def test_a_killed_worker_comes_back_and_the_outputs_are_identical(
    ray_local, temperature, role, placement, transport, pipelined
):
    ray = ray_local
    engine = _engine(
        temperature, draft_placement=placement, transport=transport, pipelined=pipelined
    )
    actor = getattr(engine, role)
    pids = [ray.get(actor.pid.remote())]

    def kill_mid_second_batch(index):
        if index == 1:  # dies at its 3rd wire call of the batch, mid-batch
            ray.get(actor.kill_after.remote(3))

    try:
        got = _batches(engine, _requests(), kill_mid_second_batch)
        pids.append(ray.get(actor.pid.remote()))
        restarts, traffic = engine.restarts(), engine.traffic()
    finally:
        engine.close()
    _same_generations(got, _uninterrupted(temperature))
    assert pids[0] != pids[1]  # a new process
    assert restarts == {"target": 0, "draft": 0, "coordinator": 0} | {role: 1}
    assert traffic["resumes"] == 1
    assert engine.transport == transport  # the channel was reopened, no fallback to Ray


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_killed_target_hosting_the_draft_comes_back_and_the_outputs_are_identical(
    ray_local, temperature
):
    """``draft_placement="target"``: the target's actor runs each batch's whole loop, so
    its death loses the batch, which runs again on the restarted actor (its draft
    loaded again there) with the same tokens."""
    ray = ray_local
    engine = _engine(temperature, draft_placement="target")

    def kill(index):
        if index == 1:  # dies as the second batch's call starts
            ray.get(engine.target.kill_after.remote(1))

    got, replaced, restarts = _decode_with_kills(ray, engine, engine.target, kill)
    _same_generations(got, _uninterrupted(temperature))
    assert replaced
    assert restarts == {"target": 1, "draft": 0, "coordinator": 0}


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_killed_coordinator_and_its_draft_come_back_and_the_outputs_are_identical(
    ray_local, temperature
):
    """The coordinator hosts the draft (the default placement): its death loses the
    batch's state, and the engine decodes the batch again on the restarted one. The
    target's restart counted by the dead coordinator is not lost."""
    ray = ray_local
    engine = _engine(temperature)  # draft_placement="coordinator"

    def kill(index):
        if index == 0:
            ray.get(engine.target.kill_after.remote(3))
        if index == 1:
            ray.get(engine.coordinator.kill_after.remote(3))

    got, replaced, restarts = _decode_with_kills(ray, engine, engine.coordinator, kill)
    _same_generations(got, _uninterrupted(temperature))
    assert replaced
    assert restarts == {"target": 1, "draft": 0, "coordinator": 1}


@pytest.mark.slow
def test_a_worker_that_is_not_restarted_fails_its_batches_with_a_clear_error(ray_local):
    """max_restarts=0: the dead target stays dead; the batch fails with WorkerLost
    naming it, and so does every later batch, at once."""
    import time

    ray = ray_local
    engine = _engine(0.0, max_restarts=0)
    requests = _requests()
    try:
        assert engine.generate(requests[:2])
        ray.get(engine.target.kill_after.remote(2))
        with pytest.raises(recovery.WorkerLost, match=r"target worker died and was not restarted"):
            engine.generate(requests[2:4])
        start = time.monotonic()
        with pytest.raises(recovery.WorkerLost, match="target worker"):
            engine.generate(requests[4:])
        assert time.monotonic() - start < 5
        assert engine.restarts() == {"target": 0, "draft": 0, "coordinator": 0}
    finally:
        engine.close()


@pytest.mark.slow
def test_a_call_to_a_worker_restarted_while_idle_counts_as_its_death(ray_local):
    """Killed between two calls of a batch, a worker comes back without the batch: the
    next call over Ray raises BatchLost, which recovery handles as that death (and
    only that error of a worker's own)."""
    from workers.model_worker import ModelWorker

    ray = ray_local
    worker = ray.remote(ModelWorker).remote(TARGET)
    try:
        with pytest.raises(ray.exceptions.RayTaskError) as lost:
            ray.get(worker.propose_first.remote("never-started", None, _settings(0.0)))
        assert isinstance(lost.value.cause, recovery.BatchLost)
        assert recovery.worker_died(lost.value)
        with pytest.raises(ray.exceptions.RayTaskError) as other:
            ray.get(worker.kill_after.remote(0))
        assert isinstance(other.value.cause, ValueError)
        assert not recovery.worker_died(other.value)
    finally:
        ray.kill(worker)


def test_a_batch_whose_worker_keeps_dying_fails_after_the_bound():
    """recovery.retrying: deaths without progress in between are bounded; deaths with
    progress are not counted against the bound; other errors are not retried."""
    recovered = []

    def dies_always():
        raise ChannelClosed("the target worker went away during 'score'")

    with pytest.raises(recovery.WorkerLost, match=r"died 3 times in a row.*max_batch_failures=2"):
        recovery.retrying(dies_always, recover=lambda: recovered.append(1), max_failures=2)
    assert len(recovered) == 2  # recovered after the 1st and 2nd death, not after the 3rd

    committed = [0]

    def dies_four_times_with_progress():
        committed[0] += 1
        if committed[0] <= 4:
            raise ChannelClosed("gone")
        return "done"

    assert (
        recovery.retrying(
            dies_four_times_with_progress,
            recover=lambda: None,
            max_failures=1,
            progress=lambda: committed[0],
        )
        == "done"
    )

    def raises():
        raise KeyError("not a death")

    with pytest.raises(KeyError):
        recovery.retrying(raises, recover=lambda: recovered.append(1), max_failures=2)


def test_committed_prompts_append_the_committed_tokens():
    prompt = np.array([[0, 0, 0, 0], [5, 6, 0, 0]], np.int32)
    out = np.array([[7, 8, 9, 0], [4, 0, 0, 0]], np.int32)
    tokens, lengths = recovery.committed_prompts(
        prompt, np.array([1, 2]), out, np.array([3, 0]), max_len=32
    )
    assert lengths.tolist() == [4, 2]
    assert tokens.shape == (2, 16)
    assert tokens[0, :4].tolist() == [0, 7, 8, 9] and tokens[1, :2].tolist() == [5, 6]
    assert not tokens[:, 4:].any() and not tokens[1, 2:].any()
    with pytest.raises(ValueError, match="exceed max_len"):
        recovery.committed_prompts(prompt, np.array([1, 2]), out, np.array([3, 0]), max_len=3)


# ------------------------------------------------------------------ the translate job


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    """tests/test_translate_job.py's sentences and tiny model pair, in a folder of ours."""
    from tests import test_translate_job as job

    root = tmp_path_factory.mktemp("restart_job")
    (root / "sentences.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in job.SENTENCES))
    job.tiny_pair(root)
    return root


def _job(root, name: str, workers: str, *extra: str):
    from pipelines.cli import main
    from tests.test_translate_job import JobRun, job_args

    output = root / f"{name}.jsonl"
    args = [
        *job_args(
            root / "sentences.tsv",
            output,
            models={"target": root / "tiny_target.yaml", "draft": root / "tiny_draft.yaml"},
            workers=workers,
            temperature=1.0,
            tracking_uri=f"sqlite:///{root}/mlflow.db",
        ),
        *extra,
    ]
    return JobRun(main(args), output, output.with_suffix(".jsonl.summary.json"))


def _job_with_a_killed_target(monkeypatch, root, name, *extra: str, **engine_options):
    """The ray translate job at T=1 whose target worker SIGKILLs itself at its 5th wire
    call (in the first batches: the warm-up or the first timed one)."""
    import ray

    from workers import ray_engine

    class KilledTarget(ray_engine.RayEngine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **(kwargs | engine_options))
            ray.get(self.target.kill_after.remote(5))

    monkeypatch.setattr(ray_engine, "RayEngine", KilledTarget)
    return _job(root, name, "ray", *extra)


@pytest.mark.slow
def test_a_job_whose_target_is_killed_writes_every_record_identical(
    ray_local, monkeypatch, job_dir
):
    expected = _job(job_dir, "uninterrupted", "inprocess")
    job = _job_with_a_killed_target(monkeypatch, job_dir, "killed")
    assert job.code == 0 and job.dead == []
    assert sorted(job.rows) == sorted(expected.rows) and len(job.rows) == 20
    for record_id, row in expected.rows.items():
        assert job.rows[record_id]["output_ids"] == row["output_ids"], record_id
    assert job.summary["worker_restarts"]["target"] >= 1
    assert expected.summary["worker_restarts"] is None  # no Ray workers


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["invariant", "paper"])
def test_a_killed_target_changes_no_sampled_token_under_either_rule(
    ray_local, monkeypatch, job_dir, rule
):
    """A Ray job at --gamma auto whose target dies and restarts mid-job writes the tokens
    of an in-process job at a fixed γ (another engine, another γ path, no restart): each
    token depends on its prefix and its position's keys only."""
    flags = ("--sampling", rule)
    expected = _job(job_dir, f"{rule}_fixed", "inprocess", *flags, "--gamma", "2")
    job = _job_with_a_killed_target(
        monkeypatch, job_dir, f"{rule}_killed", *flags, "--gamma", "auto"
    )
    assert job.code == 0 and job.dead == [] and len(job.rows) == 20
    assert job.summary["worker_restarts"]["target"] >= 1
    for record_id, row in expected.rows.items():
        assert job.rows[record_id]["output_ids"] == row["output_ids"], record_id


@pytest.mark.slow
def test_a_job_whose_target_stays_dead_puts_its_records_in_the_dead_letters(
    ray_local, monkeypatch, job_dir
):
    job = _job_with_a_killed_target(monkeypatch, job_dir, "stays_dead", max_restarts=0)
    from pipelines.cli import EXIT_DEAD_LETTERS

    assert job.code == EXIT_DEAD_LETTERS
    assert job.dead and len(job.rows) + len(job.dead) == 20
    for dead in job.dead:
        assert dead["reason"] == "engine_error"
        assert "WorkerLost" in dead["detail"] and "target worker" in dead["detail"], dead
    assert job.summary["worker_restarts"] == {"target": 0, "draft": 0, "coordinator": 0}


# ------------------------------------------------------------------ re-prefill numerics


def decode_with_a_restart(target, draft, batch, settings, restart_at: int | None):
    """The coordinator's loop over two in-process ModelWorkers; before iteration
    ``restart_at`` both are started again from the committed state, as after a worker
    restart (re-prefilled prompt + committed tokens, a first proposal)."""
    state = recovery.initial_state(batch, settings)

    def start(state):
        prompts = (batch.prompt_tokens, batch.prompt_lengths)
        if state.n_generated.max() > 0:
            prompts = recovery.committed_prompts(
                *prompts, state.out_tokens, state.n_generated, batch.max_len
            )
        for worker in (target, draft):
            worker.start("b", batch.encoder_tokens, *prompts, batch.max_len)
        return draft.propose_first("b", state, settings)

    tokens, token_probs = start(state)
    iteration = 0
    while not state.done.all():
        iteration += 1
        if iteration == restart_at:
            tokens, token_probs = start(state)
        scored = target.score("b", state, tokens, token_probs, settings)
        state, tokens, token_probs = draft.recover_and_propose("b", state, settings, *scored)
    return state, iteration


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_resuming_from_the_committed_tokens_at_any_iteration_changes_nothing(temperature):
    """Re-prefilling k committed tokens at once instead of having decoded them one block
    at a time could differ in the last float bits; on the tiny T5 pair a restart before
    any iteration gives the uninterrupted tokens and counters."""
    from workers.batching import pack
    from workers.model_worker import ModelWorker

    settings = _settings(temperature)
    target, draft = ModelWorker(TARGET), ModelWorker(DRAFT)
    batch = pack(_requests()[:BATCH], settings)
    expected, iterations = decode_with_a_restart(target, draft, batch, settings, None)
    assert iterations >= 4
    for restart_at in range(2, iterations + 1):
        state, _ = decode_with_a_restart(target, draft, batch, settings, restart_at)
        for field in ("out_tokens", "n_generated", "iterations", "accepted", "done"):
            np.testing.assert_array_equal(
                getattr(state, field), getattr(expected, field), err_msg=f"{field} @{restart_at}"
            )
