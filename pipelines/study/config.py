"""The grid file: its sections, its entries and the checks made before any work."""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from pipelines import configs
from pipelines.configs import ConfigError
from pipelines.study.dataset import DatasetConfig, iter_prompts, load_tokenizer
from pipelines.study.model_refs import (
    MissingCheckpoint,
    ModelRef,
    check_pair,
    fail,
    parse_model_ref,
)

TOP_LEVEL_KEYS = ("name", "seed", "dataset", "decode", "theory", "grid")
ENTRY_KEYS = ("target", "drafts", "label", "temperatures", "optional")


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


def _parse_drafts(
    values: Sequence[Any], target: ModelRef, *, optional: bool, where: str, file: str
) -> tuple[list[ModelRef], list[str]]:
    """(drafts, notes): in an optional entry a draft without a checkpoint is left out."""
    drafts, notes = [], []
    for j, value in enumerate(values):
        draft_where = f"{where}.drafts[{j}]"
        try:
            drafts.append(
                parse_model_ref(
                    value,
                    where=draft_where,
                    file=file,
                    draft=True,
                    vocab_size=target.config.vocab_size,
                )
            )
        except MissingCheckpoint as missing:
            if not optional:
                raise
            notes.append(f"left out: {missing}")
            continue
        check_pair(target, drafts[-1], where=draft_where, file=file)
    if not drafts:
        fail(file, where, "no draft has a checkpoint", MissingCheckpoint)
    return drafts, notes


def _parse_entry(
    raw: Any, index: int, *, decode: DecodeConfig, file: str
) -> tuple[GridEntry, list[str]]:
    """One ``grid`` item -> (entry, notes on optional drafts left out)."""
    where = f"grid[{index}]"
    if not isinstance(raw, Mapping):
        fail(file, where, f"an entry is a mapping, got {raw!r}")
    unknown = sorted(set(raw) - set(ENTRY_KEYS))
    if unknown:
        fail(file, where, f"unknown key {unknown[0]} (known: {', '.join(ENTRY_KEYS)})")
    if "target" not in raw or not raw.get("drafts"):
        fail(file, where, "an entry needs a target and a non-empty list of drafts")
    target = parse_model_ref(raw["target"], where=f"{where}.target", file=file, draft=False)
    optional = bool(raw.get("optional", False))
    drafts, notes = _parse_drafts(raw["drafts"], target, optional=optional, where=where, file=file)
    temperatures = tuple(raw.get("temperatures") or decode.temperatures)
    try:
        dataclasses.replace(decode, temperatures=temperatures)
    except ValueError as error:
        fail(file, f"{where}.temperatures", str(error))
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
    from specdec_core.models import families

    file, dataset = study.path, study.dataset
    tokenizer = load_tokenizer(dataset.tokenizer)
    longest = max(study.decode.gammas)
    for i, entry in enumerate(study.grid):
        target = entry.target
        if target.config.vocab_size < tokenizer.vocab_size:
            fail(
                file,
                f"grid[{i}].target",
                f"vocab_size {target.config.vocab_size} < the "
                f"tokenizer's {tokenizer.vocab_size} ({dataset.tokenizer})",
            )
        needed = dataset.prompt_tokens + 1 + study.decode.max_new_tokens + longest + 2
        for ref in (target, *entry.drafts):
            positions = families.get(ref.family).max_positions(ref.config)
            if positions is not None and positions < needed:
                fail(
                    file,
                    f"grid[{i}]",
                    f"{ref.name!r} has {positions} positions; "
                    f"prompts + max_new_tokens + γ need {needed}",
                )
        if families.get(target.family).is_encoder_decoder and dataset.source != "ding":
            if any(d.is_ngram for d in entry.drafts):
                fail(
                    file,
                    f"grid[{i}]",
                    "n-gram drafts of a T5 target are fit on the "
                    "German side of the Ding corpus: use dataset.source: ding",
                )
        if any(d.is_ngram for d in entry.drafts) and dataset.source == "text":
            if not dataset.train_path:
                fail(file, f"grid[{i}]", "n-gram drafts need dataset.train_path (text source)")
    if next(iter_prompts(dataset), None) is None:
        raise ConfigError(
            f"{file}: dataset {dataset.path} has no prompt of {dataset.prompt_tokens} pieces"
        )
