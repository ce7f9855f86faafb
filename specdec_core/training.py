"""Teacher-forced training of the T5 and decoder-only families: losses, optimizer, steps.

Pure JAX and optax; no files, no logging. Terms:

- *batch*: a dict of int32 arrays in T5X's feature names. T5: ``encoder_input_tokens``
  [B, S], ``decoder_input_tokens`` [B, T] (targets shifted right, starting with 0),
  ``decoder_target_tokens`` [B, T]. Decoder-only: ``decoder_input_tokens`` and
  ``decoder_target_tokens`` [B, T], optionally ``decoder_loss_weights`` [B, T] (e.g. 0
  on a prompt). 0 is padding: a position counts iff its target token is > 0 (and its
  loss weight, when given, is > 0).
- *logits_fn*: ``(params, batch) -> float32 logits [B, T, V]``, made by
  :func:`logits_fn_for` from a model config.
- *distillation*: the student is trained towards a *teacher* (the target model) by
  ``KL(teacher_T || student_T)`` at temperature T, mixed with the ordinary
  cross-entropy by ``distill_weight`` (1.0 = pure distillation). Sequence-level
  distillation (training on the teacher's greedy outputs) needs no loss of its own:
  the teacher's outputs simply replace the references in the batch.

Loss values are token means over the counted positions; metrics also carry sums
(``loss_sum``, ``correct``, ``tokens``) so evaluation over many batches is exact.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from specdec_core.models import decoder, t5

Batch = Mapping[str, jax.Array]
LogitsFn = Callable[..., jax.Array]  # (params, batch[, dropout rng]) -> logits [B, T, V]
OPTIMIZERS = ("adamw", "adafactor")
SCHEDULES = ("rsqrt", "cosine", "constant", "wsd")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Loss options; the defaults are plain cross-entropy."""

    label_smoothing: float = 0.0  # mass spread uniformly over the vocabulary
    z_loss: float = 0.0  # coefficient of log(Z)^2 (T5X uses 1e-4); 0 = off
    distill_weight: float = 0.0  # weight of the KL-to-teacher term; needs teacher logits
    distill_temperature: float = 1.0  # softens both distributions in the KL term

    def __post_init__(self):
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if not 0.0 <= self.distill_weight <= 1.0:
            raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
        if not self.distill_temperature > 0.0:
            raise ValueError(f"distill_temperature must be > 0, got {self.distill_temperature}")


# ---------------------------------------------------------------------------- models


def t5_logits(config: t5.T5Config, params, batch: Batch, rng: jax.Array | None = None) -> jax.Array:
    """T5 teacher-forced logits [B, T, V] of a T5X-style batch; ``rng`` turns on the
    config's dropout (training steps only)."""
    return t5.score(
        config,
        params,
        batch["encoder_input_tokens"],
        batch["decoder_input_tokens"],
        batch["decoder_target_tokens"],
        dropout_rng=rng,
    )


def decoder_logits(
    config: decoder.DecoderConfig, params, batch: Batch, rng: jax.Array | None = None
) -> jax.Array:
    """Decoder-only logits [B, T, V]: position t predicts ``decoder_target_tokens[:, t]``
    (this family has no dropout: ``rng`` is accepted and unused)."""
    del rng
    return decoder.score(config, params, batch["decoder_input_tokens"])


def logits_fn_for(config: t5.T5Config | decoder.DecoderConfig) -> LogitsFn:
    """The ``(params, batch) -> logits`` function of a model config."""
    if isinstance(config, t5.T5Config):
        return functools.partial(t5_logits, config)
    if isinstance(config, decoder.DecoderConfig):
        return functools.partial(decoder_logits, config)
    raise TypeError(f"no logits function for config type {type(config).__name__}")


def loss_mask(batch: Batch) -> jax.Array:
    """float32 [B, T]: weight of each target position (0 on padding)."""
    mask = (batch["decoder_target_tokens"] > 0).astype(jnp.float32)
    if "decoder_loss_weights" in batch:
        mask = mask * batch["decoder_loss_weights"].astype(jnp.float32)
    return mask


