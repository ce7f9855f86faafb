"""Typed model/training configs loaded from YAML (``configs/models/<name>.yaml``).

Schema (every section optional except ``model``; unknown keys are an error that names
the key and the file)::

    name: ende_target_debian     # run/checkpoint name; defaults to the file's stem
    family: t5                   # a family with checkpoints (specdec_core.models.families):
                                 # "t5" (T5Config) | "decoder" (DecoderConfig)
    model: {...}                 # the family's config fields (vocab_size, emb_dim, ...)
    data: {...}                  # DataConfig
    train: {...}                 # TrainConfig
    checkpoint: {...}            # CheckpointConfig
    teacher: null                # distillation teacher: a model YAML or a T5X checkpoint
                                 # folder (which then needs teacher_config: a model YAML)
    target: ende_target_debian   # a T5 draft with num_encoder_layers 0 reads this model's
                                 # encoder (its export; t5.SourceEncoder): a model name
                                 # in configs/models or a model YAML
    worker: {...}                # WorkerConfig: the Ray resources and environment of the
                                 # model's worker (num_cpus, num_gpus, resources, env)
    mesh: {data: 1, model: 8}    # MeshConfig: the model's worker shards its params and
                                 # caches over data*model devices (specdec_core.sharding)
    gamma_prior: {alpha: 0.36, draft_c: 0.21}   # a draft's: what --gamma auto assumes of
                                 # it with its target before measuring (workers.gamma.GammaPrior)

Relative paths (data, vocabulary, checkpoints, teacher) are relative to the repository
root, so a config means the same thing from any working directory.

``load_model_config(path, overrides=["train.tokens_per_batch=65536", ...])`` sets
``SECTION.KEY`` (or a top-level key) to a YAML value before validation, so an override
is checked exactly as the file is (``specdec train --set``).
"""

from __future__ import annotations

import dataclasses
import pathlib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from specdec_core.models import decoder, families, t5
from workers.gamma import GammaPrior

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MODELS_DIR = REPO_ROOT / "configs" / "models"
# The families a model YAML can name: those trained here and loaded from T5X checkpoints.
FAMILIES = {name: families.get(name).config_class for name in families.with_weights("checkpoint")}


