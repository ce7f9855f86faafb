"""T5X checkpoints: the three layouts, parity with T5X's logits, save round trip, errors."""

from __future__ import annotations

import json
import pathlib
import shutil

import flax.serialization
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from specdec_core import checkpoints
from specdec_core.checkpoints import CheckpointError
from specdec_core.models import t5

# t5x/examples/t5/local_tiny.gin, as documented in ../shared/testdata/README.md
T5X_TINY = t5.T5Config(
    vocab_size=32128,
    emb_dim=8,
    num_heads=4,
    num_encoder_layers=2,
    num_decoder_layers=2,
    head_dim=3,
    mlp_dim=16,
    mlp_activations=("gelu", "linear"),
    logits_via_embedding=False,
)
LAYOUTS = {
    "inline": "inline",
    "tensorstore": "tensorstore/checkpoint_1",
    "orbax": "orbax/checkpoint_1",
}
score = jax.jit(t5.score, static_argnums=0)


@pytest.fixture(scope="module")
def tiny_dir(shared_testdata) -> pathlib.Path:
    return shared_testdata / "t5x_tiny"


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return dict(np.load(tiny_dir / "reference_logits.npz"))


@pytest.fixture(scope="module")
def inline_params(tiny_dir):
    return checkpoints.load_t5x(tiny_dir / LAYOUTS["inline"])


def _writable_copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    shutil.copytree(src, dst)
    for path in [dst, *dst.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return dst


def _assert_matches_reference(params, reference):
    logits = score(
        T5X_TINY,
        params,
        reference["encoder_input_tokens"],
        reference["decoder_input_tokens"],
        reference["decoder_target_tokens"],
    )
    valid = reference["decoder_target_tokens"] > 0
    np.testing.assert_allclose(np.asarray(logits)[valid], reference["logits"][valid], atol=1e-4)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_score_reproduces_t5x_logits(tiny_dir, reference, layout):
    params = checkpoints.load_t5x(tiny_dir / LAYOUTS[layout])
    _assert_matches_reference(params, reference)


@pytest.mark.parametrize("layout", ["tensorstore", "orbax"])
def test_layouts_hold_identical_arrays(tiny_dir, inline_params, layout):
    params = checkpoints.load_t5x(tiny_dir / LAYOUTS[layout])
    assert jax.tree.structure(params) == jax.tree.structure(inline_params)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(inline_params), strict=True):
        assert got.dtype == want.dtype == np.float32
        np.testing.assert_array_equal(got, want)


def test_loaded_tree_has_t5x_names_and_shapes(inline_params):
    like = jax.eval_shape(lambda: t5.init_params(T5X_TINY, jax.random.key(0)))
    checkpoints.check_params(inline_params, like)  # raises on any name/shape difference
    assert inline_params["token_embedder"]["embedding"].shape == (32128, 8)
    assert inline_params["decoder"]["relpos_bias"]["rel_embedding"].shape == (4, 32)


@pytest.mark.parametrize(
    "relative",
    ["inline/checkpoint", "tensorstore", "orbax", "orbax/checkpoint_1/state"],
)
def test_accepts_file_step_folder_model_folder_and_state(tiny_dir, inline_params, relative):
    params = checkpoints.load_t5x(tiny_dir / relative)
    np.testing.assert_array_equal(
        params["decoder"]["logits_dense"]["kernel"],
        inline_params["decoder"]["logits_dense"]["kernel"],
    )


def test_save_then_load_round_trip(tmp_path, inline_params, reference):
    folder = checkpoints.save_t5x(inline_params, tmp_path, step=7)
    assert folder == tmp_path / "checkpoint_7"
    state = flax.serialization.msgpack_restore((folder / "checkpoint").read_bytes())
    assert state["version"] == 3 and int(state["optimizer"]["state"]["step"]) == 7
    spec = state["optimizer"]["target"]["decoder"]["logits_dense"]["kernel"]
    assert spec["driver"] == "zarr"
    assert spec["kvstore"] == {"driver": "file", "path": "target.decoder.logits_dense.kernel/"}
    assert (folder / "target.decoder.logits_dense.kernel" / ".zarray").is_file()
    loaded = checkpoints.load_t5x(tmp_path)  # model folder: picks checkpoint_7
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(inline_params), strict=True):
        np.testing.assert_array_equal(got, want)
    _assert_matches_reference(loaded, reference)


