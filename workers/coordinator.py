"""The speculative coordinator: the loop of a batch between a draft and a target worker.

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

Pipelined (``pipelined=True``), the draft proposes the next block while the target
verifies this one: a ``propose_ahead`` call, which returns at once, before the target's
``score``, and ``settle`` instead of ``recover_and_propose`` (:mod:`specdec_core.decoding`,
"pipelined speculation"). The tokens are the sequential loop's.

:class:`workers.ray_engine.RayEngine`, what jobs use, places the workers and a
coordinator as Ray actors (with the draft in the target's actor, the coordinator runs
in the job's process).

Workers that die come back (:mod:`workers.recovery`): every actor has
``max_restarts``; when a worker's process goes away mid-batch, the coordinator waits
for Ray to restart it (its ``__init__`` reloads the model), reopens its channel,
re-prefills both workers from the batch's committed tokens and continues, with the
same tokens as an uninterrupted run. When the coordinator itself dies (with the draft
it hosts), the engine re-runs the batch on the restarted coordinator. A worker that
keeps dying fails the batch with :class:`~workers.recovery.WorkerLost`.
"""

from __future__ import annotations

import logging
import time
import uuid

from specdec_core import decoding
from workers import recovery, wire
from workers.batching import DecodeSettings, PackedBatch
from workers.channel import ChannelClient, ChannelClosed, new_secret
from workers.spec import DEFAULT_TRANSPORT, ModelSpec

log = logging.getLogger(__name__)