# ---------------------------------------------------------------------------- losses


def token_cross_entropy(
    logits: jax.Array, targets: jax.Array, *, label_smoothing: float = 0.0, z_loss: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Per-position losses: logits [B, T, V], targets int32 [B, T] -> (loss [B, T], z [B, T]).

    ``loss`` is the cross-entropy to the (optionally smoothed) one-hot target plus
    ``z_loss * log(Z)^2``; ``z`` is the ``log(Z)^2`` part alone (unweighted).
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)  # [B, T]
    log_probs = logits - log_z[..., None]  # [B, T, V]
    target_log_prob = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    loss = -target_log_prob
    if label_smoothing:
        loss = (1.0 - label_smoothing) * loss - label_smoothing * log_probs.mean(axis=-1)
    z_term = jnp.square(log_z)
    return loss + z_loss * z_term, z_term


def token_kl(
    student_logits: jax.Array, teacher_logits: jax.Array, *, temperature: float = 1.0
) -> jax.Array:
    """KL(teacher || student) per position at ``temperature``: [B, T, V] x 2 -> [B, T].

    Multiplied by ``temperature**2`` (Hinton et al.) so gradients keep their scale.
    Zero where the two distributions agree.
    """
    student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
    teacher = jax.nn.log_softmax(teacher_logits.astype(jnp.float32) / temperature, axis=-1)
    kl = jnp.sum(jnp.exp(teacher) * (teacher - student), axis=-1)
    return kl * temperature**2


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum of values * mask over the sum of mask (0 when the mask is empty)."""
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def loss_and_metrics(
    logits: jax.Array,
    batch: Batch,
    *,
    loss_config: LossConfig = LossConfig(),
    teacher_logits: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Scalar training loss and metrics of one batch's logits [B, T, V].

    Metrics: ``loss`` (the objective), ``cross_entropy`` (unsmoothed, no z-loss),
    ``accuracy`` (argmax == target), ``kl`` (when a teacher is given), ``z``, and the
    sums ``loss_sum`` (cross-entropy), ``correct``, ``tokens``.
    """
    targets = batch["decoder_target_tokens"]  # [B, T]
    mask = loss_mask(batch)  # [B, T]
    objective_tokens, z_term = token_cross_entropy(
        logits, targets, label_smoothing=loss_config.label_smoothing, z_loss=loss_config.z_loss
    )
    plain_ce, _ = token_cross_entropy(logits, targets)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32) * mask
    metrics = {
        "cross_entropy": masked_mean(plain_ce, mask),
        "accuracy": jnp.sum(correct) / jnp.maximum(jnp.sum(mask), 1.0),
        "z": masked_mean(z_term, mask),
        "loss_sum": jnp.sum(plain_ce * mask),
        "correct": jnp.sum(correct),
        "tokens": jnp.sum(mask),
    }
    loss = masked_mean(objective_tokens, mask)
    if loss_config.distill_weight > 0.0:
        if teacher_logits is None:
            raise ValueError("distill_weight > 0 needs teacher_logits")
        kl = masked_mean(
            token_kl(logits, teacher_logits, temperature=loss_config.distill_temperature), mask
        )
        metrics["kl"] = kl
        loss = (1.0 - loss_config.distill_weight) * loss + loss_config.distill_weight * kl
    metrics["loss"] = loss
    return loss, metrics


# ------------------------------------------------------------------------- optimizer


