"""The study's measurements on one batch of prompts: the target's trajectories, β along
them for every draft, speculative runs at each γ and (for ``c: measured``) step times.

Models are :class:`~specdec_core.models.bound.BoundModel` objects (n-gram drafts too,
:func:`pipelines.study.model_refs.ngram_model`): what is used of them is ``forward``
and ``new_cache``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pipelines import text
from pipelines.study.dataset import TASK_PREFIXES, DatasetConfig, Prompt, load_tokenizer
from pipelines.study.stats import CellStats

if TYPE_CHECKING:
    from specdec_core.models.bound import BoundModel


@dataclasses.dataclass(frozen=True, kw_only=True)
class PromptBatch:
    ids: np.ndarray  # [B] int: prompt ids (padding rows repeat row 0's)
    prompt_tokens: np.ndarray  # [B, P] int32: decoder prompts (T5: the start token)
    encoder_tokens: np.ndarray | None  # [B, S] int32, 0-padded (T5 targets only)
    max_new: np.ndarray  # [B] int32: 0 on padding rows
    real: np.ndarray  # [B] bool: False on padding rows


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    sampling: Any  # SamplingConfig of both models
    gammas: tuple[int, ...]
    max_new_tokens: int
    seed: int
    eos_id: int | None
    measure_cost: bool  # time one k=1 step of each model (for c = "measured")

    @property
    def sampling_kwargs(self) -> dict:
        """The decoding loops' keywords for how tokens are drawn and where rows stop."""
        return {"sampling_config": self.sampling, "seed": self.seed, "eos_id": self.eos_id}


@contextlib.contextmanager
def hoisted_constants():
    """Runs JAX with closed-over arrays passed to compiled code as arguments.

    Models reach the decoding loops as ``forward`` closures, so their params are
    closed-over constants of every jitted step. By default JAX embeds them in the
    compiled program: XLA then constant-folds what depends on them alone (slow for a
    unigram's distribution over a large vocabulary) and every executable holds its own
    copy (a bigram's [V, V] table grows the process by its size per compiled step). With
    ``jax_use_simplified_jaxpr_constants`` they are hoisted to arguments: faster
    compilation, no memory growth, the same numbers.
    Usable as a decorator; restores the previous setting.
    """
    import jax

    previous = jax.config.jax_use_simplified_jaxpr_constants
    jax.config.update("jax_use_simplified_jaxpr_constants", True)
    try:
        yield
    finally:
        jax.config.update("jax_use_simplified_jaxpr_constants", previous)


def pack_prompts(
    prompts: Sequence[Prompt],
    *,
    family: str,
    dataset: DatasetConfig,
    batch_size: int,
    max_new_tokens: int,
) -> PromptBatch:
    """Prompts -> padded arrays; rows past ``len(prompts)`` are inert copies of row 0.
    ``family`` names the target's family: an encoder-decoder target reads the prompt
    through its encoder, a decoder-only one continues its first tokens."""
    from specdec_core.models import families

    prompts = sorted(prompts, key=lambda p: p.id)
    rows = [prompts[min(i, len(prompts) - 1)] for i in range(batch_size)]
    real = np.arange(batch_size) < len(prompts)
    encoder = None
    if families.get(family).is_encoder_decoder:
        tokenizer = load_tokenizer(dataset.tokenizer)
        prefix = TASK_PREFIXES[dataset.task]
        encoded = [text.encode(tokenizer, prefix, p.text) for p in rows]
        width = text.padded_length(max(map(len, encoded)))
        encoder = np.zeros((batch_size, width), np.int32)
        for r, ids in enumerate(encoded):
            encoder[r, : len(ids)] = ids
        prompt = np.full((batch_size, 1), text.DECODER_START_ID, np.int32)
    else:
        head = [] if dataset.bos_id is None else [dataset.bos_id]
        prompt = np.asarray([head + list(p.tokens[: dataset.prompt_tokens]) for p in rows])
    return PromptBatch(
        ids=np.asarray([p.id for p in rows]),
        prompt_tokens=prompt.astype(np.int32),
        encoder_tokens=encoder,
        max_new=np.where(real, max_new_tokens, 0).astype(np.int32),
        real=real,
    )