def test_save_keeps_bfloat16_and_chunks_large_arrays(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, "_CHUNK_BYTES", 256)  # forces several chunks
    rng = np.random.default_rng(0)
    params = {
        "a": {"kernel": rng.normal(size=(20, 12)).astype(np.float32)},
        "b": {"scale": jnp.asarray(rng.normal(size=(33,)), jnp.bfloat16)},
    }
    folder = checkpoints.save_t5x(params, tmp_path, step=0)
    assert len(list((folder / "target.a.kernel").glob("*.*"))) > 1 + 1  # .zarray + chunks
    loaded = checkpoints.load_t5x(folder / "checkpoint")
    np.testing.assert_array_equal(loaded["a"]["kernel"], params["a"]["kernel"])
    assert loaded["b"]["scale"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(loaded["b"]["scale"], np.asarray(params["b"]["scale"]))


def test_save_overwrites_an_existing_step(tmp_path):
    checkpoints.save_t5x({"w": np.zeros((2,), np.float32)}, tmp_path, step=1)
    checkpoints.save_t5x({"w": np.ones((3,), np.float32)}, tmp_path, step=1)
    np.testing.assert_array_equal(checkpoints.load_t5x(tmp_path)["w"], np.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_1"]


# ------------------------------------------------------------------------------ errors


def test_truncated_zarr_chunk_names_path_and_parameter(tmp_path, tiny_dir):
    folder = _writable_copy(tiny_dir / LAYOUTS["tensorstore"], tmp_path / "ckpt")
    chunk = folder / "target.decoder.logits_dense.kernel" / "0.0"
    chunk.write_bytes(chunk.read_bytes()[:1000])
    with pytest.raises(CheckpointError) as err:
        checkpoints.load_t5x(folder)
    assert err.value.param == "decoder/logits_dense/kernel"
    assert str(folder / "target.decoder.logits_dense.kernel") in str(err.value)
    assert "decoder/logits_dense/kernel" in str(err.value)


def test_missing_zarr_folder_names_parameter(tmp_path, tiny_dir):
    folder = _writable_copy(tiny_dir / LAYOUTS["tensorstore"], tmp_path / "ckpt")
    shutil.rmtree(folder / "target.encoder.encoder_norm.scale")
    with pytest.raises(CheckpointError, match=r"encoder/encoder_norm/scale.*NOT_FOUND"):
        checkpoints.load_t5x(folder)


def test_zarr_shape_that_disagrees_with_the_spec_is_an_error(tmp_path, tiny_dir):
    folder = _writable_copy(tiny_dir / LAYOUTS["tensorstore"], tmp_path / "ckpt")
    zarray = folder / "target.decoder.decoder_norm.scale" / ".zarray"
    meta = json.loads(zarray.read_text())
    meta["shape"], meta["chunks"] = [9], [9]
    zarray.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as err:
        checkpoints.load_t5x(folder)
    assert err.value.param == "decoder/decoder_norm/scale" and str(folder) in str(err.value)


def test_truncated_inline_msgpack_names_path(tmp_path, tiny_dir):
    file = tmp_path / "checkpoint"
    data = (tiny_dir / "inline" / "checkpoint").read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"/checkpoint: cannot decode msgpack"):
        checkpoints.load_t5x(file)


def test_truncated_orbax_data_names_parameter(tmp_path, tiny_dir):
    folder = _writable_copy(tiny_dir / LAYOUTS["orbax"], tmp_path / "ckpt")
    data_files = list((folder / "state" / "ocdbt.process_0" / "d").iterdir())
    biggest = max(data_files, key=lambda p: p.stat().st_size)  # holds the embeddings
    biggest.write_bytes(biggest.read_bytes()[:5000])
    with pytest.raises(CheckpointError) as err:
        checkpoints.load_t5x(folder)
    assert err.value.param is not None and str(folder / "state") in str(err.value)


def test_params_that_do_not_match_the_model_name_the_parameter(inline_params):
    wider = t5.T5Config(**{**T5X_TINY.__dict__, "mlp_dim": 32})
    like = jax.eval_shape(lambda: t5.init_params(wider, jax.random.key(0)))
    with pytest.raises(CheckpointError, match=r"parameter decoder/layers_0/mlp/wi_0/kernel.*shape"):
        checkpoints.check_params(inline_params, like, path="ckpt")
    trimmed = {**inline_params, "decoder": dict(inline_params["decoder"])}
    del trimmed["decoder"]["logits_dense"]
    like = jax.eval_shape(lambda: t5.init_params(T5X_TINY, jax.random.key(0)))
    with pytest.raises(CheckpointError, match=r"decoder/logits_dense/kernel\]: missing"):
        checkpoints.check_params(trimmed, like, path="ckpt")


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        checkpoints.load_t5x(tmp_path / "absent")
    with pytest.raises(CheckpointError, match="not a T5X checkpoint"):
        checkpoints.load_t5x(tmp_path)
