"""``specdec study``: acceptance-rate studies (the paper's Table 3) as a Beam job.

For every (target, draft, temperature) cell of a grid file (``configs/studies/*.yaml``)
the job streams prompts from a dataset, lets the target continue them, and measures
along the target's own trajectories:

- **β per position**: Σ_x min(p(x), q(x)) of the target's and the draft's *sampling*
  distributions (:func:`specdec_core.sampling.probs_from_logits`, the same temperature,
  top-k, top-p) at every generated position. Both models score the same prefixes in one
  teacher-forced ``forward`` over the whole trajectory (a fresh cache; no decoding).
- **α = E[β]**: the ratio estimator Σβ / #positions over all generated positions (each
  token weighs the same, as in the paper's Definition 3.2). Its confidence interval is a
  percentile bootstrap over *sequences* (prompts are the independent unit; positions of
  one sequence are correlated), ``theory.bootstrap_resamples`` resamples, level
  ``theory.confidence``.
- **Empirical acceptance** from actual speculative runs
  (:func:`specdec_core.decoding.speculative_generate`) at each γ of ``decode.gammas``:
  the acceptance rule runs one Bernoulli test per drafted position until the first
  rejection, so ``α̂ = accepted / tests`` with ``tests = accepted + rejections`` and
  ``rejections = iterations − iterations that accepted all γ`` (the maximum-likelihood
  α of the paper's model, where every test accepts with the same probability α). Each
  test accepts with probability β of its prefix, but the tested prefixes are not a
  uniform sample of the target's positions: after a rejection the next prefix ends in a
  recovered token, drawn from norm(max(0, p − q)) rather than from p, the bonus
  position after γ acceptances is never tested, and a row's last iteration may test up
  to γ − 1 positions past ``max_new_tokens``. So α̂ = α when β does not depend on the
  prefix (the paper's i.i.d. assumption) and differs by that assumption's error
  otherwise. A 4-token Markov chain of the tests, 1024 prompts: α = 0.536 [0.532,
  0.541], α̂ = 0.491 at γ=1, 0.531 at γ=3, 0.539 at γ=6. At T=0 the tested positions
  are a subset of the very trajectory α is measured on, so a pattern in β along it
  (β = 1, 0, 1, 0, ... gives α̂ = 1 at γ=1) shows up in full. α̂'s interval is the same
  bootstrap over sequences; a γ *agrees* with α when ``|α̂ − α| ≤ sqrt(h_α² + h_α̂²)``
  (h: the intervals' half-widths). Beside it: the measured tokens per iteration
  ((accepted + iterations) / iterations, the *mean accepted length* including the
  recovered/bonus token) against ``theory.expected_tokens(α, γ)``, and accepted per
  drafted token against its prediction (expected_tokens − 1) / γ.
- **Wall-time improvement** ``theory.walltime_improvement(α, γ, c)`` for γ = 1 ..
  ``theory.max_gamma`` and the optimal γ, for ``theory.cost_coefficient`` c: a number,
  or ``measured`` (median time of one draft step over one target step at k=1, the
  study's batch size, timed after a warm-up call). The "measured points" beside the
  predicted curve are the measured tokens per iteration / (γc + 1): the improvement
  the observed acceptance implies under the same cost model (wall-clock speedups of
  tiny models on a shared CPU measure dispatch overhead, not the model).

Drafts: another model (a model config, or a registry preset with a checkpoint), or
``unigram`` / ``bigram`` fit (``ngram.fit_*``, add-k smoothing ``dataset.ngram_smoothing``)
on token counts of the training split: the English side of the Ding corpus for
decoder-only targets, the German side (the decoder's language) for an En→De T5 target.

Grid file (every key is checked; unknown keys, a temperature < 0, a γ < 1, an unknown
model or a missing checkpoint fail before any work, naming the problem and the file)::

    name: table3_small           # parent MLflow run name (default: the file's stem)
    seed: 0                      # job seed (--seed overrides); with a prompt's id it
                                 # fixes every random draw of that prompt
    dataset: {...}               # DatasetConfig
    decode: {...}                # DecodeConfig
    theory: {...}                # TheoryConfig
    grid:
      - target: gpt_en_target    # model reference (below)
        drafts: [gpt_en_draft, bigram, unigram]
        label: GPT-like (Ding En)  # TASK column (default: the target's name)
        temperatures: [0, 1]     # optional; default decode.temperatures
        optional: false          # true: leave out (with a note) drafts without a checkpoint,
                                 # and the whole entry if the target has none

A model reference is a model config name (``configs/models/NAME.yaml``, checkpoint in
its export folder), a path to one, ``unigram``/``bigram`` (drafts only), or a mapping
``{preset: NAME, checkpoint: FOLDER, overrides: {field: value}, name: LABEL}`` for a
registry preset (``gpt_97m``, ``lamda_137b``, ...) with a T5X checkpoint of its tree.
``random_init: true`` (with ``init_seed``) runs untrained weights — a test-only key.
The same mapping with ``config: NAME`` instead of ``preset`` points at a model config.

Beam graph (in-process ``FnApiRunner``)::

    Create([dataset]) -> ReadPrompts (FlatMap: lines -> tokenized prompts, lazily)
      -> FanOut ((entry, temperature) key per prompt)
      -> GroupIntoBatches(decode.batch_size)
      -> Measure (target trajectories once, then β and speculative runs per draft)
      -> GroupByKey((entry, draft, temperature)) -> Summarize (α, CI, theory) -> JSON

MLflow (experiment ``acceptance-study``): one parent run per study with the results
table (``table3.json``, ``mlflow.log_table``), ``cells.json``, plots (``alpha_by_draft``,
``improvement_vs_gamma``; PNG when matplotlib is installed, CSV always) and the grid
file; one nested child run per cell with params and metrics (``alpha``,
``alpha_ci_low/high``, ``beta_by_position`` stepped by position,
``empirical_acceptance[_gamma_G]``, ``tokens_per_iteration_gamma_G``,
``predicted_improvement`` (stepped by γ, and at the optimum), ``optimal_gamma``, ``c``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import math
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import yaml

from pipelines import configs
from pipelines.configs import ConfigError

EXPERIMENT = "acceptance-study"
NGRAM_DRAFTS = ("unigram", "bigram")
ASCII_VOCAB = 128  # the "ascii" tokenizer: ids 0 pad, 1 eos, 2 unk, else the code point
T5_PREFIX = "translate English to German: "
T5_START_ID = 0  # T5's decoder start token (= pad)
T5_EOS_ID = 1
ENCODER_BUCKET = 16  # encoder inputs pad to a multiple of this (fewer compilations)
TOP_LEVEL_KEYS = ("name", "seed", "dataset", "decode", "theory", "grid")
ENTRY_KEYS = ("target", "drafts", "label", "temperatures", "optional")
REF_KEYS = ("preset", "config", "checkpoint", "overrides", "random_init", "init_seed", "name")


# ------------------------------------------------------------------------ the grid file


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    source: str = "ding"  # "ding": Ding splits (English side); "text": one prompt per line
    path: str = "assets/data/ding"  # ding: the splits folder; text: the prompts file
    split: str = "validation"  # ding: the prompts' split
    train_split: str = "train"  # ding: the split n-gram drafts are fit on
    train_path: str = ""  # text: n-gram training text, one sequence per line ("": none)
    tokenizer: str = "assets/spm/ende.model"  # SentencePiece model file, or "ascii"
    num_prompts: int = 64  # prompts read (the first that have prompt_tokens pieces)
    prompt_tokens: int = 4  # pieces of the sentence given to a decoder-only target
    bos_id: int | None = 0  # starts decoder-only prompts and n-gram sequences; null: none
    eos_id: int | None = 1  # ends generation and n-gram sequences; null: never stop
    ngram_smoothing: float = 1.0  # add-k of unigram/bigram drafts
    ngram_train_limit: int = 0  # training sequences for n-gram fits (0: all)

    def __post_init__(self):
        if self.source not in ("ding", "text"):
            raise ValueError(f"dataset.source must be 'ding' or 'text', got {self.source!r}")
        for key in ("num_prompts", "prompt_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"dataset.{key} must be >= 1, got {getattr(self, key)}")
        if self.ngram_smoothing < 0 or self.ngram_train_limit < 0:
            raise ValueError("dataset.ngram_smoothing and ngram_train_limit must be >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeConfig:
    temperatures: tuple[float, ...] = (0.0, 1.0)  # T of both models' sampling distributions
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    gammas: tuple[int, ...] = (1, 2, 3, 5)  # γ of the speculative runs
    max_new_tokens: int = 24  # trajectory length (positions measured per prompt, at most)
    batch_size: int = 16  # prompts per model call

    def __post_init__(self):
        for t in self.temperatures:
            if isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0:
                raise ValueError(f"temperature must be a number >= 0, got {t!r}")
        for g in self.gammas:
            if isinstance(g, bool) or not isinstance(g, int) or g < 1:
                raise ValueError(f"gamma must be an integer >= 1, got {g!r}")
        if not self.temperatures or not self.gammas:
            raise ValueError("decode.temperatures and decode.gammas must not be empty")
        if self.max_new_tokens < 1 or self.batch_size < 1:
            raise ValueError("decode.max_new_tokens and decode.batch_size must be >= 1")
        self.sampling(self.temperatures[0])  # top_k / top_p checks

    def sampling(self, temperature: float):
        from specdec_core.sampling import SamplingConfig

        return SamplingConfig(temperature=float(temperature), top_k=self.top_k, top_p=self.top_p)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TheoryConfig:
    cost_coefficient: Any = "measured"  # c: a number >= 0, or "measured" (timed step ratio)
    max_gamma: int = 16  # optimal γ is searched in 1..max_gamma (and plotted)
    confidence: float = 0.95  # level of the bootstrap intervals
    bootstrap_resamples: int = 1000

    def __post_init__(self):
        c = self.cost_coefficient
        if c != "measured" and (isinstance(c, bool) or not isinstance(c, int | float) or c < 0):
            raise ValueError(f"cost_coefficient must be a number >= 0 or 'measured', got {c!r}")
        if self.max_gamma < 1:
            raise ValueError(f"theory.max_gamma must be >= 1, got {self.max_gamma}")
        if not 0 < self.confidence < 1 or self.bootstrap_resamples < 1:
            raise ValueError("theory.confidence must be in (0, 1), bootstrap_resamples >= 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelRef:
    """A grid's model, resolved (files found) but not loaded."""

    name: str  # shown in tables and run names
    family: str  # "decoder" | "t5" | "unigram" | "bigram"
    config: Any = None  # DecoderConfig | T5Config; None for n-grams
    checkpoint: str | None = None  # T5X folder; None: n-gram or random init (tests)
    init_seed: int = 0
    source: str = ""  # config file, "preset:NAME" or "fit on <corpus>"

    @property
    def is_ngram(self) -> bool:
        return self.family in NGRAM_DRAFTS