@functools.lru_cache(maxsize=256)
def _probs_fn(forward: Callable, sampling_config):
    """jit: (cache, tokens [B, L]) -> sampling probs [B, L, V] of one teacher-forced pass."""
    import jax

    from specdec_core import sampling

    def probs(cache, tokens):
        logits, _ = forward(cache, tokens)
        return sampling.probs_from_logits(logits, sampling_config)

    return jax.jit(probs)


@functools.lru_cache(maxsize=256)
def _beta_fn(forward: Callable, sampling_config):
    """jit: (cache, tokens [B, L], target_probs [B, L, V]) -> β [B, L] (theory.beta)."""
    import jax

    from specdec_core import sampling, theory

    def beta(cache, tokens, target_probs):
        logits, _ = forward(cache, tokens)
        return theory.beta(target_probs, sampling.probs_from_logits(logits, sampling_config))

    return jax.jit(beta)


def _decode_args(
    target: BoundModel, batch: PromptBatch, settings: MeasureSettings, cache_len: int
) -> dict:
    """The keywords both decoding loops take: the target with a ``cache_len``-slot cache
    (its encoder run), the batch's full-width prompts and the sampling."""
    batch_size, prompt_len = batch.prompt_tokens.shape
    return dict(
        target=target.forward,
        target_cache=target.new_cache(batch.encoder_tokens, batch_size, cache_len),
        prompt_tokens=batch.prompt_tokens,
        prompt_lengths=np.full(batch_size, prompt_len, np.int32),
        request_ids=batch.ids,
        max_new_tokens=batch.max_new,
        **settings.sampling_kwargs,
    )


@hoisted_constants()
def target_trajectories(target: BoundModel, batch: PromptBatch, settings: MeasureSettings):
    """The target continues every prompt: (tokens [B, N] int32, lengths [B] int32)."""
    from specdec_core import decoding

    cache_len = batch.prompt_tokens.shape[1] + settings.max_new_tokens + 1
    result = decoding.autoregressive_generate(**_decode_args(target, batch, settings, cache_len))
    return result.tokens, result.lengths


def _teacher_forced(batch: PromptBatch, tokens, lengths):
    """(inputs [B, P + N - 1], valid [B, N]): prompt + trajectory[:-1] for one
    teacher-forced pass (the logits at index P-1+j predict generated token j), and which
    generated positions are real (within ``lengths``, on a real row)."""
    inputs = np.concatenate([batch.prompt_tokens, tokens], 1)[:, :-1]
    valid = (np.arange(tokens.shape[1])[None, :] < lengths[:, None]) & batch.real[:, None]
    return inputs, valid


@hoisted_constants()
def top_probability_along(target: BoundModel, batch: PromptBatch, tokens, lengths) -> np.ndarray:
    """The target's own (T=1) largest next-token probability at each generated position
    of a trajectory: float64 [B, N] (NaN past lengths).

    How sure the target is of its choices: at T=1 a draft that always proposes the
    target's most likely token with certainty is accepted with exactly this probability,
    and at T=0 a draft must match an argmax decided by this margin.
    """
    from specdec_core.sampling import SamplingConfig

    batch_size, prompt_len = batch.prompt_tokens.shape
    inputs, valid = _teacher_forced(batch, tokens, lengths)
    probs = _probs_fn(target.forward, SamplingConfig(temperature=1.0))(
        target.new_cache(batch.encoder_tokens, batch_size, inputs.shape[1]), inputs
    )  # [B, L, V]
    top = np.asarray(probs.max(-1))[:, prompt_len - 1 :]
    return np.where(valid, top, np.nan).astype(np.float64)


