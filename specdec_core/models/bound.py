"""A model with its params bound: what decoding loops and workers hold.

``BoundModel`` gives every family one face: ``forward`` (the model contract's
``(cache, tokens) -> (logits, cache)``) and ``new_cache`` (an empty cache for a batch,
running the encoder once for encoder-decoder models). ``load_model`` builds one from
a family name, a config and a T5X checkpoint (or a seeded random init, for tests and
benchmarks); what each family does is described once in
:mod:`specdec_core.models.families`.

A ``BoundModel`` compares and hashes by identity, and so does its ``forward``: the
compiled steps of :mod:`specdec_core.decoding` are cached per model object, so keep one
``BoundModel`` per model for the life of a job.
"""

from __future__ import annotations

import dataclasses

import jax

from specdec_core.models import families
from specdec_core.models.api import BoundModel

__all__ = ["BoundModel", "bind", "load_model", "on_mesh"]


def bind(name: str, family: str, config, params) -> BoundModel:
    """Binds ``params`` to the family's forward and cache constructor."""
    return families.get(family).bind(name, config, params)


def load_model(
    name: str, family: str, config, *, checkpoint: str | None = None, init_seed: int = 0
) -> BoundModel:
    """Reads a T5X checkpoint into the family's param tree (checked against the config's
    shapes), or initialises random params from ``init_seed`` when ``checkpoint`` is None.

    Family ``"copy"`` is the copy draft (:mod:`specdec_core.models.prompt_lookup`): its
    config is a ``PromptLookupConfig``, whose backoff draft (if any) is loaded here too."""
    return families.get(family).load(name, config, checkpoint=checkpoint, init_seed=init_seed)


def on_mesh(model: BoundModel, mesh: jax.sharding.Mesh) -> BoundModel:
    """``model`` with its params sharded over ``mesh`` and every new cache placed on it,
    per :mod:`specdec_core.sharding`'s rules (heads, MLP units, vocabulary over
    ``model``; rows over ``data``). Same function, same tokens: only where the arrays
    live changes. Families with checkpoint params only."""
    from specdec_core import sharding

    family = families.get(model.family)
    if family.weights != "checkpoint":
        raise ValueError(
            f"model {model.name!r} (family {model.family!r}) has no params to shard: "
            "a mesh is for models with checkpoint params"
        )
    sharded = bind(
        model.name, model.family, model.config, sharding.shard_params(model.params, mesh)
    )

    def new_cache(encoder_tokens, batch_size: int, max_len: int):
        return sharding.shard_cache(sharded.new_cache(encoder_tokens, batch_size, max_len), mesh)

    return dataclasses.replace(sharded, new_cache=new_cache)
