"""``--target`` / ``--draft`` values -> :class:`workers.spec.ModelSpec`.

A model reference is one of

- a **model config name**: ``configs/models/NAME.yaml`` (``ende_target_debian``,
  ``ende_draft_debian_seq2``, ...), read with the strict loader of :mod:`pipelines.configs`;
  its checkpoint is the config's export folder (``assets/checkpoints/NAME``);
- a **path** to a model config YAML (anything ending in ``.yaml``/``.yml`` or holding a
  path separator);
- a **registry preset** (:mod:`specdec_core.models.registry`), optionally with config
  overrides: ``t5_tiny_test:vocab_size=8000,num_decoder_layers=1`` (values parsed as
  YAML scalars; ``init_seed=N`` sets the random init's seed).

- a **copy draft** (drafts only; :mod:`specdec_core.models.prompt_lookup`):
  ``copy[:OPTIONS][+MODEL]``. OPTIONS as a preset's overrides: ``n`` (= ``n_max``, the
  longest suffix looked up, default 3), ``n_min`` (default 1), ``fallback`` (the token
  proposed where nothing matches, default 1: T5's EOS), ``vocab_size`` (default: the
  backoff model's, else the job's target's, else the default target's). ``+MODEL`` (any
  reference above) makes it "copy first, MODEL when no match": ``copy:n=3+summ_draft``.

A preset has no weights, and neither does a config whose checkpoint is not there yet:
both need ``allow_random_init`` (the ``--allow-random-init`` test flag), otherwise
resolution fails saying which checkpoint is needed. Unknown names fail listing the
known config names and presets.

YAML files (a study's grid) name models with :func:`resolve_model_entry`: a config name
or path as above, or a mapping ``{preset: NAME, checkpoint: FOLDER, overrides: {field:
value}, name: LABEL}`` that gives a registry preset the T5X checkpoint of its param tree;
``{config: NAME_OR_PATH, name: LABEL}`` names a model config the same way.
``random_init: true`` (with ``init_seed``) runs untrained weights, for tests. A missing
checkpoint raises :class:`MissingCheckpointError`, so a caller can leave the model out.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from workers.spec import ModelSpec, Placement, check_draft_target, check_shared_vocabulary

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO_ROOT / "configs" / "models"
# The embedded pairs that jobs default to (configs/models, exports in assets/checkpoints):
DEFAULT_TARGET = "ende_target_debian"  # En->De on the Debian corpus
DEFAULT_DRAFT = "ende_draft_debian_seq2"  # KL-distilled from it, then on its outputs (BENCHMARKS)
SUMMARY_TARGET = "summ_target"  # description -> synopsis on Debian's package descriptions
SUMMARY_DRAFT = "summ_draft"  # KL-distilled from it (BENCHMARKS, Summarizer pair)
DEFAULT_GAMMA = 2  # the best fixed γ measured for the default pair (BENCHMARKS "Automatic γ")
DEFAULT_VOCAB = REPO_ROOT / "assets" / "spm" / "ende.model"
COPY_DRAFT = "copy"  # the copy draft's name in a model reference (see the module docstring)
_COPY_OPTIONS = {"n": "n_max", "n_max": "n_max", "n_min": "n_min", "fallback": "fallback_token"}


class ModelResolutionError(ValueError):
    """A model reference names nothing usable (unknown, no checkpoint, bad override)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResolvedModel:
    spec: ModelSpec
    source: str  # the config file, or "preset:NAME[:overrides]"
    vocab_path: str | None  # the config's SentencePiece model; None for presets
    random_init: bool  # True: no checkpoint, params from spec.init_seed

    def describe(self) -> dict[str, Any]:
        """Names and locations, for MLflow params and the printed summary."""
        return {
            "name": self.spec.name,
            "family": self.spec.family,
            "source": self.source,
            "checkpoint": self.spec.checkpoint or f"random init (seed {self.spec.init_seed})",
        }


