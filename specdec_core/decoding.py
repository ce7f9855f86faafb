"""Target-only autoregressive decoding and the in-process speculative loop.

Both take models as callables that follow the contract of
:mod:`specdec_core.models.api` (``forward(cache, tokens) -> (logits, cache)``, rollback
by ``lengths``), never model classes, and caches made by the caller large enough for
``prompt + max_new_tokens + gamma + 1`` positions.

Sequence bookkeeping, per row: the *committed* sequence is the prompt followed by the
generated tokens, ``seq_lengths`` long. Caches start empty (``lengths == 0``). A
cache's lengths are always derived from the state, never carried between calls:
before each call the target's cache is rolled back to ``seq_lengths - 1`` (it then
feeds the *pending* last token with the drafts) and the draft's to ``seq_lengths - 2``
(it re-feeds the previous token with the pending one, so a fully accepted block needs
no extra draft call to catch up on x_γ; its first call feeds the pending token alone).
So a worker that holds a cache needs nothing but the state to stay in step, and a
rejected block is undone in O(1).

The roles of one iteration are separate functions — :func:`propose_fn`,
:func:`score_fn`, :func:`verify` and :func:`commit` — so that the in-process loop here
and the Ray workers in ``workers/`` run the same code. When the draft and the target
live in separate processes, an iteration is the target's :func:`score_and_count`
followed by the draft's :func:`recover_and_propose` (the two halves of
:func:`acceptance.accept` around one process boundary; :func:`propose_first` starts
a batch). A worker only jits these and moves their inputs and outputs.

Randomness: every draw of a row derives from ``(seed, request_id, position)``, the
output position it decides (:func:`position_uniforms`, :func:`position_noise`), so a
request's output does not depend on its batch, its position in it, restarts, or at a
temperature above 0 where its blocks begin and end (``SamplingConfig.drafts_bonus``).
"""

from __future__ import annotations

import collections
import functools
import math
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from specdec_core import acceptance, sampling
from specdec_core.models.api import Forward, rollback

# Compiled steps are cached per (model structure, settings): see program_cache. Each
# entry holds the params of the model that used it last and the XLA executables, so the
# caches are bounded: a job uses one target and one draft (a few γ and sampling settings
# each); a process that goes through many models (a test session, a notebook) frees the
# oldest, or all with clear_compiled().
COMPILED_CACHE_SIZE = 16


@flax.struct.dataclass
class DecodeState:
    """Per-row loop state; every field has a leading batch axis B."""

    out_tokens: jax.Array  # [B, max_new + γ + 1] int32: generated tokens (junk past n_generated)
    n_generated: jax.Array  # [B] int32: tokens generated and committed so far
    max_new: jax.Array  # [B] int32: per-row budget of new tokens
    seq_lengths: jax.Array  # [B] int32: committed sequence length, prompt included
    done: jax.Array  # [B] bool: hit EOS or max_new
    pending: jax.Array  # [B] int32: last committed token, not yet in the target's cache
    previous: jax.Array  # [B] int32: the committed token before it
    row_keys: jax.Array  # [B, 2] uint32 raw PRNG key data from (seed, request id)
    iterations: jax.Array  # [B] int32: iterations this row took part in
    drafted: jax.Array  # [B] int32: drafted tokens proposed to this row
    accepted: jax.Array  # [B] int32: drafted tokens accepted
    accepted_by_position: jax.Array  # [B, γ] int32: accepted count at each draft position


@flax.struct.dataclass
class DecodeResult:
    tokens: np.ndarray  # [B, max_new] int32, padded with pad_id past lengths
    lengths: np.ndarray  # [B] int32: generated tokens per row (EOS included when hit)
    iterations: np.ndarray  # [B] int32: iterations (= target calls) per row
    drafted: np.ndarray  # [B] int32
    accepted: np.ndarray  # [B] int32
    accepted_by_position: np.ndarray  # [B, γ] int32 (γ = 0 for target-only decoding)
    draft_s: float  # wall seconds inside draft calls (batch-level)
    target_s: float  # wall seconds inside target calls, prefill included
    overhead_s: float  # wall seconds outside model calls: acceptance, commit, the host loop
    total_s: float
    # wall seconds of the decode loop alone: what γ changes (the encoder, the prefill and
    # the state's setup are paid once per batch at any γ); NaN where not measured
    loop_s: float = float("nan")
    # wall seconds of the call spent compiling its programs (costs.compile_clock), NaN
    # where not measured: the engine that ran the call fills it in
    compile_s: float = float("nan")
    # the engine's background compiling ran beside the call, sharing its cores: its
    # seconds are not the batch's alone (workers.step_times)
    contended: bool = False

    def row_tokens(self, row: int) -> list[int]:
        return self.tokens[row, : self.lengths[row]].tolist()


def measured_loop_s(result) -> float | None:
    """``result.loop_s`` where the engine timed its decode loop apart, else None (a
    result without the field, or NaN)."""
    loop_s = getattr(result, "loop_s", float("nan"))
    return float(loop_s) if math.isfinite(loop_s) else None


def measured_compile_s(result) -> float | None:
    """``result.compile_s`` where the engine measured it, else None."""
    compile_s = getattr(result, "compile_s", float("nan"))
    return float(compile_s) if math.isfinite(compile_s) else None


def request_keys(seed: int, request_ids: jax.Array) -> jax.Array:
    """[B] PRNG keys, one per request id, from the job seed."""
    base = jax.random.key(seed)
    return jax.vmap(lambda rid: jax.random.fold_in(base, rid))(
        jnp.asarray(request_ids).astype(jnp.uint32)
    )


