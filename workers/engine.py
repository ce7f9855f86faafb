"""Engines: what a job calls to decode a batch of requests.

:class:`EngineConfig` says how a job's engine runs (in-process or on Ray, where the
draft lives, how the loop's calls travel, the Ray cluster, fixed γ or ``auto``); it is
validated once, when it is built, and :func:`workers.engines.build_engine` turns it into
an engine.
Two implementations of one interface (``generate`` speculative, ``generate_baseline``
target alone, ``close``):

- :class:`InProcessEngine` runs both models in the calling process with
  :func:`specdec_core.decoding.speculative_generate`, by default as one compiled loop
  (``compiled=False``: the host loop, which also splits the time into draft / target /
  overhead);
- :class:`workers.ray_engine.RayEngine` hosts the draft and the target in separate
  Ray actors driven by a speculative coordinator.

Given the same settings and requests both produce the same tokens: every random draw
derives from (job seed, request key, tokens generated).
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import time
from collections.abc import Sequence

from specdec_core import costs, decoding
from specdec_core.models.bound import BoundModel
from specdec_core.validation import check_choice
from workers import warmup
from workers.batching import DecodeSettings, Generation, PackedBatch, Request, pack, unpack
from workers.gamma import DEFAULT_GAMMA_MAX, at_gamma
from workers.spec import (
    DEFAULT_DRAFT_PLACEMENT,
    DEFAULT_TRANSPORT,
    DRAFT_PLACEMENTS,
    ENGINE_KINDS,
    TRANSPORTS,
    ModelSpec,
    check_draft_target,
    check_shared_vocabulary,
)

AUTO = "auto"  # γ chosen per batch (workers.gamma.AdaptiveGamma)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How a job's engine runs; every field is checked here, once, naming its flag.

    ``gamma``: drafted tokens per iteration, or ``"auto"``: chosen per batch in
    0..``gamma_max`` (default :data:`workers.gamma.DEFAULT_GAMMA_MAX`) from what the job
    measures. ``draft_placement``, ``transport`` and ``ray_address`` matter to ``kind
    "ray"`` only (:class:`workers.ray_engine.RayEngine`).
    """

    kind: str = "ray"  # --workers: "ray" (Ray actors) | "inprocess"
    draft_placement: str = DEFAULT_DRAFT_PLACEMENT  # --draft-placement: DRAFT_PLACEMENTS
    transport: str = DEFAULT_TRANSPORT  # --transport: TRANSPORTS
    ray_address: str | None = None  # --ray-address: join this cluster; None: a local one
    gamma: int | str = AUTO  # --gamma: an integer >= 0 (0: the target alone) or "auto"
    gamma_max: int | None = None  # --gamma-max: the largest γ "auto" tries
    pipelined: bool = False  # --pipelined: the draft proposes ahead (placement coordinator/worker)

    def __post_init__(self):
        if self.kind not in ENGINE_KINDS:
            raise ValueError(f"--workers must be ray or inprocess, got {self.kind!r}")
        check_choice("--draft-placement", self.draft_placement, DRAFT_PLACEMENTS)
        check_choice("--transport", self.transport, TRANSPORTS)
        if self.pipelined and (self.kind != "ray" or self.draft_placement == "target"):
            raise ValueError(
                "--pipelined needs --workers ray and --draft-placement coordinator or worker "
                "(the draft then runs in its own process, beside the target's; with "
                f"--workers {self.kind} --draft-placement {self.draft_placement} it does not)"
            )
        if self.gamma == AUTO:
            if self.gamma_max is None:
                object.__setattr__(self, "gamma_max", DEFAULT_GAMMA_MAX)
            elif not _is_int(self.gamma_max) or self.gamma_max < 1:
                raise ValueError(f"--gamma-max must be >= 1, got {self.gamma_max!r}")
        elif not _is_int(self.gamma) or self.gamma < 0:
            raise ValueError(f"--gamma must be an integer >= 0 or 'auto', got {self.gamma!r}")
        elif self.gamma_max is not None:
            raise ValueError("--gamma-max is for --gamma auto only")
        if self.gamma == 0 and self.pipelined:
            raise ValueError("--pipelined needs a draft to propose: --gamma auto or >= 1, not 0")

    @property
    def adaptive(self) -> bool:
        """γ chosen per batch (``--gamma auto``)."""
        return self.gamma == AUTO

    @property
    def target_alone(self) -> bool:
        """Every batch by the target alone (``--gamma 0``)."""
        return self.gamma == 0

    @property
    def max_gamma(self) -> int:
        """The γ the job's DecodeSettings carry: the fixed γ, or the largest ``auto`` tries
        (1 for ``--gamma 0``, whose batches never draft: the settings' γ sizes caches)."""
        return self.gamma_max if self.adaptive else max(self.gamma, 1)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_models(config: EngineConfig, *, target: ModelSpec, draft: ModelSpec) -> None:
    """A model with a ``mesh`` runs in a Ray worker of its own: in-process, both models
    share one process and one compiled loop. Raises ValueError naming the model."""
    if config.kind == "ray":
        return
    for role, spec in (("target", target), ("draft", draft)):
        if spec.mesh is not None:
            raise ValueError(
                f"--{role} {spec.name!r} has a mesh ({spec.mesh[0]}x{spec.mesh[1]}): a sharded "
                "model runs in a Ray worker of its own; use --workers ray"
            )


