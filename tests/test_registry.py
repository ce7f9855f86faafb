"""The preset registry: names, shapes, parameter counts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from specdec_core.models import decoder, registry, t5

NAMED = [n for n in registry.names() if not n.endswith("_tiny_test")]


def test_names_are_the_documented_presets():
    assert registry.names() == sorted(
        [
            "t5_1_1_small",
            "t5_1_1_base",
            "t5_1_1_large",
            "t5_1_1_xl",
            "t5_1_1_xxl",
            "gpt_97m",
            "gpt_6m",
            "lamda_100m",
            "lamda_2b",
            "lamda_8b",
            "lamda_137b",
            "t5_tiny_test",
            "gpt_tiny_test",
            "lamda_tiny_test",
        ]
    )


def test_unknown_name_lists_known_presets():
    with pytest.raises(ValueError, match="unknown model preset 'gpt_2'") as error:
        registry.get_config("gpt_2")
    assert all(name in str(error.value) for name in registry.names())
    with pytest.raises(ValueError, match="known presets: gpt_6m, gpt_97m"):
        registry.param_count("nope")


@pytest.mark.parametrize("name", NAMED)
def test_param_count_is_near_the_name(name):
    count, nominal = registry.param_count(name), registry.nominal_param_count(name)
    assert abs(count / nominal - 1) <= 0.05, f"{name}: {count:,} params vs nominal {nominal:,.0f}"


def test_exact_param_counts():
    # GPT-2 block: 12·E² + 13·E; embeddings (32000 + 1024)·E; final LayerNorm 2·E
    assert registry.param_count("gpt_97m") == 10 * (12 * 768**2 + 13 * 768) + 33024 * 768 + 1536
    assert registry.param_count("gpt_6m") == 8 * (12 * 128**2 + 13 * 128) + 33024 * 128 + 256
    # LaMDA 137B: 64 × (attention 4·8192·16384 + gated MLP 3·8192·65536 + 2 norms)
    #             + embedding 32000·8192 + relpos 128·32 + final norm
    layer = 4 * 8192 * 16384 + 3 * 8192 * 65536 + 2 * 8192
    assert registry.param_count("lamda_137b") == 64 * layer + 32000 * 8192 + 128 * 32 + 8192
    assert registry.param_count("t5_1_1_small") == 76_961_152
    assert registry.param_count("t5_1_1_xxl") == 11_135_332_352


@pytest.mark.parametrize(
    ("name", "emb", "heads", "layers", "mlp"),
    [
        ("t5_1_1_small", 512, 6, 8, 1024),
        ("t5_1_1_base", 768, 12, 12, 2048),
        ("t5_1_1_large", 1024, 16, 24, 2816),
        ("t5_1_1_xl", 2048, 32, 24, 5120),
        ("t5_1_1_xxl", 4096, 64, 24, 10240),
    ],
)
def test_t5_presets_follow_t5x_gin(name, emb, heads, layers, mlp):
    config = registry.get_config(name)
    assert isinstance(config, t5.T5Config)
    assert (config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim) == (
        emb,
        heads,
        64,
        mlp,
    )
    assert config.num_encoder_layers == config.num_decoder_layers == layers
    assert config.vocab_size == 32128 and config.mlp_activations == ("gelu", "linear")
    assert not config.logits_via_embedding


def test_t5_tiny_test_is_the_shared_t5x_tiny_shape():
    config = registry.get_config("t5_tiny_test")
    assert (config.vocab_size, config.emb_dim, config.num_heads, config.head_dim) == (
        32128,
        8,
        4,
        3,
    )
    assert (config.num_encoder_layers, config.num_decoder_layers, config.mlp_dim) == (2, 2, 16)


def test_lamda_137b_is_the_paper_shape():
    config = registry.get_config("lamda_137b")
    assert isinstance(config, decoder.DecoderConfig) and config.variant == "lamda"
    assert (
        config.num_layers,
        config.emb_dim,
        config.num_heads,
        config.head_dim,
        config.mlp_dim,
        config.vocab_size,
    ) == (64, 8192, 128, 128, 65536, 32000)


def test_overrides_and_unknown_fields():
    assert registry.get_config("gpt_6m", dtype="bfloat16").dtype == "bfloat16"
    assert registry.get_config("t5_1_1_small", dtype="bfloat16").dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['d_model'\] for preset 'gpt_6m'"):
        registry.get_config("gpt_6m", d_model=64)


@pytest.mark.parametrize("name", ["gpt_tiny_test", "lamda_tiny_test"])
def test_tiny_decoder_presets_run(name):
    config = registry.get_config(name)
    params = decoder.init_params(config, jax.random.key(0))
    logits = decoder.score(config, params, jnp.zeros((2, 5), jnp.int32))
    assert logits.shape == (2, 5, 128) and bool(jnp.isfinite(logits).all())
