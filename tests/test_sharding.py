"""Sharding: logical axes of the T5/decoder trees, and a sharded forward on a 2×4 mesh.

The mesh test runs in a subprocess: ``--xla_force_host_platform_device_count`` must be
set before JAX initializes, and this pytest process has already imported JAX.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from specdec_core import sharding
from specdec_core.models import t5

TINY = t5.T5Config(
    vocab_size=48,
    emb_dim=8,
    num_heads=4,
    num_encoder_layers=1,
    num_decoder_layers=2,
    head_dim=2,
    mlp_dim=12,
)


def test_param_axes_follow_t5x_names():
    assert sharding.param_axes(["token_embedder", "embedding"], 2) == ("vocab", "embed")
    assert sharding.param_axes(["decoder", "layers_0", "self_attention", "query", "kernel"], 2) == (
        "embed",
        "joined_kv",
    )
    assert sharding.param_axes(["encoder", "layers_0", "attention", "out", "kernel"], 2) == (
        "joined_kv",
        "embed",
    )
    assert sharding.param_axes(["decoder", "layers_0", "mlp", "wi_1", "kernel"], 2) == (
        "embed",
        "mlp",
    )
    assert sharding.param_axes(["decoder", "layers_0", "mlp", "wo", "bias"], 1) == ("embed",)
    assert sharding.param_axes(["decoder", "logits_dense", "kernel"], 2) == ("embed", "vocab")
    assert sharding.param_axes(["decoder", "decoder_norm", "scale"], 1) == ("embed",)
    assert sharding.param_axes(["encoder", "relpos_bias", "rel_embedding"], 2) == ("heads", None)
    assert sharding.param_axes(["something", "else"], 3) == (None, None, None)


def test_specs_skip_non_dividing_and_reused_mesh_axes():
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    fake = type("FakeMesh", (), {"shape": {"data": 2, "model": 4}})()
    assert sharding.logical_to_spec(("embed", "mlp"), (8, 12), fake) == P(None, "model")
    assert sharding.logical_to_spec(("embed", "mlp"), (8, 10), fake) == P(None, None)
    assert sharding.logical_to_spec(("batch", "heads", "mlp"), (2, 4, 8), fake) == P(
        "data", "model", None
    )
    assert sharding.logical_to_spec(("batch",), (3,), fake) == P(None)
    # every T5 leaf gets a sharding on a real (1x1) mesh
    params = jax.eval_shape(lambda: t5.init_params(TINY, jax.random.key(0)))
    specs = sharding.param_shardings(params, mesh)
    assert specs["decoder"]["logits_dense"]["kernel"].spec == P(None, "model")


_MESH_SCRIPT = textwrap.dedent(
    """
    import functools
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import PartitionSpec as P
    from specdec_core import sharding
    from specdec_core.models import api, decoder, t5

    TINY = t5.T5Config(vocab_size=48, emb_dim=8, num_heads=4, num_encoder_layers=1,
                       num_decoder_layers=2, head_dim=2, mlp_dim=12)
    assert len(jax.devices()) == 8, jax.devices()
    mesh = sharding.make_mesh(data=2, model=4)
    params = t5.init_params(TINY, jax.random.key(0))
    rng = np.random.default_rng(0)
    enc = rng.integers(1, 48, size=(2, 6))
    enc[1, 4:] = 0  # padding
    enc = jnp.asarray(enc, jnp.int32)
    dec = jnp.asarray(rng.integers(1, 48, size=(2, 7)), jnp.int32)

    def run(params, place_cache):
        forward = jax.jit(functools.partial(t5.forward, TINY))
        cache = place_cache(t5.init_cache(TINY, params, enc, max_decode_len=8))
        first, cache = forward(params, cache, dec[:, :4])
        cache = api.rollback(cache, jnp.asarray([2, 3], jnp.int32))
        second, cache = forward(params, cache, dec[:, 2:5])
        return np.asarray(first), np.asarray(second), cache

    plain = run(params, lambda c: c)
    sharded_params = sharding.shard_params(params, mesh)
    kernel = sharded_params["decoder"]["logits_dense"]["kernel"]
    assert kernel.sharding.spec == P(None, "model"), kernel.sharding.spec
    assert kernel.addressable_shards[0].data.shape == (8, 12)  # vocab 48 over 4
    wi = sharded_params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert wi.sharding.spec == P(None, "model")
    sharded = run(sharded_params, lambda c: sharding.shard_cache(c, mesh))
    keys = sharded[2].self_keys[0]
    want = jax.sharding.NamedSharding(mesh, P("data", "model", None, None))  # [B, H, L, D]
    assert keys.sharding.is_equivalent_to(want, 4), keys.sharding
    assert keys.addressable_shards[0].data.shape == (1, 1, 8, 2)
    for a, b in zip(plain[:2], sharded[:2]):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(sharded[2].lengths, [5, 6])

    gpt = decoder.DecoderConfig(vocab_size=48, emb_dim=8, num_heads=4, num_layers=2,
                                head_dim=2, mlp_dim=12, max_len=8)
    gparams = decoder.init_params(gpt, jax.random.key(1))
    want = decoder.score(gpt, gparams, dec)
    got = jax.jit(functools.partial(decoder.score, gpt))(sharding.shard_params(gparams, mesh), dec)
    np.testing.assert_allclose(want, got, atol=1e-5, rtol=1e-5)
    print("SHARDED-OK")
    """
)


def test_sharded_forward_on_2x4_mesh_equals_unsharded():
    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join([repo_root, os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", _MESH_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=repo_root,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "SHARDED-OK" in result.stdout