def _step_keys(state: DecodeState) -> jax.Array:
    keys = jax.random.wrap_key_data(state.row_keys)
    return jax.vmap(jax.random.fold_in)(keys, state.n_generated)


# streams, folded into a row's key before the position: the invariant rule's noise, and
# the paper rule's three draws at a position (the draft's token, the test, the next token)
_POSITION_NOISE, _DRAFT_DRAW, _TEST, _NEXT_DRAW = 2, 3, 4, 5


def position_uniforms(state: DecodeState, stream: int, width: int) -> jax.Array:
    """Uniforms [B, width] of each row's output positions ``n_generated`` ..
    ``n_generated + width - 1`` in one of the paper rule's streams, from (seed, request,
    stream, position) only: the draw a position gets is the same in every loop, at
    every γ and wherever in a block the position falls."""
    keys = jax.random.wrap_key_data(state.row_keys)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, stream))(keys)
    positions = state.n_generated[:, None] + jnp.arange(width)[None, :]

    def row(key, row_positions):
        return jax.vmap(lambda p: jax.random.uniform(jax.random.fold_in(key, p)))(row_positions)

    return jax.vmap(row)(keys, positions)


def position_noise(state: DecodeState, offset: int, vocab: int) -> jax.Array:
    """Standard Gumbel noise [B, V] of each row's output position ``n_generated +
    offset``, from (seed, request, position) only: the invariant rule's draw there
    (``SamplingConfig.rule == "invariant"``), the same in every loop and at every γ."""
    keys = jax.random.wrap_key_data(state.row_keys)
    keys = jax.vmap(lambda k: jax.random.fold_in(k, _POSITION_NOISE))(keys)
    keys = jax.vmap(jax.random.fold_in)(keys, state.n_generated + offset)
    return jax.vmap(lambda k: jax.random.gumbel(k, (vocab,), jnp.float32))(keys)


def block_noise(state: DecodeState, width: int, vocab: int) -> jax.Array:
    """:func:`position_noise` of ``width`` positions from the next one: [B, width, V]."""
    return jnp.stack([position_noise(state, i, vocab) for i in range(width)], axis=1)


def init_state(
    prompt_tokens, prompt_lengths, request_ids, *, seed, max_new_tokens, gamma
) -> DecodeState:
    """The loop state before the first iteration (prompts as in :func:`speculative_generate`)."""
    batch = prompt_tokens.shape[0]
    max_new = np.broadcast_to(np.asarray(max_new_tokens, np.int32), (batch,))
    width = int(max_new.max()) + gamma + 1
    return _init_state_fn(width, gamma)(
        prompt_tokens, prompt_lengths, np.asarray(request_ids, np.uint32), np.int32(seed), max_new
    )


def jit_over(make: Callable, forwards: Sequence[Forward], donate_argnums: tuple[int, ...] = ()):
    """``jax.jit(make(*forwards))``, with each bound model's params as inputs of the program.

    A trained model's forward is a ``jax.tree_util.Partial`` holding its params: passed in
    as an argument, ``make`` builds the step on the traced forward, so the weights are
    inputs rather than constants baked into the program (baked, every compile folds the
    whole model and every cache entry is the model's size). Other forwards (n-gram
    tables, stand-ins) stay closed over. ``donate_argnums`` count the step's own arguments.
    """
    dynamic = tuple(isinstance(f, jax.tree_util.Partial) for f in forwards)
    # the program closes over the other forwards only: the params come in as inputs
    # (program_cache rebinds them), and a closed-over model would be kept alive with it
    static = tuple(None if d else f for f, d in zip(forwards, dynamic, strict=True))

    def run(traced, *args):
        supplied = iter(traced)
        fs = [next(supplied) if d else f for f, d in zip(static, dynamic, strict=True)]
        return make(*fs)(*args)

    jitted = jax.jit(run, donate_argnums=tuple(i + 1 for i in donate_argnums))
    return functools.partial(jitted, tuple(f for f, d in zip(forwards, dynamic, strict=True) if d))


class _Structure:
    """A forward's tree structure as a cache key, its hash computed once (hashing a
    model's tree walks its config; a decode loop looks its steps up every iteration)."""

    __slots__ = ("_hash", "treedef")

    def __init__(self, treedef):
        self.treedef, self._hash = treedef, hash(treedef)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _Structure) and self.treedef == other.treedef


# each forward's structure, computed once per forward object (it walks the params' tree,
# 144 leaves for the embedded T5 target) and dropped with the forward
_STRUCTURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _structure(arg: Hashable) -> Hashable:
    """What a compiled step depends on in ``arg``: a forward with its params as inputs
    (a ``jax.tree_util.Partial``) counts by its tree's structure, which holds its
    function and config and not its weights; anything else by its own equality."""
    if not isinstance(arg, jax.tree_util.Partial):
        return arg
    known = _STRUCTURES.get(arg)
    if known is not None:
        return known
    try:
        structure = _Structure(jax.tree_util.tree_structure(arg))
    except TypeError:  # a config that cannot be hashed: only this very forward
        return arg
    _STRUCTURES[arg] = structure
    return structure


def _binds(program: functools.partial, forwards: tuple) -> bool:
    """Whether ``program`` (:func:`jit_over`'s) takes these very forward objects."""
    return tuple(map(id, program.args[0])) == tuple(map(id, forwards))


