"""The grid's models: neural models resolved by :func:`pipelines.model_resolver.resolve_model_entry`
and loaded as :class:`~specdec_core.models.bound.BoundModel`, and the study's own
``unigram`` / ``bigram`` drafts, fit on the dataset's training split."""

from __future__ import annotations

import dataclasses
from typing import Any, NoReturn

from pipelines import model_resolver
from pipelines.configs import ConfigError
from pipelines.study.dataset import DatasetConfig, ngram_sequences
from specdec_core.models import families, ngram
from workers.spec import check_draft_target

NGRAM_DRAFTS = families.with_weights("fit")  # ("unigram", "bigram"): fit on the dataset


class MissingCheckpoint(ConfigError):
    """A model has no weights to load (an optional entry is skipped, others fail)."""


_SPEC_FIELDS = ("name", "family", "config", "checkpoint", "init_seed")  # a ModelRef's, as resolved


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRef:
    """A grid's model, resolved (files found) but not loaded."""

    name: str  # shown in tables and run names
    family: str  # a name in specdec_core.models.families: "decoder" | "t5" | "unigram" | ...
    config: Any = None  # DecoderConfig | T5Config; None for n-grams
    checkpoint: str | None = None  # T5X step folder; None: n-gram or random init (tests)
    init_seed: int = 0
    source: str = ""  # config file, "preset:NAME" or "" (n-grams: fit on the training split)

    @property
    def is_ngram(self) -> bool:
        return self.family in NGRAM_DRAFTS

    @classmethod
    def from_resolved(cls, resolved: model_resolver.ResolvedModel) -> ModelRef:
        """The :data:`_SPEC_FIELDS` of the resolved model's spec, and its source."""
        taken = {name: getattr(resolved.spec, name) for name in _SPEC_FIELDS}
        return cls(**taken, source=resolved.source)


def fail(file: str, where: str, message: str, kind: type = ConfigError) -> NoReturn:
    """Raises ``kind`` naming the grid file and the place in it."""
    raise kind(f"{file}: {where}: {message}")


def parse_model_ref(
    value: Any, *, where: str, file: str, draft: bool, vocab_size: int | None = None
) -> ModelRef:
    """One grid model reference (the package docstring) -> ModelRef; ``vocab_size``: the
    target's, for a copy draft."""
    if isinstance(value, str) and value in NGRAM_DRAFTS:
        if not draft:
            fail(file, where, f"{value!r} can only be a draft")
        return ModelRef(name=value, family=value)
    try:
        resolved = model_resolver.resolve_model_entry(
            value, where=where, also=NGRAM_DRAFTS, vocab_size=vocab_size
        )
    except model_resolver.MissingCheckpointError as error:
        raise MissingCheckpoint(f"{file}: {error}") from error
    except model_resolver.ModelResolutionError as error:
        raise ConfigError(f"{file}: {error}") from error
    return ModelRef.from_resolved(resolved)


def check_pair(target: ModelRef, draft: ModelRef, *, where: str, file: str) -> None:
    """A neural draft has the target's family and vocabulary size, a copy draft an
    encoder-decoder target (n-grams take the target's vocabulary when they are fit)."""
    if draft.is_ngram:
        return
    family = families.get(draft.family)
    if family.weights == "backoff":  # a copy draft: reads the target's encoder tokens
        if not families.get(target.family).is_encoder_decoder:
            fail(file, where, f"the copy draft {draft.name!r} needs an encoder-decoder target")
        if not family.serves_encoder_decoder(draft.config):
            fail(file, where, f"the copy draft {draft.name!r} backs off to a decoder-only model")
    elif draft.family != target.family:
        fail(file, where, f"draft {draft.name!r} is {draft.family}, target is {target.family}")
    if draft.config.vocab_size != target.config.vocab_size:
        fail(
            file,
            where,
            f"draft {draft.name!r} has vocab_size {draft.config.vocab_size}, "
            f"target {target.name!r} has {target.config.vocab_size}",
        )
    try:
        check_draft_target(target.name, draft.name, draft.config)
    except ValueError as error:
        fail(file, where, str(error))


NGramConfig = ngram.NGramConfig  # what a bound n-gram draft's ``config`` says about it


def ngram_model(name: str, params):
    """A :class:`~specdec_core.models.bound.BoundModel` over n-gram params
    (``log_probs`` [V] or [V, V]); its cache ignores encoder tokens."""
    config = NGramConfig.of(params)
    return families.get(config.kind).bind(name, config, params)


def _fit_ngram(kind: str, vocab_size: int, dataset: DatasetConfig, side: str):
    fit = ngram.fit_unigram if kind == "unigram" else ngram.fit_bigram
    sequences = ngram_sequences(dataset, side=side)
    return ngram_model(kind, fit(sequences, vocab_size, k=dataset.ngram_smoothing))


_MODELS: dict[Any, Any] = {}  # this process's loaded models, by what defines them


def load_study_model(ref: ModelRef, *, target: ModelRef, dataset: DatasetConfig):
    """Loads (once per process) a neural model or fits an n-gram draft for ``target``:
    a BoundModel, the same object for the same model (compiled steps are cached per
    model)."""
    if ref.is_ngram:
        # fit on the language the target writes: its decoder's (German for En->De T5)
        side = "german" if families.get(target.family).is_encoder_decoder else "english"
        key = (ref.family, target.config.vocab_size, dataset, side)
        if key not in _MODELS:
            _MODELS[key] = _fit_ngram(ref.family, target.config.vocab_size, dataset, side)
    else:
        from specdec_core.models.bound import load_model

        key = ref
        if key not in _MODELS:
            _MODELS[key] = load_model(
                ref.name, ref.family, ref.config, checkpoint=ref.checkpoint, init_seed=ref.init_seed
            )
    return _MODELS[key]
