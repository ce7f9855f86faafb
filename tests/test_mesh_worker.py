"""The target on a slice: a model YAML's ``mesh:`` makes its Ray worker shard params and
caches over its devices (:mod:`specdec_core.sharding`), with the same tokens.

The worker gets 8 host CPU devices from its own environment (the YAML's
``worker.env``: ``XLA_FLAGS=--xla_force_host_platform_device_count=8``), which Ray
sets in the actor's process before it imports JAX; this pytest process keeps one.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
import yaml

from pipelines import configs, model_resolver
from specdec_core import checkpoints
from specdec_core.models import t5
from specdec_core.sampling import SamplingConfig
from workers.batching import DecodeSettings, Request
from workers.engine import EngineConfig, check_models
from workers.engines import build_engine
from workers.spec import ModelSpec, Placement

VOCAB = 64
# Heads, MLP units and the vocabulary divide by 8, so the model axis splits them.
CONFIG = t5.T5Config(
    vocab_size=VOCAB, emb_dim=16, num_heads=8, head_dim=4, mlp_dim=32,
    num_encoder_layers=1, num_decoder_layers=2,
)  # fmt: skip
HOST_DEVICES = "--xla_force_host_platform_device_count=8"


def _target_yaml(root, *, mesh, env) -> str:
    params = jax.tree.map(np.asarray, t5.init_params(CONFIG, jax.random.key(0)))
    checkpoints.save_t5x(params, root / "export", step=1)
    body = {
        "name": "mesh_target",
        "model": {k: list(v) if isinstance(v, tuple) else v
                  for k, v in dataclasses.asdict(CONFIG).items()},
        "checkpoint": {"export_dir": str(root / "export")},
        "worker": {"num_cpus": 1, "env": env},
        "mesh": mesh,
    }  # fmt: skip
    path = root / "mesh_target.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def _requests(n: int) -> list[Request]:
    rng = np.random.default_rng(3)
    return [
        Request(id=f"r{i}", prompt_tokens=(0,),
                encoder_tokens=(*rng.integers(3, VOCAB, 4 + 3 * i).tolist(), 1))
        for i in range(n)
    ]  # fmt: skip


def test_a_model_yaml_gives_its_worker_a_mesh_and_an_environment(tmp_path):
    path = _target_yaml(tmp_path, mesh={"data": 1, "model": 8}, env={"XLA_FLAGS": HOST_DEVICES})
    spec = model_resolver.resolve_model(path, role="target").spec
    assert spec.mesh == (1, 8)
    assert spec.placement.ray_options() == {
        "num_cpus": 1.0,
        "num_gpus": 0.0,
        "runtime_env": {"env_vars": {"XLA_FLAGS": HOST_DEVICES}},
    }
    with pytest.raises(ValueError, match="--workers ray"):
        check_models(EngineConfig(kind="inprocess"), target=spec, draft=spec)


@pytest.mark.parametrize(
    "mesh,message", [({"data": 0, "model": 8}, "mesh.data must be >= 1"), ({"modle": 8}, "modle")]
)
def test_a_bad_mesh_is_named(tmp_path, mesh, message):
    path = _target_yaml(tmp_path, mesh=mesh, env={})
    with pytest.raises(configs.ConfigError, match=message):
        configs.load_model_config(path)


def test_a_mesh_larger_than_the_devices_says_how_to_get_host_devices():
    from workers.model_worker import ModelWorker

    spec = ModelSpec(name="t", family="t5", config=CONFIG, mesh=(1, 8))
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count=8"):
        ModelWorker(spec)


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_sharded_target_in_its_ray_worker_gives_the_unsharded_tokens(
    ray_local, tmp_path, temperature
):
    from workers.ray_engine import RayEngine

    path = _target_yaml(tmp_path, mesh={"data": 1, "model": 8}, env={"XLA_FLAGS": HOST_DEVICES})
    target = model_resolver.resolve_model(path, role="target").spec
    draft = ModelSpec(name="draft", family="t5", config=CONFIG, init_seed=1)
    settings = DecodeSettings(
        gamma=3, sampling=SamplingConfig(temperature=temperature), seed=5,
        max_new_tokens=12, batch_size=2,
    )  # fmt: skip
    requests = _requests(4)
    engine = RayEngine(target, draft, settings, config=EngineConfig(kind="ray", gamma=3))
    try:
        info = ray_local.get(engine.target.info.remote())
        sharded = engine.generate(requests[:2]) + engine.generate(requests[2:])
        sharded_alone = engine.generate_baseline(requests[:2])
        # the cost probe times the sharded target in its worker, on the slice's devices
        probed = engine.step_costs(requests[0], ks=(1, 4), repeats=2) if temperature else None
    finally:
        engine.close()
    assert info["mesh"] == {"data": 1, "model": 8} and info["param_devices"] == 8
    if probed is not None:
        assert sorted(probed.target_s) == [1, 4] and min(probed.target_s.values()) > 0
        assert probed.draft_step_s > 0  # in the coordinator's actor (the default placement)
    assert info["sharded_params"] > 10  # attention, MLP and embedding arrays are split
    unsharded = build_engine(
        EngineConfig(kind="inprocess", gamma=3),
        target=dataclasses.replace(target, mesh=None, placement=Placement()),
        draft=draft,
        settings=settings,
    )
    expected = unsharded.generate(requests[:2]) + unsharded.generate(requests[2:])
    assert [g.tokens for g in sharded] == [g.tokens for g in expected]
    assert [g.accepted for g in sharded] == [g.accepted for g in expected]
    alone = unsharded.generate_baseline(requests[:2])
    assert [g.tokens for g in sharded_alone] == [g.tokens for g in alone]