def program_cache(builder: Callable) -> Callable:
    """``functools.lru_cache(maxsize=COMPILED_CACHE_SIZE)`` for a builder of compiled
    steps, keyed by the structure of its forwards rather than their identity.

    A builder takes forwards among its arguments and returns :func:`jit_over` of them,
    in the same order. Forwards with their params as inputs (trained models) that share
    a structure share the program: two loads of one checkpoint, a target and a draft of
    one config with different weights. The program found is returned bound to the
    caller's own params, so it computes with them; nothing compiles again. The entry
    keeps the params of its latest caller, so a model that is dropped (the last
    checkpoint, once the next one is loaded) is freed. Other forwards (n-gram tables,
    stand-ins) are closed over, so they key by identity as before."""
    entries: collections.OrderedDict = collections.OrderedDict()
    lock = threading.Lock()

    @functools.wraps(builder)
    def cached(*args):
        bound = tuple(a for a in args if isinstance(a, jax.tree_util.Partial))
        key = tuple(_structure(a) for a in args)
        with lock:
            program = entries.get(key)
            if program is not None:
                entries.move_to_end(key)
        if program is None:
            program = builder(*args)
            if bound and not (
                isinstance(program, functools.partial)
                and len(program.args) == 1
                and _binds(program, bound)
            ):
                raise TypeError(f"{builder.__name__} must return jit_over of its forwards")
            with lock:
                entries[key] = program
                while len(entries) > COMPILED_CACHE_SIZE:
                    entries.popitem(last=False)
            return program
        if bound and not _binds(program, bound):
            program = functools.partial(program.func, bound)  # same program, these params
            with lock:  # the entry holds the newest params: an older model can be freed
                if key in entries:
                    entries[key] = program
        return program

    def cache_clear() -> None:
        with lock:
            entries.clear()

    cached.cache_clear = cache_clear
    cached.cache_len = lambda: len(entries)
    return cached


@functools.lru_cache(maxsize=COMPILED_CACHE_SIZE)
def _init_state_fn(width: int, gamma: int):
    """One compiled call builds the whole state (a dozen tiny ops would each dispatch)."""

    def init(prompt_tokens, prompt_lengths, request_ids, seed, max_new) -> DecodeState:
        batch = prompt_tokens.shape[0]
        rows = jnp.arange(batch)
        zeros = jnp.zeros((batch,), jnp.int32)
        return DecodeState(
            out_tokens=jnp.zeros((batch, width), jnp.int32),
            n_generated=zeros,
            max_new=max_new,
            seq_lengths=prompt_lengths,
            done=max_new <= 0,
            pending=prompt_tokens[rows, prompt_lengths - 1],
            previous=prompt_tokens[rows, jnp.maximum(prompt_lengths - 2, 0)],
            row_keys=jax.random.key_data(request_keys(seed, request_ids)),
            iterations=zeros,
            drafted=zeros,
            accepted=zeros,
            accepted_by_position=jnp.zeros((batch, gamma), jnp.int32),
        )

    return jax.jit(init)


def prefill_fn(forward: Forward):
    """``(cache, prompt_tokens [B, P], prompt_lengths [B]) -> cache``: writes the prompt
    from position 0 and keeps all but its last token (the pending one).

    Prompts of one token (an encoder-decoder's start token: every translation and
    summary) leave nothing to keep, so no model call is made: the cache is emptied
    (a call would write slot 0 and then drop it; it cost a decode step per batch)."""

    compiled = _prefill_program(forward)

    def prefill(cache, prompt_tokens, prompt_lengths):
        if int(np.max(np.asarray(prompt_lengths))) == 1:
            return rollback(cache, np.zeros(prompt_tokens.shape[:1], np.int32))
        return compiled(cache, prompt_tokens, prompt_lengths)

    return prefill


@program_cache
def _prefill_program(forward: Forward):
    def make(forward):
        def prefill(cache, prompt_tokens, prompt_lengths):
            _, cache = forward(rollback(cache, jnp.zeros_like(prompt_lengths)), prompt_tokens)
            return rollback(cache, prompt_lengths - 1)

        return prefill

    return jit_over(make, (forward,))


def _commit_block(
    state: DecodeState, block: jax.Array, n_new: jax.Array, eos_id: int | None
) -> tuple[DecodeState, jax.Array]:
    """Appends block[:, :n_new] to active rows, stopping at EOS or max_new.

    block: [B, W] int32 candidate tokens; n_new: [B] int32 valid tokens in it.
    Returns the new state (pending/previous untouched) and the kept count [B].
    """
    batch, width = block.shape
    rows = jnp.arange(batch)[:, None]
    cols = state.n_generated[:, None] + jnp.arange(width)[None, :]
    valid = jnp.arange(width)[None, :] < n_new[:, None]
    if eos_id is not None:
        is_eos = (block == eos_id) & valid
        first_eos = jnp.where(is_eos.any(1), jnp.argmax(is_eos, axis=1), width)
        n_new = jnp.minimum(n_new, first_eos + 1)
        hit_eos = is_eos.any(1)
    else:
        hit_eos = jnp.zeros((batch,), bool)
    kept = jnp.where(state.done, 0, jnp.minimum(n_new, state.max_new - state.n_generated))
    written = state.out_tokens.at[rows, cols].set(block, mode="drop")
    out = jnp.where(state.done[:, None], state.out_tokens, written)
    n_generated = state.n_generated + kept
    done = state.done | hit_eos | (n_generated >= state.max_new)
    return state.replace(
        out_tokens=out, n_generated=n_generated, seq_lengths=state.seq_lengths + kept, done=done
    ), kept


# ---------------------------------------------------------------- target-only baseline


@program_cache
def _autoregressive_fn(forward: Forward, config: sampling.SamplingConfig, eos_id: int | None):
    return jit_over(lambda f: _autoregressive(f, config, eos_id), (forward,), donate_argnums=(1,))