@hoisted_constants()
def betas_along(
    target: BoundModel,
    drafts: Sequence[BoundModel],
    batch: PromptBatch,
    tokens,
    lengths,
    settings: MeasureSettings,
) -> list[np.ndarray]:
    """β at each generated position, per draft: a list of float64 [B, N] (NaN past lengths).

    One teacher-forced pass of each model over prompt + trajectory[:-1]; the logits at
    index P-1+j (P = prompt length) predict generated token j.
    """
    batch_size, prompt_len = batch.prompt_tokens.shape
    inputs, valid = _teacher_forced(batch, tokens, lengths)
    length = inputs.shape[1]
    target_probs = _probs_fn(target.forward, settings.sampling)(
        target.new_cache(batch.encoder_tokens, batch_size, length), inputs
    )  # [B, L, V]
    out = []
    for draft in drafts:
        cache = draft.new_cache(batch.encoder_tokens, batch_size, length)
        beta = np.asarray(_beta_fn(draft.forward, settings.sampling)(cache, inputs, target_probs))
        out.append(np.where(valid, beta[:, prompt_len - 1 :], np.nan).astype(np.float64))
    return out


@hoisted_constants()
def speculative_counts(
    target: BoundModel,
    draft: BoundModel,
    batch: PromptBatch,
    gamma: int,
    settings: MeasureSettings,
) -> dict[str, np.ndarray]:
    """One speculative run: per row ``accepted``, ``tests``, ``iterations``, ``drafted`` [B].

    tests = accepted + rejections; rejections = iterations that did not accept all γ.
    """
    from specdec_core import decoding, theory

    batch_size, prompt_len = batch.prompt_tokens.shape
    max_len = prompt_len + settings.max_new_tokens + gamma + 2
    result = decoding.speculative_generate(
        **_decode_args(target, batch, settings, max_len),
        draft=draft.forward,
        draft_cache=draft.new_cache(batch.encoder_tokens, batch_size, max_len),
        gamma=gamma,
    )
    full = result.accepted_by_position[:, gamma - 1]  # [B] iterations that accepted all γ
    counts = {
        "accepted": result.accepted,
        "tests": theory.acceptance_tests(result.accepted, result.iterations, full),
        "iterations": result.iterations,
        "drafted": result.drafted,
    }
    return {k: np.asarray(v, np.int64)[batch.real] for k, v in counts.items()}


@functools.lru_cache(maxsize=64)
def _step_fn(forward: Callable):
    import jax

    return jax.jit(forward)


@hoisted_constants()
def step_seconds(model: BoundModel, batch: PromptBatch, *, repeats: int = 5) -> float:
    """Median wall time of one k=1 forward after the prompt (compiled and warmed first)."""
    import jax

    batch_size, prompt_len = batch.prompt_tokens.shape
    step = _step_fn(model.forward)
    cache = model.new_cache(batch.encoder_tokens, batch_size, prompt_len + 2)
    _, cache = step(cache, batch.prompt_tokens)
    one = batch.prompt_tokens[:, -1:]
    jax.block_until_ready(step(cache, one))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(step(cache, one))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_batch(
    target: BoundModel,
    drafts: Sequence[BoundModel],
    batch: PromptBatch,
    settings: MeasureSettings,
) -> list[CellStats]:
    """One batch of prompts: target trajectories once, then per draft β and speculative runs."""
    tokens, lengths = target_trajectories(target, batch, settings)
    betas = betas_along(target, drafts, batch, tokens, lengths, settings)
    target_s = [step_seconds(target, batch)] if settings.measure_cost else []
    out = []
    for draft, beta in zip(drafts, betas, strict=True):
        beta = beta[batch.real]  # [b, N]
        spec = {}
        for gamma in settings.gammas:
            counts = speculative_counts(target, draft, batch, gamma, settings)
            spec[gamma] = {k: v.tolist() for k, v in counts.items()}
        out.append(
            CellStats(
                ids=batch.ids[batch.real].tolist(),
                beta_sum=np.nansum(beta, 1).tolist(),
                beta_count=np.isfinite(beta).sum(1).tolist(),
                position_sum=np.nansum(beta, 0),
                position_count=np.isfinite(beta).sum(0),
                spec=spec,
                target_step_s=target_s,
                draft_step_s=[step_seconds(draft, batch)] if settings.measure_cost else [],
            )
        )
    return out