def _checkpoint_version(spec: ModelSpec) -> int | None:
    """mtime of the checkpoint folder: a new export (a new checkpoint_<step>) changes it."""
    if spec.checkpoint is None:
        return None
    path = pathlib.Path(spec.checkpoint)
    return path.stat().st_mtime_ns if path.exists() else None


@functools.lru_cache(maxsize=4)
def _cached_model(spec: ModelSpec, version: int | None) -> BoundModel:
    del version  # part of the cache key only
    return spec.load()


def bound_model(spec: ModelSpec) -> BoundModel:
    """One BoundModel per spec (and checkpoint version) per process: compiled steps are
    cached per model object, so repeated in-process jobs (tests, notebooks) do not
    recompile."""
    return _cached_model(spec, _checkpoint_version(spec))


def load_models(*specs: ModelSpec) -> list[BoundModel]:
    """Each spec's BoundModel, loaded into this process's model cache (which
    :func:`measure_step_costs` and in-process engines read)."""
    return [bound_model(spec) for spec in specs]


def clear_model_cache() -> None:
    """Forgets the BoundModels built in this process (:func:`bound_model`)."""
    _cached_model.cache_clear()


PROBE_REPEATS = 8  # model calls per timed run of the cost probe


def measure_step_costs(
    target: ModelSpec,
    draft: ModelSpec,
    settings: DecodeSettings,
    request: Request,
    *,
    ks: Sequence[int],
    repeats: int = PROBE_REPEATS,
):
    """The cost model's inputs (``theory.StepCosts``), measured in this process on the
    job's models (:func:`probe_costs`; for a Ray job they load here: this host's figures,
    not those of the workers' devices, which :meth:`workers.ray_engine.RayEngine.step_costs`
    gives while the workers run)."""
    return probe_costs(
        bound_model(target), bound_model(draft), settings, request, ks=ks, repeats=repeats
    )


def probe_batch(request: Request, settings: DecodeSettings) -> PackedBatch:
    """The batch the cost probe times: ``settings.batch_size`` copies of ``request``,
    packed as the engine packs a batch (its rows and cache length)."""
    return pack([request] * settings.batch_size, settings)


def probe_costs(
    target: BoundModel,
    draft: BoundModel,
    settings: DecodeSettings,
    request: Request,
    *,
    ks: Sequence[int],
    repeats: int = PROBE_REPEATS,
):
    """The target on each k of ``ks`` tokens and one draft step, timed on decode-sized
    caches of :func:`probe_batch`, as the compiled loop calls them
    (``specdec_core.costs.step_costs``)."""
    from specdec_core import costs

    batch = probe_batch(request, settings)
    return costs.step_costs(
        target,
        draft,
        batch.encoder_tokens,
        ks=ks,
        cache_len=batch.max_len,
        batch=batch.size,
        repeats=repeats,
    )


def _new_cache(model: BoundModel, batch: PackedBatch, *, source_cache=None):
    """``model``'s decoder cache for ``batch`` (its encoder run on the batch's encoder
    tokens); a draft that reads the target's encoder reads ``source_cache``'s output."""
    args = (batch.encoder_tokens, batch.prompt_tokens.shape[0], batch.max_len)
    if getattr(model.config, "source_encoder", None) is not None and source_cache is not None:
        return model.new_cache(*args, source_cache=source_cache)
    return model.new_cache(*args)


def _decode_args(target: BoundModel, batch: PackedBatch, settings: DecodeSettings) -> dict:
    """The keywords both decoding loops take: the target (its encoder run), the batch
    and the sampling."""
    return dict(
        target=target.forward,
        target_cache=_new_cache(target, batch),
        prompt_tokens=batch.prompt_tokens,
        prompt_lengths=batch.prompt_lengths,
        request_ids=batch.request_keys,
        max_new_tokens=batch.max_new_tokens,
        **settings.sampling_kwargs,
    )


def decode_speculative(
    target: BoundModel,
    draft: BoundModel,
    batch: PackedBatch,
    settings: DecodeSettings,
    *,
    compiled: bool = False,
    dry_run: bool = False,
) -> decoding.DecodeResult:
    """One packed batch through the in-process speculative loop (encoders included),
    with the seconds it spent compiling (``compile_s``); ``dry_run``: its programs
    compiled and run, nothing generated (:mod:`workers.warmup`)."""
    with costs.compile_clock() as compiling:
        args = _decode_args(target, batch, settings)
        result = decoding.speculative_generate(
            **args,
            draft=draft.forward,
            draft_cache=_new_cache(draft, batch, source_cache=args["target_cache"]),
            gamma=settings.gamma,
            compiled=compiled,
            slots=settings.slots if compiled else None,
            dry_run=dry_run,
        )
    return result.replace(compile_s=compiling())


