"""The speculative coordinator and the Ray engine.

``SpeculativeCoordinator`` drives the loop of one batch between a draft worker and a
target worker (both :class:`workers.model_worker.ModelWorker` actors): per iteration
one ``score`` call to the target and one ``recover_and_propose`` call to the draft
(in this actor's process when co-located), which takes the target's result, commits
the iteration (the same :func:`decoding.commit` the in-process loop runs, so outputs
are identical) and returns the state the coordinator keeps and sends next. The calls
go over each worker's direct channel (:mod:`workers.channel`, ``transport="socket"``)
or as Ray actor calls, where a draft actor gets the target's result as an ObjectRef.
Arguments and results cross as one blob per call (:mod:`workers.wire`); the
coordinator counts every byte that crosses between processes.

``RayEngine`` is what jobs use: it starts (or joins, with ``address``) a Ray
instance, places the two workers and a coordinator as actors, and exposes the
engine interface of :mod:`workers.engine`.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import uuid
from collections.abc import Sequence

import jax

from specdec_core import decoding
from workers import wire
from workers.batching import DecodeSettings, Generation, PackedBatch, Request, pack, unpack
from workers.channel import ChannelClient, ChannelClosed
from workers.spec import (
    DEFAULT_DRAFT_PLACEMENT,
    DEFAULT_TRANSPORT,
    DRAFT_PLACEMENTS,
    TRANSPORTS,
    ModelSpec,
)


class SpeculativeCoordinator:
    """Drives a target worker (a Ray actor) and a draft for packed batches.

    The draft is either another actor (``draft``) or, with ``draft_spec``, a
    :class:`~workers.model_worker.ModelWorker` in this actor's own process
    (co-located): then each iteration is one round trip, to the target, and the
    draft's recover-and-propose runs here between them.
    """

    def __init__(
        self,
        draft,
        target,
        *,
        draft_spec: ModelSpec | None = None,
        transport: str = DEFAULT_TRANSPORT,
    ):
        import ray

        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        self._ray = ray
        self.target = target
        self.draft = draft
        self.local_draft = None
        if draft_spec is not None:
            from workers.model_worker import ModelWorker

            self.local_draft = ModelWorker(draft_spec)
        if (draft is None) == (self.local_draft is None):
            raise ValueError("give exactly one of a draft actor and draft_spec")
        self.traffic_bytes = 0
        self.iterations = 0
        self.transport = transport
        self._target_channel = self._draft_channel = None
        if transport == "socket":
            self._open_channels()

    def _open_channels(self) -> None:
        """Connects to each remote worker's channel; falls back to Ray calls if one fails."""
        ray = self._ray
        remote = (
            {"target": self.target}
            if self.draft is None
            else {"target": self.target, "draft": self.draft}
        )
        try:
            addresses = ray.get([actor.open_channel.remote() for actor in remote.values()])
            clients = {
                role: ChannelClient(address, name=f"{role} worker")
                for role, address in zip(remote, addresses, strict=True)
            }
        except (ChannelClosed, OSError) as error:
            print(
                f"specdec: no direct channel to the workers ({error}); the loop's calls "
                "go through Ray instead (slower per iteration)",
                file=sys.stderr,
                flush=True,
            )
            self.transport = "ray"
            return
        self._target_channel = clients["target"]
        self._draft_channel = clients.get("draft")

    def draft_info(self) -> dict:
        if self.local_draft is not None:
            info = self.local_draft.info()
        else:
            info = self._ray.get(self.draft.info.remote())
        return {**info, "transport": self.transport}

    def _draft_call(self, method: str, *args):
        """A draft method: called directly when co-located, else as a wire call."""
        if self.local_draft is not None:
            return getattr(self.local_draft, method)(*args)
        if self._draft_channel is not None:
            return wire.loads(self._draft_channel.call(method, wire.dumps(args)))
        return wire.loads(self._ray.get(self.draft.call.remote(method, wire.dumps(args))))

    def _iterate(self, batch_id, state, tokens, token_probs, settings):
        """One iteration: (committed state, next tokens, their q, bytes, target seconds)."""
        if self.local_draft is None and self._draft_channel is None:
            return self._iterate_chained(batch_id, state, tokens, token_probs, settings)
        t0 = time.perf_counter()
        to_target = wire.dumps((batch_id, state, tokens, token_probs, settings))
        if self._target_channel is not None:
            score_blob = self._target_channel.call("score", to_target)
        else:
            score_blob = self._ray.get(self.target.call.remote("score", to_target))
        score_s = time.perf_counter() - t0
        crossed = len(to_target) + len(score_blob)
        if self.local_draft is not None:
            committed = self.local_draft.recover_and_propose(
                batch_id, state, settings, *wire.loads(score_blob)
            )
            return (*committed, crossed, score_s)
        # The draft's channel: the target's result crosses a second time, to the draft.
        to_draft = wire.dumps((batch_id, state, settings))
        result = self._draft_channel.call("recover_and_propose", to_draft, score_blob)
        crossed += len(to_draft) + len(score_blob) + len(result)
        return (*wire.loads(result), crossed, score_s)

    def _iterate_chained(self, batch_id, state, tokens, token_probs, settings):
        """:meth:`_iterate` for a draft actor over Ray: the draft's call takes the
        target's result as an ObjectRef, handed over when the target is done, with no
        round trip through here (the result is counted once)."""
        ray = self._ray
        t0 = time.perf_counter()
        to_target = wire.dumps((batch_id, state, tokens, token_probs, settings))
        scored = self.target.call.remote("score", to_target)
        to_draft = wire.dumps((batch_id, state, settings))
        committed = self.draft.call.remote("recover_and_propose", to_draft, scored)
        ray.wait([scored], fetch_local=False)
        score_s = time.perf_counter() - t0
        result, score_blob = ray.get(committed), ray.get(scored)
        crossed = len(to_target) + len(to_draft) + len(score_blob) + len(result)
        return (*wire.loads(result), crossed, score_s)

    def generate(self, batch: PackedBatch, settings: DecodeSettings) -> decoding.DecodeResult:
        ray, draft, target, local = self._ray, self.draft, self.target, self.local_draft
        batch_id = uuid.uuid4().hex
        start = time.perf_counter()
        state = jax.device_get(
            decoding.init_state(
                batch.prompt_tokens,
                batch.prompt_lengths,
                batch.request_keys,
                seed=settings.seed,
                max_new_tokens=batch.max_new_tokens,
                gamma=settings.gamma,
            )
        )
        args = (batch.encoder_tokens, batch.prompt_tokens, batch.prompt_lengths, batch.max_len)
        started = [target.start.remote(batch_id, *args)]
        if local is not None:
            local.start(batch_id, *args)  # while the target prefills
        else:
            started.append(draft.start.remote(batch_id, *args))
        ray.get(started)
        draft_s = target_s = 0.0
        t0 = time.perf_counter()
        tokens, token_probs = self._draft_call("propose_first", batch_id, state, settings)
        draft_s += time.perf_counter() - t0
        try:
            while True:
                t0 = time.perf_counter()
                state, tokens, token_probs, crossed, score_s = self._iterate(
                    batch_id, state, tokens, token_probs, settings
                )
                self.traffic_bytes += crossed
                self.iterations += 1
                target_s += score_s
                draft_s += time.perf_counter() - t0 - score_s
                if state.done.all():
                    break
        finally:
            if local is not None:
                local.release(batch_id)
            else:
                draft.release.remote(batch_id)
            target.release.remote(batch_id)
        total = time.perf_counter() - start
        return decoding.result_from_state(
            state,
            batch.max_new_tokens,
            0,
            draft_s=draft_s,
            target_s=target_s,
            overhead_s=total - draft_s - target_s,
            total_s=total,
        )

    def generate_baseline(
        self, batch: PackedBatch, settings: DecodeSettings
    ) -> decoding.DecodeResult:
        return self._ray.get(self.target.generate_alone.remote(batch, settings))

    def traffic(self) -> dict:
        return {
            "iterations": self.iterations,
            "bytes": self.traffic_bytes,
            "bytes_per_iteration": self.traffic_bytes / max(self.iterations, 1),
        }