def config_names() -> list[str]:
    """Model config names under ``configs/models``."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")) if CONFIG_DIR.is_dir() else []


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref


def resolve_model(
    ref: str,
    *,
    role: str,
    allow_random_init: bool = False,
    init_seed: int = 0,
    vocab_size: int | None = None,
) -> ResolvedModel:
    """Resolves one ``--target``/``--draft`` value (``role`` names the flag in errors).

    ``vocab_size``: the target's, when it is known; a copy draft without a backoff model
    or its own ``vocab_size`` option takes it (else the default target's)."""
    from specdec_core.models import registry

    if _is_copy_ref(ref):  # before paths: copy+a/b.yaml
        return _copy_draft(
            ref,
            role=role,
            allow_random_init=allow_random_init,
            init_seed=init_seed,
            vocab_size=vocab_size,
        )
    if _looks_like_path(ref):
        return _from_config_file(pathlib.Path(ref), role=role, allow_random_init=allow_random_init)
    if ref in config_names():
        return _from_config_file(
            CONFIG_DIR / f"{ref}.yaml", role=role, allow_random_init=allow_random_init
        )
    name = ref.split(":", 1)[0]
    if name in registry.names():
        return _from_preset(ref, role=role, allow_random_init=allow_random_init, seed=init_seed)
    raise ModelResolutionError(
        f"--{role}: unknown model {ref!r}. Model configs (configs/models): "
        f"{', '.join(config_names()) or 'none'}; registry presets: {', '.join(registry.names())}; "
        "or give a path to a model config YAML; drafts also: copy[:n=3][+MODEL]"
    )


def _has_checkpoint(folder: pathlib.Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _from_config_file(path: pathlib.Path, *, role: str, allow_random_init: bool) -> ResolvedModel:
    from pipelines import configs

    if not path.is_absolute() and not path.exists():
        path = REPO_ROOT / path  # a repository path given from another folder
    if not path.is_file():
        raise ModelResolutionError(f"--{role}: model config not found: {path}")
    model_file = configs.load_model_config(path.resolve())
    checkpoint = model_file.export_dir
    random_init = not _has_checkpoint(checkpoint)
    if random_init and not allow_random_init:
        raise ModelResolutionError(
            f"--{role}: model {model_file.name!r} ({model_file.path}) has no checkpoint at "
            f"{checkpoint}; train it with `specdec train --config {model_file.path}` "
            "(or pass --allow-random-init to run untrained weights, for tests only)"
        )
    worker, mesh = model_file.worker, model_file.mesh
    spec = ModelSpec(
        name=model_file.name,
        family=model_file.family,
        config=model_file.model,
        checkpoint=None if random_init else str(checkpoint),
        init_seed=0,
        placement=Placement(
            num_cpus=worker.num_cpus,
            num_gpus=worker.num_gpus,
            resources=tuple(sorted(worker.resources.items())),
            env=tuple(sorted(worker.env.items())),
        ),
        mesh=None if mesh is None else (mesh.data, mesh.model),
        gamma_prior=model_file.gamma_prior,
    )
    vocab = str(configs.resolve(model_file.data.vocab_path))
    return ResolvedModel(
        spec=spec, source=model_file.path, vocab_path=vocab, random_init=random_init
    )


def parse_overrides(text: str, *, role: str) -> dict[str, Any]:
    """``a=1,b=x`` -> ``{"a": 1, "b": "x"}`` (values as YAML scalars)."""
    overrides: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ModelResolutionError(
                f"--{role}: override {item!r} is not key=value (e.g. t5_tiny_test:vocab_size=8000)"
            )
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def _from_preset(ref: str, *, role: str, allow_random_init: bool, seed: int) -> ResolvedModel:
    from specdec_core.models import registry

    name, _, override_text = ref.partition(":")
    if not allow_random_init:
        raise ModelResolutionError(
            f"--{role}: {name!r} is a registry preset: it has an architecture but no "
            "checkpoint. Give a model config with a trained checkpoint "
            f"({', '.join(config_names()) or 'configs/models/*.yaml'}), "
            "or pass --allow-random-init to run random weights (tests only)"
        )
    overrides = parse_overrides(override_text, role=role)
    init_seed = int(overrides.pop("init_seed", seed))
    try:
        config = registry.get_config(name, **overrides)
    except (ValueError, TypeError) as error:
        raise ModelResolutionError(f"--{role}: {error}") from error
    family = registry.PRESETS[name].family
    spec = ModelSpec(name=name, family=family, config=config, checkpoint=None, init_seed=init_seed)
    return ResolvedModel(spec=spec, source=f"preset:{ref}", vocab_path=None, random_init=True)


def _is_copy_ref(ref: str) -> bool:
    """``copy``, ``copy:OPTIONS``, ``copy+MODEL``, ``copy:OPTIONS+MODEL``."""
    return ref.split(":", 1)[0].split("+", 1)[0] == COPY_DRAFT


def _copy_draft(
    ref: str, *, role: str, allow_random_init: bool, init_seed: int, vocab_size: int | None
) -> ResolvedModel:
    """``copy[:OPTIONS][+MODEL]`` -> a ModelSpec of family ``copy`` (module docstring)."""
    from specdec_core.models import prompt_lookup

    if role != "draft":
        raise ModelResolutionError(
            f"--{role}: {ref!r} is the copy draft; it can only be given as --draft"
        )
    head, plus, backoff_ref = ref.partition("+")
    _, _, option_text = head.partition(":")
    options = parse_overrides(option_text, role=role)
    fields: dict[str, Any] = {}
    for key, value in options.items():
        if key not in (*_COPY_OPTIONS, "vocab_size"):
            raise ModelResolutionError(
                f"--{role}: unknown copy draft option {key!r}; options: n (= n_max), n_min, "
                "fallback, vocab_size (e.g. copy:n=3 or copy:n=3+summ_draft)"
            )
        if not isinstance(value, int) or isinstance(value, bool):
            raise ModelResolutionError(
                f"--{role}: copy draft option {key}={value!r} must be an integer"
            )
        fields[_COPY_OPTIONS.get(key, key)] = value
    backoff = None
    if plus:
        if not backoff_ref:
            raise ModelResolutionError(
                f"--{role}: {ref!r} ends in '+': name the model draft after it "
                "(e.g. copy+summ_draft)"
            )
        if _is_copy_ref(backoff_ref):
            raise ModelResolutionError(f"--{role}: a copy draft cannot back off to a copy draft")
        inner = resolve_model(
            backoff_ref, role=role, allow_random_init=allow_random_init, init_seed=init_seed
        )
        backoff = prompt_lookup.BackoffSpec(
            name=inner.spec.name,
            family=inner.spec.family,
            config=inner.spec.config,
            checkpoint=inner.spec.checkpoint,
            init_seed=inner.spec.init_seed,
        )
        fields.setdefault("vocab_size", inner.spec.config.vocab_size)
    else:
        fields.setdefault("vocab_size", vocab_size or _default_target_vocab_size())
    try:
        config = prompt_lookup.PromptLookupConfig(backoff=backoff, **fields)
    except ValueError as error:
        raise ModelResolutionError(f"--{role}: {error}") from error
    name = COPY_DRAFT if backoff is None else f"{COPY_DRAFT}+{backoff.name}"
    spec = ModelSpec(name=name, family=prompt_lookup.FAMILY, config=config, checkpoint=None)
    return ResolvedModel(
        spec=spec,
        source=f"copy:{ref}",
        vocab_path=None,
        random_init=backoff is not None and backoff.checkpoint is None,
    )


def _default_target_vocab_size() -> int:
    from pipelines import configs

    return configs.load_model_config(CONFIG_DIR / f"{DEFAULT_TARGET}.yaml").model.vocab_size


def check_pair(target: ResolvedModel, draft: ResolvedModel, *, vocab_size: int) -> None:
    """Both models encoder-decoder, one vocabulary size, large enough for the tokenizer.

    A copy draft passes as encoder-decoder (it reads the encoder tokens); its backoff
    model, if any, must be one."""
    from specdec_core.models import families

    for role, model in (("target", target), ("draft", draft)):
        family = families.get(model.spec.family)
        # a target runs the encoder itself; a draft may also read or ignore the encoder
        # tokens (a copy draft does, unless its backoff model is decoder-only)
        if role == "target":
            fits = family.is_encoder_decoder
        else:
            fits = family.serves_encoder_decoder(model.spec.config)
        if not fits:
            backoff = getattr(model.spec.config, "backoff", None)
            kind = family.name if backoff is None else backoff.family
            raise ModelResolutionError(
                f"--{role}: {model.spec.name!r} is a {kind} model; translate and "
                "summarize jobs run encoder-decoder (t5) models"
            )
        if model.spec.config.vocab_size < vocab_size:
            raise ModelResolutionError(
                f"--{role}: {model.spec.name!r} has vocab_size {model.spec.config.vocab_size} "
                f"but the SentencePiece model has {vocab_size} pieces"
            )
    target_vocab = target.spec.config.vocab_size
    try:
        check_draft_target(target.spec.name, draft.spec.name, draft.spec.config)
    except ValueError as error:
        raise ModelResolutionError(f"--draft: {error}") from None
    try:
        check_shared_vocabulary(
            target.spec.name, target_vocab, draft.spec.name, draft.spec.config.vocab_size
        )
    except ValueError as error:
        copy_only = (
            families.get(draft.spec.family).weights == "backoff"
            and draft.spec.config.backoff is None
        )
        hint = f" (give copy:vocab_size={target_vocab})" if copy_only else ""
        raise ModelResolutionError(f"{error}{hint}") from None


# ------------------------------------------------------------------ models named in YAML files

ENTRY_KEYS = ("preset", "config", "checkpoint", "overrides", "random_init", "init_seed", "name")


class MissingCheckpointError(ModelResolutionError):
    """The reference names a real model, but it has no weights to load."""


def latest_checkpoint_step(folder: pathlib.Path) -> pathlib.Path:
    """An export folder -> its newest ``checkpoint_<step>`` (so runs record the step)."""
    steps = [
        (int(child.name.split("_")[1]), child)
        for child in folder.glob("checkpoint_*")
        if child.is_dir() and child.name.split("_")[1].isdigit()
    ]
    return max(steps)[1] if steps else folder


def resolve_model_entry(
    value: Any, *, where: str, also: Sequence[str] = (), vocab_size: int | None = None
) -> ResolvedModel:
    """A model named in a YAML file -> ResolvedModel (module docstring); every error
    starts with ``where`` (e.g. ``grid[0].target``). ``also``: names the caller resolves
    itself (n-gram drafts), listed beside the config names when a name is unknown. A
    copy draft (``copy[:OPTIONS][+MODEL]``) takes ``vocab_size`` (the target's) as
    ``resolve_model`` does.

    Unlike a ``--target`` value a preset needs weights (``checkpoint``) unless
    ``random_init`` is set, and ``random_init`` runs untrained weights even where a
    checkpoint exists. Checkpoints resolve to their newest step folder."""
    from specdec_core.models import registry

    def fail(message: str, kind: type[ModelResolutionError] = ModelResolutionError):
        raise kind(f"{where}: {message}")

    if isinstance(value, Mapping):
        unknown = sorted(set(value) - set(ENTRY_KEYS))
        if unknown:
            fail(f"unknown key {unknown[0]} (known: {', '.join(ENTRY_KEYS)})")
        if ("preset" in value) == ("config" in value):
            fail("a model mapping needs exactly one of preset or config")
        if "preset" in value:
            return _preset_entry(value, fail=fail)
        for key in ("checkpoint", "overrides"):
            if key in value:
                fail(f"{key} applies to a preset; a model config's checkpoint is its export folder")
        return _config_entry(str(value["config"]), value, fail=fail)
    if not isinstance(value, str):
        fail(f"a model is a name or a mapping, got {value!r}")
    if _is_copy_ref(value):
        try:
            return resolve_model(value, role="draft", vocab_size=vocab_size)
        except ModelResolutionError as error:
            fail(str(error).removeprefix("--draft: "))
    if _looks_like_path(value) or value in config_names():
        return _config_entry(value, {}, fail=fail)
    if value in registry.names():
        fail(_preset_without_checkpoint(value), MissingCheckpointError)
    fail(
        f"unknown model {value!r}; model configs and drafts: "
        f"{', '.join([*config_names(), *also])}; presets (as {{preset: NAME, "
        f"checkpoint: ...}}): {', '.join(registry.names())}"
    )


def _preset_without_checkpoint(preset: str) -> str:
    return (
        f"{preset!r} is a registry preset: it has an architecture but no weights. Provide a "
        f"T5X checkpoint of its param tree (specdec_core/models/decoder.py or t5.py; e.g. "
        f"from checkpoints.import_hf_gpt2 or pipelines.train) as "
        f"`{{preset: {preset}, checkpoint: <folder with checkpoint_<step>>}}`, or name a model "
        f"config (configs/models/*.yaml) whose export folder holds one"
    )


def _preset_entry(raw: Mapping, *, fail) -> ResolvedModel:
    """``{preset, checkpoint | random_init, overrides, init_seed, name}``."""
    from pipelines import configs
    from specdec_core.models import registry

    name = raw["preset"]
    if name not in registry.names():
        fail(f"unknown preset {name!r}; presets: {', '.join(registry.names())}")
    try:
        config = registry.get_config(name, **dict(raw.get("overrides") or {}))
    except (TypeError, ValueError) as error:
        fail(str(error))
    checkpoint, random_init = raw.get("checkpoint"), bool(raw.get("random_init"))
    if random_init and checkpoint:
        fail("give either checkpoint or random_init, not both")
    if not random_init:
        if not checkpoint:
            fail(_preset_without_checkpoint(name), MissingCheckpointError)
        folder = configs.resolve(checkpoint)
        if not folder.exists():
            fail(f"checkpoint not found: {folder}", MissingCheckpointError)
        checkpoint = str(latest_checkpoint_step(folder))
    spec = ModelSpec(
        name=str(raw.get("name", name)),
        family=registry.PRESETS[name].family,
        config=config,
        checkpoint=checkpoint,
        init_seed=int(raw.get("init_seed", 0)),
    )
    return ResolvedModel(
        spec=spec, source=f"preset:{name}", vocab_path=None, random_init=random_init
    )


def _config_entry(ref: str, raw: Mapping, *, fail) -> ResolvedModel:
    """A model config (name or path); its checkpoint is the config's export folder."""
    from pipelines import configs

    path = pathlib.Path(ref) if _looks_like_path(ref) else CONFIG_DIR / f"{ref}.yaml"
    path = configs.resolve(path)
    if not path.is_file():
        fail(f"model config not found: {path}")
    model_file = configs.load_model_config(path)
    random_init = bool(raw.get("random_init"))
    if not random_init and not _has_checkpoint(model_file.export_dir):
        fail(
            f"model {model_file.name!r} ({model_file.path}) has no checkpoint at "
            f"{model_file.export_dir}; train it (python -m pipelines.train --config "
            f"{model_file.path}) or copy a T5X checkpoint there",
            MissingCheckpointError,
        )
    spec = ModelSpec(
        name=str(raw.get("name", model_file.name)),
        family=model_file.family,
        config=model_file.model,
        checkpoint=None if random_init else str(latest_checkpoint_step(model_file.export_dir)),
        init_seed=int(raw.get("init_seed", 0)),
    )
    vocab = str(configs.resolve(model_file.data.vocab_path))
    return ResolvedModel(
        spec=spec, source=model_file.path, vocab_path=vocab, random_init=random_init
    )