class ConfigError(ValueError):
    """A config file is malformed: names the file and the offending key."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataConfig:
    task: str = "ding_ende"  # seqio task name (registered by pipelines.tasks)
    source: str = "seqio"  # "seqio": the task; "tsv": TSV + SentencePiece directly (no TF);
    #                        "lm": one side of the Ding split as plain text (decoder-only LMs)
    lm_side: str = "en"  # source "lm": "en" or "de", deduplicated lines, loss on every token
    data_dir: str = "assets/data/ding"  # the Ding TSV splits
    vocab_path: str = "assets/spm/ende.model"  # SentencePiece model (pad=0, eos=1, unk=2)
    max_input_length: int = 64  # longer inputs are trimmed (EOS kept last)
    max_target_length: int = 64  # longer targets are trimmed (EOS kept last)
    sentence_weight: float = 1.0  # sampling weight of full-sentence pairs vs phrases (1)
    eval_split: str = "validation"
    length_buckets: tuple[int, ...] = ()  # padded lengths of both sides (each capped at its
    #                                       max length); () = automatic (pipelines.train.data)
    sources: tuple[str, ...] = ()  # source "debian": only these corpus sources (e.g.
    #                                [ddtp, lohelp]); () = every source in counts.json


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    seed: int = 0
    max_steps: int = 20_000  # total optimizer steps (--max-steps overrides)
    tokens_per_batch: int = 2048  # padded encoder tokens per batch (batch size per bucket)
    max_batch_size: int = 256  # cap for buckets of short examples
    optimizer: str = "adamw"  # "adamw" | "adafactor"
    learning_rate: float = 1e-3
    warmup_steps: int = 500
    schedule: str = "rsqrt"  # "rsqrt" | "cosine" | "constant" | "wsd"
    decay_steps: int = 0  # wsd: the last N steps before max_steps decay linearly to 0
    weight_decay: float = 0.0
    clip_norm: float = 1.0  # global gradient norm clip; 0 = none
    label_smoothing: float = 0.0
    z_loss: float = 0.0
    distill_weight: float = 0.0  # KL-to-teacher weight (needs `teacher`)
    distill_temperature: float = 1.0
    log_every: int = 20  # steps between progress lines / MLflow train metrics
    eval_every: int = 500  # steps between evaluations
    eval_examples: int = 512  # validation examples for loss/accuracy
    bleu_examples: int = 128  # validation examples greedily decoded for BLEU (0 = off)
    samples: int = 3  # greedy sample translations printed per evaluation
    precompile: bool = False  # compile every bucket shape's step in parallel before step 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    train_dir: str = ""  # resumable f32 checkpoints + optimizer state; "" = runs/train/<name>
    export_dir: str = ""  # params-only checkpoints to commit; "" = assets/checkpoints/<name>
    export_dtype: str = "bfloat16"  # storage dtype of the exported params
    every_steps: int = 0  # save every N steps (0 = by time only)
    every_seconds: float = 600.0  # save at least this often (0 = by steps only)
    keep: int = 2  # training checkpoints kept (exports keep only the latest)
    init_from: str = ""  # params-only checkpoint folder (e.g. another model's export, same
    #                      architecture) to start from when there is nothing to resume;
    #                      "" = random init
    init_matching: bool = False  # take from init_from only the params of the same path and
    #                      shape, the rest fresh (a draft started from one of another design)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Where Ray places the model's worker (``num_gpus``, ``resources: {TPU: 4}`` on a
    slice) and the environment variables of its process (Ray ``runtime_env``; e.g.
    ``XLA_FLAGS`` for host CPU devices)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """A ``data × model`` device mesh (T5X's 1-D partitioning: heads, MLP units and the
    vocabulary over ``model``, rows over ``data``)."""

    data: int = 1
    model: int = 1

    def __post_init__(self):
        for axis in ("data", "model"):
            if getattr(self, axis) < 1:
                raise ValueError(f"mesh.{axis} must be >= 1, got {getattr(self, axis)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFileConfig:
    """One parsed ``configs/models/<name>.yaml``."""

    name: str
    family: str
    model: t5.T5Config | decoder.DecoderConfig
    data: DataConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    teacher: str | None  # a model YAML or a checkpoint folder (resolved path), or None
    teacher_config: str | None  # model YAML for a checkpoint-folder teacher
    path: str  # the file this came from
    worker: WorkerConfig = dataclasses.field(default_factory=WorkerConfig)
    mesh: MeshConfig | None = None  # None: the model's worker uses one device
    gamma_prior: GammaPrior | None = None  # a draft's prior for --gamma auto; None: defaults
    target: str | None = None  # the model YAML whose encoder this draft reads, or None

    @property
    def train_dir(self) -> pathlib.Path:
        return resolve(self.checkpoint.train_dir or f"runs/train/{self.name}")

    @property
    def export_dir(self) -> pathlib.Path:
        return resolve(self.checkpoint.export_dir or f"assets/checkpoints/{self.name}")

    @property
    def init_from(self) -> pathlib.Path | None:
        return resolve(self.checkpoint.init_from) if self.checkpoint.init_from else None


def resolve(path: str | pathlib.Path) -> pathlib.Path:
    """A path relative to the repository root (absolute paths pass through)."""
    path = pathlib.Path(path)
    return path if path.is_absolute() else REPO_ROOT / path


def _coerce(value: Any, annotation: Any, *, key: str, file: str) -> Any:
    """Checks a YAML scalar/list against a dataclass field's type; int -> float allowed."""
    hint = annotation if not isinstance(annotation, str) else None
    if hint is None:
        return value
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{file}: {key} must be a list, got {value!r}")
        return tuple(value)
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{file}: {key} must be a mapping, got {value!r}")
        key_type, value_type = typing.get_args(hint)
        return {
            _coerce(k, key_type, key=f"{key} key", file=file): _coerce(
                v, value_type, key=f"{key}.{k}", file=file
            )
            for k, v in value.items()
        }
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not (
        isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{file}: {key} must be {hint.__name__}, got {value!r}")
    return value


def build_dataclass(cls: type, values: Mapping[str, Any] | None, *, section: str, file: str):
    """``cls(**values)`` with unknown keys and wrong types reported by key and file."""
    values = dict(values or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ConfigError(
            f"{file}: unknown key {section}.{unknown[0]} (known: {', '.join(sorted(fields))})"
        )
    coerced = {
        k: _coerce(v, hints.get(k), key=f"{section}.{k}", file=file) for k, v in values.items()
    }
    try:
        return cls(**coerced)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"{file}: invalid {section}: {error}") from error


TOP_LEVEL_KEYS = ("name", "family", "model", "data", "train", "checkpoint", "teacher")
TOP_LEVEL_KEYS += ("teacher_config", "worker", "mesh", "gamma_prior", "target")


def apply_overrides(raw: dict, overrides: Sequence[str], *, file: str) -> dict:
    """``raw`` with each ``KEY=VALUE`` / ``SECTION.KEY=VALUE`` set (VALUE read as YAML)."""
    raw = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    for override in overrides:
        key, sep, value = override.partition("=")
        section, dot, field = key.strip().partition(".")
        if not sep or not section or (dot and not field) or "." in field:
            raise ConfigError(
                f"{file}: override {override!r} is not KEY=VALUE or SECTION.KEY=VALUE"
            )
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as error:
            raise ConfigError(f"{file}: override {override!r}: bad value: {error}") from None
        if not dot:
            raw[section] = parsed
        elif section in SECTIONS:
            raw.setdefault(section, {})[field] = parsed
        else:
            raise ConfigError(
                f"{file}: override {override!r}: section must be one of {', '.join(SECTIONS)}"
            )
    return raw


SECTIONS = ("model", "data", "train", "checkpoint")


def load_model_config(path: str | pathlib.Path, overrides: Sequence[str] = ()) -> ModelFileConfig:
    """Parses one model YAML (with ``overrides`` applied); raises ConfigError naming the
    file and key on any problem."""
    path = resolve(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    file = str(path)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{file}: top level must be a mapping, got {type(raw).__name__}")
    raw = apply_overrides(raw, overrides, file=file)
    unknown = sorted(set(raw) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise ConfigError(f"{file}: unknown key {unknown[0]} (known: {', '.join(TOP_LEVEL_KEYS)})")
    family = raw.get("family", "t5")
    if family not in FAMILIES:
        raise ConfigError(f"{file}: family must be one of {sorted(FAMILIES)}, got {family!r}")
    if "model" not in raw:
        raise ConfigError(f"{file}: missing key model")
    teacher = raw.get("teacher")
    teacher_config = raw.get("teacher_config")
    model = build_dataclass(FAMILIES[family], raw["model"], section="model", file=file)
    target = None
    if raw.get("target") is not None:
        target, model = _reading_target(raw["target"], model, family, file=file)
    return ModelFileConfig(
        name=str(raw.get("name", path.stem)),
        family=family,
        model=model,
        target=target,
        data=build_dataclass(DataConfig, raw.get("data"), section="data", file=file),
        train=build_dataclass(TrainConfig, raw.get("train"), section="train", file=file),
        checkpoint=build_dataclass(
            CheckpointConfig, raw.get("checkpoint"), section="checkpoint", file=file
        ),
        teacher=str(resolve(teacher)) if teacher else None,
        teacher_config=str(resolve(teacher_config)) if teacher_config else None,
        path=file,
        worker=build_dataclass(WorkerConfig, raw.get("worker"), section="worker", file=file),
        mesh=_optional(MeshConfig, raw, "mesh", file=file),
        gamma_prior=_optional(GammaPrior, raw, "gamma_prior", file=file),
    )


def _reading_target(ref: Any, model, family: str, *, file: str):
    """(the target's YAML path, ``model`` reading the target's encoder) for ``target:``
    (a model name in configs/models, or a YAML path)."""
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{file}: target must be a model name or a model YAML, got {ref!r}")
    path = resolve(ref) if ref.endswith((".yaml", ".yml")) else MODELS_DIR / f"{ref}.yaml"
    if not path.is_file():
        raise ConfigError(f"{file}: target {ref!r}: no model config at {path}")
    target = load_model_config(path)
    if family != "t5" or target.family != "t5":
        raise ConfigError(
            f"{file}: target: a draft reads its target's encoder only when both are t5 "
            f"(here {family} and {target.family})"
        )
    source = t5.SourceEncoder(
        name=target.name, config=target.model, checkpoint=str(target.export_dir)
    )
    try:
        return str(path), dataclasses.replace(model, source_encoder=source)
    except ValueError as error:
        raise ConfigError(f"{file}: target {target.name!r}: {error}") from error


def _optional(cls: type, raw: Mapping, section: str, *, file: str):
    """``cls`` built from ``raw[section]``, or None where the file has no such section."""
    if raw.get(section) is None:
        return None
    return build_dataclass(cls, raw[section], section=section, file=file)


def param_count(config: t5.T5Config | decoder.DecoderConfig) -> int:
    """Number of parameters ``init_params`` would make (from shapes, no memory), less
    those the model shares with another (its target's encoder)."""
    import jax

    family = families.of_config(config)
    shapes = jax.eval_shape(lambda: family.init_params(config, jax.random.key(0)))
    return sum(int(x.size) for x in jax.tree.leaves(families.own_params(config, shapes)))