def ensure_ray(address: str | None = None, *, num_cpus: int | None = None) -> None:
    """Starts a local Ray instance (or joins ``address``) unless one is running."""
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Ray starts workers at nice 15; its own daemons and the driver then preempt the
    # model compute at every wake-up. The workers are this job's work: normal priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus or max(os.cpu_count() or 2, 3), **kwargs)


class RayEngine:
    """The engine interface with the target, the draft and the coordinator on Ray.

    ``draft_placement``: ``"worker"`` puts the draft in its own actor (two calls per
    iteration); ``"coordinator"`` hosts it in the coordinator's actor, placed with the
    draft's resources (one call per iteration, to the target). Either way the draft
    and the target are separate processes and give the same tokens.
    ``transport``: ``"socket"`` sends the loop's per-iteration calls over a direct
    channel to each remote worker (:mod:`workers.channel`; Ray if it cannot connect),
    ``"ray"`` as Ray actor calls. Same tokens either way.
    """

    def __init__(
        self,
        target: ModelSpec,
        draft: ModelSpec,
        settings: DecodeSettings,
        *,
        address: str | None = None,
        draft_placement: str = DEFAULT_DRAFT_PLACEMENT,
        transport: str = DEFAULT_TRANSPORT,
        gamma_policy=None,
    ):
        import ray

        from workers.model_worker import ModelWorker

        if draft_placement not in DRAFT_PLACEMENTS:
            raise ValueError(
                f"draft_placement must be one of {DRAFT_PLACEMENTS}, got {draft_placement!r}"
            )
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS}, got {transport!r}")
        ensure_ray(address)
        self._ray, self.settings = ray, settings
        self.gamma_policy = gamma_policy  # workers.gamma.AdaptiveGamma: γ ≤ settings.gamma
        self.draft_placement = draft_placement
        self.draft = self.coordinator = None
        worker = ray.remote(ModelWorker)
        coordinator = ray.remote(SpeculativeCoordinator)
        self.target = worker.options(**target.placement.ray_options()).remote(target)
        if draft_placement == "worker":
            self.draft = worker.options(**draft.placement.ray_options()).remote(draft)
            self.coordinator = coordinator.options(num_cpus=0).remote(
                self.draft, self.target, transport=transport
            )
        else:
            self.coordinator = coordinator.options(**draft.placement.ray_options()).remote(
                None, self.target, draft_spec=draft, transport=transport
            )
        infos = ray.get([self.target.info.remote(), self.coordinator.draft_info.remote()])
        self.transport = infos[1]["transport"]  # "ray" if the channel could not connect
        if infos[0]["vocab_size"] != infos[1]["vocab_size"]:
            self.close()
            raise ValueError(
                f"draft {draft.name!r} has vocab_size {infos[1]['vocab_size']} but target "
                f"{target.name!r} has {infos[0]['vocab_size']}: they must share a vocabulary"
            )

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        if self.gamma_policy is not None:  # γ per batch (workers.gamma); 0: the target alone
            result, _, seconds = self.gamma_policy.decode(
                batch,
                lambda gamma: self._ray.get(
                    self.coordinator.generate.remote(
                        batch, dataclasses.replace(self.settings, gamma=gamma)
                    )
                ),
                lambda: self._ray.get(
                    self.coordinator.generate_baseline.remote(batch, self.settings)
                ),
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = self._ray.get(self.coordinator.generate.remote(batch, self.settings))
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def generate_baseline(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        if self.gamma_policy is not None:  # its time per step is the γ = 0 cost
            result, seconds = self.gamma_policy.decode_baseline(
                batch,
                lambda: self._ray.get(
                    self.coordinator.generate_baseline.remote(batch, self.settings)
                ),
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = self._ray.get(self.coordinator.generate_baseline.remote(batch, self.settings))
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def traffic(self) -> dict:
        return self._ray.get(self.coordinator.traffic.remote())

    def close(self) -> None:
        for actor in ("coordinator", "draft", "target"):
            handle = getattr(self, actor, None)
            if handle is not None:
                self._ray.kill(handle)
                setattr(self, actor, None)
