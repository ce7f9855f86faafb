"""Every model family, described once.

A :class:`Family` holds what the code above the models needs to know about one kind of
model, so no caller switches on a family's name:

- ``config_class``: the frozen config a model of the family is built from;
- ``weights``: where its params come from. ``"checkpoint"``: a T5X checkpoint of the
  tree ``init_params`` makes (or, for tests and benchmarks, ``init_params`` from a seed);
  ``"fit"``: fit from token counts (the n-gram tables: no checkpoint, no seeded init);
  ``"backoff"``: none of its own (the copy draft; its backoff model's, if it has one);
- ``forward(config, params)``: the model contract's forward with the params bound
  (:mod:`specdec_core.models.api`);
- ``new_cache(name, config, params)``: a function ``(encoder_tokens [B, S] or None,
  batch_size, max_len) -> empty cache``. An encoder-decoder family requires the encoder
  tokens (its encoder runs once here), a decoder-only one refuses them, the n-gram tables
  ignore them and the copy draft reads them as its source;
- ``is_encoder_decoder``: whether its cache is built by an encoder;
- ``serves_encoder_decoder(config)``: whether a model of this config can run in an
  encoder-decoder job (translate, summarize): T5 and the n-gram tables (which ignore the
  source) can, a decoder-only model cannot, and a copy draft can unless it backs off to
  a decoder-only model;
- ``max_positions(config)``: the longest sequence its position encoding covers (the
  gpt variant's learned positions), or None where only the cache's size limits it;
- ``shared_keys(config)`` / ``load_shared(config)``: the top-level params a model takes
  from another model's checkpoint (a T5 draft that reads its target's encoder:
  ``t5.SourceEncoder``). Its own checkpoint holds the rest; training freezes them and
  exports leave them out (:func:`own_params`).

``get(name)`` looks a family up and raises ValueError naming the unknown family and the
known ones; :func:`specdec_core.models.bound.bind` and ``load_model`` build a
:class:`~specdec_core.models.bound.BoundModel` through it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from specdec_core.models import api, decoder, layers, ngram, prompt_lookup, t5
from specdec_core.models.api import BoundModel, Forward

# (encoder_tokens [B, S] int32 or None, batch_size, max_len) -> an empty cache
NewCache = Callable[[Any, int, int], Any]
WEIGHTS = ("checkpoint", "fit", "backoff")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    """One model family (module docstring)."""

    name: str
    config_class: type
    is_encoder_decoder: bool
    weights: str  # one of WEIGHTS
    forward: Callable[[Any, Any], Forward]  # (config, params) -> forward(cache, tokens)
    new_cache: Callable[[str, Any, Any], NewCache]  # (model name, config, params) -> new_cache
    serves_encoder_decoder: Callable[[Any], bool]  # (config) -> runs in encoder-decoder jobs
    init_params: Callable[[Any, jax.Array], Any] | None = None  # (config, key); "checkpoint" only
    max_positions: Callable[[Any], int | None] = lambda config: None  # (config) -> limit
    # what the BoundModel holds as ``params`` given what ``bind`` received (default: the same)
    held_params: Callable[[Any], Any] = lambda params: params
    # (config) -> top-level param keys loaded from another model's checkpoint, and loader
    shared_keys: Callable[[Any], tuple[str, ...]] = lambda config: ()
    load_shared: Callable[[Any], dict] = lambda config: {}

    def __post_init__(self):
        if self.weights not in WEIGHTS:
            raise ValueError(f"family {self.name!r}: weights must be one of {WEIGHTS}")
        if (self.weights == "checkpoint") != (self.init_params is not None):
            raise ValueError(f"family {self.name!r}: init_params iff weights == 'checkpoint'")

    @property
    def has_checkpoint(self) -> bool:
        """Whether its params load from a T5X checkpoint (else they are fit, or none)."""
        return self.weights == "checkpoint"

    def bind(self, name: str, config, params) -> BoundModel:
        """``params`` bound to this family's forward and cache constructor. For the copy
        draft ``params`` is its backoff BoundModel (or None)."""
        # a decode's weights: as held, or prepared for the config's matmul_dtype
        served = params
        if self.weights == "checkpoint":
            served = layers.matmul_weights(params, config.matmul_dtype)
        new_cache = self.new_cache(name, config, served)  # may check the pair first
        return BoundModel(
            name=name,
            family=self.name,
            config=config,
            params=self.held_params(params),
            forward=self.forward(config, served),
            new_cache=new_cache,
            is_encoder_decoder=self.is_encoder_decoder,
        )

    def load(
        self, name: str, config, *, checkpoint: str | None = None, init_seed: int = 0
    ) -> BoundModel:
        """A BoundModel of ``config``: params read from the T5X ``checkpoint`` (checked
        against the config's shapes) or initialised from ``init_seed`` when it is None;
        a copy draft loads its backoff model the same way. The n-gram tables have nothing
        to load: fit them (``ngram.fit_*``) and :meth:`bind` the params."""
        if self.weights == "backoff":
            backoff = config.backoff
            model = None
            if backoff is not None:
                model = get(backoff.family).load(
                    backoff.name,
                    backoff.config,
                    checkpoint=backoff.checkpoint,
                    init_seed=backoff.init_seed,
                )
            return self.bind(name, config, model)
        if self.weights == "fit":
            raise ValueError(
                f"model family {self.name!r} has no checkpoint to load: its params are fit "
                f"from token counts (specdec_core.models.ngram.fit_{self.name}); bind them "
                "with specdec_core.models.bound.bind"
            )
        from specdec_core import checkpoints

        like = own_params(
            config, jax.eval_shape(functools.partial(self.init_params, config), jax.random.key(0))
        )
        if checkpoint is None:
            params = own_params(config, self.init_params(config, jax.random.key(init_seed)))
        else:
            loaded = checkpoints.load_t5x(checkpoint, like=like)
            params = jax.tree_util.tree_map(lambda x, ref: jnp.asarray(x, ref.dtype), loaded, like)
        return self.bind(name, config, {**params, **self.load_shared(config)})


def own_params(config, params) -> dict:
    """``params`` less what the model shares with another (``Family.shared_keys``): what
    its own checkpoint holds and training exports."""
    shared = of_config(config).shared_keys(config)
    return {key: value for key, value in params.items() if key not in shared}


# ------------------------------------------------------------------------------ t5


@functools.lru_cache(maxsize=16)
def _t5_cache_init(config: t5.T5Config):
    """The compiled encoder pass and cache set-up of ``config``'s models, one program for
    all of them (the params are an input)."""
    # the encoder runs at the tokens' width; the cache is padded to the source width
    return jax.jit(
        lambda params, tokens, max_len: t5.pad_source(
            t5.init_cache(config, params, tokens, max_decode_len=max_len),
            api.source_width(tokens.shape[1]),
        ),
        static_argnums=2,
    )


@functools.lru_cache(maxsize=16)
def _t5_source_states(config: t5.T5Config):
    """The compiled encoder pass of ``config`` alone, its output padded to the source
    width: what a reader of this encoder builds its cache from."""

    def states(params, tokens):
        encoded = t5.encode(config, params, tokens)
        extra = api.source_width(tokens.shape[1]) - tokens.shape[1]
        return jnp.pad(encoded, ((0, 0), (0, extra), (0, 0)))

    return jax.jit(states)


@functools.lru_cache(maxsize=16)
def _t5_reader_init(config: t5.T5Config):
    """The compiled cache set-up of a reader of another model's encoder, from that
    encoder's padded output and the tokens padded to the same width."""
    return jax.jit(
        lambda params, tokens, states, max_len: t5.init_cache(
            config, params, tokens, max_decode_len=max_len, source_states=states
        ),
        static_argnums=3,
    )


def _t5_new_cache(name: str, config: t5.T5Config, params) -> NewCache:
    """``new_cache(encoder_tokens, batch_size, max_len)``; a reader of another model's
    encoder also takes ``source_cache=``, that model's cache for the same tokens, and
    reads its encoder output instead of running the encoder again (the same bits:
    both come from the same encoder program, ``tests/test_target_encoder_draft.py``)."""
    if config.source_encoder is not None:
        return _t5_reader_new_cache(name, config, params)
    init = _t5_cache_init(config)  # a T5Config is frozen, its fields hashable

    def new_cache(encoder_tokens, batch_size, max_len):
        if encoder_tokens is None:
            raise ValueError(f"model {name!r} is encoder-decoder: it needs encoder tokens")
        return init(params, jnp.asarray(encoder_tokens, jnp.int32), max_len)

    return new_cache


def _t5_reader_new_cache(name: str, config: t5.T5Config, params) -> NewCache:
    source_states = _t5_source_states(config.source_encoder.config)
    init = _t5_reader_init(config)

    def new_cache(encoder_tokens, batch_size, max_len, *, source_cache=None):
        if encoder_tokens is None:
            raise ValueError(f"model {name!r} is encoder-decoder: it needs encoder tokens")
        tokens = jnp.asarray(encoder_tokens, jnp.int32)
        width = api.source_width(tokens.shape[1])
        if source_cache is None:
            states = source_states(params[t5.SOURCE], tokens)
        else:
            states = source_cache.encoded
        if states.shape[:2] != (tokens.shape[0], width):
            raise ValueError(
                f"model {name!r}: the source cache holds {states.shape[:2]} encoded "
                f"positions, these tokens need {(tokens.shape[0], width)}"
            )
        padded = jnp.pad(tokens, ((0, 0), (0, width - tokens.shape[1])))
        return init(params, padded, states, max_len)

    return new_cache


def _t5_shared_keys(config: t5.T5Config) -> tuple[str, ...]:
    return () if config.source_encoder is None else (t5.SOURCE,)


@functools.lru_cache(maxsize=4)
def _source_encoder_params(source: t5.SourceEncoder) -> dict:
    """The embedder and encoder of ``source``'s checkpoint (or seeded init), read once per
    process however many readers load them."""
    from specdec_core import checkpoints

    init = functools.partial(t5.init_params, source.config)
    if source.checkpoint is None:
        return t5.source_params(init(jax.random.key(source.init_seed)))
    like = jax.eval_shape(init, jax.random.key(0))
    try:
        loaded = checkpoints.load_t5x(source.checkpoint, like=like)
    except (checkpoints.CheckpointError, OSError) as error:
        raise ValueError(
            f"cannot read {source.name!r}'s encoder from {source.checkpoint}: {error}"
        ) from error
    return t5.source_params(
        jax.tree_util.tree_map(lambda x, ref: jnp.asarray(x, ref.dtype), loaded, like)
    )


def _t5_load_shared(config: t5.T5Config) -> dict:
    if config.source_encoder is None:
        return {}
    return {t5.SOURCE: _source_encoder_params(config.source_encoder)}


@dataclasses.dataclass(frozen=True)
class _Configured:
    """``forward`` with its config bound, equal to any other binding of an equal config:
    the function of a forward's pytree, so two models of one config (another load, other
    weights) have one tree structure and share their compiled programs
    (decoding.program_cache)."""

    forward: Callable
    config: Any

    def __call__(self, *args):
        return self.forward(self.config, *args)


def _params_as_inputs(forward, config, params) -> Forward:
    """``forward`` bound to its config and params as a pytree (a ``jax.tree_util.Partial``):
    decoding.jit_over passes the params to compiled programs as inputs, not constants."""
    return jax.tree_util.Partial(_Configured(forward, config), params)


def _trained(name: str, module, config_class: type, **fields) -> Family:
    """A family of trained networks: weights from a checkpoint, ``module.init_params``
    for the shapes (and random init), ``module.forward`` taking the params as inputs."""
    return Family(
        name=name,
        config_class=config_class,
        weights="checkpoint",
        init_params=module.init_params,
        forward=functools.partial(_params_as_inputs, module.forward),
        **fields,
    )


T5 = _trained(
    "t5",
    t5,
    t5.T5Config,
    is_encoder_decoder=True,
    new_cache=_t5_new_cache,
    serves_encoder_decoder=lambda config: True,
    shared_keys=_t5_shared_keys,
    load_shared=_t5_load_shared,
)


# ------------------------------------------------------------------------- decoder


def _decoder_new_cache(name: str, config: decoder.DecoderConfig, params) -> NewCache:
    def new_cache(encoder_tokens, batch_size, max_len):
        if encoder_tokens is not None:
            raise ValueError(f"model {name!r} is decoder-only: it takes no encoder tokens")
        return decoder.init_cache(config, batch_size, max_len)

    return new_cache


DECODER = _trained(
    "decoder",
    decoder,
    decoder.DecoderConfig,
    is_encoder_decoder=False,
    new_cache=_decoder_new_cache,
    serves_encoder_decoder=lambda config: False,
    # gpt: learned absolute positions; lamda: relative position buckets, no limit
    max_positions=lambda config: config.max_len if config.variant == "gpt" else None,
)


# ------------------------------------------------------------------ n-gram tables


def _ngram_family(kind: str) -> Family:
    return Family(
        name=kind,
        config_class=ngram.NGramConfig,
        is_encoder_decoder=False,
        weights="fit",
        forward=lambda config, params: functools.partial(ngram.forward, params),
        # the tables condition on the decoder tokens alone: encoder tokens are ignored
        new_cache=lambda name, config, params: (
            lambda encoder_tokens, batch_size, max_len: ngram.init_cache(batch_size, max_len)
        ),
        serves_encoder_decoder=lambda config: True,
    )


UNIGRAM = _ngram_family("unigram")
BIGRAM = _ngram_family("bigram")


# ------------------------------------------------------------------ copy (prompt lookup)


def _copy_serves_encoder_decoder(config: prompt_lookup.PromptLookupConfig) -> bool:
    backoff = config.backoff
    return backoff is None or get(backoff.family).serves_encoder_decoder(backoff.config)


COPY = Family(
    name=prompt_lookup.FAMILY,
    config_class=prompt_lookup.PromptLookupConfig,
    is_encoder_decoder=False,
    weights="backoff",
    forward=prompt_lookup.bound_forward,
    new_cache=prompt_lookup.cache_constructor,
    serves_encoder_decoder=_copy_serves_encoder_decoder,
    held_params=lambda backoff: None if backoff is None else backoff.params,
)


# ------------------------------------------------------------------------ the registry

FAMILIES: dict[str, Family] = {f.name: f for f in (T5, DECODER, UNIGRAM, BIGRAM, COPY)}


def names() -> tuple[str, ...]:
    """Every family's name, in registration order."""
    return tuple(FAMILIES)


def get(name: str) -> Family:
    """The family called ``name``; ValueError naming it and the known families if none is."""
    family = FAMILIES.get(name)
    if family is None:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}")
    return family


def of_config(config) -> Family:
    """The family a config belongs to (an ``NGramConfig`` names its kind)."""
    if isinstance(config, ngram.NGramConfig):
        return get(config.kind)
    for family in FAMILIES.values():
        if type(config) is family.config_class:
            return family
    raise ValueError(
        f"{type(config).__name__} is the config of no model family; known: {', '.join(FAMILIES)}"
    )


def with_weights(weights: str) -> tuple[str, ...]:
    """Names of the families whose params come from ``weights`` (one of WEIGHTS)."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; known: {', '.join(WEIGHTS)}")
    return tuple(name for name, family in FAMILIES.items() if family.weights == weights)
