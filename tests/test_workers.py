"""Engines: packing, in-process vs Ray workers (same tokens), traffic per iteration."""

import re

import numpy as np
import pytest

from specdec_core.models import bound, registry
from specdec_core.sampling import SamplingConfig
from tests import stub_models
from workers.batching import DecodeSettings, Request, pack
from workers.engine import EngineConfig, InProcessEngine
from workers.spec import ModelSpec

VOCAB = 512  # large enough that one V-vector per row stands out from the framing
CONFIG = registry.get_config("t5_tiny_test", vocab_size=VOCAB)


def _requests(n: int, offset: int = 0) -> list[Request]:
    return stub_models.encoder_requests(n, VOCAB, offset)


def test_pack_pads_rows_and_buckets_lengths():
    settings = DecodeSettings(gamma=3, max_new_tokens=20, batch_size=4)
    reqs = _requests(3)
    batch = pack(reqs, settings)
    assert batch.ids == ["r0", "r1", "r2"]
    assert batch.encoder_tokens.shape == (4, 16) and batch.prompt_tokens.shape == (4, 16)
    np.testing.assert_array_equal(batch.max_new_tokens, [20, 20, 20, 0])
    assert batch.encoder_tokens[3].tolist() == [1] + [0] * 15  # padding row: a lone EOS
    assert batch.max_len == 64 and batch.max_len >= 16 + 20 + 3 + 2
    assert len(set(batch.request_keys[:3].tolist())) == 3
    # The key depends on the id only.
    assert pack(reqs[1:2], settings).request_keys[0] == batch.request_keys[1]
    with pytest.raises(ValueError, match="exceed batch_size"):
        pack(_requests(5), settings)


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="gamma"):
        DecodeSettings(gamma=0)
    with pytest.raises(ValueError, match="batch_size"):
        DecodeSettings(batch_size=0)


def _inprocess(settings, draft_seed: int = 1):
    return InProcessEngine(
        bound.load_model("target", "t5", CONFIG, init_seed=0),
        bound.load_model("draft", "t5", CONFIG, init_seed=draft_seed),
        settings,
    )


def test_inprocess_greedy_equals_baseline_and_rejects_vocab_mismatch():
    settings = DecodeSettings(gamma=3, max_new_tokens=10, batch_size=3)
    engine = _inprocess(settings)
    reqs = _requests(3)
    spec = engine.generate(reqs)
    base = engine.generate_baseline(reqs)
    assert [g.tokens for g in spec] == [g.tokens for g in base]
    assert all(g.drafted == 3 * g.iterations for g in spec)
    other = registry.get_config("t5_tiny_test", vocab_size=VOCAB + 1)
    with pytest.raises(ValueError, match="vocab"):
        InProcessEngine(engine.target, bound.load_model("d", "t5", other), settings)


def _ray_settings(temperature: float) -> DecodeSettings:
    return DecodeSettings(
        gamma=3,
        sampling=SamplingConfig(temperature=temperature),
        seed=5,
        max_new_tokens=12,
        batch_size=2,
    )


def _ray_engine(settings: DecodeSettings, draft_seed: int = 1, **config):
    """A RayEngine of the random target and draft with ``EngineConfig(**config)``."""
    from workers.ray_engine import RayEngine

    return RayEngine(
        ModelSpec(name="target", family="t5", config=CONFIG, init_seed=0),
        ModelSpec(name="draft", family="t5", config=CONFIG, init_seed=draft_seed),
        settings,
        config=EngineConfig(kind="ray", **config),
    )


def _assert_probed(engine, settings: DecodeSettings) -> None:
    """The cost probe times the target on every k in its worker and the draft's step
    where the draft runs (``RayEngine.step_costs``)."""
    ks = (1, 2, settings.gamma + 1)
    costs = engine.step_costs(_requests(1, offset=30)[0], ks=ks, repeats=2)
    assert sorted(costs.target_s) == sorted(ks) and min(costs.target_s.values()) > 0
    assert costs.draft_step_s > 0


def _as_inprocess(engine, local, reqs) -> tuple[list, dict]:
    """Decodes ``reqs`` in two batches and the first with the target alone on ``engine``
    (then closes it), asserts that ``local`` gives the same tokens and acceptance counts,
    and returns the engine's generations and traffic."""
    try:
        remote = engine.generate(reqs[:2]) + engine.generate(reqs[2:])
        remote_base = engine.generate_baseline(reqs[:2])
        traffic = engine.traffic()
    finally:
        engine.close()
    expected = local.generate(reqs[:2]) + local.generate(reqs[2:])
    assert [g.tokens for g in remote] == [g.tokens for g in expected]
    assert [g.accepted for g in remote] == [g.accepted for g in expected]
    assert [g.tokens for g in remote_base] == [g.tokens for g in local.generate_baseline(reqs[:2])]
    return remote, traffic


@pytest.mark.parametrize(
    "temperature,placement,transport",
    [
        (0.0, "coordinator", "socket"),
        (1.0, "coordinator", "socket"),
        (1.0, "worker", "socket"),
        (0.0, "coordinator", "ray"),
        (1.0, "worker", "ray"),
    ],
)
def test_ray_workers_equal_inprocess(ray_local, temperature, placement, transport):
    settings = _ray_settings(temperature)
    reqs = _requests(4, offset=10)
    engine = _ray_engine(settings, draft_placement=placement, transport=transport)
    assert engine.transport == transport  # the direct channel connected (no fallback)
    if transport == "ray":  # once per placement: the draft in the coordinator, in its own actor
        _assert_probed(engine, settings)
    remote, traffic = _as_inprocess(engine, _inprocess(settings), reqs)
    # Per-iteration traffic (the pickled blobs): one V-vector per row plus the state,
    # ids and scalars, never γ·V.
    rows, gamma = settings.batch_size, settings.gamma
    per_batch = [max(g.iterations for g in remote[:2]), max(g.iterations for g in remote[2:])]
    assert traffic["iterations"] == sum(per_batch)
    assert traffic["bytes_per_iteration"] < rows * 4 * VOCAB * 2 + 4096
    assert traffic["bytes_per_iteration"] < rows * 4 * VOCAB * (gamma + 1)