class SpeculativeCoordinator(recovery.Restartable):
    """Drives a target worker (a Ray actor) and a draft for packed batches.

    The draft is either another actor (``draft``) or, with ``draft_spec``, a
    :class:`~workers.model_worker.ModelWorker` in this actor's own process
    (co-located): then each iteration is one round trip, to the target, and the
    draft's recover-and-propose runs here between them. With ``in_target`` the draft
    of ``draft_spec`` lives in the target's actor instead, and a batch is one call
    there (:meth:`ModelWorker.generate_with_draft`), retried whole after a death; the
    Ray engine then runs this class in the job's own process, not as an actor.
    """

    def __init__(
        self,
        draft,
        target,
        *,
        draft_spec: ModelSpec | None = None,
        transport: str = DEFAULT_TRANSPORT,
        max_batch_failures: int = recovery.DEFAULT_MAX_BATCH_FAILURES,
        restart_timeout_s: float = recovery.DEFAULT_RESTART_TIMEOUT_S,
        channel_secret: bytes | None = None,
        in_target: bool = False,
        pipelined: bool = False,
    ):
        import ray

        self._ray = ray
        self.target = target
        self.draft = draft
        self.local_draft = None
        self.in_target = draft_spec if in_target else None  # the spec the target hosts
        if in_target:
            transport = "ray"  # nothing crosses per iteration: no channel to open
        elif draft_spec is not None:
            from workers.model_worker import ModelWorker

            self.local_draft = ModelWorker(draft_spec)
        if (draft is None) == (self.local_draft is None and self.in_target is None):
            raise ValueError("give exactly one of a draft actor and draft_spec")
        self.traffic_bytes = 0
        self.iterations = 0
        # The draft proposes the next block while the target verifies (workers/model_worker:
        # propose_ahead, settle); without it, after (recover_and_propose).
        self.pipelined = pipelined
        self._commit_method = "settle" if pipelined else "recover_and_propose"
        self.transport = transport
        self._target_channel = self._draft_channel = None
        self._channel_secret = channel_secret or new_secret()  # the job's (RayEngine's)
        if transport == "socket":
            self._open_channels()
        self.max_batch_failures, self.restart_timeout_s = max_batch_failures, restart_timeout_s
        self.restarts = {"target": 0, "draft": 0}  # worker restarts this coordinator saw
        self.resumes = 0  # batches resumed from their committed state after a death
        self._lost: str | None = None  # a worker gone for good: every batch fails at once
        self._instances = {
            role: recovery.await_actor(actor, f"{role} worker", timeout_s=restart_timeout_s)
            for role, actor in self._remote_workers().items()
        }
        in_actor = ray.get_runtime_context().get_actor_id() is not None  # not: a driver's
        if in_actor and ray.get_runtime_context().was_current_actor_reconstructed:
            for actor in self._remote_workers().values():  # the dead coordinator's batches
                actor.release_all.remote()

    def _remote_workers(self) -> dict:
        """role -> actor handle of the workers in other processes."""
        if self.draft is None:
            return {"target": self.target}
        return {"target": self.target, "draft": self.draft}

    def _open_channels(self) -> None:
        """Connects to each remote worker's channel; falls back to Ray calls if one fails."""
        ray, remote = self._ray, self._remote_workers()
        try:
            secret = self._channel_secret
            addresses = ray.get([actor.open_channel.remote(secret) for actor in remote.values()])
            clients = {
                role: ChannelClient(address, secret=secret, name=f"{role} worker")
                for role, address in zip(remote, addresses, strict=True)
            }
        except (ChannelClosed, OSError) as error:
            log.warning(
                "specdec: no direct channel to the workers (%s); the loop's calls go "
                "through Ray instead (slower per iteration)",
                error,
            )
            self.transport = "ray"
            return
        self._target_channel = clients["target"]
        self._draft_channel = clients.get("draft")

    def draft_info(self) -> dict:
        if self.in_target is not None:
            info = self._ray.get(self.target.host_draft.remote(self.in_target))
            return {**info, "transport": "none: the draft is in the target's actor"}
        if self.local_draft is not None:
            info = self.local_draft.info()
        else:
            info = self._ray.get(self.draft.info.remote())
        return {**info, "transport": self.transport}

    def step_costs(
        self, encoder_tokens, ks: tuple[int, ...], cache_len: int, batch: int, repeats: int
    ) -> dict:
        """The cost model's inputs timed where the job's models run
        (``workers.model_worker.ModelWorker.step_costs``): the target on each k of ``ks``
        in its actor, and the draft's step where the draft is, beside the target in
        interleaved rounds when the target's actor hosts it. {"target_s", "draft_step_s"}."""
        shape = (cache_len, batch, repeats)  # the cache, the rows, calls per timed run
        call = self.target.step_costs.remote(encoder_tokens, ks, *shape, draft=self.in_target)
        measured = self._ray.get(call)  # before the draft's timing starts: never both at once
        if self.in_target is not None:
            return measured
        args = (encoder_tokens, (1,), *shape)
        if self.local_draft is not None:
            draft = self.local_draft.step_costs(*args)
        else:
            draft = self._ray.get(self.draft.step_costs.remote(*args))
        return {**measured, "draft_step_s": draft["target_s"][1]}

    def _draft_call(self, method: str, *args):
        """A draft method: called directly when co-located, else as a wire call."""
        if self.local_draft is not None:
            return getattr(self.local_draft, method)(*args)
        if self._draft_channel is not None:
            return wire.loads(self._draft_channel.call(method, wire.dumps(args)))
        return wire.loads(self._ray.get(self.draft.call.remote(method, wire.dumps(args))))

    def _iterate(self, batch_id, state, tokens, token_probs, settings):
        """One iteration: (committed state, next tokens, their q, bytes, target seconds).

        Pipelined, the draft's early proposal of the next block is started first (the
        call returns at once) and runs while the target scores this block."""
        if self.local_draft is None and self._draft_channel is None:
            return self._iterate_chained(batch_id, state, tokens, token_probs, settings)
        if self.pipelined:
            self._draft_call("propose_ahead", batch_id, state, settings)
        t0 = time.perf_counter()
        to_target = wire.dumps((batch_id, state, tokens, token_probs, settings))
        if self._target_channel is not None:
            score_blob = self._target_channel.call("score", to_target)
        else:
            score_blob = self._ray.get(self.target.call.remote("score", to_target))
        score_s = time.perf_counter() - t0
        crossed = len(to_target) + len(score_blob)
        if self.local_draft is not None:
            commit = getattr(self.local_draft, self._commit_method)
            committed = commit(batch_id, state, settings, *wire.loads(score_blob))
            return (*committed, crossed, score_s)
        # The draft's channel: the target's result crosses a second time, to the draft.
        to_draft = wire.dumps((batch_id, state, settings))
        result = self._draft_channel.call(self._commit_method, to_draft, score_blob)
        crossed += len(to_draft) + len(score_blob) + len(result)
        return (*wire.loads(result), crossed, score_s)

    def _iterate_chained(self, batch_id, state, tokens, token_probs, settings):
        """:meth:`_iterate` for a draft actor over Ray: the draft's call takes the
        target's result as an ObjectRef, handed over when the target is done, with no
        round trip through here (the result is counted once)."""
        ray = self._ray
        to_draft = wire.dumps((batch_id, state, settings))
        if self.pipelined:  # the draft's actor runs its calls in order: this one first
            self.draft.call.remote("propose_ahead", to_draft)
        t0 = time.perf_counter()
        to_target = wire.dumps((batch_id, state, tokens, token_probs, settings))
        scored = self.target.call.remote("score", to_target)
        committed = self.draft.call.remote(self._commit_method, to_draft, scored)
        ray.wait([scored], fetch_local=False)
        score_s = time.perf_counter() - t0
        score_blob = ray.get(scored)  # first: a dead target's error, not the draft's
        result = ray.get(committed)
        crossed = len(to_target) + len(to_draft) + len(score_blob) + len(result)
        return (*wire.loads(result), crossed, score_s)

    def generate(self, batch: PackedBatch, settings: DecodeSettings):
        """Decodes one batch: (DecodeResult, the worker restarts this coordinator saw).

        A worker that dies mid-batch costs only the iteration in flight: the batch
        resumes from its last committed state once the worker is back.
        """
        if self.in_target is not None:  # one call: the loop runs in the target's actor
            call = self.target.generate_with_draft.remote
            result = self._retrying(lambda: self._ray.get(call(batch, settings, self.in_target)))
            return result, dict(self.restarts)
        batch_id = uuid.uuid4().hex
        start = time.perf_counter()
        state = recovery.initial_state(batch, settings)
        seconds = {"draft": 0.0, "target": 0.0}
        progress = [state]  # the last committed state, kept across worker deaths
        attempts = []

        def attempt():
            self.resumes += bool(attempts)
            attempts.append(len(attempts))
            return self._decode(batch_id, batch, progress, settings, seconds)

        try:
            state = self._retrying(attempt, lambda: int(progress[0].n_generated.sum()))
        finally:
            if self.local_draft is not None:
                self.local_draft.release(batch_id)
            for actor in self._remote_workers().values():
                actor.release.remote(batch_id)
        total = time.perf_counter() - start
        result = decoding.result_from_state(
            state,
            batch.max_new_tokens,
            0,
            draft_s=seconds["draft"],
            target_s=seconds["target"],
            overhead_s=total - seconds["draft"] - seconds["target"],
            total_s=total,
        )
        return result, dict(self.restarts)

    def _decode(self, batch_id, batch: PackedBatch, progress: list, settings, seconds: dict):
        """Prefills both workers from the committed state ``progress[0]`` (the prompts,
        at first) and runs the loop to the end, updating ``progress[0]``; adds the
        time inside draft and target calls to ``seconds``."""
        ray, target, local = self._ray, self.target, self.local_draft
        state = progress[0]
        if int(state.n_generated.max()) == 0:
            prompts = batch.prompt_tokens, batch.prompt_lengths
        else:
            prompts = recovery.committed_prompts(
                batch.prompt_tokens,
                batch.prompt_lengths,
                state.out_tokens,
                state.n_generated,
                batch.max_len,
            )
        args = (batch.encoder_tokens, *prompts, batch.max_len)
        started = [target.start.remote(batch_id, *args)]
        if local is not None:
            local.start(batch_id, *args)  # while the target prefills
        else:
            started.append(self.draft.start.remote(batch_id, *args))
        ray.get(started)
        t0 = time.perf_counter()
        tokens, token_probs = self._draft_call("propose_first", batch_id, state, settings)
        seconds["draft"] += time.perf_counter() - t0
        while True:
            self._step()  # (kill_after: a test's fault)
            t0 = time.perf_counter()
            state, tokens, token_probs, crossed, score_s = self._iterate(
                batch_id, state, tokens, token_probs, settings
            )
            progress[0] = state
            self.traffic_bytes += crossed
            self.iterations += 1
            seconds["target"] += score_s
            seconds["draft"] += time.perf_counter() - t0 - score_s
            if state.done.all():
                return state

    def _retrying(self, attempt, progress=lambda: 0):
        """``attempt()`` with :func:`recovery.retrying` (resumed after worker deaths)."""
        if self._lost is not None:
            raise recovery.WorkerLost(self._lost)
        return recovery.retrying(
            attempt, recover=self._recover, max_failures=self.max_batch_failures, progress=progress
        )

    def _recover(self) -> None:
        """Waits for every remote worker to answer (a dead one restarted), counts the
        restarts and reopens the channels."""
        for role, actor in self._remote_workers().items():
            try:
                instance = recovery.await_actor(
                    actor, f"{role} worker", timeout_s=self.restart_timeout_s
                )
            except recovery.WorkerLost as error:
                self._lost = str(error)  # gone for good: later batches fail at once
                raise
            if instance != self._instances[role]:
                self.restarts[role] += 1
                self._instances[role] = instance
        if self.transport == "socket":
            for channel in (self._target_channel, self._draft_channel):
                if channel is not None:
                    channel.close()
            self._target_channel = self._draft_channel = None
            self._open_channels()

    def generate_baseline(
        self, batch: PackedBatch, settings: DecodeSettings
    ) -> decoding.DecodeResult:
        return self._retrying(
            lambda: self._ray.get(self.target.generate_alone.remote(batch, settings))
        )

    def traffic(self) -> dict:
        traffic = {
            "iterations": self.iterations,
            "bytes": self.traffic_bytes,
            "bytes_per_iteration": self.traffic_bytes / max(self.iterations, 1),
            "resumes": self.resumes,
        }
        if self.pipelined:  # early_blocks_proposed / _kept: the draft's (workers.model_worker)
            draft = self.local_draft
            early = (
                draft.early_blocks() if draft else self._ray.get(self.draft.early_blocks.remote())
            )
            traffic |= {f"early_blocks_{key}": count for key, count in early.items()}
        return traffic