def _autoregressive(forward: Forward, config: sampling.SamplingConfig, eos_id: int | None):
    def step(carry):
        state, cache = carry
        logits, cache = forward(cache, state.pending[:, None])
        probs = sampling.probs_from_logits(logits[:, 0], config)
        if config.invariant:
            token = sampling.gumbel_argmax(probs, position_noise(state, 0, probs.shape[-1]))
        else:
            token = sampling.draw_rows(_step_keys(state), probs, config)
        was_active = ~state.done
        new_state, _ = _commit_block(state, token[:, None], jnp.ones_like(token), eos_id)
        # Rows that were already done do not advance their cache.
        cache = rollback(cache, jnp.where(was_active, cache.lengths, cache.lengths - 1))
        new_state = new_state.replace(
            pending=jnp.where(was_active, token, state.pending),
            iterations=state.iterations + was_active,
        )
        return new_state, cache

    def run(state, cache):
        return jax.lax.while_loop(lambda c: ~jnp.all(c[0].done), step, (state, cache))

    return run


def autoregressive_generate(
    *,
    target: Forward,
    target_cache: Any,
    prompt_tokens,
    prompt_lengths,
    request_ids,
    max_new_tokens,
    sampling_config: sampling.SamplingConfig,
    seed: int = 0,
    eos_id: int | None = None,
    pad_id: int = 0,
    dry_run: bool = False,
) -> DecodeResult:
    """Target-only decoding, one token per target call, the whole loop compiled.

    prompt_tokens: [B, P] int32 (padded); prompt_lengths: [B] int32 ≥ 1;
    request_ids: [B] ints; max_new_tokens: int or [B]. ``dry_run``: every row starts
    done, so the call compiles (or loads) and runs the programs of these shapes and
    generates nothing (a job warms its batches' programs ahead of them).
    """
    prompt_tokens, prompt_lengths, state, start = _begin(
        prompt_tokens,
        prompt_lengths,
        request_ids,
        seed,
        max_new_tokens,
        gamma=0,
        dry_run=dry_run,
    )
    cache = prefill_fn(target)(target_cache, prompt_tokens, prompt_lengths)
    jax.block_until_ready((state, cache))
    loop_start = time.perf_counter()
    state, cache = _autoregressive_fn(target, sampling_config, eos_id)(state, cache)
    jax.block_until_ready(state)
    end = time.perf_counter()
    total = end - start
    return result_from_state(
        state,
        max_new_tokens,
        pad_id,
        draft_s=0.0,
        target_s=total,
        overhead_s=0.0,
        total_s=total,
        loop_s=end - loop_start,
    )


# ---------------------------------------------------------------- speculative loop


@program_cache
def propose_fn(draft: Forward, gamma: int, config: sampling.SamplingConfig, first: bool):
    """``(draft_cache, state) -> (draft_tokens [B, γ], draft_probs [B, γ, V], cache)``.

    The draft samples γ tokens autoregressively from its own sampling distribution.
    ``first``: the draft's cache was just prefilled (it holds ``seq_lengths - 1``).
    """
    return jit_over(lambda d: _propose(d, gamma, config, first), (draft,), donate_argnums=(0,))


def chain(draft_tokens: jax.Array, config: sampling.SamplingConfig) -> jax.Array:
    """x_1..x_γ of a block [B, D]: without the drafted bonus x_{γ+1}, where
    ``config.drafts_bonus`` has the draft propose it (D = γ + 1)."""
    return draft_tokens[:, : draft_tokens.shape[1] - config.drafts_bonus]


def _propose(draft: Forward, gamma: int, config: sampling.SamplingConfig, first: bool):
    """``propose(cache, state, steps=None)``: γ draft tokens (γ + 1 where
    ``config.drafts_bonus``: the bonus position's too), or with ``steps`` (a traced int32
    in [0, γ]) the first ``steps`` (+ 1) of the slots, the rest zeros: the same draft
    calls and draws as a proposal at γ = ``steps``, in buffers of one shape. The draft
    draws x_i with its position's uniform (:func:`position_uniforms`), or under the
    invariant rule its noise."""
    width = gamma + config.drafts_bonus

    def propose(cache, state: DecodeState, steps=None):
        if first:
            cache, feed = rollback(cache, state.seq_lengths - 1), state.pending[:, None]
        else:
            cache = rollback(cache, jnp.maximum(state.seq_lengths - 2, 0))
            feed = jnp.stack([state.previous, state.pending], 1)
        logits, cache = draft(cache, feed)
        probs = sampling.probs_from_logits(logits[:, -1], config)
        if config.invariant:  # the target's noise at each drafted position
            draws = jnp.swapaxes(block_noise(state, width, probs.shape[-1]), 0, 1)  # [D, B, V]

            def draw(noise, probs):
                return sampling.gumbel_argmax(probs, noise)
        else:
            uniforms = position_uniforms(state, _DRAFT_DRAW, width)  # [B, D]
            draws = jnp.swapaxes(uniforms, 0, 1)  # [D, B]

            def draw(u, probs):
                return sampling.draw(u, probs, config)

        token = draw(draws[0], probs)
        if steps is not None:
            drafts = steps + config.drafts_bonus
            return _propose_steps(draft, config, draw, cache, token, probs, draws, drafts)

        def step(carry, d):
            cache, token = carry
            logits, cache = draft(cache, token[:, None])
            probs = sampling.probs_from_logits(logits[:, 0], config)
            next_token = draw(d, probs)
            return (cache, next_token), (next_token, probs)

        (cache, _), (tokens, probs_rest) = jax.lax.scan(step, (cache, token), draws[1:])
        draft_tokens = jnp.concatenate([token[:, None], jnp.swapaxes(tokens, 0, 1)], 1)
        draft_probs = jnp.concatenate([probs[:, None], jnp.swapaxes(probs_rest, 0, 1)], 1)
        return draft_tokens, draft_probs, cache

    return propose


