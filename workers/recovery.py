"""What the coordinator and the Ray engine do when a worker's process dies.

Ray restarts a killed actor (``max_restarts``) by re-running its ``__init__``: a model
worker reloads its model and holds no batch. The coordinator keeps each batch's
committed state (:class:`specdec_core.decoding.DecodeState`: the tokens committed so
far, the lengths, the counters; every random draw derives from (seed, request id,
tokens generated)), so it re-prefills both workers from the prompt and the committed
tokens (:func:`committed_prompts`) and continues: the tokens come out as from an
uninterrupted run. A worker that keeps dying ends the batch with :class:`WorkerLost`.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid

import numpy as np

log = logging.getLogger(__name__)

DEFAULT_MAX_RESTARTS = 3  # Ray restarts of each actor (model workers and coordinator)
DEFAULT_MAX_BATCH_FAILURES = 3  # worker deaths in a row, without progress, before a batch fails
DEFAULT_RESTART_TIMEOUT_S = 300.0  # a restarted worker reloads (and recompiles) its model


class WorkerLost(RuntimeError):
    """A worker died and did not come back, or kept dying on the same batch."""


class BatchLost(RuntimeError):
    """A worker was called about a batch it does not hold: Ray restarted it between two
    of the batch's calls (it died while idle). Handled as that death."""


def worker_died(error: BaseException) -> bool:
    """Whether ``error`` means that a worker's process went away (as opposed to the
    worker raising an error of its own, which is not retried here)."""
    import ray

    from workers.channel import ChannelClosed

    if isinstance(error, ray.exceptions.RayTaskError):  # the task ran and raised:
        return isinstance(error.cause, BatchLost)  # only a restarted worker's batch counts
    # OutOfMemoryError: Ray's memory monitor killed the process (restarted like any death).
    died = ChannelClosed | ray.exceptions.RayActorError | ray.exceptions.OutOfMemoryError
    return isinstance(error, died)


def await_actor(actor, name: str, *, timeout_s: float = DEFAULT_RESTART_TIMEOUT_S) -> str:
    """Waits until ``actor`` answers again and returns its ``instance()`` id.

    Ray queues calls to an actor that is restarting; a call to one that is dead for
    good (its ``max_restarts`` spent) fails at once with ``ActorDiedError``, which is
    retried twice (the first answers after a death can race the restart) before
    :class:`WorkerLost` is raised.
    """
    import ray

    deadline = time.monotonic() + timeout_s
    died = 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerLost(f"the {name} did not come back within {timeout_s:g} s")
        try:
            return ray.get(actor.instance.remote(), timeout=remaining)
        except ray.exceptions.GetTimeoutError:
            continue
        except ray.exceptions.ActorDiedError as error:
            died += 1
            if died >= 3:
                reason = str(error).splitlines()[0] if str(error) else type(error).__name__
                raise WorkerLost(
                    f"the {name} died and was not restarted (its max_restarts are spent): {reason}"
                ) from error
            time.sleep(0.5)
        except ray.exceptions.RayActorError:  # unavailable for now: restarting
            time.sleep(0.2)


def initial_state(batch, settings):
    """The committed state of a batch before its first iteration, on the host (numpy):
    what a restart resumes from when nothing is committed yet."""
    import jax

    from specdec_core import decoding

    return jax.device_get(
        decoding.init_state(
            batch.prompt_tokens,
            batch.prompt_lengths,
            batch.request_keys,
            seed=settings.seed,
            max_new_tokens=batch.max_new_tokens,
            gamma=settings.gamma,
        )
    )


def committed_prompts(
    prompt_tokens: np.ndarray,
    prompt_lengths: np.ndarray,
    out_tokens: np.ndarray,
    n_generated: np.ndarray,
    max_len: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Each row's prompt followed by its committed tokens: what a restarted worker
    prefills to resume a batch (the last one stays pending, as after any commit).

    prompt_tokens [B, P], prompt_lengths [B], out_tokens [B, W], n_generated [B]
    (a :class:`~specdec_core.decoding.DecodeState`'s fields). Returns (tokens [B, P'],
    lengths [B]) with lengths = prompt_lengths + n_generated (the state's
    ``seq_lengths``), P' rounded up to a multiple of 16 and at most ``max_len``.
    """
    prompt_lengths = np.asarray(prompt_lengths)
    n_generated = np.asarray(n_generated)
    lengths = prompt_lengths + n_generated
    width = -(-int(lengths.max()) // 16) * 16
    width = min(max(width, prompt_tokens.shape[1]), max_len)
    if int(lengths.max()) > width:
        raise ValueError(f"committed sequences of {int(lengths.max())} exceed max_len {max_len}")
    tokens = np.zeros((prompt_tokens.shape[0], width), np.int32)
    for row, (p, n) in enumerate(zip(prompt_lengths.tolist(), n_generated.tolist(), strict=True)):
        tokens[row, :p] = prompt_tokens[row, :p]
        tokens[row, p : p + n] = out_tokens[row, :n]
    return tokens, lengths.astype(np.int32)


def retrying(attempt, *, recover, max_failures: int, progress=lambda: 0):
    """``attempt()``, again after each death of a worker it calls (``recover()`` in
    between: wait for the restart, reconnect), until it returns.

    Raises :class:`WorkerLost` after ``max_failures`` deaths in a row with no
    ``progress()`` (e.g. committed tokens) between them; any other error, and a
    ``WorkerLost`` from ``attempt`` or ``recover``, at once.
    """
    failures, last, pending = 0, progress(), False
    while True:
        try:
            if pending:
                recover()
            return attempt()
        except WorkerLost:
            raise
        except Exception as error:
            if not worker_died(error):
                raise
            now = progress()
            failures = 1 if now > last else failures + 1
            last, pending = now, True
            summary = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"
            if failures > max_failures:
                raise WorkerLost(
                    f"a worker died {failures} times in a row on this batch "
                    f"(max_batch_failures={max_failures}); last: {summary}"
                ) from error
            log.warning(
                "specdec: a worker went away (%s); waiting for Ray to restart it, then "
                "resuming the batch from its committed tokens",
                summary,
            )


class Restartable:
    """What the coordinator asks of an actor that Ray may restart: an id of its
    incarnation (a restarted actor, a new process, has a new one), its pid, and a
    fault-injection hook for tests."""

    _instance: str | None = None
    _kill_in: int | None = None

    def instance(self) -> str:
        if self._instance is None:
            self._instance = uuid.uuid4().hex
        return self._instance

    def pid(self) -> int:
        return os.getpid()

    def kill_after(self, steps: int) -> None:
        """Fault injection for tests: SIGKILL this process at its ``steps``-th next
        step (a worker's wire call, a coordinator's iteration), mid-batch, as an
        outside kill would. The restarted actor does not inherit it."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        self._kill_in = steps

    def _step(self) -> None:
        """Called at each step: dies here if :meth:`kill_after` says so."""
        if self._kill_in is not None:
            self._kill_in -= 1
            if self._kill_in <= 0:
                os.kill(os.getpid(), signal.SIGKILL)