def decode_baseline(
    target: BoundModel, batch: PackedBatch, settings: DecodeSettings, *, dry_run: bool = False
) -> decoding.DecodeResult:
    """One packed batch decoded by the target alone (encoder included), with the
    seconds it spent compiling (``compile_s``); ``dry_run`` as :func:`decode_speculative`'s."""
    with costs.compile_clock() as compiling:
        result = decoding.autoregressive_generate(
            **_decode_args(target, batch, settings), dry_run=dry_run
        )
    return result.replace(compile_s=compiling())


def warm_programs(
    target: BoundModel,
    draft: BoundModel | None,
    settings: DecodeSettings,
    encoder_lengths: Sequence[int],
    prompt_tokens: tuple[int, ...],
    *,
    loops: Sequence[DecodeSettings],
    eager: bool,
    compiled: bool = True,
) -> warmup.Warmup:
    """A :class:`workers.warmup.Warmup` of the job's programs on these models for each
    encoder width bucket of ``encoder_lengths`` (the records'), at the job's batch size:
    the target alone's at once; the speculative ``loops``' at once where ``eager``, else
    each shape's when the policy buys it (:meth:`workers.warmup.Warmup.buy`)."""
    requests = warmup.shape_requests(encoder_lengths, prompt_tokens)
    alone, by_shape = warmup.programs(
        [pack([request], settings) for request in requests],
        baseline=lambda b: decode_baseline(target, b, settings, dry_run=True),
        loop=lambda b, s: decode_speculative(target, draft, b, s, compiled=compiled, dry_run=True),
        loops=loops if draft is not None else (),
    )
    if eager:
        return warmup.Warmup(alone + [p for shape in by_shape.values() for p in shape])
    return warmup.Warmup(alone, on_demand=by_shape)


class InProcessEngine:
    """Draft and target in this process; ``compiled``: the whole speculative loop as one
    compiled call (the same tokens as the host loop, without a host round trip per
    iteration). ``gamma_policy`` (:class:`workers.gamma.AdaptiveGamma`): γ chosen per
    batch (0: the target alone), ``settings.gamma`` being the largest."""

    def __init__(
        self,
        target: BoundModel,
        draft: BoundModel,
        settings: DecodeSettings,
        *,
        compiled: bool = True,
        gamma_policy=None,
    ):
        check_shared_vocabulary(target.name, target.vocab_size, draft.name, draft.vocab_size)
        check_draft_target(target.name, draft.name, draft.config)
        self.target, self.draft, self.settings = target, draft, settings
        self.compiled, self.gamma_policy = compiled, gamma_policy
        self.warmup: warmup.Warmup | None = None  # the job's programs compiled ahead (warm)

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        self._settle(batch, loop=self.gamma_policy is None)
        if self.gamma_policy is not None:
            result, _, seconds = self.gamma_policy.decode(
                batch,
                lambda gamma: self._speculative(batch, gamma),
                lambda: warmup.beside(
                    self.warmup, lambda: decode_baseline(self.target, batch, self.settings)
                ),
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = decode_speculative(
            self.target, self.draft, batch, self.settings, compiled=self.compiled
        )
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def _speculative(self, batch: PackedBatch, gamma: int) -> decoding.DecodeResult:
        self._settle(batch, loop=True)
        settings = at_gamma(self.settings, gamma, rows=batch.prompt_tokens.shape[0])
        return warmup.beside(
            self.warmup,
            lambda: decode_speculative(
                self.target, self.draft, batch, settings, compiled=self.compiled
            ),
        )

    def generate_baseline(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        self._settle(batch, loop=False)
        if self.gamma_policy is not None:  # its time per step is the γ = 0 cost
            result, seconds = self.gamma_policy.decode_baseline(
                batch,
                lambda: warmup.beside(
                    self.warmup, lambda: decode_baseline(self.target, batch, self.settings)
                ),
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = decode_baseline(self.target, batch, self.settings)
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def warm(self, encoder_lengths: Sequence[int], prompt_tokens: tuple[int, ...]) -> None:
        """Compiles the programs of the job's batch shapes in the background
        (:mod:`workers.warmup`): one per encoder width bucket of ``encoder_lengths``;
        returns once the first batch's target-alone program is warm."""
        self.warmup = warm_programs(
            self.target,
            self.draft,
            self.settings,
            encoder_lengths,
            prompt_tokens,
            loops=warmup.loop_settings(self.settings, self.gamma_policy, self.settings.batch_size),
            eager=warmup.eager_loops(self.gamma_policy),
            compiled=self.compiled,
        )
        self.warmup.first()
        if self.gamma_policy is not None:
            self.gamma_policy.ahead = self.warmup

    def _settle(self, batch: PackedBatch, *, loop: bool) -> None:
        if self.warmup is not None:
            self.warmup.settle(batch.shape(), loop=loop)

    def step_costs(self, request: Request, ks: Sequence[int], repeats: int = PROBE_REPEATS):
        """The cost model's inputs on this engine's models (:func:`probe_costs`)."""
        return probe_costs(self.target, self.draft, self.settings, request, ks=ks, repeats=repeats)

    def close(self) -> None:
        if self.warmup is not None:
            self.warmup.report(stop=True)