def make_schedule(
    *,
    learning_rate: float,
    warmup_steps: int,
    schedule: str = "rsqrt",
    total_steps: int = 0,
    decay_steps: int = 0,
) -> optax.Schedule:
    """Linear warmup to ``learning_rate``, then ``rsqrt`` (∝ 1/√step), ``cosine`` to 0 at
    ``total_steps``, ``constant``, or ``wsd`` (warmup-stable-decay): constant, then linear
    to 0 over the last ``decay_steps`` steps before ``total_steps``."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    warmup_steps = max(int(warmup_steps), 1)
    warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
    if schedule == "constant":
        decay = optax.constant_schedule(learning_rate)
    elif schedule == "rsqrt":
        # join_schedules passes steps counted from the end of the warmup (negative before)
        decay = lambda step: (
            learning_rate * jnp.sqrt(warmup_steps / jnp.maximum(step + warmup_steps, warmup_steps))
        )
    elif schedule == "wsd":
        if not 0 < decay_steps <= total_steps - warmup_steps:
            raise ValueError(
                f"wsd needs 0 < decay_steps <= total_steps - warmup_steps, got decay_steps "
                f"{decay_steps}, total_steps {total_steps}, warmup_steps {warmup_steps}"
            )
        stable = total_steps - warmup_steps - decay_steps
        decay = optax.join_schedules(
            [
                optax.constant_schedule(learning_rate),
                optax.linear_schedule(learning_rate, 0.0, decay_steps),
            ],
            [stable],
        )
    else:
        if total_steps <= warmup_steps:
            raise ValueError(f"cosine needs total_steps > warmup_steps, got {total_steps}")
        decay = optax.cosine_decay_schedule(learning_rate, total_steps - warmup_steps)
    return optax.join_schedules([warmup, decay], [warmup_steps])


def make_optimizer(
    *,
    name: str = "adamw",
    learning_rate: float = 1e-3,
    warmup_steps: int = 1000,
    schedule: str = "rsqrt",
    total_steps: int = 0,
    decay_steps: int = 0,
    weight_decay: float = 0.0,
    b1: float = 0.9,
    b2: float = 0.98,
    clip_norm: float = 1.0,
) -> optax.GradientTransformation:
    """AdamW or Adafactor on a warmup schedule, after global-norm clipping (0 = none)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    lr = make_schedule(
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        schedule=schedule,
        total_steps=total_steps,
        decay_steps=decay_steps,
    )
    if name == "adamw":
        core = optax.adamw(lr, b1=b1, b2=b2, weight_decay=weight_decay)
    else:
        core = optax.adafactor(lr, weight_decay_rate=weight_decay or None)
    return optax.chain(optax.clip_by_global_norm(clip_norm), core) if clip_norm else core


def freeze(optimizer: optax.GradientTransformation, keys) -> optax.GradientTransformation:
    """``optimizer`` on every top-level param but ``keys``, which never move (no state)."""
    keys = frozenset(keys)

    def labels(params):
        return {k: jax.tree.map(lambda _, frozen=k in keys: frozen, v) for k, v in params.items()}

    return optax.multi_transform({False: optimizer, True: optax.set_to_zero()}, labels)


# ----------------------------------------------------------------------------- steps


