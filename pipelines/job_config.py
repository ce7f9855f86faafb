"""A job's kinds and config: :class:`JobKind` (translate, summarize), :class:`JobConfig`
(everything a job needs, resolved) and :func:`make_job`, which builds one from the CLI's
flags. :mod:`pipelines.translate` runs a job; the modules that read a job's config
(reading, decoding, reporting) import it from here, below them all.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

from pipelines import record_io, text
from pipelines.model_resolver import (
    DEFAULT_DRAFT,
    DEFAULT_GAMMA,
    DEFAULT_TARGET,
    SUMMARY_DRAFT,
    SUMMARY_TARGET,
    ResolvedModel,
)
from workers.batching import DecodeSettings
from workers.engine import EngineConfig, check_models


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobKind:
    name: str  # subcommand and MLflow experiment
    prefix: str  # T5's task prefix (pipelines.text)
    fields: record_io.FieldNames  # JSONL keys of source and reference
    quality_metric: str  # "bleu" | "rouge"
    max_input_tokens: int  # default --max-input-tokens
    max_new_tokens: int  # default --max-new-tokens
    default_target: str  # default --target: the embedded model for this kind of job
    default_draft: str  # default --draft


TRANSLATE = JobKind(
    name="translate",
    prefix=text.TRANSLATE_PREFIX,
    fields=record_io.FieldNames(source=("source", "en"), reference=("reference", "de")),
    quality_metric="bleu",
    max_input_tokens=256,
    max_new_tokens=64,
    default_target=DEFAULT_TARGET,
    default_draft=DEFAULT_DRAFT,
)
SUMMARIZE = JobKind(
    name="summarize",
    prefix=text.SUMMARIZE_PREFIX,
    fields=record_io.FieldNames(
        source=("source", "article"), reference=("reference", "summary", "highlights")
    ),
    quality_metric="rouge",
    max_input_tokens=1024,
    max_new_tokens=128,
    default_target=SUMMARY_TARGET,
    default_draft=SUMMARY_DRAFT,
)
KINDS = {kind.name: kind for kind in (TRANSLATE, SUMMARIZE)}
NO_DRAFT = "none"  # --draft none: the target alone, with no draft model loaded
BATCH_SIZE_AUTO = "auto"  # --batch-size auto: chosen by the job (pipelines.batch_choice)


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobConfig:
    """Everything a job needs, resolved (models found, paths absolute)."""

    kind: JobKind
    input: str  # file path or seqio:TASK:SPLIT
    output: str  # output JSONL
    dead_letter: str  # dead-letter JSONL
    target: ResolvedModel
    draft: ResolvedModel
    vocab_path: str  # SentencePiece model
    settings: DecodeSettings  # settings.gamma: the fixed γ, or the largest --gamma auto tries
    engine: EngineConfig  # in-process or Ray, draft placement, transport, γ policy
    compare_baseline: bool = False
    max_input_tokens: int = 256
    limit: int | None = None  # read at most this many input records
    tracking_uri: str | None = None  # None: pipelines.tracking.default_tracking_uri()
    summary_json: str | None = None
    beam_args: tuple[str, ...] = ()  # Beam pipeline options (--runner=..., ...)
    progress: bool = True  # progress lines on stderr
    # compile the programs of the job's batch shapes ahead, in the background
    # (workers.warmup); False: each when a batch first needs it, on the batch's path
    warmup: bool = True
    no_draft: bool = False  # --draft none: ``draft`` is the target, never called
    # --batch-size auto: the job times the target and picks settings.batch_size before
    # it decodes (pipelines.batch_choice); settings hold the candidate 1 until then
    batch_size_auto: bool = False

    @property
    def input_eos_id(self) -> int:
        """The EOS id appended to each tokenized input (the settings' stop token, else
        T5's)."""
        return self.settings.eos_id if self.settings.eos_id is not None else text.EOS_ID


def default_summary_path(output: str) -> str:
    """``<output>.summary.json``: where a job without ``summary_json`` writes its summary
    when MLflow was unavailable (for ``specdec log-run``)."""
    return f"{output}.summary.json"


def make_job(
    kind: JobKind,
    *,
    input: str,
    output: str,
    target: str | None = None,
    draft: str | None = None,
    engine: EngineConfig | None = None,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    sampling_rule: str = "invariant",
    seed: int = 0,
    batch_size: int | str = 1,
    max_new_tokens: int | None = None,
    max_input_tokens: int | None = None,
    compare_baseline: bool = False,
    dead_letter: str | None = None,
    vocab: str | None = None,
    allow_random_init: bool = False,
    **options: Any,
) -> JobConfig:
    """Resolves models and vocabulary and validates settings into a JobConfig.

    ``engine`` (validated when it was built; default: on Ray, γ = DEFAULT_GAMMA) says how
    the job decodes: in-process or on Ray, and γ fixed or ``"auto"``: chosen per batch in
    0..``gamma_max`` from the job's measurements (workers.gamma). ``batch_size`` is a
    number or ``"auto"`` (chosen when the job runs: :mod:`pipelines.batch_choice`).
    ``target``/``draft`` default to the kind's embedded pair; ``options`` are the remaining
    JobConfig fields (limit, tracking_uri, summary_json, beam_args, ...).
    Raises ValueError (ModelResolutionError, ConfigError, ...) with a message for users.
    """
    from pipelines import model_resolver
    from specdec_core.sampling import SamplingConfig

    engine = engine or EngineConfig(gamma=DEFAULT_GAMMA)
    batch_size_auto = batch_size == BATCH_SIZE_AUTO
    if not batch_size_auto and not (isinstance(batch_size, int) and batch_size >= 1):
        raise ValueError(f"batch_size must be >= 1 or {BATCH_SIZE_AUTO!r}, got {batch_size!r}")
    resolved = {
        "target": model_resolver.resolve_model(
            target or kind.default_target, role="target", allow_random_init=allow_random_init
        )
    }
    no_draft = draft == NO_DRAFT
    if no_draft:
        if not engine.target_alone:
            raise ValueError(
                f"--draft {NO_DRAFT} runs the target alone: use it with --gamma 0 (or "
                f"without --gamma), not --gamma {engine.gamma}"
            )
        # The engines take a draft: the target stands in, and at γ = 0 it is never
        # called; it shares the target's loaded model (in-process, and in the target's
        # actor with the draft placed there).
        resolved["draft"] = resolved["target"]
        if engine.kind == "ray":
            engine = dataclasses.replace(engine, draft_placement="target")
    else:
        resolved["draft"] = model_resolver.resolve_model(
            draft or kind.default_draft,
            role="draft",
            allow_random_init=allow_random_init,
            init_seed=1,
            vocab_size=resolved["target"].spec.config.vocab_size,
        )
    vocab_path = str(vocab or resolved["target"].vocab_path or model_resolver.DEFAULT_VOCAB)
    pieces = text.sentencepiece(vocab_path).get_piece_size()
    model_resolver.check_pair(resolved["target"], resolved["draft"], vocab_size=pieces)
    check_models(engine, target=resolved["target"].spec, draft=resolved["draft"].spec)
    settings = DecodeSettings(
        gamma=engine.max_gamma,
        sampling=SamplingConfig(
            temperature=temperature, top_k=top_k, top_p=top_p, rule=sampling_rule
        ),
        seed=seed,
        max_new_tokens=max_new_tokens or kind.max_new_tokens,
        batch_size=1 if batch_size_auto else batch_size,
    )
    output = _absolute(output)
    return JobConfig(
        kind=kind,
        input=input,
        output=output,
        dead_letter=_absolute(dead_letter or record_io.default_dead_letter_path(output)),
        target=resolved["target"],
        draft=resolved["draft"],
        vocab_path=vocab_path,
        settings=settings,
        engine=engine,
        compare_baseline=compare_baseline,
        max_input_tokens=max_input_tokens or kind.max_input_tokens,
        no_draft=no_draft,
        batch_size_auto=batch_size_auto,
        **options,
    )


def _absolute(path: str) -> str:
    """Local paths made absolute (Beam writes through temp folders); URLs unchanged."""
    return path if "://" in path else str(pathlib.Path(path).resolve())