@pytest.mark.parametrize(
    "temperature,placement,transport,draft_seed",
    [
        (0.0, "coordinator", "socket", 0),  # the target as its own draft: blocks kept
        (1.0, "worker", "socket", 1),
        (1.0, "worker", "ray", 0),  # the chained Ray calls
    ],
)
def test_pipelined_ray_workers_equal_inprocess(
    ray_local, temperature, placement, transport, draft_seed
):
    """``pipelined``: the draft proposes each next block while the target verifies; the
    same tokens and acceptance counts as the in-process (sequential) loop, and every
    iteration settles an early block (kept whole where the draft is the target, at
    T = 0: its guess of the bonus token is the target's greedy token)."""
    settings = _ray_settings(temperature)
    engine = _ray_engine(
        settings, draft_seed, draft_placement=placement, transport=transport, pipelined=True
    )
    assert engine.transport == transport
    _, traffic = _as_inprocess(engine, _inprocess(settings, draft_seed), _requests(4, offset=10))
    assert traffic["early_blocks_proposed"] == traffic["iterations"]
    if draft_seed == 0 and temperature == 0:
        assert traffic["early_blocks_kept"] == traffic["early_blocks_proposed"]


def test_pipelined_needs_a_draft_in_its_own_process():
    for config in ({"kind": "inprocess"}, {"kind": "ray", "draft_placement": "target"}):
        with pytest.raises(ValueError, match="--pipelined needs"):
            EngineConfig(pipelined=True, **config)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_in_the_targets_actor_equals_inprocess(ray_local, temperature):
    """``draft_placement="target"``: each batch's whole loop runs compiled in the
    target's actor; the same tokens and counts as in-process, nothing crosses per
    iteration, and the draft reports the target's node."""
    settings = _ray_settings(temperature)
    reqs = _requests(4, offset=10)
    local = _inprocess(settings)
    engine = _ray_engine(settings, draft_placement="target")
    try:
        remote = engine.generate(reqs[:2]) + engine.generate(reqs[2:])
        traffic, placement = engine.traffic(), engine.placement()
        _assert_probed(engine, settings)  # both models timed in the target's actor
    finally:
        engine.close()
    expected = local.generate(reqs[:2]) + local.generate(reqs[2:])
    assert [g.tokens for g in remote] == [g.tokens for g in expected]
    assert [g.accepted for g in remote] == [g.accepted for g in expected]
    assert sum(g.drafted for g in remote) > 0
    assert traffic["iterations"] == 0 and traffic["bytes"] == 0
    assert placement["draft"] == placement["target"] is not None
    assert engine.transport.startswith("none")


def test_sparse_rows_round_trip_sends_only_the_support():
    from workers.model_worker import dense_rows, sparse_rows

    dense = np.zeros((4, 10), np.float32)
    dense[0, 3] = 1.0  # one-hot (temperature 0)
    dense[2, [1, 5, 9]] = [0.2, 0.3, 0.5]  # top-3
    dense[3] = 0.1  # full support
    rows = np.array([0, 2, 3])
    ids, values, offsets = sparse_rows(dense, rows)
    assert offsets.tolist() == [0, 1, 4, 14]
    assert ids[:4].tolist() == [3, 1, 5, 9]
    np.testing.assert_array_equal(dense_rows((ids, values, offsets), rows, dense.shape), dense)
    empty = sparse_rows(dense, np.array([], np.int64))
    assert dense_rows(empty, np.array([], np.int64), (4, 10)).sum() == 0
    # Mostly full support (sampling without top-k): the dense rows, 4 bytes per entry.
    dense[0] = 0.1
    ids, values, offsets = sparse_rows(dense, np.array([0, 3]))
    assert ids is None and offsets is None and values.shape == (2, 10)
    restored = dense_rows((ids, values, offsets), np.array([0, 3]), dense.shape)
    np.testing.assert_array_equal(restored[[0, 3]], dense[[0, 3]])
    assert restored[[1, 2]].sum() == 0


def test_unknown_draft_placement_and_transport_are_named():
    with pytest.raises(ValueError, match="draft-placement"):
        EngineConfig(draft_placement="elsewhere")
    with pytest.raises(ValueError, match="transport"):
        EngineConfig(transport="pigeon")


def test_killed_target_worker_is_a_clear_error_not_a_hang(ray_local):
    """A target killed for good (``ray.kill`` does not restart it) fails the next batch
    at once with a clear error naming it (tests/test_worker_restarts.py: a worker that
    dies and is restarted costs nothing)."""
    import time

    import ray

    from workers.ray_engine import RayEngine
    from workers.recovery import WorkerLost

    settings = DecodeSettings(gamma=3, max_new_tokens=12, batch_size=1)
    engine = RayEngine(
        ModelSpec(name="target", family="t5", config=CONFIG, init_seed=0),
        ModelSpec(name="draft", family="t5", config=CONFIG, init_seed=1),
        settings,
    )
    try:
        assert engine.generate(_requests(1))[0].tokens
        ray.kill(engine.target)
        start = time.monotonic()
        with pytest.raises(WorkerLost) as failure:
            engine.generate(_requests(1, offset=3))
        assert re.search(r"target worker died and was not restarted", str(failure.value))
        assert time.monotonic() - start < 30
    finally:
        engine.close()