@dataclasses.dataclass(frozen=True, kw_only=True)
class GridEntry:
    target: ModelRef
    drafts: tuple[ModelRef, ...]
    label: str  # TASK column
    temperatures: tuple[float, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyConfig:
    name: str
    seed: int
    dataset: DatasetConfig
    decode: DecodeConfig
    theory: TheoryConfig
    grid: tuple[GridEntry, ...]
    skipped: tuple[str, ...]  # optional entries and drafts left out (missing checkpoints)
    path: str  # the grid file


class MissingCheckpoint(ConfigError):
    """A model has no weights to load (an optional entry is skipped, others fail)."""


def _fail(file: str, where: str, message: str, kind: type = ConfigError) -> NoReturn:
    raise kind(f"{file}: {where}: {message}")


def _has_checkpoint(folder: pathlib.Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _latest_step(folder: pathlib.Path) -> pathlib.Path:
    """An export folder -> its newest ``checkpoint_<step>`` (so runs record the step)."""
    steps = [
        (int(child.name.split("_")[1]), child)
        for child in folder.glob("checkpoint_*")
        if child.is_dir() and child.name.split("_")[1].isdigit()
    ]
    return max(steps)[1] if steps else folder


def _preset_ref(raw: Mapping, *, where: str, file: str) -> ModelRef:
    """``{preset: NAME, checkpoint | random_init, overrides, init_seed, name}`` -> ModelRef."""
    from specdec_core.models import registry

    name = raw["preset"]
    if name not in registry.names():
        _fail(file, where, f"unknown preset {name!r}; presets: {', '.join(registry.names())}")
    try:
        config = registry.get_config(name, **dict(raw.get("overrides") or {}))
    except (TypeError, ValueError) as error:
        _fail(file, where, str(error))
    checkpoint = raw.get("checkpoint")
    if raw.get("random_init") and checkpoint:
        _fail(file, where, "give either checkpoint or random_init, not both")
    if not raw.get("random_init"):
        if not checkpoint:
            _fail(file, where, _no_checkpoint_message(name), MissingCheckpoint)
        folder = configs.resolve(checkpoint)
        if not folder.exists():
            _fail(file, where, f"checkpoint not found: {folder}", MissingCheckpoint)
        checkpoint = str(_latest_step(folder))
    return ModelRef(
        name=str(raw.get("name", name)),
        family=registry.PRESETS[name].family,
        config=config,
        checkpoint=checkpoint,
        init_seed=int(raw.get("init_seed", 0)),
        source=f"preset:{name}",
    )


def _no_checkpoint_message(preset: str) -> str:
    return (
        f"{preset!r} is a registry preset: it has an architecture but no weights. Provide a "
        f"T5X checkpoint of its param tree (specdec_core/models/decoder.py or t5.py; e.g. "
        f"from checkpoints.import_hf_gpt2 or pipelines.train) as "
        f"`{{preset: {preset}, checkpoint: <folder with checkpoint_<step>>}}`, or name a model "
        f"config (configs/models/*.yaml) whose export folder holds one"
    )


def _config_ref(ref: str, raw: Mapping, *, where: str, file: str) -> ModelRef:
    """A model config (name or path) -> ModelRef; its checkpoint is the export folder."""
    path = pathlib.Path(ref)
    if not ref.endswith((".yaml", ".yml")) and "/" not in ref:
        path = configs.REPO_ROOT / "configs" / "models" / f"{ref}.yaml"
    path = configs.resolve(path)
    if not path.is_file():
        _fail(file, where, f"model config not found: {path}")
    model_file = configs.load_model_config(path)
    random_init = bool(raw.get("random_init"))
    if not random_init and not _has_checkpoint(model_file.export_dir):
        message = (
            f"model {model_file.name!r} ({model_file.path}) has no checkpoint at "
            f"{model_file.export_dir}; train it (python -m pipelines.train --config "
            f"{model_file.path}) or copy a T5X checkpoint there"
        )
        _fail(file, where, message, MissingCheckpoint)
    return ModelRef(
        name=str(raw.get("name", model_file.name)),
        family=model_file.family,
        config=model_file.model,
        checkpoint=None if random_init else str(_latest_step(model_file.export_dir)),
        init_seed=int(raw.get("init_seed", 0)),
        source=model_file.path,
    )


def _config_names() -> list[str]:
    folder = configs.REPO_ROOT / "configs" / "models"
    return sorted(p.stem for p in folder.glob("*.yaml"))


def parse_model_ref(value: Any, *, where: str, file: str, draft: bool) -> ModelRef:
    """One grid model reference (see the module docstring) -> ModelRef."""
    from specdec_core.models import registry

    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(REF_KEYS))
        if unknown:
            _fail(file, where, f"unknown key {unknown[0]} (known: {', '.join(REF_KEYS)})")
        if ("preset" in value) == ("config" in value):
            _fail(file, where, "a model mapping needs exactly one of preset or config")
        if "preset" in value:
            return _preset_ref(value, where=where, file=file)
        return _config_ref(str(value["config"]), value, where=where, file=file)
    if not isinstance(value, str):
        _fail(file, where, f"a model is a name or a mapping, got {value!r}")
    if value in NGRAM_DRAFTS:
        if not draft:
            _fail(file, where, f"{value!r} can only be a draft")
        return ModelRef(name=value, family=value)
    if value.endswith((".yaml", ".yml")) or "/" in value or value in _config_names():
        return _config_ref(value, {}, where=where, file=file)
    if value in registry.names():
        _fail(file, where, _no_checkpoint_message(value), MissingCheckpoint)
    known = ", ".join([*_config_names(), *NGRAM_DRAFTS])
    _fail(
        file,
        where,
        f"unknown model {value!r}; model configs and drafts: {known}; "
        f"presets (as {{preset: NAME, checkpoint: ...}}): {', '.join(registry.names())}",
    )


def _check_pair(target: ModelRef, draft: ModelRef, *, where: str, file: str) -> None:
    if draft.is_ngram:
        return
    if draft.family != target.family:
        _fail(file, where, f"draft {draft.name!r} is {draft.family}, target is {target.family}")
    if draft.config.vocab_size != target.config.vocab_size:
        _fail(
            file,
            where,
            f"draft {draft.name!r} has vocab_size {draft.config.vocab_size}, "
            f"target {target.name!r} has {target.config.vocab_size}",
        )


def _parse_drafts(
    values: Sequence[Any], target: ModelRef, *, optional: bool, where: str, file: str
) -> tuple[list[ModelRef], list[str]]:
    """(drafts, notes): in an optional entry a draft without a checkpoint is left out."""
    drafts, notes = [], []
    for j, value in enumerate(values):
        draft_where = f"{where}.drafts[{j}]"
        try:
            drafts.append(parse_model_ref(value, where=draft_where, file=file, draft=True))
        except MissingCheckpoint as missing:
            if not optional:
                raise
            notes.append(f"left out: {missing}")
            continue
        _check_pair(target, drafts[-1], where=draft_where, file=file)
    if not drafts:
        _fail(file, where, "no draft has a checkpoint", MissingCheckpoint)
    return drafts, notes


def _parse_entry(
    raw: Any, index: int, *, decode: DecodeConfig, file: str
) -> tuple[GridEntry, list[str]]:
    """One ``grid`` item -> (entry, notes on optional drafts left out)."""
    where = f"grid[{index}]"
    if not isinstance(raw, Mapping):
        _fail(file, where, f"an entry is a mapping, got {raw!r}")
    unknown = sorted(set(raw) - set(ENTRY_KEYS))
    if unknown:
        _fail(file, where, f"unknown key {unknown[0]} (known: {', '.join(ENTRY_KEYS)})")
    if "target" not in raw or not raw.get("drafts"):
        _fail(file, where, "an entry needs a target and a non-empty list of drafts")
    target = parse_model_ref(raw["target"], where=f"{where}.target", file=file, draft=False)
    optional = bool(raw.get("optional", False))
    drafts, notes = _parse_drafts(raw["drafts"], target, optional=optional, where=where, file=file)
    temperatures = tuple(raw.get("temperatures") or decode.temperatures)
    try:
        dataclasses.replace(decode, temperatures=temperatures)
    except ValueError as error:
        _fail(file, f"{where}.temperatures", str(error))
    entry = GridEntry(
        target=target,
        drafts=tuple(drafts),
        label=str(raw.get("label", target.name)),
        temperatures=tuple(float(t) for t in temperatures),
    )
    return entry, notes


def load_study_config(path: str | pathlib.Path, *, seed: int | None = None) -> StudyConfig:
    """Parses and checks a grid file (models resolved, checkpoints found); no model loads."""
    path = configs.resolve(path)
    if not path.is_file():
        raise ConfigError(f"study config not found: {path}")
    file = str(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{file}: not valid YAML: {error}") from error
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{file}: top level must be a mapping")
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(f"{file}: unknown key {unknown[0]} (known: {', '.join(TOP_LEVEL_KEYS)})")
    if not raw.get("grid"):
        raise ConfigError(f"{file}: missing key grid (a list of target/drafts entries)")
    section = functools.partial(configs.build_dataclass, file=file)
    decode = section(DecodeConfig, raw.get("decode"), section="decode")
    entries, skipped = [], []
    for index, entry in enumerate(raw["grid"]):
        try:
            parsed, notes = _parse_entry(entry, index, decode=decode, file=file)
            entries.append(parsed)
            skipped += notes
        except MissingCheckpoint as missing:
            if not (isinstance(entry, Mapping) and entry.get("optional")):
                raise
            skipped.append(f"skipped optional grid[{index}]: {missing}")
    if not entries:
        raise ConfigError(f"{file}: no grid entry can run ({'; '.join(skipped)})")
    study = StudyConfig(
        name=str(raw.get("name", path.stem)),
        seed=int(raw.get("seed", 0) if seed is None else seed),
        dataset=section(DatasetConfig, raw.get("dataset"), section="dataset"),
        decode=decode,
        theory=section(TheoryConfig, raw.get("theory"), section="theory"),
        grid=tuple(entries),
        skipped=tuple(skipped),
        path=file,
    )
    check_study(study)
    return study


def check_study(study: StudyConfig) -> None:
    """Checks that need the dataset: tokenizer found, vocabularies fit, positions fit."""
    from specdec_core.models import decoder

    file, dataset = study.path, study.dataset
    tokenizer = load_tokenizer(dataset.tokenizer)
    longest = max(study.decode.gammas)
    for i, entry in enumerate(study.grid):
        target = entry.target
        if target.config.vocab_size < tokenizer.vocab_size:
            _fail(
                file,
                f"grid[{i}].target",
                f"vocab_size {target.config.vocab_size} < the "
                f"tokenizer's {tokenizer.vocab_size} ({dataset.tokenizer})",
            )
        needed = dataset.prompt_tokens + 1 + study.decode.max_new_tokens + longest + 2
        for ref in (target, *entry.drafts):
            if isinstance(ref.config, decoder.DecoderConfig) and ref.config.variant == "gpt":
                if ref.config.max_len < needed:
                    _fail(
                        file,
                        f"grid[{i}]",
                        f"{ref.name!r} has {ref.config.max_len} positions; "
                        f"prompts + max_new_tokens + γ need {needed}",
                    )
        if target.family == "t5" and dataset.source != "ding":
            if any(d.is_ngram for d in entry.drafts):
                _fail(
                    file,
                    f"grid[{i}]",
                    "n-gram drafts of a T5 target are fit on the "
                    "German side of the Ding corpus: use dataset.source: ding",
                )
        if any(d.is_ngram for d in entry.drafts) and dataset.source == "text":
            if not dataset.train_path:
                _fail(file, f"grid[{i}]", "n-gram drafts need dataset.train_path (text source)")
    if next(iter_prompts(dataset), None) is None:
        raise ConfigError(
            f"{file}: dataset {dataset.path} has no prompt of {dataset.prompt_tokens} pieces"
        )


# ------------------------------------------------------------------------ dataset


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    encode: Callable[[str], list[int]]
    vocab_size: int


def _ascii_encode(text: str) -> list[int]:
    return [o if 3 <= (o := ord(ch)) < ASCII_VOCAB else 2 for ch in text]


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: str) -> Tokenizer:
    """``"ascii"`` (ids = code points 3..127, else unk 2) or a SentencePiece model path."""
    if spec == "ascii":
        return Tokenizer(encode=_ascii_encode, vocab_size=ASCII_VOCAB)
    import sentencepiece as spm

    path = configs.resolve(spec)
    if not path.is_file():
        raise ConfigError(f"tokenizer not found: {path} (a SentencePiece model, or 'ascii')")
    processor = spm.SentencePieceProcessor(model_file=str(path))
    return Tokenizer(encode=processor.encode, vocab_size=processor.get_piece_size())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prompt:
    id: int  # line number in the dataset (0-based): seeds the prompt's random draws
    text: str  # the English sentence
    tokens: tuple[int, ...]  # its pieces (no bos/eos)


def _iter_lines(dataset: DatasetConfig, *, train: bool, side: int = 0) -> Iterator[str]:
    """Lines of the prompt file or training text; for Ding, one side of the pairs."""
    from pipelines.data import ding

    if dataset.source == "ding":
        split = dataset.train_split if train else dataset.split
        for pair in ding.iter_split(configs.resolve(dataset.path), split):
            yield pair[side]
        return
    path = configs.resolve(dataset.train_path if train else dataset.path)
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            yield line.rstrip("\n")


def iter_prompts(dataset: DatasetConfig) -> Iterator[Prompt]:
    """The first ``num_prompts`` lines with at least ``prompt_tokens`` pieces, lazily."""
    tokenizer = load_tokenizer(dataset.tokenizer)
    prompts = (
        Prompt(id=i, text=text, tokens=tuple(tokenizer.encode(text)))
        for i, text in enumerate(_iter_lines(dataset, train=False))
    )
    long_enough = (p for p in prompts if len(p.tokens) >= dataset.prompt_tokens)
    return itertools.islice(long_enough, dataset.num_prompts)


def ngram_sequences(dataset: DatasetConfig, *, side: str) -> list[list[int]]:
    """Training sequences for n-gram drafts: [bos] + pieces + [eos] of each line.

    side: "english" (decoder-only targets continue English) or "german" (a T5 En→De
    target's decoder writes German; its start token is T5_START_ID).
    """
    tokenizer = load_tokenizer(dataset.tokenizer)
    start = T5_START_ID if side == "german" else dataset.bos_id
    lines = _iter_lines(dataset, train=True, side=1 if side == "german" else 0)
    if dataset.ngram_train_limit:
        lines = itertools.islice(lines, dataset.ngram_train_limit)
    head = [] if start is None else [start]
    tail = [] if dataset.eos_id is None else [dataset.eos_id]
    return [head + tokenizer.encode(line) + tail for line in lines if line]


# ------------------------------------------------------------------------ models


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class StudyModel:
    """What the measurements need of a model; compares by identity (compiled steps are
    cached per ``forward`` object, so keep one per model for the job)."""

    name: str
    family: str  # "decoder" | "t5" | "unigram" | "bigram"
    vocab_size: int
    forward: Callable  # (cache, tokens [B, K]) -> (logits [B, K, V], cache)
    new_cache: Callable  # (encoder_tokens [B, S] | None, batch, max_len) -> empty cache
    param_count: int
    params: Any = None  # the bound params (NGramParams for n-grams), for inspection


def ngram_model(name: str, params) -> StudyModel:
    """A StudyModel over n-gram params (``log_probs`` [V] or [V, V])."""
    from specdec_core.models import ngram

    return StudyModel(
        name=name,
        family="unigram" if params.log_probs.ndim == 1 else "bigram",
        vocab_size=int(params.log_probs.shape[-1]),
        forward=functools.partial(ngram.forward, params),
        new_cache=lambda encoder_tokens, batch, max_len: ngram.init_cache(batch, max_len),
        param_count=int(params.log_probs.size),
        params=params,
    )


_MODELS: dict[Any, StudyModel] = {}  # this process's loaded models, by what defines them


def from_bound(bound) -> StudyModel:
    """A StudyModel over a loaded :class:`~specdec_core.models.bound.BoundModel`."""
    return StudyModel(
        name=bound.name,
        family=bound.family,
        vocab_size=bound.vocab_size,
        forward=bound.forward,
        new_cache=bound.new_cache,
        param_count=bound.param_count(),
        params=bound.params,
    )


def _load_neural(ref: ModelRef) -> StudyModel:
    from specdec_core.models.bound import load_model

    return from_bound(
        load_model(
            ref.name, ref.family, ref.config, checkpoint=ref.checkpoint, init_seed=ref.init_seed
        )
    )


def _fit_ngram(kind: str, vocab_size: int, dataset: DatasetConfig, side: str) -> StudyModel:
    from specdec_core.models import ngram

    fit = ngram.fit_unigram if kind == "unigram" else ngram.fit_bigram
    sequences = ngram_sequences(dataset, side=side)
    return ngram_model(kind, fit(sequences, vocab_size, k=dataset.ngram_smoothing))


def load_study_model(ref: ModelRef, *, target: ModelRef, dataset: DatasetConfig) -> StudyModel:
    """Loads (once per process) a neural model or fits an n-gram draft for ``target``."""
    if ref.is_ngram:
        side = "german" if target.family == "t5" else "english"
        key = (ref.family, target.config.vocab_size, dataset, side)
        if key not in _MODELS:
            _MODELS[key] = _fit_ngram(ref.family, target.config.vocab_size, dataset, side)
    else:
        key = ref
        if key not in _MODELS:
            _MODELS[key] = _load_neural(ref)
    return _MODELS[key]


# ------------------------------------------------------------------------ measurements


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptBatch:
    ids: np.ndarray  # [B] int: prompt ids (padding rows repeat row 0's)
    prompt_tokens: np.ndarray  # [B, P] int32: decoder prompts (T5: the start token)
    encoder_tokens: np.ndarray | None  # [B, S] int32, 0-padded (T5 targets only)
    max_new: np.ndarray  # [B] int32: 0 on padding rows
    real: np.ndarray  # [B] bool: False on padding rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    sampling: Any  # SamplingConfig of both models
    gammas: tuple[int, ...]
    max_new_tokens: int
    seed: int
    eos_id: int | None
    measure_cost: bool  # time one k=1 step of each model (for c = "measured")


@contextlib.contextmanager
def hoisted_constants():
    """Runs JAX with closed-over arrays passed to compiled code as arguments.

    Models reach the decoding loops as ``forward`` closures, so their params are
    closed-over constants of every jitted step. By default JAX embeds them in the
    compiled program: XLA then constant-folds what depends on them alone (53 s for a
    unigram's distribution over 8000 pieces) and every executable holds its own copy (a
    bigram's [8000, 8000] table grew a study by 1.25 GB per compiled step). With
    ``jax_use_simplified_jaxpr_constants`` they are hoisted to arguments: the T5 +
    bigram cell compiled in 5 s instead of 13 s, with no memory growth, same numbers.
    Usable as a decorator; restores the previous setting.
    """
    import jax

    previous = jax.config.jax_use_simplified_jaxpr_constants
    jax.config.update("jax_use_simplified_jaxpr_constants", True)
    try:
        yield
    finally:
        jax.config.update("jax_use_simplified_jaxpr_constants", previous)


def pack_prompts(
    prompts: Sequence[Prompt],
    *,
    family: str,
    dataset: DatasetConfig,
    batch_size: int,
    max_new_tokens: int,
) -> PromptBatch:
    """Prompts -> padded arrays; rows past ``len(prompts)`` are inert copies of row 0."""
    prompts = sorted(prompts, key=lambda p: p.id)
    rows = [prompts[min(i, len(prompts) - 1)] for i in range(batch_size)]
    real = np.arange(batch_size) < len(prompts)
    encoder = None
    if family == "t5":
        tokenizer = load_tokenizer(dataset.tokenizer)
        encoded = [[*tokenizer.encode(T5_PREFIX + p.text), T5_EOS_ID] for p in rows]
        width = -(-max(map(len, encoded)) // ENCODER_BUCKET) * ENCODER_BUCKET
        encoder = np.zeros((batch_size, width), np.int32)
        for r, ids in enumerate(encoded):
            encoder[r, : len(ids)] = ids
        prompt = np.full((batch_size, 1), T5_START_ID, np.int32)
    else:
        head = [] if dataset.bos_id is None else [dataset.bos_id]
        prompt = np.asarray([head + list(p.tokens[: dataset.prompt_tokens]) for p in rows])
    return PromptBatch(
        ids=np.asarray([p.id for p in rows]),
        prompt_tokens=prompt.astype(np.int32),
        encoder_tokens=encoder,
        max_new=np.where(real, max_new_tokens, 0).astype(np.int32),
        real=real,
    )


@functools.lru_cache(maxsize=256)
def _probs_fn(forward: Callable, sampling_config):
    """jit: (cache, tokens [B, L]) -> sampling probs [B, L, V] of one teacher-forced pass."""
    import jax

    from specdec_core import sampling

    def probs(cache, tokens):
        logits, _ = forward(cache, tokens)
        return sampling.probs_from_logits(logits, sampling_config)

    return jax.jit(probs)


@functools.lru_cache(maxsize=256)
def _beta_fn(forward: Callable, sampling_config):
    """jit: (cache, tokens [B, L], target_probs [B, L, V]) -> β [B, L] (theory.beta)."""
    import jax

    from specdec_core import sampling, theory

    def beta(cache, tokens, target_probs):
        logits, _ = forward(cache, tokens)
        return theory.beta(target_probs, sampling.probs_from_logits(logits, sampling_config))

    return jax.jit(beta)


@hoisted_constants()
def target_trajectories(target: StudyModel, batch: PromptBatch, settings: MeasureSettings):
    """The target continues every prompt: (tokens [B, N] int32, lengths [B] int32)."""
    from specdec_core import decoding

    batch_size, prompt_len = batch.prompt_tokens.shape
    cache = target.new_cache(
        batch.encoder_tokens, batch_size, prompt_len + settings.max_new_tokens + 1
    )
    result = decoding.autoregressive_generate(
        target=target.forward,
        target_cache=cache,
        prompt_tokens=batch.prompt_tokens,
        prompt_lengths=np.full(batch_size, prompt_len, np.int32),
        request_ids=batch.ids,
        max_new_tokens=batch.max_new,
        sampling_config=settings.sampling,
        seed=settings.seed,
        eos_id=settings.eos_id,
    )
    return result.tokens, result.lengths


def _teacher_forced(batch: PromptBatch, tokens, lengths):
    """(inputs [B, P + N - 1], valid [B, N]): prompt + trajectory[:-1] for one
    teacher-forced pass (the logits at index P-1+j predict generated token j), and which
    generated positions are real (within ``lengths``, on a real row)."""
    inputs = np.concatenate([batch.prompt_tokens, tokens], 1)[:, :-1]
    valid = (np.arange(tokens.shape[1])[None, :] < lengths[:, None]) & batch.real[:, None]
    return inputs, valid


@hoisted_constants()
def top_probability_along(target: StudyModel, batch: PromptBatch, tokens, lengths) -> np.ndarray:
    """The target's own (T=1) largest next-token probability at each generated position
    of a trajectory: float64 [B, N] (NaN past lengths).

    How sure the target is of its choices: at T=1 a draft that always proposes the
    target's most likely token with certainty is accepted with exactly this probability,
    and at T=0 a draft must match an argmax decided by this margin.
    """
    from specdec_core.sampling import SamplingConfig

    batch_size, prompt_len = batch.prompt_tokens.shape
    inputs, valid = _teacher_forced(batch, tokens, lengths)
    probs = _probs_fn(target.forward, SamplingConfig(temperature=1.0))(
        target.new_cache(batch.encoder_tokens, batch_size, inputs.shape[1]), inputs
    )  # [B, L, V]
    top = np.asarray(probs.max(-1))[:, prompt_len - 1 :]
    return np.where(valid, top, np.nan).astype(np.float64)


@hoisted_constants()
def betas_along(
    target: StudyModel,
    drafts: Sequence[StudyModel],
    batch: PromptBatch,
    tokens,
    lengths,
    settings: MeasureSettings,
) -> list[np.ndarray]:
    """β at each generated position, per draft: a list of float64 [B, N] (NaN past lengths).

    One teacher-forced pass of each model over prompt + trajectory[:-1]; the logits at
    index P-1+j (P = prompt length) predict generated token j.
    """
    batch_size, prompt_len = batch.prompt_tokens.shape
    inputs, valid = _teacher_forced(batch, tokens, lengths)
    length = inputs.shape[1]
    target_probs = _probs_fn(target.forward, settings.sampling)(
        target.new_cache(batch.encoder_tokens, batch_size, length), inputs
    )  # [B, L, V]
    out = []
    for draft in drafts:
        cache = draft.new_cache(batch.encoder_tokens, batch_size, length)
        beta = np.asarray(_beta_fn(draft.forward, settings.sampling)(cache, inputs, target_probs))
        out.append(np.where(valid, beta[:, prompt_len - 1 :], np.nan).astype(np.float64))
    return out


@hoisted_constants()
def speculative_counts(
    target: StudyModel,
    draft: StudyModel,
    batch: PromptBatch,
    gamma: int,
    settings: MeasureSettings,
) -> dict[str, np.ndarray]:
    """One speculative run: per row ``accepted``, ``tests``, ``iterations``, ``drafted`` [B].

    tests = accepted + rejections; rejections = iterations that did not accept all γ.
    """
    from specdec_core import decoding, theory

    batch_size, prompt_len = batch.prompt_tokens.shape
    max_len = prompt_len + settings.max_new_tokens + gamma + 2
    result = decoding.speculative_generate(
        target=target.forward,
        target_cache=target.new_cache(batch.encoder_tokens, batch_size, max_len),
        draft=draft.forward,
        draft_cache=draft.new_cache(batch.encoder_tokens, batch_size, max_len),
        prompt_tokens=batch.prompt_tokens,
        prompt_lengths=np.full(batch_size, prompt_len, np.int32),
        request_ids=batch.ids,
        max_new_tokens=batch.max_new,
        gamma=gamma,
        sampling_config=settings.sampling,
        seed=settings.seed,
        eos_id=settings.eos_id,
    )
    full = result.accepted_by_position[:, gamma - 1]  # [B] iterations that accepted all γ
    counts = {
        "accepted": result.accepted,
        "tests": theory.acceptance_tests(result.accepted, result.iterations, full),
        "iterations": result.iterations,
        "drafted": result.drafted,
    }
    return {k: np.asarray(v, np.int64)[batch.real] for k, v in counts.items()}


@functools.lru_cache(maxsize=64)
def _step_fn(forward: Callable):
    import jax

    return jax.jit(forward)


@hoisted_constants()
def step_seconds(model: StudyModel, batch: PromptBatch, *, repeats: int = 5) -> float:
    """Median wall time of one k=1 forward after the prompt (compiled and warmed first)."""
    import jax

    batch_size, prompt_len = batch.prompt_tokens.shape
    step = _step_fn(model.forward)
    cache = model.new_cache(batch.encoder_tokens, batch_size, prompt_len + 2)
    _, cache = step(cache, batch.prompt_tokens)
    one = batch.prompt_tokens[:, -1:]
    jax.block_until_ready(step(cache, one))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(cache, one))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


@dataclasses.dataclass(kw_only=True)
class CellStats:
    """Per-row measurements of one (target, draft, temperature) cell; rows concatenate."""

    ids: list[int]  # prompt ids, one per row
    beta_sum: list[float]  # per row: Σ β over its generated positions
    beta_count: list[int]  # per row: generated positions
    position_sum: np.ndarray  # [N] float64: Σ over rows of β at generated position j
    position_count: np.ndarray  # [N] int64: rows with a position j
    spec: dict[int, dict[str, list[int]]]  # γ -> {accepted, tests, iterations, drafted} per row
    target_step_s: list[float]  # timed k=1 steps (c = "measured" only)
    draft_step_s: list[float]


def merge_stats(parts: Iterable[CellStats]) -> CellStats:
    """Concatenates the rows of several batches of one cell."""
    parts = list(parts)
    first = parts[0]
    gammas = sorted(first.spec)
    return CellStats(
        ids=[i for p in parts for i in p.ids],
        beta_sum=[x for p in parts for x in p.beta_sum],
        beta_count=[x for p in parts for x in p.beta_count],
        position_sum=np.sum([p.position_sum for p in parts], 0),
        position_count=np.sum([p.position_count for p in parts], 0),
        spec={
            g: {k: [x for p in parts for x in p.spec[g][k]] for k in first.spec[g]} for g in gammas
        },
        target_step_s=[x for p in parts for x in p.target_step_s],
        draft_step_s=[x for p in parts for x in p.draft_step_s],
    )


def measure_batch(
    target: StudyModel,
    drafts: Sequence[StudyModel],
    batch: PromptBatch,
    settings: MeasureSettings,
) -> list[CellStats]:
    """One batch of prompts: target trajectories once, then per draft β and speculative runs."""
    tokens, lengths = target_trajectories(target, batch, settings)
    betas = betas_along(target, drafts, batch, tokens, lengths, settings)
    target_s = [step_seconds(target, batch)] if settings.measure_cost else []
    out = []
    for draft, beta in zip(drafts, betas, strict=True):
        beta = beta[batch.real]  # [b, N]
        spec = {}
        for gamma in settings.gammas:
            counts = speculative_counts(target, draft, batch, gamma, settings)
            spec[gamma] = {k: v.tolist() for k, v in counts.items()}
        out.append(
            CellStats(
                ids=batch.ids[batch.real].tolist(),
                beta_sum=np.nansum(beta, 1).tolist(),
                beta_count=np.isfinite(beta).sum(1).tolist(),
                position_sum=np.nansum(beta, 0),
                position_count=np.isfinite(beta).sum(0),
                spec=spec,
                target_step_s=target_s,
                draft_step_s=[step_seconds(draft, batch)] if settings.measure_cost else [],
            )
        )
    return out


# ------------------------------------------------------------------------ statistics


def ratio_with_ci(
    numerators, denominators, *, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float]:
    """(Σnum / Σden, low, high): percentile bootstrap over rows (sequences) of the ratio.

    numerators, denominators: [S] per sequence. One sequence gives a zero-width interval.
    """
    num = np.asarray(numerators, np.float64)
    den = np.asarray(denominators, np.float64)
    estimate = float(num.sum() / den.sum())
    if len(num) < 2:
        return estimate, estimate, estimate
    rows = np.random.default_rng(seed).integers(0, len(num), (resamples, len(num)))  # [R, S]
    ratios = num[rows].sum(1) / np.maximum(den[rows].sum(1), 1e-300)
    low, high = np.quantile(ratios, [(1 - confidence) / 2, (1 + confidence) / 2])
    return estimate, float(min(low, estimate)), float(max(high, estimate))


def _half_width(estimate: float, low: float, high: float) -> float:
    return max(estimate - low, high - estimate)


def _clip_alpha(alpha: float) -> float:
    """α for the theory's formulas: float sums of min(p, q) can exceed 1 by ~1e-7."""
    return float(min(max(alpha, 0.0), 1.0))


def gamma_summary(
    alpha_ci: tuple[float, float, float],
    counts: Mapping[str, Sequence[int]],
    gamma: int,
    *,
    theory_config: TheoryConfig,
    seed: int,
) -> dict[str, Any]:
    """Empirical acceptance of one γ with its CI, against the theory's predictions from α."""
    from specdec_core import theory

    alpha = _clip_alpha(alpha_ci[0])
    acceptance, low, high = ratio_with_ci(
        counts["accepted"],
        counts["tests"],
        confidence=theory_config.confidence,
        resamples=theory_config.bootstrap_resamples,
        seed=seed,
    )
    accepted, iterations = int(np.sum(counts["accepted"])), int(np.sum(counts["iterations"]))
    tests, drafted = int(np.sum(counts["tests"])), int(np.sum(counts["drafted"]))
    predicted_tokens = theory.expected_tokens(alpha, gamma)
    tolerance = math.hypot(_half_width(*alpha_ci), _half_width(acceptance, low, high))
    return {
        "gamma": gamma,
        "empirical_acceptance": acceptance,
        "empirical_acceptance_ci_low": low,
        "empirical_acceptance_ci_high": high,
        "agrees_with_alpha": bool(abs(acceptance - alpha_ci[0]) <= tolerance),
        "accepted": accepted,
        "tests": tests,
        "drafted": drafted,
        "iterations": iterations,
        "accepted_per_drafted": accepted / max(drafted, 1),
        "predicted_accepted_per_drafted": (predicted_tokens - 1.0) / gamma,
        "tokens_per_iteration": (accepted + iterations) / max(iterations, 1),
        "predicted_tokens_per_iteration": predicted_tokens,
    }


def cost_coefficient(stats: CellStats, theory_config: TheoryConfig) -> tuple[float, str]:
    """(c, where it came from): the configured number, or the timed step ratio."""
    if theory_config.cost_coefficient != "measured":
        return float(theory_config.cost_coefficient), "config"
    return float(np.median(stats.draft_step_s) / np.median(stats.target_step_s)), "measured"


def summarize_cell(stats: CellStats, *, theory_config: TheoryConfig, seed: int) -> dict[str, Any]:
    """α with its CI, β by position, each γ's empirical acceptance, c, optimal γ."""
    from specdec_core import theory

    order = np.argsort(stats.ids, kind="stable")  # bootstrap rows in a fixed order
    pick = lambda values: np.asarray(values)[order]
    alpha_ci = ratio_with_ci(
        pick(stats.beta_sum),
        pick(stats.beta_count),
        confidence=theory_config.confidence,
        resamples=theory_config.bootstrap_resamples,
        seed=seed,
    )
    by_gamma = [
        gamma_summary(
            alpha_ci,
            {k: pick(v) for k, v in stats.spec[g].items()},
            g,
            theory_config=theory_config,
            seed=seed + g,
        )
        for g in sorted(stats.spec)
    ]
    pooled = {k: sum(sum(row[k]) for row in stats.spec.values()) for k in ("accepted", "tests")}
    c, c_source = cost_coefficient(stats, theory_config)
    alpha = _clip_alpha(alpha_ci[0])
    gammas = range(1, theory_config.max_gamma + 1)
    optimal = theory.optimal_gamma(alpha, c, max_gamma=theory_config.max_gamma)
    position_mean = stats.position_sum / np.maximum(stats.position_count, 1)
    return {
        "alpha": alpha_ci[0],
        "alpha_ci_low": alpha_ci[1],
        "alpha_ci_high": alpha_ci[2],
        "sequences": len(stats.ids),
        "positions": int(sum(stats.beta_count)),
        "beta_by_position": [
            float(b) if n else None
            for b, n in zip(position_mean, stats.position_count, strict=True)
        ],
        "empirical_acceptance": pooled["accepted"] / max(pooled["tests"], 1),
        "by_gamma": by_gamma,
        "agrees_with_alpha": all(g["agrees_with_alpha"] for g in by_gamma),
        "c": c,
        "c_source": c_source,
        "optimal_gamma": optimal,
        "predicted_improvement": theory.walltime_improvement(alpha, optimal, c),
        "improvement_by_gamma": [theory.walltime_improvement(alpha, g, c) for g in gammas],
    }


# ------------------------------------------------------------------------ the Beam job


def cell_keys(study: StudyConfig) -> list[tuple[int, int]]:
    """(entry index, temperature index) for every entry and its temperatures."""
    return [(e, t) for e, entry in enumerate(study.grid) for t in range(len(entry.temperatures))]


def measure_settings(study: StudyConfig, temperature: float) -> MeasureSettings:
    return MeasureSettings(
        sampling=study.decode.sampling(temperature),
        gammas=study.decode.gammas,
        max_new_tokens=study.decode.max_new_tokens,
        seed=study.seed,
        eos_id=study.dataset.eos_id,
        measure_cost=study.theory.cost_coefficient == "measured",
    )


def entry_models(study: StudyConfig, index: int) -> tuple[StudyModel, list[StudyModel]]:
    entry = study.grid[index]
    load = functools.partial(load_study_model, target=entry.target, dataset=study.dataset)
    return load(entry.target), [load(d) for d in entry.drafts]


def measure_keyed_batch(study: StudyConfig, keyed: tuple[tuple[int, int], list[Prompt]]):
    """((entry, temperature), prompts) -> ((entry, draft, temperature), CellStats) per draft."""
    (entry_index, temp_index), prompts = keyed
    entry = study.grid[entry_index]
    target, drafts = entry_models(study, entry_index)
    batch = pack_prompts(
        prompts,
        family=entry.target.family,
        dataset=study.dataset,
        batch_size=study.decode.batch_size,
        max_new_tokens=study.decode.max_new_tokens,
    )
    settings = measure_settings(study, entry.temperatures[temp_index])
    for draft_index, stats in enumerate(measure_batch(target, drafts, batch, settings)):
        yield (entry_index, draft_index, temp_index), stats


def cell_row(study: StudyConfig, key: tuple[int, int, int], parts: Iterable[CellStats]) -> dict:
    """One finished cell: names, the temperature and :func:`summarize_cell`'s numbers."""
    entry_index, draft_index, temp_index = key
    entry = study.grid[entry_index]
    target, drafts = entry_models(study, entry_index)
    summary = summarize_cell(merge_stats(parts), theory_config=study.theory, seed=study.seed)
    return {
        "entry": entry_index,
        "draft_index": draft_index,
        "task": entry.label,
        "target": entry.target.name,
        "draft": entry.drafts[draft_index].name,
        "temperature": entry.temperatures[temp_index],
        "target_params": target.param_count,
        "draft_params": drafts[draft_index].param_count,
        "target_source": entry.target.source or entry.target.name,
        "draft_source": entry.drafts[draft_index].source or "fit on the training split",
        "target_checkpoint": _weights(entry.target),
        "draft_checkpoint": _weights(entry.drafts[draft_index]),
        **summary,
    }


def _weights(ref: ModelRef) -> str:
    """Where a model's weights came from (the checkpoint step folder, for the record)."""
    if ref.is_ngram:
        return "n-gram fit on the training split"
    return ref.checkpoint or f"random init (seed {ref.init_seed}, test-only)"


def build_pipeline(pipeline, study: StudyConfig, output: str) -> None:
    """The study's Beam graph (module docstring), writing one JSON line per cell."""
    import apache_beam as beam
    from apache_beam import typehints

    keys = cell_keys(study)
    (
        pipeline
        | "Dataset" >> beam.Create([study.dataset])
        | "ReadPrompts" >> beam.FlatMap(iter_prompts)
        | "FanOut"
        >> beam.FlatMap(lambda prompt: [(key, prompt) for key in keys]).with_output_types(
            # a deterministic key coder for the stateful batching
            typehints.KV[typehints.Tuple[int, int], typehints.Any]
        )
        | "Batch" >> beam.GroupIntoBatches(study.decode.batch_size)
        | "Measure" >> beam.FlatMap(functools.partial(measure_keyed_batch, study))
        | "GroupCells" >> beam.GroupByKey()
        | "Summarize" >> beam.MapTuple(functools.partial(cell_row, study))
        | "ToJson" >> beam.Map(json.dumps)
        | "Write" >> beam.io.WriteToText(output, shard_name_template="", num_shards=1)
    )


def run_cells(study: StudyConfig) -> list[dict]:
    """Runs the pipeline on the in-process FnApiRunner; cells in grid order."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    with tempfile.TemporaryDirectory(prefix="specdec-study-") as folder:
        output = str(pathlib.Path(folder) / "cells.jsonl")
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            build_pipeline(pipeline, study, output)
        rows = [json.loads(line) for line in pathlib.Path(output).read_text().splitlines()]
    order = {(e, d, t): i for i, (e, d, t) in enumerate(_grid_order(study))}
    return sorted(rows, key=lambda r: order[(r["entry"], r["draft_index"], r["temperature"])])


def _grid_order(study: StudyConfig) -> Iterator[tuple[int, int, float]]:
    for e, entry in enumerate(study.grid):
        for d in range(len(entry.drafts)):
            for t in entry.temperatures:
                yield e, d, t


# ------------------------------------------------------------------------ MLflow


def _artifact_root(tracking_uri: str) -> str | None:
    """``<db folder>/mlartifacts`` for a SQLite store (MLflow's default would be ./mlruns)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    return str(pathlib.Path(tracking_uri[len(prefix) :]).resolve().parent / "mlartifacts")


def _ensure_experiment(tracking_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    if client.get_experiment_by_name(EXPERIMENT) is None:
        client.create_experiment(EXPERIMENT, artifact_location=_artifact_root(tracking_uri))


def cell_run_name(row: Mapping) -> str:
    return f"{row['target']} | {row['draft']} | T={row['temperature']:g}"


def cell_params(study: StudyConfig, row: Mapping) -> dict[str, Any]:
    decode, dataset = study.decode, study.dataset
    return {
        "task": row["task"],
        "target": row["target"],
        "draft": row["draft"],
        "temperature": row["temperature"],
        "top_k": decode.top_k,
        "top_p": decode.top_p,
        "gammas": list(decode.gammas),
        "max_new_tokens": decode.max_new_tokens,
        "prompts": row["sequences"],
        "prompt_tokens": dataset.prompt_tokens,
        "dataset": f"{dataset.source}:{dataset.path}:{dataset.split}",
        "tokenizer": dataset.tokenizer,
        "seed": study.seed,
        "c_source": row["c_source"],
        "target_source": row["target_source"],
        "draft_source": row["draft_source"],
        "target_checkpoint": row["target_checkpoint"],
        "draft_checkpoint": row["draft_checkpoint"],
        "target_params": row["target_params"],
        "draft_params": row["draft_params"],
        "ci": f"{study.theory.confidence:g} percentile bootstrap over sequences "
        f"({study.theory.bootstrap_resamples} resamples)",
    }


def cell_metrics(row: Mapping) -> tuple[dict[str, float], dict[str, list[tuple[int, float]]]]:
    """(scalar metrics, stepped metrics {name: [(step, value)]}) of one cell's child run."""
    keys = (
        "alpha",
        "alpha_ci_low",
        "alpha_ci_high",
        "empirical_acceptance",
        "optimal_gamma",
        "predicted_improvement",
        "c",
        "positions",
        "sequences",
    )
    scalars = {k: float(row[k]) for k in keys}
    scalars["agrees_with_alpha"] = float(row["agrees_with_alpha"])
    for g in row["by_gamma"]:
        for name in (
            "empirical_acceptance",
            "empirical_acceptance_ci_low",
            "empirical_acceptance_ci_high",
            "tokens_per_iteration",
            "predicted_tokens_per_iteration",
            "accepted_per_drafted",
        ):
            scalars[f"{name}_gamma_{g['gamma']}"] = float(g[name])
    stepped = {
        "beta_by_position": [
            (j + 1, b) for j, b in enumerate(row["beta_by_position"]) if b is not None
        ],
        "predicted_improvement_by_gamma": [
            (g, v) for g, v in enumerate(row["improvement_by_gamma"], start=1)
        ],
    }
    return scalars, stepped


def _log_stepped(run_id: str, stepped: Mapping[str, list[tuple[int, float]]]) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, s) for k, pairs in stepped.items() for s, v in pairs]
    client = MlflowClient()
    for start in range(0, len(metrics), 900):  # log_batch takes at most 1000 metrics
        client.log_batch(run_id, metrics=metrics[start : start + 900])


def table3(rows: Sequence[Mapping]) -> dict[str, list]:
    """The results as columns, laid out like the paper's Table 3 (TASK, Mp, Mq, T, α, ...)."""
    return {
        "TASK": [r["task"] for r in rows],
        "target": [r["target"] for r in rows],
        "draft": [r["draft"] for r in rows],
        "T": [r["temperature"] for r in rows],
        "alpha": [r["alpha"] for r in rows],
        "alpha_ci_low": [r["alpha_ci_low"] for r in rows],
        "alpha_ci_high": [r["alpha_ci_high"] for r in rows],
        "empirical_acceptance": [r["empirical_acceptance"] for r in rows],
        "agrees": [r["agrees_with_alpha"] for r in rows],
        "optimal_gamma": [r["optimal_gamma"] for r in rows],
        "predicted_improvement": [r["predicted_improvement"] for r in rows],
        "c": [r["c"] for r in rows],
        "positions": [r["positions"] for r in rows],
    }


def log_study(study: StudyConfig, rows: list[dict], *, tracking_uri: str) -> str:
    """Parent run + one nested child run per cell; sets ``row["mlflow_run_id"]``."""
    import mlflow

    from pipelines import tracking

    _ensure_experiment(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(EXPERIMENT)
    tags = {"git_commit": tracking.git_commit(), "study": study.name}
    with mlflow.start_run(run_name=study.name, tags=tags) as parent:
        mlflow.log_params(tracking.flatten_params(study_params(study)))
        for row in rows:
            with mlflow.start_run(run_name=cell_run_name(row), nested=True, tags=tags) as child:
                mlflow.log_params(tracking.flatten_params(cell_params(study, row)))
                scalars, stepped = cell_metrics(row)
                mlflow.log_metrics(scalars)
                _log_stepped(child.info.run_id, stepped)
                mlflow.log_dict(row, "cell.json")
                row["mlflow_run_id"] = child.info.run_id
        mlflow.log_table(data=table3(rows), artifact_file="table3.json")
        mlflow.log_dict({"rows": rows, "skipped": list(study.skipped)}, "cells.json")
        mlflow.log_artifact(study.path, "config")
        log_plots(rows, study)
    return parent.info.run_id


def study_params(study: StudyConfig) -> dict[str, Any]:
    return {
        "study": study.name,
        "config": study.path,
        "seed": study.seed,
        "dataset": dataclasses.asdict(study.dataset),
        "decode": dataclasses.asdict(study.decode),
        "theory": dataclasses.asdict(study.theory),
        "grid": [f"{e.target.name}: {', '.join(d.name for d in e.drafts)}" for e in study.grid],
        "runner": "FnApiRunner (in-process)",
    }


# ------------------------------------------------------------------------ plots


def plot_csvs(rows: Sequence[Mapping], study: StudyConfig) -> dict[str, str]:
    """The plots' data as CSV text: α per draft and temperature; improvement vs γ."""
    alpha = ["target,draft,temperature,alpha,alpha_ci_low,alpha_ci_high"]
    alpha += [
        f"{r['target']},{r['draft']},{r['temperature']:g},{r['alpha']:.6f},"
        f"{r['alpha_ci_low']:.6f},{r['alpha_ci_high']:.6f}"
        for r in rows
    ]
    curve = ["target,draft,temperature,gamma,predicted_improvement,measured_improvement"]
    for r in rows:
        measured = {
            g["gamma"]: g["tokens_per_iteration"] / (g["gamma"] * r["c"] + 1) for g in r["by_gamma"]
        }
        for g, value in enumerate(r["improvement_by_gamma"], start=1):
            point = f"{measured[g]:.6f}" if g in measured else ""
            curve.append(f"{r['target']},{r['draft']},{r['temperature']:g},{g},{value:.6f},{point}")
    return {
        "alpha_by_draft.csv": "\n".join(alpha) + "\n",
        "improvement_vs_gamma.csv": "\n".join(curve) + "\n",
    }


def log_plots(rows: Sequence[Mapping], study: StudyConfig) -> None:
    """CSV always; PNG figures when matplotlib is installed."""
    import mlflow

    for name, text in plot_csvs(rows, study).items():
        mlflow.log_text(text, f"plots/{name}")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    for name, figure in (
        ("alpha_by_draft.png", alpha_figure(plt, rows)),
        ("improvement_vs_gamma.png", improvement_figure(plt, rows)),
    ):
        mlflow.log_figure(figure, f"plots/{name}")
        plt.close(figure)


def _targets(rows: Sequence[Mapping]) -> list[str]:
    return list(dict.fromkeys(r["target"] for r in rows))


def alpha_figure(plt, rows: Sequence[Mapping]):
    """Bars: α per draft (x) and temperature (colour), one panel per target, CI whiskers."""
    targets = _targets(rows)
    fig, axes = plt.subplots(1, len(targets), figsize=(4.5 * len(targets), 3.4), squeeze=False)
    for ax, target in zip(axes[0], targets, strict=True):
        mine = [r for r in rows if r["target"] == target]
        drafts = list(dict.fromkeys(r["draft"] for r in mine))
        temps = sorted({r["temperature"] for r in mine})
        width = 0.8 / len(temps)
        for k, temp in enumerate(temps):
            cells = {r["draft"]: r for r in mine if r["temperature"] == temp}
            xs = [i + k * width for i, d in enumerate(drafts) if d in cells]
            got = [cells[d] for d in drafts if d in cells]
            errors = [
                [r["alpha"] - r["alpha_ci_low"] for r in got],
                [r["alpha_ci_high"] - r["alpha"] for r in got],
            ]
            ax.bar(xs, [r["alpha"] for r in got], width, yerr=errors, label=f"T={temp:g}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(drafts))], drafts, rotation=20)
        ax.set(title=f"target {target}", ylabel="α", ylim=(0, 1.05))
        ax.legend()
    fig.tight_layout()
    return fig


def improvement_figure(plt, rows: Sequence[Mapping]):
    """Predicted improvement vs γ (lines) with the measured-acceptance points (markers)."""
    targets = _targets(rows)
    fig, axes = plt.subplots(1, len(targets), figsize=(4.8 * len(targets), 3.4), squeeze=False)
    for ax, target in zip(axes[0], targets, strict=True):
        for i, r in enumerate(row for row in rows if row["target"] == target):
            gammas = range(1, len(r["improvement_by_gamma"]) + 1)
            label = f"{r['draft']} T={r['temperature']:g} (c={r['c']:.3g})"
            ax.plot(gammas, r["improvement_by_gamma"], color=f"C{i % 10}", label=label)
            measured = [
                (g["gamma"], g["tokens_per_iteration"] / (g["gamma"] * r["c"] + 1))
                for g in r["by_gamma"]
            ]
            ax.plot(*zip(*measured, strict=True), "o", color=f"C{i % 10}")
        ax.set(title=f"target {target}", xlabel="γ", ylabel="predicted improvement (×)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------ output


def _size(n: int) -> str:
    """Parameter counts as the paper writes them: 97M, 137B (n-grams: table entries)."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)


def format_table(rows: Sequence[Mapping]) -> str:
    """The paper's Table 3 layout (TASK/Mp, Mq, T, α) plus CI, α̂, γ*, improvement, c."""
    header = ("TASK (Mp)", "Mq", "T", "α", "CI", "α̂ spec", "agree", "γ*", "improv.", "c")
    lines = []
    for r in rows:
        lines.append(
            (
                f"{r['task']} ({_size(r['target_params'])})",
                f"{r['draft']} ({_size(r['draft_params'])})",
                f"{r['temperature']:g}",
                f"{r['alpha']:.3f}",
                f"[{r['alpha_ci_low']:.3f}, {r['alpha_ci_high']:.3f}]",
                f"{r['empirical_acceptance']:.3f}",
                "yes" if r["agrees_with_alpha"] else "NO",
                str(r["optimal_gamma"]),
                f"{r['predicted_improvement']:.2f}x",
                f"{r['c']:.3g}",
            )
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()
    rule = "-" * len(fmt(header))
    return "\n".join([fmt(header), rule, *map(fmt, lines)])


SUMMARY_KEYS = (
    "target",
    "draft",
    "temperature",
    "alpha",
    "alpha_ci_low",
    "alpha_ci_high",
    "empirical_acceptance",
    "optimal_gamma",
    "mlflow_run_id",
)


def summary_rows(rows: Sequence[Mapping]) -> list[dict[str, Any]]:
    """One ``--summary-json`` row per (target, draft, temperature)."""
    return [{k: r[k] for k in SUMMARY_KEYS} for r in rows]


# ------------------------------------------------------------------------ entry points


@dataclasses.dataclass(frozen=True, kw_only=True)
class StudyResult:
    study: StudyConfig
    rows: list[dict]  # one per cell, grid order, with mlflow_run_id
    parent_run_id: str
    tracking_uri: str


def run(
    config: str | pathlib.Path,
    *,
    summary_json: str | None = None,
    tracking_uri: str | None = None,
    seed: int | None = None,
    progress: bool = True,
) -> StudyResult:
    """Loads and checks the grid file, runs the Beam job, logs MLflow, writes the summary."""
    from pipelines import tracking

    study = load_study_config(config, seed=seed)
    say = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda _: None)
    for note in study.skipped:
        say(f"specdec study: {note}")
    cells = sum(len(e.drafts) * len(e.temperatures) for e in study.grid)
    say(
        f"specdec study {study.name}: {cells} cells, {study.dataset.num_prompts} prompts, "
        f"γ in {list(study.decode.gammas)}"
    )
    start = time.perf_counter()
    rows = run_cells(study)
    say(f"specdec study {study.name}: measured in {time.perf_counter() - start:.0f}s")
    uri = tracking_uri or tracking.default_tracking_uri()
    parent = log_study(study, rows, tracking_uri=uri)
    if summary_json:
        path = pathlib.Path(summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary_rows(rows), indent=2) + "\n", encoding="utf-8")
    return StudyResult(study=study, rows=rows, parent_run_id=parent, tracking_uri=uri)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``specdec study`` flags (named as in ``specdec translate``)."""
    parser.add_argument("--config", required=True, help="grid file (configs/studies/*.yaml)")
    parser.add_argument("--summary-json", default=None, help="write one row per cell here")
    parser.add_argument(
        "--tracking-uri",
        default=None,
        help="MLflow store (default sqlite:///<repo>/runs/mlflow.db)",
    )
    parser.add_argument("--seed", type=int, default=None, help="job seed (default: the file's)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def command(args: argparse.Namespace) -> int:
    """Runs the study of parsed ``args`` and prints the table; returns the exit status."""
    result = run(
        args.config,
        summary_json=args.summary_json,
        tracking_uri=args.tracking_uri,
        seed=args.seed,
        progress=not args.quiet,
    )
    print(format_table(result.rows))
    print(f"MLflow: experiment {EXPERIMENT!r}, run {result.parent_run_id} ({result.tracking_uri})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.study --config FILE ...``; grid errors exit 2 with one line."""
    parser = argparse.ArgumentParser(prog="specdec study", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return command(args)
    except (ConfigError, FileNotFoundError) as error:
        print(f"specdec: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # Run the importable module, not __main__: Beam pickles module functions by reference
    # then (functions of __main__ are pickled by value, with everything they reference).
    from pipelines import study

    sys.exit(study.main())
