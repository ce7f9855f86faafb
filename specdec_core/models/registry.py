"""The one registry of named model presets.

``get_config(name)`` returns a frozen config (``t5.T5Config`` or
``decoder.DecoderConfig``); ``param_count(name)`` counts the parameters its
``init_params`` would make, from shapes alone (no memory, even for 137B). Unknown names
raise ``ValueError`` listing the known ones.

T5 1.1 (encoder-decoder, gated-GELU, untied ``logits_dense``, vocab 32128), values of
T5X's ``t5x/examples/t5/t5_1_1/{small,base,large,xl,xxl}.gin``; T5X runs them with
``dtype='bfloat16'``, the presets here default to float32 (the one-machine default is
CPU) — pass ``dtype="bfloat16"`` to ``get_config``:

=============  =====  =====  ==  ======  ===========  ==========
name           emb    heads  D   mlp     enc + dec    params
=============  =====  =====  ==  ======  ===========  ==========
t5_1_1_small     512      6  64    1024   8 + 8          76.96M
t5_1_1_base      768     12  64    2048  12 + 12        247.58M
t5_1_1_large    1024     16  64    2816  24 + 24        783.15M
t5_1_1_xl       2048     32  64    5120  24 + 24          2.85B
t5_1_1_xxl      4096     64  64   10240  24 + 24         11.14B
=============  =====  =====  ==  ======  ===========  ==========

GPT-like (``variant="gpt"``: GPT-2 blocks, tied embedding, 1024 learned positions,
vocab 32000 — a SentencePiece vocabulary of LM1B's size; the paper gives only the
totals 97M and 6M). Per layer a GPT-2 block has 12·E² + 13·E params; the embeddings
add (32000 + 1024)·E:

- ``gpt_97m``: E=768, 12 heads × 64, mlp 3072, 10 layers → 96.24M
  (GPT-2 small's width; 10 rather than 12 layers because the 32k vocabulary is
  smaller than GPT-2's 50k, 24.6M embedding + 70.9M blocks ≈ 97M).
- ``gpt_6m``: E=128, 4 heads × 32, mlp 512, 8 layers → 5.81M (the shared 32k
  vocabulary alone costs 4.1M at E=128, leaving ~1.6M for 8 thin blocks).

LaMDA-style (``variant="lamda"``: RMS norm, gated-GELU with mlp = 8·E, shared T5
relative position bias, tied embedding, vocab 32000). ``lamda_137b`` is the LaMDA
paper's model (64 layers, d_model 8192, 128 heads × 128, d_ff 65536); for the drafts
the paper gives only their totals, so they keep 137B's d_ff = 8·d_model ratio with
64-wide heads (heads · 64 = d_model), widths and depths chosen to land near the name:

==============  =====  ============  =====  ======  =========
name            E      heads × D     mlp    layers  params
==============  =====  ============  =====  ======  =========
lamda_100m        512  8 × 64         4096      12    104.48M
lamda_2b         2560  40 × 64       20480      10      1.92B
lamda_8b         4096  64 × 64       32768      16      7.65B
lamda_137b       8192  128 × 128     65536      64    137.70B
==============  =====  ============  =====  ======  =========

Tiny test configs: ``t5_tiny_test`` is T5X's ``t5_1_1/tiny.gin`` (the shape of
``../shared/testdata/t5x_tiny``: vocab 32128, emb 8, 4 heads × 3, 2 + 2 layers, mlp 16);
``gpt_tiny_test`` and ``lamda_tiny_test`` share a 128-token vocabulary so either can
draft for the other or for an n-gram model of the same vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax

from specdec_core.models import families


@dataclasses.dataclass(frozen=True)
class Preset:
    family: str  # "t5" | "decoder": the family (models.families) of its config and init_params
    fields: Mapping[str, Any]  # config fields
    nominal_params: float  # the size the name promises (tests hold the count near it)


def _t5(nominal: float, **fields) -> Preset:
    return Preset(
        "t5",
        {
            "vocab_size": 32128,
            "mlp_activations": ("gelu", "linear"),
            "logits_via_embedding": False,
            **fields,
        },
        nominal,
    )


def _gpt(nominal: float, **fields) -> Preset:
    return Preset(
        "decoder", {"variant": "gpt", "vocab_size": 32000, "max_len": 1024, **fields}, nominal
    )


def _lamda(
    nominal: float, *, emb_dim: int, num_heads: int, head_dim: int = 64, num_layers: int
) -> Preset:
    return Preset(
        "decoder",
        {
            "variant": "lamda",
            "vocab_size": 32000,
            "emb_dim": emb_dim,
            "num_heads": num_heads,
            "head_dim": head_dim,
            "mlp_dim": 8 * emb_dim,
            "num_layers": num_layers,
        },
        nominal,
    )


def _t5_sized(nominal: float, *, emb_dim, num_heads, mlp_dim, num_layers) -> Preset:
    return _t5(
        nominal,
        emb_dim=emb_dim,
        num_heads=num_heads,
        head_dim=64,
        mlp_dim=mlp_dim,
        num_encoder_layers=num_layers,
        num_decoder_layers=num_layers,
    )


def _tiny_decoder(variant: str, **extra) -> Preset:
    """A 2-layer, 32-wide decoder of ``variant`` over 128 tokens (tests)."""
    config = {"variant": variant, "vocab_size": 128, "emb_dim": 32, "num_heads": 4}
    config |= {"head_dim": 8, "mlp_dim": 64, "num_layers": 2, **extra}
    return Preset("decoder", config, 0.0)


PRESETS: dict[str, Preset] = {
    # T5 1.1, T5X gin values; nominal sizes as T5 1.1's release names them
    "t5_1_1_small": _t5_sized(77e6, emb_dim=512, num_heads=6, mlp_dim=1024, num_layers=8),
    "t5_1_1_base": _t5_sized(250e6, emb_dim=768, num_heads=12, mlp_dim=2048, num_layers=12),
    "t5_1_1_large": _t5_sized(780e6, emb_dim=1024, num_heads=16, mlp_dim=2816, num_layers=24),
    "t5_1_1_xl": _t5_sized(2.85e9, emb_dim=2048, num_heads=32, mlp_dim=5120, num_layers=24),
    "t5_1_1_xxl": _t5_sized(11e9, emb_dim=4096, num_heads=64, mlp_dim=10240, num_layers=24),
    # the paper's GPT-like pair on LM1B
    "gpt_97m": _gpt(97e6, emb_dim=768, num_heads=12, head_dim=64, mlp_dim=3072, num_layers=10),
    "gpt_6m": _gpt(6e6, emb_dim=128, num_heads=4, head_dim=32, mlp_dim=512, num_layers=8),
    # the paper's LaMDA target and drafts
    "lamda_100m": _lamda(100e6, emb_dim=512, num_heads=8, num_layers=12),
    "lamda_2b": _lamda(2e9, emb_dim=2560, num_heads=40, num_layers=10),
    "lamda_8b": _lamda(8e9, emb_dim=4096, num_heads=64, num_layers=16),
    "lamda_137b": _lamda(137e9, emb_dim=8192, num_heads=128, head_dim=128, num_layers=64),
    # tiny shapes for tests
    "t5_tiny_test": _t5(
        0.0,
        emb_dim=8,
        num_heads=4,
        head_dim=3,
        mlp_dim=16,
        num_encoder_layers=2,
        num_decoder_layers=2,
    ),
    "gpt_tiny_test": _tiny_decoder("gpt", max_len=128),
    "lamda_tiny_test": _tiny_decoder("lamda"),
}


def names() -> list[str]:
    """All preset names, sorted."""
    return sorted(PRESETS)


def _preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(names())}")
    return PRESETS[name]


def get_config(name: str, **overrides):
    """The frozen config of preset ``name``, with ``overrides`` (e.g. ``dtype="bfloat16"``).

    Raises ValueError for an unknown name (listing the known ones) or an override that
    is not a field of the config.
    """
    preset = _preset(name)
    config_class = families.get(preset.family).config_class
    known_fields = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(overrides) - known_fields)
    if unknown:
        raise ValueError(
            f"unknown field(s) {unknown} for preset {name!r} "
            f"({config_class.__name__}); fields: {sorted(known_fields)}"
        )
    return config_class(**{**preset.fields, **overrides})


def count_params(init_params, config) -> int:
    """Parameters that ``init_params(config, key)`` makes, from shapes alone (no memory)."""
    shapes = jax.eval_shape(functools.partial(init_params, config), jax.random.key(0))
    return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))


@functools.cache
def param_count(name: str) -> int:
    """Exact parameter count of preset ``name``."""
    return count_params(families.get(_preset(name).family).init_params, get_config(name))


def nominal_param_count(name: str) -> float:
    """The size the preset's name promises (0.0 for test configs)."""
    return _preset(name).nominal_params