def _propose_steps(draft: Forward, config, draw, cache, token, probs, draws, steps):
    """The rest of :func:`_propose` for a traced number of ``steps`` drafts: one draft
    call per token after the first, as its scan makes, into [B, D] / [B, D, V] buffers."""
    gamma = draws.shape[0]
    tokens = jnp.zeros((token.shape[0], gamma), jnp.int32).at[:, 0].set(token)
    all_probs = jnp.zeros((*probs.shape[:1], gamma, probs.shape[-1]), probs.dtype)
    all_probs = all_probs.at[:, 0].set(probs)

    def step(i, carry):
        cache, token, tokens, all_probs = carry
        logits, cache = draft(cache, token[:, None])
        probs = sampling.probs_from_logits(logits[:, 0], config)
        next_token = draw(draws[i], probs)
        return cache, next_token, tokens.at[:, i].set(next_token), all_probs.at[:, i].set(probs)

    cache, _, tokens, all_probs = jax.lax.fori_loop(
        1, steps, step, (cache, token, tokens, all_probs)
    )
    return tokens, all_probs, cache


@program_cache
def score_fn(target: Forward, config: sampling.SamplingConfig):
    """``(target_cache, state, draft_tokens [B, D]) -> (target_probs [B, γ+1, V], cache)``:
    p at the γ+1 positions after the pending token (the drafted bonus is not fed)."""
    return jit_over(lambda t: _score(t, config), (target,), donate_argnums=(0,))


def _score(target: Forward, config: sampling.SamplingConfig):

    def score(cache, state: DecodeState, draft_tokens):
        cache = rollback(cache, state.seq_lengths - 1)
        tokens = jnp.concatenate([state.pending[:, None], chain(draft_tokens, config)], 1)
        logits, cache = target(cache, tokens)
        return sampling.probs_from_logits(logits, config), cache

    return score


def verify_uniforms(state: DecodeState, gamma: int) -> tuple[jax.Array, jax.Array]:
    """(tests [B, γ+1], draws [B, γ+1]): the acceptance rule's uniforms at the block's
    γ+1 positions (:func:`position_uniforms`), the same that :func:`verify` uses; for
    split workers that run the rule in two parts."""
    return (
        position_uniforms(state, _TEST, gamma + 1),
        position_uniforms(state, _NEXT_DRAW, gamma + 1),
    )


def verify(
    state: DecodeState,
    draft_tokens,
    draft_probs,
    target_probs,
    config: sampling.SamplingConfig,
    steps=None,
) -> acceptance.Verdict:
    """Algorithm 1 (:func:`acceptance.verdict`) with each position's own uniforms, or
    under ``config``'s invariant rule :func:`acceptance.accept_invariant` with the
    positions' noise; with ``steps`` (traced), at γ = ``steps`` on the block's first
    slots only (:func:`acceptance.accept_invariant_first` for the invariant rule)."""
    if config.invariant:
        noise = block_noise(state, draft_tokens.shape[1] + 1, target_probs.shape[-1])
        if steps is not None:
            return acceptance.accept_invariant_first(draft_tokens, target_probs, noise, steps)
        return acceptance.accept_invariant(draft_tokens, target_probs, noise)
    tests, draws = verify_uniforms(state, target_probs.shape[1] - 1)
    return acceptance.verdict(
        draft_tokens,
        draft_probs,
        target_probs,
        tests,
        draws,
        steps,
        bonus_drafted=config.drafts_bonus,
    )


def commit(
    state: DecodeState,
    draft_tokens: jax.Array,
    verdict: acceptance.Verdict,
    eos_id: int | None,
    steps=None,
) -> DecodeState:
    """Appends the accepted drafts and the next token to every active row; counts stats
    (``steps``: drafted tokens per row where fewer than the block's slots were used).
    ``draft_tokens`` [B, γ]: x_1..x_γ (:func:`chain`)."""
    batch, gamma = draft_tokens.shape
    rows = jnp.arange(batch)
    n = verdict.n_accepted
    block = jnp.concatenate([draft_tokens, jnp.zeros((batch, 1), jnp.int32)], 1)
    block = block.at[rows, n].set(verdict.next_token)  # [B, γ+1]
    active = ~state.done
    new_state, _ = _commit_block(state, block, n + 1, eos_id)
    prev_of_next = (
        jnp.where(n > 0, draft_tokens[rows, jnp.maximum(n - 1, 0)], state.pending)
        if gamma
        else state.pending
    )
    accepted_at = active[:, None] & (jnp.arange(gamma)[None, :] < n[:, None])
    return new_state.replace(
        pending=jnp.where(active, verdict.next_token, state.pending),
        previous=jnp.where(active, prev_of_next, state.previous),
        iterations=state.iterations + active,
        drafted=state.drafted + active * (gamma if steps is None else steps),
        accepted=state.accepted + jnp.where(active, n, 0),
        accepted_by_position=state.accepted_by_position + accepted_at,
    )


# ---------------------------------------------------------------- split across processes