def make_train_step(
    logits_fn: LogitsFn,
    optimizer: optax.GradientTransformation,
    *,
    loss_config: LossConfig = LossConfig(),
    teacher_logits_fn: LogitsFn | None = None,
    teacher_params: Any = None,
) -> Callable:
    """Jitted ``(params, opt_state, batch, rng=None, lr_scale=1.0) -> (params, opt_state,
    metrics)``.

    ``rng`` (a key) is passed to ``logits_fn`` as its third argument: the model's dropout
    for this step (None: deterministic). The teacher never drops. ``lr_scale`` multiplies
    the step's updates, i.e. the learning rate (AdamW's and Adafactor's updates are linear
    in it): a schedule the host sets step by step (a time budget) without recompiling.

    With ``loss_config.distill_weight > 0``, ``teacher_logits_fn(teacher_params, batch)``
    gives the teacher's logits (no gradient flows into the teacher). Params and
    optimizer state are donated: do not reuse the arrays passed in.
    """
    if loss_config.distill_weight > 0.0 and teacher_logits_fn is None:
        raise ValueError("distill_weight > 0 needs teacher_logits_fn and teacher_params")

    def step(params, opt_state, batch, teacher, rng, lr_scale):
        teacher_logits = None
        if loss_config.distill_weight > 0.0:
            teacher_logits = jax.lax.stop_gradient(teacher_logits_fn(teacher, batch))

        def objective(p):
            logits = logits_fn(p, batch) if rng is None else logits_fn(p, batch, rng)
            return loss_and_metrics(
                logits, batch, loss_config=loss_config, teacher_logits=teacher_logits
            )

        grads, metrics = jax.grad(objective, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        updates = jax.tree.map(lambda u: (u * lr_scale).astype(u.dtype), updates)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.global_norm(grads)
        return params, opt_state, metrics

    jitted = jax.jit(step, donate_argnums=(0, 1))

    def train_step(params, opt_state, batch, rng=None, lr_scale=1.0):
        return jitted(params, opt_state, batch, teacher_params, rng, jnp.float32(lr_scale))

    def lower(params, opt_state, batch, rng=None, lr_scale=1.0):
        """The step lowered for these arguments' shapes (``.compile()`` it ahead of time:
        a compilation cache then serves the calls)."""
        return jitted.lower(params, opt_state, batch, teacher_params, rng, jnp.float32(lr_scale))

    train_step.lower = lower
    return train_step


def make_eval_step(logits_fn: LogitsFn) -> Callable:
    """Jitted ``(params, batch) -> metrics`` (cross-entropy, accuracy and their sums)."""

    def step(params, batch):
        _, metrics = loss_and_metrics(logits_fn(params, batch), batch)
        return metrics

    return jax.jit(step)


def combine_eval_metrics(per_batch: list[Mapping[str, Any]]) -> dict[str, float]:
    """Token-weighted ``loss`` and ``accuracy`` over batches from :func:`make_eval_step`."""
    if not per_batch:
        raise ValueError("no eval batches")
    tokens = sum(float(m["tokens"]) for m in per_batch)
    loss_sum = sum(float(m["loss_sum"]) for m in per_batch)
    correct = sum(float(m["correct"]) for m in per_batch)
    return {
        "loss": loss_sum / max(tokens, 1.0),
        "accuracy": correct / max(tokens, 1.0),
        "tokens": tokens,
    }


# -------------------------------------------------------------------------- decoding


def t5_greedy_decode(
    config: t5.T5Config,
    params,
    encoder_input_tokens: jax.Array,
    *,
    max_decode_len: int,
    eos_id: int = t5.EOS_ID,
) -> jax.Array:
    """Greedy T5 outputs: encoder_input_tokens int32[B, S] -> int32[B, max_decode_len].

    Each row stops at its first EOS (kept); later positions are 0. Used for sample
    translations, BLEU during training and sequence-level distillation targets.
    Jit with ``config`` and ``max_decode_len`` static (see :func:`t5_greedy_decoder`).
    """
    batch = encoder_input_tokens.shape[0]
    cache = t5.init_cache(config, params, encoder_input_tokens, max_decode_len=max_decode_len)
    outputs = jnp.zeros((batch, max_decode_len), jnp.int32)
    previous = jnp.zeros((batch,), jnp.int32)  # decoder start token
    done = jnp.zeros((batch,), bool)

    def body(carry):
        i, cache, outputs, previous, done = carry
        logits, cache = t5.forward(config, params, cache, previous[:, None])  # [B, 1, V]
        token = jnp.where(done, 0, jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32))
        outputs = outputs.at[:, i].set(token)
        return i + 1, cache, outputs, token, done | (token == eos_id)

    def keep_going(carry):
        i, _, _, _, done = carry
        return (i < max_decode_len) & ~jnp.all(done)

    carry = (jnp.int32(0), cache, outputs, previous, done)
    return jax.lax.while_loop(keep_going, body, carry)[2]


def t5_greedy_decoder(
    config: t5.T5Config, *, max_decode_len: int, eos_id: int = t5.EOS_ID
) -> Callable:
    """Jitted ``(params, encoder_input_tokens [B, S]) -> tokens [B, max_decode_len]``."""
    return jax.jit(
        functools.partial(t5_greedy_decode, config, max_decode_len=max_decode_len, eos_id=eos_id)
    )
