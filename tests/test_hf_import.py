"""HuggingFace import: a tiny random T5 1.1 made with transformers gives the same logits."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from specdec_core import checkpoints
from specdec_core.checkpoints import CheckpointError
from specdec_core.models import decoder, t5

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _tiny_hf_t5(*, seed: int = 0):
    """T5 1.1 (gated-gelu, untied lm_head) with random weights, float32, eval mode."""
    torch.manual_seed(seed)
    config = transformers.T5Config(
        vocab_size=67,
        d_model=16,
        d_kv=4,
        num_heads=3,
        d_ff=24,
        num_layers=2,
        num_decoder_layers=3,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,  # in transformers 5.x: no decoder output scaling
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = transformers.T5ForConditionalGeneration(config)
    # transformers 5.x ties lm_head to `shared` in every T5; T5 1.1 needs its own.
    model.lm_head = torch.nn.Linear(config.d_model, config.vocab_size, bias=False)
    with torch.no_grad():
        for param in model.parameters():  # HF's init leaves small values; widen them
            param.normal_(0.0, 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def hf_model():
    return _tiny_hf_t5()


def _hf_logits(model, encoder_tokens: np.ndarray, decoder_tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(encoder_tokens),
            attention_mask=torch.as_tensor(encoder_tokens > 0).long(),
            decoder_input_ids=torch.as_tensor(decoder_tokens),
        )
    return out.logits.numpy()


def test_imported_t5_reproduces_hf_logits(hf_model):
    config = checkpoints.t5_config_from_hf(hf_model.config)
    assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 3)
    assert config.mlp_activations == ("gelu", "linear")
    params = checkpoints.import_hf_t5(hf_model.state_dict())
    like = jax.eval_shape(lambda: t5.init_params(config, jax.random.key(0)))
    checkpoints.check_params(params, like)
    assert not np.shares_memory(
        params["decoder"]["logits_dense"]["kernel"], params["token_embedder"]["embedding"]
    )

    rng = np.random.default_rng(0)
    encoder_tokens = rng.integers(1, 67, size=(2, 9))
    encoder_tokens[1, 5:] = 0  # padding
    decoder_tokens = rng.integers(1, 67, size=(2, 6))
    decoder_tokens[:, 0] = 0
    want = _hf_logits(hf_model, encoder_tokens, decoder_tokens)
    got = t5.score(config, params, encoder_tokens, decoder_tokens, np.ones_like(decoder_tokens))
    assert np.abs(want).max() > 1.0  # a meaningful scale for the 1e-4 tolerance
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)
    # the cached path too: prefill 2 positions, then one block of 4
    cache = t5.init_cache(config, params, encoder_tokens, max_decode_len=8)
    first, cache = t5.forward(config, params, cache, decoder_tokens[:, :2])
    rest, cache = t5.forward(config, params, cache, decoder_tokens[:, 2:])
    np.testing.assert_allclose(np.concatenate([first, rest], 1), want, atol=1e-4, rtol=1e-4)


def test_import_from_safetensors_file(tmp_path, hf_model):
    hf_model.save_pretrained(tmp_path)
    from_file = checkpoints.import_hf_t5(tmp_path)
    from_dict = checkpoints.import_hf_t5(hf_model.state_dict())
    for got, want in zip(jax.tree.leaves(from_file), jax.tree.leaves(from_dict), strict=True):
        np.testing.assert_array_equal(got, want)


def test_missing_hf_tensor_names_it(hf_model):
    state = dict(hf_model.state_dict())
    del state["decoder.block.1.layer.1.EncDecAttention.v.weight"]
    with pytest.raises(CheckpointError, match=r"decoder\.block\.1\.layer\.1\.EncDecAttention\.v"):
        checkpoints.import_hf_t5(state)
    state = dict(hf_model.state_dict())
    state["encoder.block.0.layer.0.SelfAttention.extra.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match=r"SelfAttention\.extra\.weight.*not mapped"):
        checkpoints.import_hf_t5(state)


def _tiny_hf_gpt2(*, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=53, n_positions=16, n_embd=12, n_layer=2, n_head=3, n_inner=20,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for param in model.parameters():  # nonzero biases and LayerNorm params too
            param.normal_(0.0, 0.3)
    return model.eval()


def test_imported_gpt2_reproduces_hf_logits(tmp_path):
    model = _tiny_hf_gpt2()
    config = checkpoints.gpt2_config_from_hf(model.config)
    assert (config.head_dim, config.mlp_dim, config.max_len) == (4, 20, 16)
    params = checkpoints.import_hf_gpt2(model.state_dict())
    like = jax.eval_shape(lambda: decoder.init_params(config, jax.random.key(0)))
    checkpoints.check_params(params, like)
    tokens = np.random.default_rng(1).integers(0, 53, size=(2, 9))
    with torch.no_grad():
        want = model(input_ids=torch.as_tensor(tokens)).logits.numpy()
    got = decoder.score(config, params, tokens)
    assert np.abs(want).max() > 0.5
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-4, rtol=1e-4)
    model.save_pretrained(tmp_path)
    from_file = checkpoints.import_hf_gpt2(tmp_path)
    for a, b in zip(jax.tree.leaves(from_file), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)