def score_and_count(target: Forward, config: sampling.SamplingConfig):
    """The target's step of a split iteration (pure; the caller jits it).

    ``(target_cache, state, draft_tokens [B, D], draft_token_probs [B, D])
    -> (n [B], p_{n+1} [B, V], target_cache)``: scores the γ+1 positions
    (:func:`score_fn`) and runs :func:`acceptance.target_half` with the row's
    uniforms (:func:`verify_uniforms`). Only the draft's q_i(x_i) come in, and only
    the target's distribution at one position goes out.
    """
    score = _score(target, config)

    def step(cache, state: DecodeState, draft_tokens, draft_token_probs):
        target_probs, cache = score(cache, state, draft_tokens)  # [B, γ+1, V]
        if config.invariant:
            noise = block_noise(state, draft_tokens.shape[1] + 1, target_probs.shape[-1])
            n_accepted, target_at_n = acceptance.invariant_target_half(
                draft_tokens, target_probs, noise
            )
            return n_accepted, target_at_n, cache
        tests, _ = verify_uniforms(state, target_probs.shape[1] - 1)
        n_accepted, target_at_n = acceptance.target_half(
            draft_tokens,
            draft_token_probs,
            target_probs,
            tests,
            bonus_drafted=config.drafts_bonus,
        )
        return n_accepted, target_at_n, cache

    return step


def propose_first(draft: Forward, gamma: int, config: sampling.SamplingConfig):
    """The draft's first step of a batch (pure; the caller jits it), on a just-prefilled cache.

    ``(draft_cache, state) -> (draft_tokens [B, γ], draft_probs [B, γ, V],
    draft_token_probs [B, γ], draft_cache)``: the draft keeps its full q and sends
    its tokens with their q_i(x_i).
    """
    propose = _propose(draft, gamma, config, True)

    def step(cache, state: DecodeState):
        tokens, probs, cache = propose(cache, state)
        return tokens, probs, acceptance.token_probs(probs, tokens), cache

    return step


def recover_and_propose(
    draft: Forward, gamma: int, config: sampling.SamplingConfig, eos_id: int | None
):
    """The draft's step of a split iteration (pure; the caller jits it).

    ``(draft_cache, state, draft_tokens, draft_probs, n_accepted, p_{n+1})
    -> (state', next draft_tokens, their draft_probs, draft_token_probs, draft_cache)``:
    draws the recovered/bonus token (:func:`acceptance.draft_half`, with the same
    uniforms as the target's half), commits the iteration (:func:`commit`, as the
    in-process loop does) and proposes the next γ tokens from the committed state.
    """
    propose = _propose(draft, gamma, config, False)

    def step(cache, state: DecodeState, draft_tokens, draft_probs, n_accepted, target_at_n):
        new_state, _ = _recover_commit(
            state, draft_tokens, draft_probs, n_accepted, target_at_n, eos_id, config
        )
        tokens, probs, cache = propose(cache, new_state)
        return new_state, tokens, probs, acceptance.token_probs(probs, tokens), cache

    return step


def _recover_commit(state, draft_tokens, draft_probs, n, target_at_n, eos_id, config):
    """The recovered/bonus token drawn (the draft's half of the rule) and committed:
    (state', the iteration's verdict)."""
    x = chain(draft_tokens, config)
    _, draws = verify_uniforms(state, x.shape[1])
    verdict = acceptance.draft_half(
        draft_tokens, draft_probs, n, target_at_n, draws, bonus_drafted=config.drafts_bonus
    )
    return commit(state, x, verdict, eos_id), verdict


# ---------------------------------------------------------------- pipelined speculation
#
# While the target verifies block i, the draft proposes block i+1 as if every token
# of block i were accepted and the bonus token were the guess: the draft's own most
# likely next token, or where the draft proposes the bonus position too
# (``SamplingConfig.drafts_bonus``) its x_{γ+1}: ``propose_ahead``. When the target's verdict comes,
# ``settle`` draws the recovered/bonus token and commits, as ``recover_and_propose``
# does, and says per row whether the early block is the one the draft would propose
# now (every token accepted, the bonus token equal to the guess, or the row done).
# Those rows keep it; the others get a fresh proposal (``propose_missed``). An early
# block is the very computation the sequential loop makes on the same cache, state
# and keys, so the tokens are the sequential loop's, bit for bit, at every
# temperature; and any proposal is exact under the rule as long as it is checked
# against the q it was drawn from.


def propose_ahead(draft: Forward, gamma: int, config: sampling.SamplingConfig, eos_id: int | None):
    """The draft's early proposal of the next block (pure; the caller jits it).

    ``(draft_cache, state, draft_tokens [B, D]) -> (guess [B], tokens [B, D],
    probs [B, D, V], token_probs [B, D], draft_cache)``: guesses the bonus token, and
    proposes from the state that committing all γ tokens and the guess would give. The
    guess is the drafted x_{γ+1} where the draft proposes it (``config.drafts_bonus``),
    else the most likely token after x_γ, which it feeds (the cache holds the block up
    to x_{γ-1}). Positions before x_γ are left as they were, so a fresh proposal after
    a rejection finds the cache it expects.
    """
    propose = _propose(draft, gamma, config, False)

    def step(cache, state: DecodeState, draft_tokens):
        if config.drafts_bonus:
            guess = draft_tokens[:, -1]
        else:
            fed = rollback(cache, state.seq_lengths + gamma - 1)
            logits, cache = draft(fed, draft_tokens[:, -1:])
            guess = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
        everything = jnp.full_like(state.n_generated, gamma)
        verdict = acceptance.Verdict(everything, guess)
        ahead = commit(state, chain(draft_tokens, config), verdict, eos_id)
        tokens, probs, cache = propose(cache, ahead)
        return guess, tokens, probs, acceptance.token_probs(probs, tokens), cache

    return step


