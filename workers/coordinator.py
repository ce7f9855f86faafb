"""The speculative coordinator and the Ray engine.

``SpeculativeCoordinator`` drives the loop of one batch between a draft worker and a
target worker (both :class:`workers.model_worker.ModelWorker` actors): per iteration
one ``score`` call to the target and one ``recover_and_propose`` call to the draft,
which takes the target's result as an ObjectRef (submitted together, so no Python
round trip between them), commits the iteration (the same :func:`decoding.commit`
the in-process loop runs, so outputs are identical) and returns the state the
coordinator keeps and sends next. Arguments and results cross as one blob per call
(:mod:`workers.wire`); the coordinator counts those bytes, the target's result once.

``RayEngine`` is what jobs use: it starts (or joins, with ``address``) a Ray
instance, places the two workers and a coordinator as actors, and exposes the
engine interface of :mod:`workers.engine`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence

import jax

from specdec_core import decoding
from workers import wire
from workers.batching import DecodeSettings, Generation, PackedBatch, Request, pack, unpack
from workers.spec import ModelSpec


class SpeculativeCoordinator:
    """Drives draft and target workers (Ray actor handles) for packed batches."""

    def __init__(self, draft, target):
        import ray

        self._ray = ray
        self.draft, self.target = draft, target
        self.traffic_bytes = 0
        self.iterations = 0

    def generate(self, batch: PackedBatch, settings: DecodeSettings) -> decoding.DecodeResult:
        ray, draft, target = self._ray, self.draft, self.target
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
        ray.get([draft.start.remote(batch_id, *args), target.start.remote(batch_id, *args)])
        draft_s = target_s = 0.0
        t0 = time.perf_counter()
        tokens, token_probs = wire.loads(
            ray.get(draft.call.remote("propose_first", wire.dumps((batch_id, state, settings))))
        )
        draft_s += time.perf_counter() - t0
        try:
            while True:
                t0 = time.perf_counter()
                to_target = wire.dumps((batch_id, state, tokens, token_probs, settings))
                to_draft = wire.dumps((batch_id, state, settings))
                # The draft's call takes the target's result as an ObjectRef: Ray hands
                # it over when the target is done, with no round trip through here.
                scored = target.call.remote("score", to_target)
                committed = draft.call.remote("recover_and_propose", to_draft, scored)
                ray.wait([scored], fetch_local=False)
                t1 = time.perf_counter()
                result = ray.get(committed)
                t2 = time.perf_counter()
                score_bytes = len(ray.get(scored))
                state, tokens, token_probs = wire.loads(result)
                self.traffic_bytes += len(to_target) + len(to_draft) + score_bytes + len(result)
                self.iterations += 1
                target_s, draft_s = target_s + t1 - t0, draft_s + t2 - t1
                if state.done.all():
                    break
        finally:
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
    kwargs = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address:
        ray.init(address=address, **kwargs)
    else:
        ray.init(num_cpus=num_cpus or max(os.cpu_count() or 2, 3), **kwargs)


class RayEngine:
    """The engine interface with the draft, the target and the coordinator as Ray actors."""

    def __init__(
        self,
        target: ModelSpec,
        draft: ModelSpec,
        settings: DecodeSettings,
        *,
        address: str | None = None,
    ):
        import ray

        from workers.model_worker import ModelWorker

        ensure_ray(address)
        self._ray, self.settings = ray, settings
        worker = ray.remote(ModelWorker)
        self.target = worker.options(**target.placement.ray_options()).remote(target)
        self.draft = worker.options(**draft.placement.ray_options()).remote(draft)
        infos = ray.get([self.target.info.remote(), self.draft.info.remote()])
        if infos[0]["vocab_size"] != infos[1]["vocab_size"]:
            self.close()
            raise ValueError(
                f"draft {draft.name!r} has vocab_size {infos[1]['vocab_size']} but target "
                f"{target.name!r} has {infos[0]['vocab_size']}: they must share a vocabulary"
            )
        self.coordinator = (
            ray.remote(SpeculativeCoordinator).options(num_cpus=0).remote(self.draft, self.target)
        )

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        start = time.perf_counter()
        result = self._ray.get(self.coordinator.generate.remote(batch, self.settings))
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def generate_baseline(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
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
