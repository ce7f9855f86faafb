"""The Ray engine: the target, the draft and a :class:`SpeculativeCoordinator` as
Ray actors, behind the engine interface of :mod:`workers.engine`.

It starts (or joins, with ``EngineConfig.ray_address``) a Ray instance, places the
workers by their roles' resources, restarts actors that die (the coordinator resumes a
batch, :mod:`workers.recovery`; a dead coordinator's batch is run again) and reports
restarts, traffic and placement.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from specdec_core import decoding
from workers import recovery, spec, warmup
from workers.batching import DecodeSettings, Generation, PackedBatch, Request, pack, unpack
from workers.channel import new_secret
from workers.coordinator import SpeculativeCoordinator
from workers.engine import PROBE_REPEATS, EngineConfig, probe_batch
from workers.gamma import at_gamma
from workers.spec import ModelSpec, check_draft_target, check_shared_vocabulary, ensure_ray


class _ActorWarmup:
    """The warm-up in the target's actor (:meth:`ModelWorker.warm`), as the engine and
    the policy ask it. A batch asks once per encoder width whether to wait, and again
    each batch only while its loop is bought and compiling."""

    def __init__(self, ray, actor):
        self._ray, self._actor = ray, actor
        self._ready: dict[tuple, bool | None] = {}
        self._settled: set[tuple] = set()

    def settle(self, key: tuple, shape: tuple, *, loop: bool) -> None:
        ready = self._ready.get(shape)
        if ready or (key in self._settled and ready is None and not loop):
            return  # nothing of this batch's left to compile there
        self._ready[shape] = self._ray.get(self._actor.warm_settle.remote(key, shape, loop))
        self._settled.add(key)

    def loop_ready(self, shape: tuple) -> bool | None:
        return self._ready.get(shape)

    def buy(self, shape: tuple) -> bool:
        bought = self._ray.get(self._actor.warm_buy.remote(shape))
        if bought:
            self._ready[shape] = False
        return bought

    def report(self, *, stop: bool = False) -> dict | None:
        return self._ray.get(self._actor.warm_report.remote(stop))


class RayEngine:
    """The engine interface with the target, the draft and the coordinator on Ray.

    ``config`` (:class:`workers.engine.EngineConfig`, validated there) gives the Ray
    address to join and: ``draft_placement``: ``"worker"`` puts the draft in its own
    actor (two calls per iteration); ``"coordinator"`` hosts it in the coordinator's
    actor, placed with the draft's resources (one call per iteration, to the target);
    ``"target"`` in the target's actor, which runs each batch's whole loop compiled
    (the coordinator, which then only hands over batches and retries them, runs in this
    process).
    Nodes that offer a ``target`` / ``draft`` resource host that role
    (:func:`workers.spec.role_options`); :meth:`placement` says where each ran.
    Either way the draft and the target are separate processes and give the same
    tokens. ``transport``: ``"socket"`` sends the loop's per-iteration calls over a
    direct channel to each remote worker (:mod:`workers.channel`; Ray if it cannot
    connect), ``"ray"`` as Ray actor calls. Same tokens either way. Its γ fields are
    the caller's: ``gamma_policy`` (:class:`workers.gamma.AdaptiveGamma`) chooses γ per
    batch, ``settings.gamma`` being the largest.
    """

    def __init__(
        self,
        target: ModelSpec,
        draft: ModelSpec,
        settings: DecodeSettings,
        *,
        config: EngineConfig | None = None,
        gamma_policy=None,
        max_restarts: int = recovery.DEFAULT_MAX_RESTARTS,
        max_batch_failures: int = recovery.DEFAULT_MAX_BATCH_FAILURES,
    ):
        import ray

        from workers.model_worker import ModelWorker

        config = config or EngineConfig()
        draft_placement, transport = config.draft_placement, config.transport
        check_shared_vocabulary(
            target.name, target.config.vocab_size, draft.name, draft.config.vocab_size
        )
        check_draft_target(target.name, draft.name, draft.config)
        self.draft = self.coordinator = None
        if max_restarts < 0 or max_batch_failures < 0:
            raise ValueError(
                f"max_restarts and max_batch_failures must be >= 0, got {max_restarts} "
                f"and {max_batch_failures}"
            )
        ensure_ray(config.ray_address)
        self._ray, self.settings = ray, settings
        self.gamma_policy = gamma_policy  # workers.gamma.AdaptiveGamma: γ ≤ settings.gamma
        self.draft_placement = draft_placement
        # Ray restarts a dead actor (re-running __init__); the calls are retried here.
        restartable = {"max_restarts": max_restarts, "max_task_retries": 0}
        worker = ray.remote(**restartable)(ModelWorker)
        coordinator = ray.remote(**restartable)(SpeculativeCoordinator)
        self.max_batch_failures = max_batch_failures
        failures = {"max_batch_failures": max_batch_failures, "pipelined": config.pipelined}
        # The workers' channels serve only this job's coordinator (workers.channel); a
        # restarted coordinator gets the same constructor arguments, so the same secret.
        self._channel_secret = new_secret()
        # Nodes that offer a "target" / "draft" resource host that role (workers.spec).
        offered = ray.cluster_resources()
        target_options = spec.role_options(target.placement, "target", offered)
        self.target = worker.options(**target_options).remote(target)
        draft_options = spec.role_options(draft.placement, "draft", offered)
        if draft_placement == "worker":
            self.draft = worker.options(**draft_options).remote(draft)
            self.coordinator = coordinator.options(num_cpus=0).remote(
                self.draft,
                self.target,
                transport=transport,
                channel_secret=self._channel_secret,
                **failures,
            )
        elif draft_placement == "coordinator":
            self.coordinator = coordinator.options(**draft_options).remote(
                None,
                self.target,
                draft_spec=draft,
                transport=transport,
                channel_secret=self._channel_secret,
                **failures,
            )
        # "target": the target's actor runs each batch's whole loop, so the coordinator
        # only hands it the batch and retries it after a death: it runs in this process
        # (one actor process fewer to start, one Ray hop fewer per batch).
        self._local = None
        if self.coordinator is None:
            target_info = self.target.info.remote()
            self._local = SpeculativeCoordinator(
                None, self.target, in_target=True, draft_spec=draft, **failures
            )
            infos = [ray.get(target_info), self._local.draft_info()]
        else:
            infos = ray.get([self.target.info.remote(), self.coordinator.draft_info.remote()])
            self._coordinator_instance = ray.get(self.coordinator.instance.remote())
        self._draft_spec, self.warmup = draft, None
        self._restarts = {"target": 0, "draft": 0, "coordinator": 0}
        self._seen = {"target": 0, "draft": 0}  # counted by the coordinator now running
        self.transport = infos[1]["transport"]  # "ray" if the channel could not connect

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        self._settle(batch, loop=self.gamma_policy is None)
        if self.gamma_policy is not None:  # γ per batch (workers.gamma); 0: the target alone
            result, _, seconds = self.gamma_policy.decode(
                batch,
                lambda gamma: self._generate(
                    batch, at_gamma(self.settings, gamma, rows=batch.prompt_tokens.shape[0])
                ),
                lambda: self._on_coordinator("generate_baseline", batch, self.settings),
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = self._generate(batch, self.settings)
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def generate_baseline(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        self._settle(batch, loop=False)
        if self.gamma_policy is not None:  # its time per step is the γ = 0 cost
            result, seconds = self.gamma_policy.decode_baseline(
                batch,
                lambda: self._on_coordinator("generate_baseline", batch, self.settings),
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = self._on_coordinator("generate_baseline", batch, self.settings)
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def warm(self, encoder_lengths: Sequence[int], prompt_tokens: tuple[int, ...]) -> None:
        """With the draft in the target's actor, compiles the job's programs there in the
        background (:meth:`workers.model_worker.ModelWorker.warm`), returning once the
        first batch's target-alone program is warm; other placements run their loops'
        calls across processes and compile them on the batches' path."""
        if self._local is None:
            return
        loops = warmup.loop_settings(self.settings, self.gamma_policy, self.settings.batch_size)
        self._ray.get(
            self.target.warm.remote(
                tuple(encoder_lengths),
                prompt_tokens,
                self.settings,
                tuple(loops),
                self._draft_spec,
                warmup.eager_loops(self.gamma_policy),
            )
        )
        self.warmup = _ActorWarmup(self._ray, self.target)
        if self.gamma_policy is not None:
            self.gamma_policy.ahead = self.warmup

    def _settle(self, batch: PackedBatch, *, loop: bool) -> None:
        if self.warmup is not None:
            self.warmup.settle(batch.shape(), batch.program_shape(), loop=loop)

    def step_costs(self, request: Request, ks: Sequence[int], repeats: int = PROBE_REPEATS):
        """The cost model's inputs (``theory.StepCosts``), timed by the workers that ran
        the job, on their own devices (a target on a slice included): the target's call
        on each k of ``ks`` in its actor, the draft's step where the draft runs
        (:meth:`workers.coordinator.SpeculativeCoordinator.step_costs`)."""
        from specdec_core import theory

        batch = probe_batch(request, self.settings)
        args = (batch.encoder_tokens, tuple(ks), batch.max_len, batch.size, repeats)
        return theory.StepCosts(**self._on_coordinator("step_costs", *args))

    def _generate(self, batch: PackedBatch, settings: DecodeSettings) -> decoding.DecodeResult:
        result, self._seen = self._on_coordinator("generate", batch, settings)
        return result

    def _on_coordinator(self, method: str, *args):
        """A coordinator call, made again on the restarted coordinator if it died (a
        batch then starts over: the same tokens, since every draw derives from (seed,
        request id, step)). A coordinator's ``WorkerLost`` is raised as itself."""
        if self._local is not None:  # in this process: it retries the target's deaths
            return getattr(self._local, method)(*args)
        ray = self._ray

        def attempt():
            try:
                return ray.get(getattr(self.coordinator, method).remote(*args))
            except ray.exceptions.RayTaskError as error:
                if isinstance(error.cause, recovery.WorkerLost):
                    raise error.cause from error
                raise

        return recovery.retrying(
            attempt, recover=self._coordinator_back, max_failures=self.max_batch_failures
        )

    def _coordinator_back(self) -> None:
        instance = recovery.await_actor(self.coordinator, "coordinator")
        if instance != self._coordinator_instance:
            self._coordinator_instance = instance
            self._restarts["coordinator"] += 1
            for role, count in self._seen.items():  # what the dead one had counted
                self._restarts[role] += count
            self._seen = {"target": 0, "draft": 0}

    def restarts(self) -> dict[str, int]:
        """Ray restarts of each actor so far: {"target", "draft", "coordinator"}.

        A draft hosted by the coordinator restarts with it (counted as "coordinator").
        """
        return {role: count + self._seen.get(role, 0) for role, count in self._restarts.items()}

    def traffic(self) -> dict:
        if self._local is not None:
            return self._local.traffic()
        return self._ray.get(self.coordinator.traffic.remote())

    def placement(self) -> dict[str, str | None]:
        """Where each role runs now: {"target": node id, "draft": node id} (hex Ray node
        ids read inside the actors, the draft's coordinator's when it hosts the draft;
        None for an actor that is gone)."""
        draft = self.coordinator if self.draft is None else self.draft
        hosts = {"target": self.target, "draft": self.target if draft is None else draft}
        return {role: spec.actor_node_id(actor) for role, actor in hosts.items()}

    def close(self) -> None:
        for actor in ("coordinator", "draft", "target"):
            handle = getattr(self, actor, None)
            if handle is not None:
                self._ray.kill(handle)
                setattr(self, actor, None)