def settle(
    state: DecodeState, draft_tokens, draft_probs, n_accepted, target_at_n, guess, eos_id, config
):
    """The draft's half of the rule and the commit, as in :func:`recover_and_propose`,
    after :func:`propose_ahead`: (state', hit [B]), hit where the early block stands."""
    new_state, verdict = _recover_commit(
        state, draft_tokens, draft_probs, n_accepted, target_at_n, eos_id, config
    )
    everything = verdict.n_accepted == chain(draft_tokens, config).shape[1]
    return new_state, new_state.done | (everything & (verdict.next_token == guess))


def propose_missed(draft: Forward, gamma: int, config: sampling.SamplingConfig):
    """A fresh proposal for the rows whose early block does not stand (pure; the caller
    jits it): ``(draft_cache, state', hit [B], early tokens, early probs) -> (tokens,
    probs, token_probs, draft_cache)``, the early block kept where ``hit``."""
    propose = _propose(draft, gamma, config, False)

    def step(cache, state: DecodeState, hit, early_tokens, early_probs):
        tokens, probs, cache = propose(cache, state)
        tokens = jnp.where(hit[:, None], early_tokens, tokens)
        probs = jnp.where(hit[:, None, None], early_probs, probs)
        return tokens, probs, acceptance.token_probs(probs, tokens), cache

    return step


def _verify_commit(
    state: DecodeState, draft_tokens, draft_probs, target_probs, eos_id, config, steps=None
):
    verdict = verify(state, draft_tokens, draft_probs, target_probs, config, steps)
    new_state = commit(state, chain(draft_tokens, config), verdict, eos_id, steps)
    return new_state, jnp.all(new_state.done)


@functools.lru_cache(maxsize=COMPILED_CACHE_SIZE)
def _verify_commit_fn(eos_id: int | None, config: sampling.SamplingConfig):
    return jax.jit(functools.partial(_verify_commit, eos_id=eos_id, config=config))


@program_cache
def _compiled_loop_fn(
    target: Forward,
    draft: Forward,
    gamma: int,
    config: sampling.SamplingConfig,
    eos_id,
    shared: bool = False,
):
    """The whole speculative loop as one compiled call: the same propose, score and
    verify/commit steps as the host loop (so the same tokens), with no host round trip
    per iteration. ``(state, target_cache, draft_cache) -> (state, target_cache, draft_cache)``
    on prefilled caches. ``shared``: one program for every γ up to ``gamma`` draft slots,
    called as ``(state, target_cache, draft_cache, steps)`` with the batch's γ as ``steps``
    (the target scores all γ + 1 slots, so it pays where its call on more tokens costs
    about what one on fewer does)."""
    make = functools.partial(
        _compiled_loop, gamma=gamma, config=config, eos_id=eos_id, shared=shared
    )
    return jit_over(make, (target, draft), donate_argnums=(1, 2))


def _compiled_loop(target: Forward, draft: Forward, *, gamma, config, eos_id, shared=False):
    propose_first, propose = (_propose(draft, gamma, config, f) for f in (True, False))
    score = _score(target, config)

    def iteration(propose_step, steps, state, target_cache, draft_cache):
        draft_tokens, draft_probs, draft_cache = propose_step(draft_cache, state, steps)
        target_probs, target_cache = score(target_cache, state, draft_tokens)
        state, _ = _verify_commit(
            state, draft_tokens, draft_probs, target_probs, eos_id, config, steps
        )
        return state, target_cache, draft_cache

    def run(state, target_cache, draft_cache, steps=None):
        # The first iteration's draft starts from its just-prefilled cache. It runs
        # unguarded: on rows already done, commit keeps the state as it is (it writes
        # only stale cache slots), and a lax.cond around it made XLA copy every cache
        # in and out of its branches once per batch.
        carry = iteration(propose_first, steps, state, target_cache, draft_cache)
        return jax.lax.while_loop(
            lambda c: ~jnp.all(c[0].done), lambda c: iteration(propose, steps, *c), carry
        )

    if shared:
        return run
    return lambda state, target_cache, draft_cache: run(state, target_cache, draft_cache)


