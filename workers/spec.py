"""What a worker needs to build its model, where Ray should place it, and the local Ray
instance a job starts."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from typing import Any

# Where a job's engine runs (workers.engine.EngineConfig.kind, the --workers flag): the
# models in Ray actors (workers.ray_engine.RayEngine) or in the calling process.
ENGINE_KINDS = ("ray", "inprocess")
# Where a Ray job hosts the draft: in the coordinator's actor (one call per iteration),
# in an actor of its own (two calls), or in the target's actor, where the whole loop of
# a batch runs compiled (one call per batch: for one host, where crossing processes
# every iteration costs more than the draft). workers.ray_engine.RayEngine reads it.
DRAFT_PLACEMENTS = ("worker", "coordinator", "target")
DEFAULT_DRAFT_PLACEMENT = "coordinator"
# How the loop's per-iteration calls travel: a direct TCP channel from the coordinator
# to each worker's process (workers.channel), or Ray actor calls.
TRANSPORTS = ("socket", "ray")
DEFAULT_TRANSPORT = "socket"
# Custom Ray resources that say which node hosts which model: a node started with
# ``--resources '{"target": 1}'`` hosts the target's actor, one with ``{"draft": 1}``
# the draft's (or the coordinator's that hosts it). Each actor asks for this share of its
# role's resource, so one node can host the actors of many engines (Beam workers).
ROLE_RESOURCES = ("target", "draft")
ROLE_RESOURCE_SHARE = 0.01


@dataclasses.dataclass(frozen=True, kw_only=True)
class Placement:
    """Ray resources of one model worker (``TPU``/``GPU`` at scale)."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()  # custom resources, e.g. (("TPU", 4),)
    env: tuple[tuple[str, str], ...] = ()  # environment variables of the worker's process

    def ray_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            options["resources"] = dict(self.resources)
        if self.env:
            options["runtime_env"] = {"env_vars": dict(self.env)}
        return options


def role_options(
    placement: Placement, role: str, cluster_resources: Mapping[str, float]
) -> dict[str, Any]:
    """Ray options of the actor that hosts ``role``'s model: ``placement``'s, plus a
    share of the custom resource named ``role`` when the cluster offers it (else
    unchanged: Ray places the actor by CPU). A share the placement already asks for
    is kept."""
    if role not in ROLE_RESOURCES:
        raise ValueError(f"role must be one of {ROLE_RESOURCES}, got {role!r}")
    options = placement.ray_options()
    if cluster_resources.get(role, 0) > 0:
        options["resources"] = {role: ROLE_RESOURCE_SHARE, **options.get("resources", {})}
    return options


def node_id(_actor=None) -> str:
    """The hex id of the Ray node this process runs on; an actor's, when a driver calls
    it through ``actor.__ray_call__`` (which passes the actor instance)."""
    import ray

    return ray.get_runtime_context().get_node_id()


def actor_node_id(actor, *, timeout_s: float = 60.0) -> str | None:
    """The hex id of the Ray node ``actor`` runs on, read inside it; None when it is
    gone (or does not answer within ``timeout_s``: restarting)."""
    import ray

    try:
        return ray.get(actor.__ray_call__.remote(node_id), timeout=timeout_s)
    except ray.exceptions.RayError:
        return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model by family, config and checkpoint; serialisable, so it can cross to a worker."""

    name: str
    family: str  # "t5" | "decoder"
    config: Any  # T5Config | DecoderConfig
    checkpoint: str | None = None  # T5X checkpoint folder; None: random init (tests)
    init_seed: int = 0
    placement: Placement = dataclasses.field(default_factory=Placement)
    mesh: tuple[int, int] | None = None  # (data, model): the worker shards params and caches
    gamma_prior: Any = None  # a draft's workers.gamma.GammaPrior for --gamma auto; None: defaults

    def load(self):
        """The model as a ``specdec_core.models.bound.BoundModel``: its checkpoint read, or
        random params from ``init_seed`` when it has none."""
        from specdec_core.models.bound import load_model

        return load_model(
            self.name,
            self.family,
            self.config,
            checkpoint=self.checkpoint,
            init_seed=self.init_seed,
        )


def check_shared_vocabulary(
    target_name: str, target_vocab: int, draft_name: str, draft_vocab: int
) -> None:
    """Draft and target must score the same token ids: one vocabulary size."""
    if target_vocab != draft_vocab:
        raise ValueError(
            f"draft {draft_name!r} has vocab_size {draft_vocab} but target "
            f"{target_name!r} has {target_vocab}: they must share a vocabulary"
        )


def check_draft_target(target_name: str, draft_name: str, draft_config: Any) -> None:
    """A draft that reads a target's encoder (``t5.SourceEncoder``) runs beside that
    target only."""
    source = getattr(draft_config, "source_encoder", None)
    if source is not None and source.name != target_name:
        raise ValueError(
            f"draft {draft_name!r} reads the encoder of {source.name!r}: it runs beside that "
            f"target only, not {target_name!r}"
        )


def ray_cpus(engines: int = 1) -> int:
    """CPUs a local Ray instance offers for ``engines`` engines: one per model worker
    (the target and the draft; the coordinator takes none), at least this machine's
    cores and 3."""
    return max(os.cpu_count() or 2, 3, 2 * engines)


VERBOSE_ENV = "SPECDEC_VERBOSE"  # specdec --verbose, for the processes a job starts


def verbose_requested() -> bool:
    """Whether ``specdec --verbose`` (or ``SPECDEC_VERBOSE=1``) asked for the libraries'
    output (:mod:`pipelines.log_setup` sets it for this process and those it starts)."""
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> bool:
    """Starts a local Ray instance (or joins ``address``) unless one is running; True
    when it started a local instance (whose daemons live as long as the calling thread,
    :class:`workers.background.Background`)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts workers at nice 15; its own daemons and the driver then preempt the
    # model compute at every wake-up. The workers are this job's work: normal priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Ray's import gives the "ray" logger a stderr handler and cuts it off from the root
    # logger; ray.init drops that handler (configure_logging=False), and this sends its
    # records where the process's others go (the CLI's choice: pipelines.log_setup)
    logging.getLogger("ray").propagate = True
    kwargs = {
        "include_dashboard": False,
        # the workers' output (their libraries' warnings) stays in Ray's session logs,
        # unless specdec --verbose asked for it (pipelines.log_setup)
        "log_to_driver": verbose_requested(),
        # Ray's loggers keep no handler of their own: the CLI decides where they go
        "configure_logging": False,
    }
    if address:
        ray.init(address=address, **kwargs)
        return False
    ray.init(num_cpus=num_cpus or ray_cpus(), **kwargs)
    return True
