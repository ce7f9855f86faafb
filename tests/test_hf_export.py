"""HuggingFace export: our T5 params as a transformers T5 give our logits and greedy tokens."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import jax
import numpy as np
import pytest

from specdec_core import checkpoints
from specdec_core.checkpoints import CheckpointError
from specdec_core.models import bound, t5
from workers.batching import DecodeSettings, Request
from workers.engine import InProcessEngine

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.test_hf_import import _hf_logits  # noqa: E402  (after the skips: it imports torch)

VOCAB = 67
GATED = ("gelu", "linear")  # T5 1.1 gated-GELU: wi_0, wi_1, wo
CONFIGS = {  # every combination our model configs use, and a non-gated MLP
    "untied": dict(logits_via_embedding=False, mlp_activations=GATED),
    "tied": dict(logits_via_embedding=True, mlp_activations=GATED),
    "tied-relu": dict(logits_via_embedding=True, mlp_activations=("relu",)),
}


def _config(name: str) -> t5.T5Config:
    return t5.T5Config(
        vocab_size=VOCAB, emb_dim=16, num_heads=3, head_dim=4, mlp_dim=24,
        num_encoder_layers=2, num_decoder_layers=3, **CONFIGS[name],
    )  # fmt: skip


def _params(config: t5.T5Config, seed: int = 0) -> dict:
    """Every parameter (norm scales too) drawn from N(0, 0.5²): varied greedy outputs."""
    rng = np.random.default_rng(seed)
    like = t5.init_params(config, jax.random.key(seed))
    return jax.tree.map(lambda x: rng.normal(0.0, 0.5, x.shape).astype(np.float32), like)


@pytest.mark.parametrize("name", CONFIGS)
def test_export_then_import_is_the_identity(name):
    config = _config(name)
    params = _params(config)
    state = checkpoints.export_hf_t5(params, config)
    assert ("lm_head.weight" in state) == (not config.logits_via_embedding)
    assert "encoder.embed_tokens.weight" not in state  # tied to shared.weight in HF
    # HF's layouts: Linear weights [out, in], the bias table [buckets, H]
    assert state["decoder.block.2.layer.1.EncDecAttention.q.weight"].shape == (12, 16)
    assert state["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"].shape == (
        t5.NUM_BUCKETS,
        3,
    )
    mlp = "decoder.block.1.layer.2.DenseReluDense"
    assert (f"{mlp}.wi_1.weight" in state) == (len(config.mlp_activations) == 2)
    assert all(a.dtype == np.float32 and a.flags.c_contiguous for a in state.values())

    back = checkpoints.import_hf_t5(state)
    flat_back, flat_params = checkpoints.flatten(back), checkpoints.flatten(params)
    assert sorted(flat_back) == sorted(flat_params)
    for path, value in flat_params.items():
        np.testing.assert_array_equal(flat_back[path], value, err_msg="/".join(path))
    hf_config = checkpoints.hf_t5_config(config)
    again = checkpoints.t5_config_from_hf(
        hf_config, logits_via_embedding=config.logits_via_embedding
    )
    assert again == config


@pytest.mark.parametrize("name", CONFIGS)
def test_exported_model_reproduces_our_logits(name):
    config = _config(name)
    params = _params(config, seed=1)
    model = checkpoints.hf_t5_model(params, config)
    tied = model.lm_head.weight is model.shared.weight
    assert tied == config.logits_via_embedding
    assert model.config.scale_decoder_outputs == config.logits_via_embedding

    rng = np.random.default_rng(0)
    encoder_tokens = rng.integers(2, VOCAB, size=(2, 9))
    encoder_tokens[1, 5:] = 0  # padding
    decoder_tokens = rng.integers(2, VOCAB, size=(2, 6))
    decoder_tokens[:, 0] = t5.DECODER_START_ID
    want = t5.score(config, params, encoder_tokens, decoder_tokens, np.ones_like(decoder_tokens))
    got = _hf_logits(model, encoder_tokens, decoder_tokens)
    assert np.abs(want).max() > 0.25  # a meaningful scale for the 1e-4 tolerance
    np.testing.assert_allclose(got, np.asarray(want), atol=1e-4, rtol=1e-4)


def _hf_greedy(model, encoder_tokens: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """HF greedy ids without the decoder start, up to and including EOS."""
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.as_tensor([encoder_tokens]), max_new_tokens=max_new_tokens,
            do_sample=False, num_beams=1,
        )  # fmt: skip
    tokens = out[0, 1:].tolist()
    return tokens[: tokens.index(t5.EOS_ID) + 1] if t5.EOS_ID in tokens else tokens


@pytest.mark.parametrize("name", ["tied", "untied"])
def test_hf_greedy_matches_our_greedy_tokens(name):
    # more encoder than decoder layers: HF's generate sizes its decoder cache by the
    # encoder's count (hf_t5_model's docstring), so the other way round needs help
    config = dataclasses.replace(_config(name), num_encoder_layers=3, num_decoder_layers=2)
    params = _params(config, seed=2)
    model = checkpoints.hf_t5_model(params, config)
    ours = bound.bind("tiny", "t5", config, params)
    engine = InProcessEngine(ours, ours, DecodeSettings(gamma=1, max_new_tokens=12))
    rng = np.random.default_rng(3)
    requests = [
        Request(
            id=str(i),
            prompt_tokens=(t5.DECODER_START_ID,),
            encoder_tokens=(*rng.integers(2, VOCAB, size=n).tolist(), t5.EOS_ID),
        )
        for i, n in enumerate((4, 9, 20))  # 20: the encoder pads to 32 on our side
    ]
    generated = set()
    for request in requests:
        (mine,) = engine.generate_baseline([request])
        assert _hf_greedy(model, request.encoder_tokens, 12) == mine.tokens
        generated.update(mine.tokens)
    assert len(generated) > 3  # not one repeated token (or an immediate EOS)


def test_config_hf_cannot_express_is_a_value_error():
    config = dataclasses.replace(_config("tied"), mlp_activations=("gelu_exact", "linear"))
    with pytest.raises(ValueError, match=r"HF T5 cannot express mlp_activations"):
        checkpoints.hf_t5_config(config)
    with pytest.raises(ValueError, match=r"cannot express"):
        checkpoints.export_hf_t5(_params(config), config)
    swish = dataclasses.replace(_config("tied"), mlp_activations=("swish", "linear"))
    assert checkpoints.hf_t5_config(swish).feed_forward_proj == "gated-silu"


def test_params_that_do_not_fit_the_config_name_the_parameter():
    config = _config("untied")
    params = _params(config)
    del params["decoder"]["logits_dense"]
    with pytest.raises(CheckpointError, match=r"decoder/logits_dense/kernel"):
        checkpoints.export_hf_t5(params, config)
    params = _params(config)
    with pytest.raises(CheckpointError, match=r"logits_dense.*not expected"):
        checkpoints.export_hf_t5(params, dataclasses.replace(config, logits_via_embedding=True))


def test_checkpoints_module_imports_neither_torch_nor_transformers():
    code = (
        "import sys, specdec_core.checkpoints; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
