"""A model with its params bound: what decoding loops and workers hold.

``BoundModel`` gives every family one face: ``forward`` (the model contract's
``(cache, tokens) -> (logits, cache)``) and ``new_cache`` (an empty cache for a batch,
running the encoder once for encoder-decoder models). ``load_model`` builds one from
a family name, a config and a T5X checkpoint (or a seeded random init, for tests and
benchmarks).

A ``BoundModel`` compares and hashes by identity, and so does its ``forward``: the
compiled steps of :mod:`specdec_core.decoding` are cached per model object, so keep one
``BoundModel`` per model for the life of a job.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_core.models.api import Forward

FAMILIES = ("t5", "decoder")


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class BoundModel:
    name: str
    family: str  # one of FAMILIES
    config: Any  # T5Config | DecoderConfig
    params: Any
    forward: Forward  # (cache, tokens [B, K]) -> (logits [B, K, V], cache)
    # (encoder_tokens [B, S] int32 or None, batch_size, max_len) -> empty cache
    new_cache: Callable[[Any, int, int], Any]

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def is_encoder_decoder(self) -> bool:
        return self.family == "t5"

    def param_count(self) -> int:
        return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(self.params))


def bind(name: str, family: str, config, params) -> BoundModel:
    """Binds ``params`` to the family's forward and cache constructor."""
    if family == "t5":
        from specdec_core.models import t5

        forward = functools.partial(t5.forward, config, params)
        init = jax.jit(
            lambda params, tokens, max_len: t5.init_cache(
                config, params, tokens, max_decode_len=max_len
            ),
            static_argnums=2,
        )

        def new_cache(encoder_tokens, batch_size, max_len):
            if encoder_tokens is None:
                raise ValueError(f"model {name!r} is encoder-decoder: it needs encoder tokens")
            return init(params, jnp.asarray(encoder_tokens, jnp.int32), max_len)

    elif family == "decoder":
        from specdec_core.models import decoder

        forward = functools.partial(decoder.forward, config, params)

        def new_cache(encoder_tokens, batch_size, max_len):
            if encoder_tokens is not None:
                raise ValueError(f"model {name!r} is decoder-only: it takes no encoder tokens")
            return decoder.init_cache(config, batch_size, max_len)

    else:
        raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
    return BoundModel(
        name=name,
        family=family,
        config=config,
        params=params,
        forward=forward,
        new_cache=new_cache,
    )


def load_model(
    name: str, family: str, config, *, checkpoint: str | None = None, init_seed: int = 0
) -> BoundModel:
    """Reads a T5X checkpoint into the family's param tree (checked against the config's
    shapes), or initialises random params from ``init_seed`` when ``checkpoint`` is None.

    Family ``"copy"`` is the copy draft (:mod:`specdec_core.models.prompt_lookup`): its
    config is a ``PromptLookupConfig``, whose backoff draft (if any) is loaded here too."""
    from specdec_core import checkpoints

    if family == "copy":  # the copy draft: no params of its own (its backoff loads inside)
        from specdec_core.models import prompt_lookup

        return prompt_lookup.load(name, config)
    module = _family_module(family)
    like = jax.eval_shape(functools.partial(module.init_params, config), jax.random.key(0))
    if checkpoint is None:
        params = module.init_params(config, jax.random.key(init_seed))
    else:
        loaded = checkpoints.load_t5x(checkpoint, like=like)
        params = jax.tree_util.tree_map(lambda x, ref: jnp.asarray(x, ref.dtype), loaded, like)
    return bind(name, family, config, params)


def _family_module(family: str):
    if family == "t5":
        from specdec_core.models import t5

        return t5
    if family == "decoder":
        from specdec_core.models import decoder

        return decoder
    raise ValueError(f"unknown model family {family!r}; known: {', '.join(FAMILIES)}")
