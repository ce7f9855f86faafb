"""An engine from a job's :class:`workers.engine.EngineConfig`: the in-process engine or
the Ray engine, with the γ policy the config names. The one module that knows both
engines, above them (``workers.engine`` and ``workers.ray_engine`` import neither it
nor each other's callers)."""

from __future__ import annotations

from workers.batching import DecodeSettings
from workers.engine import EngineConfig, InProcessEngine, bound_model, check_models
from workers.gamma import AdaptiveGamma
from workers.spec import ModelSpec
from workers.target_alone import TargetAlone


def build_engine(
    config: EngineConfig,
    *,
    target: ModelSpec,
    draft: ModelSpec,
    settings: DecodeSettings,
    batches: int | None = None,
):
    """The engine ``config`` describes over two ModelSpecs. With ``gamma="auto"`` an
    :class:`workers.gamma.AdaptiveGamma` (starting from the draft's ``gamma_prior``, if
    its config has one) chooses γ per batch in 0..``settings.gamma`` (``batches``: how
    many the job has, where known, so that it compiles no loop the job cannot earn back)."""
    check_models(config, target=target, draft=draft)
    policy = None
    if config.adaptive:
        policy = AdaptiveGamma(
            settings.gamma,
            prior=draft.gamma_prior,
            batches=batches,
            speculative_zero=settings.sampling.drafts_bonus,
        )
    elif config.target_alone:
        policy = TargetAlone()
    if config.kind == "ray":
        from workers.ray_engine import RayEngine  # imports Ray: only for a Ray engine

        return RayEngine(target, draft, settings, config=config, gamma_policy=policy)
    return InProcessEngine(bound_model(target), bound_model(draft), settings, gamma_policy=policy)