def speculative_generate(
    *,
    target: Forward,
    target_cache: Any,
    draft: Forward,
    draft_cache: Any,
    prompt_tokens,
    prompt_lengths,
    request_ids,
    max_new_tokens,
    gamma: int,
    sampling_config: sampling.SamplingConfig,
    seed: int = 0,
    eos_id: int | None = None,
    pad_id: int = 0,
    compiled: bool = False,
    slots: int | None = None,
    dry_run: bool = False,
) -> DecodeResult:
    """Speculative decoding (Leviathan et al., 2023) for a batch, rows ragged.

    Each iteration: the draft proposes γ tokens (γ + 1 where
    ``sampling_config.drafts_bonus``; then γ may be 0) in one compiled call, the target
    scores γ+1 positions (one call), and one compiled call accepts, commits and rolls
    both caches back. Output tokens follow the target's distribution under
    ``sampling_config``; at temperature 0 they equal target-only greedy decoding.

    ``compiled=True`` runs the whole loop as one compiled call instead (as
    :func:`autoregressive_generate` does): the same tokens, no host round trip per
    iteration; the split of the time into draft / target / overhead is then unknown
    and reported as NaN (``total_s`` is measured). ``slots`` (compiled only): run the
    loop compiled for that many draft slots, drafting ``gamma`` of them, so that every
    γ up to ``slots`` shares one program (the same tokens as the loop compiled for γ;
    the target scores ``slots`` + 1 tokens per call). ``dry_run``: every row starts
    done (:func:`autoregressive_generate`'s); the compiled loop still runs its first
    iteration, which changes no row.
    """
    if gamma < 1 - sampling_config.drafts_bonus:
        raise ValueError(
            f"gamma must be >= 1, got {gamma} (0 only where the draft proposes the bonus "
            "position: the paper's rule at a temperature above 0)"
        )
    if slots is not None and not (compiled and slots >= gamma):
        raise ValueError(f"slots ({slots}) needs compiled=True and slots >= gamma ({gamma})")
    prompt_tokens, prompt_lengths, state, start = _begin(
        prompt_tokens,
        prompt_lengths,
        request_ids,
        seed,
        max_new_tokens,
        gamma=slots or gamma,
        dry_run=dry_run,
    )
    t0 = time.perf_counter()
    target_cache = jax.block_until_ready(
        prefill_fn(target)(target_cache, prompt_tokens, prompt_lengths)
    )
    t1 = time.perf_counter()
    draft_cache = jax.block_until_ready(
        prefill_fn(draft)(draft_cache, prompt_tokens, prompt_lengths)
    )
    jax.block_until_ready(state)
    loop_start = time.perf_counter()
    target_s, draft_s = t1 - t0, loop_start - t1
    if compiled:
        if slots is None:
            loop = _compiled_loop_fn(target, draft, gamma, sampling_config, eos_id)
            state, _, _ = jax.block_until_ready(loop(state, target_cache, draft_cache))
        else:
            loop = _compiled_loop_fn(target, draft, slots, sampling_config, eos_id, True)
            state, _, _ = loop(state, target_cache, draft_cache, np.int32(gamma))
            state = jax.block_until_ready(state)
        end, unknown = time.perf_counter(), float("nan")
        result = result_from_state(
            state,
            max_new_tokens,
            pad_id,
            draft_s=unknown,
            target_s=unknown,
            overhead_s=unknown,
            total_s=end - start,
            loop_s=end - loop_start,
        )
        # the slots beyond γ were never drafted (sliced on the host: a device slice
        # would compile once per γ)
        return result.replace(accepted_by_position=result.accepted_by_position[:, :gamma])
    score = score_fn(target, sampling_config)
    verify_commit = _verify_commit_fn(eos_id, sampling_config)
    all_done, first = bool(jnp.all(state.done)), True
    while not all_done:
        t0 = time.perf_counter()
        propose = propose_fn(draft, gamma, sampling_config, first)
        draft_tokens, draft_probs, draft_cache = propose(draft_cache, state)
        draft_probs.block_until_ready()  # one output of the call; the cache is ready with it
        t1 = time.perf_counter()
        target_probs, target_cache = score(target_cache, state, draft_tokens)
        target_probs.block_until_ready()
        t2 = time.perf_counter()
        state, all_done = verify_commit(state, draft_tokens, draft_probs, target_probs)
        all_done, first = bool(all_done), False
        draft_s += t1 - t0
        target_s += t2 - t1
    end = time.perf_counter()
    return result_from_state(
        state,
        max_new_tokens,
        pad_id,
        draft_s=draft_s,
        target_s=target_s,
        overhead_s=end - start - draft_s - target_s,
        total_s=end - start,
        loop_s=end - loop_start,
    )


# ---------------------------------------------------------------- helpers


def _begin(
    prompt_tokens, prompt_lengths, request_ids, seed, max_new_tokens, *, gamma, dry_run=False
):
    """Checked prompts, the loop's initial state (every row done: ``dry_run``) and the
    start time of a decode."""
    prompt_tokens, prompt_lengths = _check_prompts(prompt_tokens, prompt_lengths)
    start = time.perf_counter()
    state = init_state(
        prompt_tokens,
        prompt_lengths,
        request_ids,
        seed=seed,
        max_new_tokens=max_new_tokens,
        gamma=gamma,
    )
    if dry_run:
        state = state.replace(done=np.ones(state.done.shape, bool))
    return prompt_tokens, prompt_lengths, state, start


def _check_prompts(prompt_tokens, prompt_lengths) -> tuple[jax.Array, jax.Array]:
    prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
    prompt_lengths = jnp.asarray(prompt_lengths, jnp.int32)
    if prompt_tokens.ndim != 2:
        raise ValueError(f"prompt_tokens must be [B, P], got shape {prompt_tokens.shape}")
    if prompt_lengths.shape != prompt_tokens.shape[:1]:
        raise ValueError(
            f"prompt_lengths must be [B]={prompt_tokens.shape[:1]}, got {prompt_lengths.shape}"
        )
    lengths = np.asarray(prompt_lengths)
    if (lengths < 1).any() or (lengths > prompt_tokens.shape[1]).any():
        raise ValueError(f"prompt_lengths must be in [1, {prompt_tokens.shape[1]}], got {lengths}")
    return prompt_tokens, prompt_lengths


def result_from_state(
    state: DecodeState, max_new_tokens, pad_id: int, **timings: float
) -> DecodeResult:
    host = jax.device_get(state)
    width = int(np.max(max_new_tokens))
    tokens = np.asarray(host.out_tokens[:, :width])
    lengths = np.asarray(host.n_generated)
    tokens = np.where(np.arange(width)[None, :] < lengths[:, None], tokens, pad_id)
    return DecodeResult(
        tokens=tokens.astype(np.int32),
        lengths=lengths,
        iterations=np.asarray(host.iterations),
        drafted=np.asarray(host.drafted),
        accepted=np.asarray(host.accepted),
        accepted_by_position=np.asarray(host.accepted_by_position),
        **timings,
    )


def clear_compiled() -> None:
    """Drops every compiled step cached here (and the models they hold)."""
    for cached in (
        _init_state_fn,
        _prefill_program,
        _autoregressive_fn,
        propose_fn,
        score_fn,
        _verify_commit_fn,
        _compiled_loop_fn,
    ):
        cached.cache_clear()
