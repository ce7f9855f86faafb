"""A model worker: one model (draft or target) in its own process, as a Ray actor.

It keeps one cache per in-flight batch (``batch_id``) and serves the roles of an
iteration. Per iteration a coordinator makes two calls, and only what is needed
crosses. Each runs one step of :mod:`specdec_core.decoding`, jitted here:

- target ``score(state, draft_tokens, q_tok) -> (n_accepted, p_at_n)``:
  :func:`~specdec_core.decoding.score_and_count` scores γ+1 positions, runs the
  acceptance tests on the scalars q(x_i) and p(x_i), and returns the target
  distribution at the one position where it is needed ([B, V]);
- draft ``recover_and_propose(state, n_accepted, p_at_n) -> (state', tokens, q_tok)``:
  :func:`~specdec_core.decoding.recover_and_propose` samples the recovered/bonus
  token from norm(max(0, p − q)) with its own q, commits (state' is the committed
  state), and proposes the next γ tokens, keeping their full q for the next call.

Pipelined (``workers.coordinator``, ``pipelined=True``), the draft gets
``propose_ahead(state)`` before the target's ``score`` (the next block, proposed while
the target verifies; the call returns before it is computed) and ``settle`` in place
of ``recover_and_propose`` (the same result, the early block kept where it stands).

Caches' lengths derive from the state the coordinator sends, so calls carry no
hidden position and a restarted worker only needs the committed tokens again.
The class is plain Python; ``workers.ray_engine`` wraps it with ``ray.remote``.

The per-iteration calls go through :meth:`ModelWorker.call`, over the worker's direct
channel (:meth:`ModelWorker.open_channel`, :mod:`workers.channel`) or as Ray actor
calls: arguments and results travel as one ``bytes`` value each way, in
:mod:`workers.wire`'s own format (never pickle: the channel is a socket). Ray
ships every numpy array as its own out-of-band buffer, which for a dozen tiny arrays
costs more than the call itself on a small machine; one in-band blob costs about
what an empty call does.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import numpy as np

from specdec_core import decoding
from specdec_core.models.bound import BoundModel
from specdec_core.sampling import SamplingConfig
from workers import recovery, wire
from workers.batching import DecodeSettings
from workers.spec import ModelSpec
from workers.warmup import beside

WIRE_METHODS = ("propose_first", "score", "recover_and_propose", "propose_ahead", "settle")


@decoding.program_cache
def _score_and_count_fn(forward, config: SamplingConfig):
    make = lambda f: decoding.score_and_count(f, config)
    return decoding.jit_over(make, (forward,), donate_argnums=(0,))


@decoding.program_cache
def _propose_first_fn(forward, gamma: int, config: SamplingConfig):
    make = lambda f: decoding.propose_first(f, gamma, config)
    return decoding.jit_over(make, (forward,), donate_argnums=(0,))


@decoding.program_cache
def _recover_and_propose_fn(forward, gamma: int, config: SamplingConfig, eos_id: int | None):
    make = lambda f: decoding.recover_and_propose(f, gamma, config, eos_id)
    return decoding.jit_over(make, (forward,), donate_argnums=(0,))


@decoding.program_cache
def _propose_ahead_fn(forward, gamma: int, config: SamplingConfig, eos_id: int | None):
    make = lambda f: decoding.propose_ahead(f, gamma, config, eos_id)
    return decoding.jit_over(make, (forward,), donate_argnums=(0,))


@functools.lru_cache(maxsize=decoding.COMPILED_CACHE_SIZE)
def _settle_fn(eos_id: int | None, config: SamplingConfig):
    return jax.jit(functools.partial(decoding.settle, eos_id=eos_id, config=config))


@decoding.program_cache
def _propose_missed_fn(forward, gamma: int, config: SamplingConfig):
    make = lambda f: decoding.propose_missed(f, gamma, config)
    return decoding.jit_over(make, (forward,), donate_argnums=(0,))


def clear_compiled() -> None:
    """Drops the worker steps compiled in this process (and the models they hold)."""
    for cached in (
        _score_and_count_fn,
        _propose_first_fn,
        _recover_and_propose_fn,
        _propose_ahead_fn,
        _settle_fn,
        _propose_missed_fn,
    ):
        cached.cache_clear()


def sparse_rows(dense: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray | None, ...]:
    """``dense[rows]`` ([B, V]) in the smaller of two encodings.

    Sparse, (ids, values, offsets [R+1]): the target's distribution at the rejection
    point is one-hot at temperature 0 and has k entries under top-k, so sending only
    its support keeps traffic small without changing a single value. Dense,
    (None, dense[rows], None), when the support is over half the row (sampling at
    T > 0 without top-k/top-p): 4 bytes per entry instead of 8.
    """
    selected = dense[rows]
    support = selected != 0
    if 2 * int(support.sum()) > support.size:
        return None, selected, None
    ids, values, offsets = [], [], [0]
    for row in selected:
        nonzero = np.flatnonzero(row)
        ids.append(nonzero.astype(np.int32))
        values.append(row[nonzero])
        offsets.append(offsets[-1] + len(nonzero))
    if not ids:
        return np.zeros(0, np.int32), np.zeros(0, dense.dtype), np.zeros(1, np.int64)
    return np.concatenate(ids), np.concatenate(values), np.asarray(offsets, np.int64)


def dense_rows(sparse: tuple[np.ndarray | None, ...], rows: np.ndarray, shape) -> np.ndarray:
    """Inverse of :func:`sparse_rows`: a [B, V] float32 array, zero outside ``rows``."""
    ids, values, offsets = sparse
    dense = np.zeros(shape, np.float32)
    if ids is None:
        dense[rows] = values
        return dense
    for i, row in enumerate(rows):
        dense[row, ids[offsets[i] : offsets[i + 1]]] = values[offsets[i] : offsets[i + 1]]
    return dense


class ModelWorker(recovery.Restartable):
    """Hosts one model; see the module docstring for the protocol."""

    def __init__(self, spec: ModelSpec):
        self.spec = spec
        self.model: BoundModel = spec.load()
        self.mesh = None
        if spec.mesh is not None:  # the model on a slice (e.g. mesh: {data: 1, model: 8})
            from specdec_core import sharding
            from specdec_core.models.bound import on_mesh

            data, model = spec.mesh
            self.mesh = sharding.make_mesh(data=data, model=model)
            self.model = on_mesh(self.model, self.mesh)
        self._caches: dict[str, Any] = {}
        self._proposals: dict[str, tuple[jax.Array, jax.Array]] = {}  # tokens, full q
        self._early: dict[str, tuple] = {}  # guess, the next block and its q (propose_ahead)
        self._early_counts = {"proposed": 0, "kept": 0}  # iterations pipelined, since (re)start
        self._channel = None
        self._draft: ModelWorker | None = None  # a draft hosted here (host_draft)
        self._warmup = None  # the job's programs compiled ahead here (warm)

    def open_channel(self, secret: bytes) -> tuple[str, int]:
        """Starts (once) the direct channel for the loop's calls; returns its address.

        The channel serves :meth:`call` (:mod:`workers.channel`) to clients that hold
        ``secret``, the job's channel secret; Ray still carries start, release and the
        rest. A restarted actor has no channel: the coordinator calls this again.
        """
        if self._channel is None:
            from workers.channel import ChannelServer

            self._channel = ChannelServer(self.call, secret=secret)
        elif secret != self._channel.secret:
            raise ValueError("this worker's channel is already open with another secret")
        return self._channel.address

    def info(self) -> dict:
        """The model's name, family, vocabulary and size; its mesh (None: one device),
        the devices its params live on and how many of its param arrays are split."""
        leaves = jax.tree.leaves(self.model.params)
        return {
            "name": self.model.name,
            "family": self.model.family,
            "vocab_size": self.model.vocab_size,
            "params": self.model.param_count(),
            "mesh": None if self.mesh is None else dict(self.mesh.shape),
            "param_devices": len({d for leaf in leaves for d in leaf.devices()}),
            "sharded_params": sum(not leaf.sharding.is_fully_replicated for leaf in leaves),
        }

    def start(
        self, batch_id: str, encoder_tokens, prompt_tokens, prompt_lengths, max_len: int
    ) -> None:
        """Encodes (T5) and prefills the prompts of a new batch."""
        cache = self.model.new_cache(encoder_tokens, prompt_tokens.shape[0], max_len)
        self._caches[batch_id] = jax.block_until_ready(
            decoding.prefill_fn(self.model.forward)(cache, prompt_tokens, prompt_lengths)
        )

    def propose_first(self, batch_id: str, state, settings: DecodeSettings):
        fn = _propose_first_fn(self.model.forward, settings.gamma, settings.sampling)
        tokens, probs, token_probs, self._caches[batch_id] = fn(self._cache(batch_id), state)
        self._proposals[batch_id] = (tokens, probs)
        return np.asarray(tokens), np.asarray(token_probs)

    def score(
        self, batch_id: str, state, draft_tokens, draft_token_probs, settings: DecodeSettings
    ):
        """n_accepted [B], and p at the rejection point of each active row (sparse)."""
        fn = _score_and_count_fn(self.model.forward, settings.sampling)
        n_accepted, target_at_n, self._caches[batch_id] = fn(
            self._cache(batch_id), state, draft_tokens, draft_token_probs
        )
        active = np.flatnonzero(~np.asarray(state.done))
        return np.asarray(n_accepted), sparse_rows(np.asarray(target_at_n), active)

    def recover_and_propose(
        self, batch_id: str, state, settings: DecodeSettings, n_accepted, target_at_n
    ):
        """(committed state, next draft tokens [B, γ], their q [B, γ]).

        Samples the recovered/bonus token, commits the iteration (the same
        :func:`decoding.commit` as the in-process loop) and proposes the next block;
        the coordinator adopts the returned state.
        """
        fn = _recover_and_propose_fn(
            self.model.forward, settings.gamma, settings.sampling, settings.eos_id
        )
        cache = self._cache(batch_id)
        draft_tokens, draft_probs = self._proposals[batch_id]
        active = np.flatnonzero(~np.asarray(state.done))
        target_at_n = dense_rows(target_at_n, active, draft_probs.shape[::2])
        new_state, tokens, probs, token_probs, self._caches[batch_id] = fn(
            cache, state, draft_tokens, draft_probs, n_accepted, target_at_n
        )
        self._proposals[batch_id] = (tokens, probs)
        return jax.device_get(new_state), np.asarray(tokens), np.asarray(token_probs)

    def propose_ahead(self, batch_id: str, state, settings: DecodeSettings) -> None:
        """Starts the next block's early proposal while the target scores this one
        (pipelined speculation, :func:`decoding.propose_ahead`) and returns before it is
        computed: JAX dispatches the call and this process's threads run it."""
        fn = _propose_ahead_fn(
            self.model.forward, settings.gamma, settings.sampling, settings.eos_id
        )
        cache = self._cache(batch_id)  # (a restarted worker: BatchLost, named)
        draft_tokens, _ = self._proposals[batch_id]
        *early, self._caches[batch_id] = fn(cache, state, draft_tokens)
        self._early[batch_id] = tuple(early)

    def settle(self, batch_id: str, state, settings: DecodeSettings, n_accepted, target_at_n):
        """:meth:`recover_and_propose` after :meth:`propose_ahead`: the same result, with
        the early block kept by the rows where it stands and a fresh one for the rest
        (:func:`decoding.settle`, :func:`decoding.propose_missed`)."""
        cache = self._cache(batch_id)  # (a restarted worker: BatchLost, named)
        draft_tokens, draft_probs = self._proposals[batch_id]
        guess, tokens, probs, token_probs = self._early.pop(batch_id)
        active = np.flatnonzero(~np.asarray(state.done))
        target_at_n = dense_rows(target_at_n, active, draft_probs.shape[::2])
        new_state, hit = _settle_fn(settings.eos_id, settings.sampling)(
            state, draft_tokens, draft_probs, n_accepted, target_at_n, guess
        )
        kept = bool(np.asarray(hit).all())
        if not kept:
            fn = _propose_missed_fn(self.model.forward, settings.gamma, settings.sampling)
            tokens, probs, token_probs, self._caches[batch_id] = fn(
                cache, new_state, hit, tokens, probs
            )
        self._early_counts["proposed"] += 1
        self._early_counts["kept"] += kept
        self._proposals[batch_id] = (tokens, probs)
        return jax.device_get(new_state), np.asarray(tokens), np.asarray(token_probs)

    def early_blocks(self) -> dict[str, int]:
        """Iterations that settled an early block, and those that kept it whole (every row
        stood: no fresh proposal), since this worker (re)started."""
        return dict(self._early_counts)

    def call(self, method: str, payload: bytes, *chained: bytes) -> bytes:
        """``method(*args, *results)`` with args and result as :mod:`workers.wire` blobs.

        ``chained`` are other calls' result blobs (tuples), appended to the arguments:
        the coordinator passes the target's ``score`` result to the draft as an
        ObjectRef, so it goes to the draft without a round trip through Python.
        """
        if method not in WIRE_METHODS:
            raise ValueError(f"{method!r} is not a wire method (one of {WIRE_METHODS})")
        self._step()  # (kill_after: a test's fault)
        args = tuple(wire.loads(payload))
        for result in chained:
            args += tuple(wire.loads(result))
        return wire.dumps(getattr(self, method)(*args))

    def host_draft(self, spec: ModelSpec) -> dict:
        """Loads ``spec`` beside this worker's model (once; ``draft_placement="target"``)
        and returns its :meth:`info`."""
        if self._draft is None or self._draft.spec != spec:
            # the target standing in for the draft (--draft none) is this worker's model
            self._draft = self if spec == self.spec else ModelWorker(spec)
        return self._draft.info()

    def step_costs(
        self,
        encoder_tokens,
        ks: tuple[int, ...],
        cache_len: int,
        batch: int,
        repeats: int,
        draft: ModelSpec | None = None,
    ) -> dict:
        """The cost model's inputs timed on this worker's devices, as the job's loop ran
        them (``specdec_core.costs.timed_calls``): {"target_s": {k: seconds per call on k
        tokens}, "draft_step_s": seconds per step of ``draft`` (:meth:`host_draft`, so
        the draft this worker ran) or None}."""
        from specdec_core import costs

        if draft is not None:
            self.host_draft(draft)
        target_s, draft_s = costs.timed_calls(
            self.model,
            self._draft.model if draft is not None else None,
            encoder_tokens,
            ks=ks,
            cache_len=cache_len,
            batch=batch,
            repeats=repeats,
        )
        return {"target_s": target_s, "draft_step_s": draft_s}

    def generate_with_draft(
        self, batch, settings: DecodeSettings, spec: ModelSpec
    ) -> decoding.DecodeResult:
        """One packed batch through the whole speculative loop in this process, compiled
        (:func:`workers.engine.decode_speculative`), with the draft :meth:`host_draft`
        loaded here: no call crosses a process until the batch is done."""
        from workers.engine import decode_speculative

        self._step()  # (kill_after: a test's fault)
        self.host_draft(spec)
        return beside(
            self._warmup,
            lambda: decode_speculative(
                self.model, self._draft.model, batch, settings, compiled=True
            ),
        )

    def warm(
        self,
        encoder_lengths: tuple[int, ...],
        prompt_tokens: tuple[int, ...],
        settings: DecodeSettings,
        loops: tuple[DecodeSettings, ...],
        draft: ModelSpec | None,
        eager: bool,
    ) -> None:
        """Starts compiling the job's programs in a background thread here
        (:func:`workers.engine.warm_programs`; ``draft``: the one :meth:`host_draft`
        loads, for the ``loops``); returns once the first program is warm
        (:meth:`workers.warmup.Warmup.first`)."""
        from workers.engine import warm_programs

        if draft is not None:
            self.host_draft(draft)
        draft_model = None if draft is None else self._draft.model
        self._warmup = warm_programs(
            self.model,
            draft_model,
            settings,
            encoder_lengths,
            prompt_tokens,
            loops=loops,
            eager=eager,
        )
        self._warmup.first()

    def warm_settle(self, key: tuple, shape: tuple, loop: bool) -> bool | None:
        """Waits while the warm-up runs a program a batch of ``key`` needs now
        (:meth:`workers.warmup.Warmup.settle`); returns whether the loop of its program
        ``shape`` is warm (:meth:`workers.warmup.Warmup.loop_ready`). A restarted
        worker has none: None."""
        if self._warmup is None:
            return None
        self._warmup.settle(key, loop=loop)
        return self._warmup.loop_ready(shape)

    def warm_buy(self, shape: tuple) -> bool:
        """:meth:`workers.warmup.Warmup.buy` here; False without a warm-up."""
        return self._warmup is not None and self._warmup.buy(shape)

    def warm_report(self, stop: bool) -> dict | None:
        """:meth:`workers.warmup.Warmup.report` of the warm-up here; None: none."""
        return None if self._warmup is None else self._warmup.report(stop=stop)

    def generate_alone(self, batch, settings: DecodeSettings) -> decoding.DecodeResult:
        """Target-only decoding of a packed batch, for the baseline of a job."""
        from workers.engine import decode_baseline

        return beside(self._warmup, lambda: decode_baseline(self.model, batch, settings))

    def release(self, batch_id: str) -> None:
        for held in (self._caches, self._proposals, self._early):
            held.pop(batch_id, None)

    def _cache(self, batch_id: str):
        try:
            return self._caches[batch_id]
        except KeyError:
            raise recovery.BatchLost(
                f"no batch {batch_id!r} here: this worker was restarted since it started"
            ) from None

    def release_all(self) -> None:
        """Drops every batch (a restarted coordinator's predecessor left its own)."""
        for held in (self._caches, self._proposals, self._early):
            held.clear()
