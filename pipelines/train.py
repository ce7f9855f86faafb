"""The training job: ``python -m pipelines.train --config configs/models/<name>.yaml``.

Options: ``--resume`` (continue from the latest checkpoint in the config's train dir),
``--max-steps N`` (override ``train.max_steps``), ``--tracking-uri URI`` (MLflow;
default ``sqlite:///<repo>/runs/mlflow.db``). ``main(argv)`` is the same as a function.

Data: the ``ding_ende`` seqio task (``data.source: seqio``), or with ``data.source: tsv``
the same Ding TSV splits tokenized with the same SentencePiece model in plain Python
(no TensorFlow; identical ids: ``translate English to German: {en}`` + EOS ->
``{de}`` + EOS); ``data.source: debian`` reads the Debian corpus folder
(``pipelines.data.debian.build.read_split``: every source's split, interleaved) the
same way. Examples are bucketed by (input, target) length (``length_buckets``: fine
buckets up to 64 tokens, powers of two above, so that paragraph-length data compiles
few shapes); each step draws one
bucket (by its share of the sampling weight) and ``tokens_per_batch // S`` examples
from it, from a generator seeded by ``(seed, step)``, so a resumed run sees exactly
the batches an uninterrupted one would. ``data.sentence_weight`` oversamples
full-sentence pairs over dictionary phrases.

Checkpoints: every ``checkpoint.every_steps`` steps or ``every_seconds`` seconds, and
on SIGTERM/SIGINT:

- ``<train_dir>/checkpoint_<step>/``: float32 params in T5X layout (``save_t5x``) plus
  ``train_state.msgpack`` (flax msgpack: step, optimizer state, metadata; no pickle).
  The latest ``checkpoint.keep`` are kept; ``--resume`` takes the newest complete one.
- ``<export_dir>/checkpoint_<step>/``: params only, cast to ``export_dtype``, in T5X
  layout (what gets committed), plus ``<export_dir>/training.json`` (step, wall time,
  last evaluation, vocabulary hash, the command). Only the latest export is kept.

Evaluation every ``train.eval_every`` steps: validation loss and token accuracy, BLEU
(sacrebleu) of greedy translations of ``bleu_examples`` validation pairs, and a few
sample translations printed. Metrics go to MLflow experiment ``train``.

Distillation: ``teacher: configs/models/ende_target.yaml`` (its latest checkpoint) or a
checkpoint folder (with ``teacher_config``) and ``train.distill_weight > 0``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import pathlib
import re
import shutil
import signal
import sys
import time
from collections.abc import Sequence

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pipelines import configs
from specdec_core import checkpoints, training
from specdec_core.models import decoder, t5

PREFIX = "translate English to German: "
EOS_ID = 1
INPUT_BUCKETS = (16, 24, 32, 48, 64)  # padded encoder lengths
TARGET_BUCKETS = (8, 16, 24, 32, 48, 64)  # padded decoder lengths
LONG_BUCKETS = (16, 32, 64, 128, 256, 512)  # both sides, when a max length exceeds 64
SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
TRAIN_STATE_FILE = "train_state.msgpack"
LM_SIDES = ("en", "de")  # columns of a Ding split


@dataclasses.dataclass(frozen=True)
class Examples:
    """Tokenized pairs of one split (ids include the final EOS)."""

    inputs: list[np.ndarray]  # each int32 [S_i]
    targets: list[np.ndarray]  # each int32 [T_i]
    english: list[str]
    german: list[str]

    def __len__(self) -> int:
        return len(self.inputs)

    def take(self, indices: Sequence[int]) -> Examples:
        """The examples at ``indices``, in that order."""
        return Examples(
            inputs=[self.inputs[i] for i in indices],
            targets=[self.targets[i] for i in indices],
            english=[self.english[i] for i in indices],
            german=[self.german[i] for i in indices],
        )

    @property
    def is_sentence(self) -> np.ndarray:
        """bool [N]: the English side (LM text: the text) ends like a sentence."""
        texts = zip(self.english, self.german, strict=True)
        return np.array([bool(SENTENCE_END.search(en or de)) for en, de in texts])


# ------------------------------------------------------------------------------ data


def _trim(ids: Sequence[int], max_length: int) -> np.ndarray:
    """Token ids with EOS last, at most max_length long."""
    ids = list(ids)[: max_length - 1]
    return np.asarray([*ids, EOS_ID], np.int32)


def read_pairs(data: configs.DataConfig, split: str) -> list[tuple[str, str]]:
    """``(english, german)`` pairs of a split: Ding TSV (``tsv``) or the Debian corpus."""
    if data.source == "debian":
        from pipelines.data.debian import build

        return build.read_split(configs.resolve(data.data_dir), split)
    from pipelines.data import ding

    return ding.read_split(configs.resolve(data.data_dir), split)


def load_examples_tsv(data: configs.DataConfig, split: str) -> Examples:
    """The split (Ding TSV or Debian corpus) tokenized with SentencePiece (no TensorFlow)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(configs.resolve(data.vocab_path)))
    pairs = read_pairs(data, split)
    english = [en for en, _ in pairs]
    german = [de for _, de in pairs]
    inputs = processor.encode([PREFIX + en for en in english])
    targets = processor.encode(german)
    return Examples(
        inputs=[_trim(x, data.max_input_length) for x in inputs],
        targets=[_trim(y, data.max_target_length) for y in targets],
        english=english,
        german=german,
    )


def load_examples_seqio(data: configs.DataConfig, split: str) -> Examples:
    """The split through the registered seqio task (T5 preprocessing, EOS appended)."""
    import seqio

    from pipelines import tasks

    data_dir = configs.resolve(data.data_dir)
    tasks.register_tasks(
        ding_dir=data_dir, debian_dir=data_dir, vocab_path=configs.resolve(data.vocab_path)
    )
    task = seqio.get_mixture_or_task(data.task)
    dataset = task.get_dataset(
        sequence_length=None, split=split, shuffle=False, use_cached=False, seed=0
    )
    inputs, targets, english, german = [], [], [], []
    for example in dataset.as_numpy_iterator():
        inputs.append(_trim(example["inputs"][:-1], data.max_input_length))
        targets.append(_trim(example["targets"][:-1], data.max_target_length))
        english.append(example["inputs_pretokenized"].decode()[len(PREFIX) :])
        german.append(example["targets_pretokenized"].decode())
    return Examples(inputs=inputs, targets=targets, english=english, german=german)


def load_examples_lm(data: configs.DataConfig, split: str) -> Examples:
    """Plain language-model text: one side of the Ding split, each line once, in order.

    Every example has an empty input, so :func:`to_decoder_only` puts the loss on every
    token (the line's pieces and EOS) after the start id 0, as a GPT-style LM trains.
    """
    import sentencepiece as spm

    from pipelines.data import ding

    if data.lm_side not in LM_SIDES:
        raise configs.ConfigError(f"data.lm_side must be one of {LM_SIDES}, got {data.lm_side!r}")
    processor = spm.SentencePieceProcessor(model_file=str(configs.resolve(data.vocab_path)))
    column = LM_SIDES.index(data.lm_side)
    lines = list(
        dict.fromkeys(
            pair[column] for pair in ding.read_split(configs.resolve(data.data_dir), split)
        )
    )
    empty = np.zeros((0,), np.int32)
    return Examples(
        inputs=[empty] * len(lines),
        targets=[_trim(y, data.max_target_length) for y in processor.encode(lines)],
        english=lines if data.lm_side == "en" else [""] * len(lines),
        german=lines if data.lm_side == "de" else [""] * len(lines),
    )


def load_examples(data: configs.DataConfig, split: str) -> Examples:
    if data.source == "seqio":
        return load_examples_seqio(data, split)
    if data.source in ("tsv", "debian"):
        return load_examples_tsv(data, split)
    if data.source == "lm":
        return load_examples_lm(data, split)
    raise ValueError(f"data.source must be 'seqio', 'tsv', 'debian' or 'lm', got {data.source!r}")


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= length (the last bucket if none)."""
    return next((b for b in buckets if b >= length), buckets[-1])


Buckets = tuple[tuple[int, ...], tuple[int, ...]]  # (input lengths, target lengths)
DEFAULT_BUCKETS: Buckets = (INPUT_BUCKETS, TARGET_BUCKETS)


def length_buckets(data: configs.DataConfig) -> Buckets:
    """Padded (input, target) lengths for a config's maximum lengths.

    Up to 64 tokens: the fine default buckets. Longer: powers of two from 16 up to the
    maximum (``LONG_BUCKETS``), so a paragraph corpus compiles few batch shapes.
    """
    if max(data.max_input_length, data.max_target_length) <= INPUT_BUCKETS[-1]:
        return DEFAULT_BUCKETS

    def coarse(max_length: int) -> tuple[int, ...]:
        return (*(b for b in LONG_BUCKETS if b < max_length), max_length)

    return coarse(data.max_input_length), coarse(data.max_target_length)


def make_batch(examples: Examples, indices: Sequence[int], *, input_len: int, target_len: int):
    """T5X-style numpy batch [B, S] / [B, T] of the given examples, 0-padded."""
    batch = len(indices)
    enc = np.zeros((batch, input_len), np.int32)
    dec_in = np.zeros((batch, target_len), np.int32)
    dec_out = np.zeros((batch, target_len), np.int32)
    for row, i in enumerate(indices):
        x, y = examples.inputs[i][:input_len], examples.targets[i][:target_len]
        enc[row, : len(x)] = x
        dec_out[row, : len(y)] = y
        dec_in[row, 1 : len(y)] = y[:-1]  # shifted right; position 0 is the start id 0
    return {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": dec_in,
        "decoder_target_tokens": dec_out,
    }


@dataclasses.dataclass
class BucketSampler:
    """Draws (bucket shape, example indices) per step, deterministically from the step."""

    buckets: dict[tuple[int, int], np.ndarray]  # (S, T) -> example indices
    weights: dict[tuple[int, int], np.ndarray]  # (S, T) -> normalized weights in the bucket
    shares: np.ndarray  # [num_buckets] probability of each bucket
    tokens_per_batch: int
    max_batch_size: int
    seed: int

    @classmethod
    def build(
        cls,
        examples: Examples,
        train: configs.TrainConfig,
        sentence_weight: float,
        buckets: Buckets = DEFAULT_BUCKETS,
    ):
        weight = np.where(examples.is_sentence, sentence_weight, 1.0)
        input_buckets, target_buckets = buckets
        keys = [
            (bucket_length(len(x), input_buckets), bucket_length(len(y), target_buckets))
            for x, y in zip(examples.inputs, examples.targets, strict=True)
        ]
        buckets: dict[tuple[int, int], list[int]] = {}
        for i, key in enumerate(keys):
            buckets.setdefault(key, []).append(i)
        ordered = sorted(buckets)
        index = {k: np.asarray(buckets[k]) for k in ordered}
        totals = np.array([weight[index[k]].sum() for k in ordered])
        return cls(
            buckets=index,
            weights={k: weight[index[k]] / weight[index[k]].sum() for k in ordered},
            shares=totals / totals.sum(),
            tokens_per_batch=train.tokens_per_batch,
            max_batch_size=train.max_batch_size,
            seed=train.seed,
        )

    def batch_size(self, key: tuple[int, int]) -> int:
        size = self.tokens_per_batch // max(key)
        return int(min(max(8, size - size % 8), self.max_batch_size))

    def draw(self, step: int) -> tuple[tuple[int, int], np.ndarray]:
        rng = np.random.default_rng([self.seed, step])
        keys = list(self.buckets)
        key = keys[rng.choice(len(keys), p=self.shares)]
        chosen = rng.choice(self.buckets[key], size=self.batch_size(key), p=self.weights[key])
        return key, chosen


def eval_batches(
    examples: Examples, *, count: int, batch_size: int = 64, buckets: Buckets = DEFAULT_BUCKETS
):
    """Deterministic batches over the first ``count`` examples, sorted by length."""
    order = sorted(range(min(count, len(examples))), key=lambda i: len(examples.targets[i]))
    input_buckets, target_buckets = buckets
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        input_len = bucket_length(max(len(examples.inputs[i]) for i in chunk), input_buckets)
        target_len = bucket_length(max(len(examples.targets[i]) for i in chunk), target_buckets)
        yield chunk, make_batch(examples, chunk, input_len=input_len, target_len=target_len)


# ----------------------------------------------------------------------- checkpoints


def _module(model_config):
    return t5 if isinstance(model_config, t5.T5Config) else decoder


def init_params(model_config, seed: int) -> dict:
    """Fresh float32 params of the config's family."""
    return _module(model_config).init_params(model_config, jax.random.key(seed))


def complete_checkpoints(train_dir: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """(step, folder) of checkpoints that have their train-state sidecar, oldest first."""
    if not train_dir.is_dir():
        return []
    found = []
    for child in train_dir.iterdir():
        match = re.fullmatch(r"checkpoint_(\d+)", child.name)
        if match and (child / TRAIN_STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def save_train_checkpoint(
    train_dir: pathlib.Path, *, step: int, params, opt_state, meta: dict, keep: int
) -> pathlib.Path:
    """float32 params (T5X layout) + msgpack sidecar (step, optimizer state, meta)."""
    folder = checkpoints.save_t5x(params, train_dir, step=step)
    state = {
        "step": np.int64(step),
        "opt_state": flax.serialization.to_state_dict(jax.device_get(opt_state)),
        "meta": json.dumps(meta),
    }
    tmp = folder / f"{TRAIN_STATE_FILE}.tmp"
    tmp.write_bytes(flax.serialization.msgpack_serialize(state))
    tmp.rename(folder / TRAIN_STATE_FILE)
    for _, old in complete_checkpoints(train_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def restore_train_checkpoint(folder: pathlib.Path, *, params_like, opt_state_like):
    """(params, opt_state, step, meta) from :func:`save_train_checkpoint`'s folder."""
    params = checkpoints.load_t5x(folder, like=params_like)
    params = jax.tree.map(lambda x, like: jnp.asarray(x, like.dtype), params, params_like)
    state = flax.serialization.msgpack_restore((folder / TRAIN_STATE_FILE).read_bytes())
    opt_state = flax.serialization.from_state_dict(opt_state_like, state["opt_state"])
    opt_state = jax.tree.map(jnp.asarray, opt_state)
    return params, opt_state, int(state["step"]), json.loads(state["meta"])


def at_schedule_step(opt_state, step: int):
    """Fresh optimizer state whose learning-rate schedule continues at ``step``.

    Only the schedule's counter moves: the moments' own counters (Adam's bias
    correction, Adafactor's decay) stay at 0 because their moments are fresh.
    """

    def advance(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return node._replace(count=jnp.full_like(node.count, step))
        return node

    return jax.tree.map(
        advance, opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState)
    )


def export_params(export_dir: pathlib.Path, *, step: int, params, dtype: str, info: dict):
    """Params cast to ``dtype`` as the only T5X checkpoint in export_dir + training.json."""
    cast = jax.tree.map(lambda x: np.asarray(jax.device_get(x)).astype(jnp.dtype(dtype)), params)
    folder = checkpoints.save_t5x(cast, export_dir, step=step)
    for child in export_dir.iterdir():
        if re.fullmatch(r"checkpoint_\d+", child.name) and child != folder:
            shutil.rmtree(child, ignore_errors=True)
    (export_dir / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return folder


def _repo_relative(path) -> str:
    path = pathlib.Path(path)
    return (
        str(path.relative_to(configs.REPO_ROOT))
        if path.is_relative_to(configs.REPO_ROOT)
        else str(path)
    )


def load_model_params(model_file: configs.ModelFileConfig, path: pathlib.Path | None = None):
    """Latest params of a model config: its train dir, else its export dir (as float32)."""
    like = jax.eval_shape(lambda: init_params(model_file.model, 0))
    if path is None:
        complete = complete_checkpoints(model_file.train_dir)
        path = complete[-1][1] if complete else model_file.export_dir
    params = checkpoints.load_t5x(path, like=like)
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def load_teacher(model_file: configs.ModelFileConfig):
    """(teacher model config, teacher params) from ``teacher`` (YAML or checkpoint folder)."""
    teacher = pathlib.Path(model_file.teacher)
    if teacher.suffix in (".yaml", ".yml"):
        teacher_file = configs.load_model_config(teacher)
        return teacher_file.model, load_model_params(teacher_file)
    if not model_file.teacher_config:
        raise configs.ConfigError(
            f"{model_file.path}: teacher {teacher} is a checkpoint; set teacher_config to the "
            "teacher's model YAML"
        )
    teacher_file = configs.load_model_config(model_file.teacher_config)
    return teacher_file.model, load_model_params(teacher_file, teacher)


def file_sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------------ evaluation


def evaluate(
    eval_step, params, examples: Examples, *, count: int, buckets: Buckets = DEFAULT_BUCKETS
) -> dict[str, float]:
    """Token-weighted validation loss and accuracy over the first ``count`` examples."""
    batches = eval_batches(examples, count=count, buckets=buckets)
    per_batch = [eval_step(params, batch) for _, batch in batches]
    return training.combine_eval_metrics(jax.device_get(per_batch))


def translate(
    decode,
    params,
    examples: Examples,
    indices: Sequence[int],
    processor,
    input_buckets: Sequence[int] = INPUT_BUCKETS,
) -> list[str]:
    """Greedy translations (text) of the examples at ``indices``, in that order."""
    input_len = bucket_length(max(len(examples.inputs[i]) for i in indices), input_buckets)
    batch = make_batch(examples, indices, input_len=input_len, target_len=1)
    tokens = np.asarray(decode(params, batch["encoder_input_tokens"]))
    texts = []
    for row in tokens.tolist():
        row = row[: row.index(EOS_ID)] if EOS_ID in row else row
        texts.append(processor.decode([t for t in row if t > 0]))
    return texts


def bleu_and_samples(
    decode,
    params,
    examples: Examples,
    *,
    count: int,
    samples: int,
    processor,
    input_buckets: Sequence[int] = INPUT_BUCKETS,
):
    """sacrebleu BLEU of greedy translations of the first ``count`` examples + samples."""
    import sacrebleu

    hypotheses = []
    for start in range(0, count, 64):
        indices = list(range(start, min(start + 64, count)))
        hypotheses += translate(decode, params, examples, indices, processor, input_buckets)
    references = examples.german[: len(hypotheses)]
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    shown = [
        (examples.english[i], references[i], hypotheses[i])
        for i in range(min(samples, len(hypotheses)))
    ]
    return bleu, shown


# ----------------------------------------------------------------------------- loop


class StopFlag:
    """Set by SIGTERM/SIGINT so the loop saves a checkpoint before exiting."""

    def __init__(self):
        self.stop = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        del frame
        print(f"signal {signum}: saving a checkpoint and stopping", flush=True)
        self.stop = True


def to_decoder_only(batch: dict) -> dict:
    """Encoder-decoder batch -> prefix-LM batch for decoder-only models (loss on targets)."""
    rows = []
    for enc, tgt in zip(batch["encoder_input_tokens"], batch["decoder_target_tokens"], strict=True):
        rows.append((enc[enc > 0], tgt[tgt > 0]))
    length = bucket_length(max(len(x) + len(y) for x, y in rows), (*INPUT_BUCKETS, 96, 128))
    tokens = np.zeros((len(rows), length), np.int32)
    weights = np.zeros((len(rows), length), np.float32)
    for r, (x, y) in enumerate(rows):
        seq = np.concatenate([x, y])[:length]
        tokens[r, : len(seq)] = seq
        weights[r, len(x) : len(seq)] = 1.0
    inputs = np.zeros_like(tokens)
    inputs[:, 1:] = tokens[:, :-1]
    return {
        "decoder_input_tokens": inputs,
        "decoder_target_tokens": tokens,
        "decoder_loss_weights": weights,
    }


def _optimizer(train: configs.TrainConfig, max_steps: int):
    return training.make_optimizer(
        name=train.optimizer,
        learning_rate=train.learning_rate,
        warmup_steps=train.warmup_steps,
        schedule=train.schedule,
        total_steps=max_steps,
        decay_steps=train.decay_steps,
        weight_decay=train.weight_decay,
        clip_norm=train.clip_norm,
    )


def _loss_config(train: configs.TrainConfig) -> training.LossConfig:
    return training.LossConfig(
        label_smoothing=train.label_smoothing,
        z_loss=train.z_loss,
        distill_weight=train.distill_weight,
        distill_temperature=train.distill_temperature,
    )


def _train_step(model_file: configs.ModelFileConfig, optimizer):
    """The jitted train step, with the teacher bound when distilling."""
    loss_config = _loss_config(model_file.train)
    teacher_fn = teacher_params = None
    if loss_config.distill_weight > 0.0:
        if not model_file.teacher:
            raise configs.ConfigError(f"{model_file.path}: distill_weight > 0 needs a teacher")
        teacher_config, teacher_params = load_teacher(model_file)
        teacher_fn = training.logits_fn_for(teacher_config)
    return training.make_train_step(
        training.logits_fn_for(model_file.model),
        optimizer,
        loss_config=loss_config,
        teacher_logits_fn=teacher_fn,
        teacher_params=teacher_params,
    )


def _progress_line(step, max_steps, metrics, rate) -> str:
    eta = (max_steps - step) / rate if rate > 0 else float("inf")
    eta_text = f"{eta / 3600:.1f}h" if eta >= 3600 else f"{eta / 60:.0f}m"
    extra = f" kl {metrics['kl']:.3f}" if "kl" in metrics else ""
    return (
        f"step {step}/{max_steps} loss {metrics['loss']:.3f} acc {metrics['accuracy']:.3f}"
        f"{extra} gnorm {metrics['grad_norm']:.2f} {rate:.2f} steps/s ETA {eta_text}"
    )


@dataclasses.dataclass
class RunState:
    """Mutable bookkeeping of one training run (the arrays live in the loop)."""

    step: int = 0
    wall_s: float = 0.0  # training wall time over all resumes
    last_eval: dict = dataclasses.field(default_factory=dict)


class Trainer:
    """One training run of a model config: data, steps, evaluation, checkpoints."""

    def __init__(self, model_file: configs.ModelFileConfig, *, max_steps: int | None = None):
        import sentencepiece as spm

        self.file = model_file
        self.train = model_file.train
        self.max_steps = max_steps if max_steps is not None else self.train.max_steps
        self.is_t5 = isinstance(model_file.model, t5.T5Config)
        vocab_path = configs.resolve(model_file.data.vocab_path)
        self.processor = spm.SentencePieceProcessor(model_file=str(vocab_path))
        self.vocab_sha256 = file_sha256(vocab_path)
        start = time.perf_counter()
        self.examples = load_examples(model_file.data, "train")
        self.validation = load_examples(model_file.data, model_file.data.eval_split)
        print(
            f"data: {len(self.examples)} train / {len(self.validation)} "
            f"{model_file.data.eval_split} pairs ({model_file.data.source}) in "
            f"{time.perf_counter() - start:.0f}s",
            flush=True,
        )
        self.buckets = length_buckets(model_file.data)
        self.sampler = BucketSampler.build(
            self.examples, self.train, model_file.data.sentence_weight, self.buckets
        )
        self.optimizer = _optimizer(self.train, self.max_steps)
        self.train_step = _train_step(model_file, self.optimizer)
        logits_fn = training.logits_fn_for(model_file.model)
        self.eval_step = training.make_eval_step(logits_fn)
        self.decode = None
        if self.is_t5:
            self.decode = training.t5_greedy_decoder(
                model_file.model, max_decode_len=model_file.data.max_target_length
            )

    def initial_state(self, *, resume: bool):
        """(params, opt_state, RunState): the newest complete checkpoint (``resume``), else
        the committed export (``resume``), else ``checkpoint.init_from``, else fresh."""
        params = init_params(self.file.model, self.train.seed)
        opt_state = self.optimizer.init(params)
        run = RunState()
        complete = complete_checkpoints(self.file.train_dir)
        if resume and complete:
            step, folder = complete[-1]
            params, opt_state, step, meta = restore_train_checkpoint(
                folder, params_like=params, opt_state_like=opt_state
            )
            self.check_vocabulary(meta.get("vocab_sha256"), folder)
            run = RunState(step=step, wall_s=meta.get("wall_s", 0.0), last_eval=meta["eval"])
            print(f"resumed from {folder} (step {step})", flush=True)
        elif resume and (warm := self.exported_state()) is not None:
            params, run = warm
            opt_state = at_schedule_step(self.optimizer.init(params), run.step)
            print(
                f"warm start from the export {self.file.export_dir} (step {run.step}); "
                "no resumable train state, so the optimizer state starts afresh",
                flush=True,
            )
        elif (folder := self.file.init_from) is not None:
            try:
                params = load_model_params(self.file, folder)
            except Exception as error:
                raise RuntimeError(
                    f"{self.file.path}: cannot start from checkpoint.init_from {folder}: {error}"
                ) from error
            opt_state = self.optimizer.init(params)
            print(f"initialised from {folder} (step 0, fresh optimizer state)", flush=True)
        return params, opt_state, run

    def check_vocabulary(self, recorded_sha256: str | None, where: pathlib.Path) -> None:
        """A checkpoint's recorded vocabulary hash (None: not recorded) must be ours."""
        if recorded_sha256 not in (None, self.vocab_sha256):
            raise RuntimeError(f"{where} was trained with another vocabulary")

    def exported_state(self):
        """(float32 params, RunState) of the committed export, or None when there is none.

        A fresh checkout has the bfloat16 export but not the float32 train dir; resuming
        from the export keeps the training progress (step, wall time) and loses only the
        optimizer moments, which re-estimate within a few hundred steps.
        """
        info_path = self.file.export_dir / "training.json"
        if not info_path.is_file():
            return None
        info = json.loads(info_path.read_text())
        self.check_vocabulary(info.get("vocab_sha256"), self.file.export_dir)
        try:
            params = load_model_params(self.file, self.file.export_dir)
        except checkpoints.CheckpointError as error:
            raise RuntimeError(f"cannot warm-start from {self.file.export_dir}: {error}") from error
        run = RunState(
            step=int(info["step"]),
            wall_s=float(info.get("wall_s", 0.0)),
            last_eval=info.get("validation", {}),
        )
        return params, run

    def batch(self, step: int) -> dict:
        (input_len, target_len), indices = self.sampler.draw(step)
        batch = make_batch(self.examples, indices, input_len=input_len, target_len=target_len)
        return batch if self.is_t5 else to_decoder_only(batch)

    def evaluate(self, params) -> dict[str, float]:
        batches = eval_batches(
            self.validation, count=self.train.eval_examples, buckets=self.buckets
        )
        per_batch = [
            self.eval_step(params, b if self.is_t5 else to_decoder_only(b)) for _, b in batches
        ]
        result = training.combine_eval_metrics(jax.device_get(per_batch))
        if self.decode is not None and self.train.bleu_examples > 0:
            bleu, shown = bleu_and_samples(
                self.decode,
                params,
                self.validation,
                count=min(self.train.bleu_examples, len(self.validation)),
                samples=self.train.samples,
                processor=self.processor,
                input_buckets=self.buckets[0],
            )
            result["bleu"] = bleu
            for english, reference, hypothesis in shown:
                print(f"  EN  {english}\n  REF {reference}\n  HYP {hypothesis}", flush=True)
        return result

    def save(self, params, opt_state, run: RunState, command: str) -> None:
        meta = {
            "wall_s": run.wall_s,
            "eval": run.last_eval,
            "vocab_sha256": self.vocab_sha256,
            "config": self.file.path,
        }
        save_train_checkpoint(
            self.file.train_dir,
            step=run.step,
            params=params,
            opt_state=opt_state,
            meta=meta,
            keep=self.file.checkpoint.keep,
        )
        info = {
            "name": self.file.name,
            "step": run.step,
            "wall_s": round(run.wall_s, 1),
            "params": configs.param_count(self.file.model),
            "dtype": self.file.checkpoint.export_dtype,
            "validation": run.last_eval,
            "vocab_sha256": self.vocab_sha256,
            "command": command,
        }
        for key, path in (("teacher", self.file.teacher), ("init_from", self.file.init_from)):
            if path:  # provenance: what the params were distilled from / started from
                info[key] = _repo_relative(path)
        export_params(
            self.file.export_dir,
            step=run.step,
            params=params,
            dtype=self.file.checkpoint.export_dtype,
            info=info,
        )
        print(f"checkpoint at step {run.step} ({self.file.train_dir})", flush=True)

    def log_eval(self, params, run: RunState, tracking) -> None:
        start = time.perf_counter()
        run.last_eval = {k: round(float(v), 4) for k, v in self.evaluate(params).items()}
        bleu = f" bleu {run.last_eval['bleu']:.2f}" if "bleu" in run.last_eval else ""
        print(
            f"eval step {run.step}: loss {run.last_eval['loss']:.3f} "
            f"acc {run.last_eval['accuracy']:.3f}{bleu} ({time.perf_counter() - start:.0f}s)",
            flush=True,
        )
        tracking.log_metrics({f"eval_{k}": v for k, v in run.last_eval.items()}, step=run.step)

    def mlflow_params(self) -> dict:
        return {
            "config": self.file.path,
            "max_steps": self.max_steps,
            "model": dataclasses.asdict(self.file.model),
            "data": dataclasses.asdict(self.file.data),
            "train": dataclasses.asdict(self.train),
        }

    def checkpoint_due(self, step: int, seconds_since_save: float) -> bool:
        every_steps, every_seconds = (
            self.file.checkpoint.every_steps,
            self.file.checkpoint.every_seconds,
        )
        return bool(
            (every_steps and step % every_steps == 0)
            or (every_seconds and seconds_since_save >= every_seconds)
            or step == self.max_steps
        )

    def fit(self, *, resume: bool, tracking_uri: str | None, command: str) -> RunState:
        """Trains to ``max_steps`` (or a stop signal); returns the final RunState."""
        from pipelines import tracking

        params, opt_state, run = self.initial_state(resume=resume)
        stop = StopFlag()
        size = configs.param_count(self.file.model) / 1e6
        print(
            f"{self.file.name}: {size:.2f}M params, steps {run.step} -> {self.max_steps}",
            flush=True,
        )
        with tracking.start_run(
            "train",
            run_name=self.file.name,
            params=self.mlflow_params(),
            tags={"model": self.file.name, "resumed_from_step": str(run.step)},
            tracking_uri=tracking_uri,
        ):
            last_save = window_start = segment_start = time.time()
            window_step, wall_at_start = run.step, run.wall_s
            while run.step < self.max_steps and not stop.stop:
                params, opt_state, metrics = self.train_step(
                    params, opt_state, self.batch(run.step), self.dropout_key(run.step)
                )
                run.step += 1
                run.wall_s = wall_at_start + time.time() - segment_start
                if run.step % self.train.log_every == 0:
                    rate = (run.step - window_step) / max(time.time() - window_start, 1e-9)
                    window_start, window_step = time.time(), run.step
                    self.log_progress(run.step, jax.device_get(metrics), rate, tracking)
                if run.step % self.train.eval_every == 0 or run.step == self.max_steps:
                    self.log_eval(params, run, tracking)
                if self.checkpoint_due(run.step, time.time() - last_save) or stop.stop:
                    self.save(params, opt_state, run, command)
                    last_save = time.time()
        return run

    def dropout_key(self, step: int) -> jax.Array | None:
        """The dropout key of ``step`` (from the seed and the step, so a resumed run drops
        what an uninterrupted one would); None when the model has no dropout."""
        if getattr(self.file.model, "dropout_rate", 0.0) <= 0.0:
            return None
        return jax.random.fold_in(jax.random.PRNGKey(self.train.seed + 1_000_003), step)

    def log_progress(self, step: int, metrics, rate: float, tracking) -> None:
        """One progress line (loss, accuracy, steps/s, ETA) and the MLflow train metrics."""
        metrics = {k: float(v) for k, v in metrics.items()}
        print(_progress_line(step, self.max_steps, metrics, rate), flush=True)
        logged = {k: metrics[k] for k in ("loss", "accuracy", "grad_norm")}
        tracking.log_metrics(logged | {"steps_per_s": rate}, step=step)


def evaluate_checkpoint(
    model_file: configs.ModelFileConfig, *, split: str, sentences: int | None = None
) -> dict:
    """Loss, accuracy and greedy BLEU of the latest checkpoint on every pair of ``split``,
    or on its first ``sentences`` full-sentence pairs (both sides end like a sentence, as
    every test pair does): e.g. as many training sentences as the test split holds, to
    set what the model learnt beside how it generalises."""
    import sentencepiece as spm

    from pipelines.data import ding

    if sentences is not None and sentences < 1:
        raise ValueError(f"--sentences must be at least 1, got {sentences}")
    examples = load_examples(model_file.data, split)
    if sentences is not None:
        pairs = zip(examples.english, examples.german, strict=True)
        chosen = [i for i, pair in enumerate(pairs) if ding.is_sentence_pair(pair)][:sentences]
        if len(chosen) < sentences:
            raise ValueError(
                f"split {split!r} of {model_file.data.data_dir} holds {len(chosen)} "
                f"full-sentence pairs, fewer than --sentences {sentences}"
            )
        examples = examples.take(chosen)
    params = load_model_params(model_file)
    logits_fn = training.logits_fn_for(model_file.model)
    buckets = length_buckets(model_file.data)
    result = evaluate(
        training.make_eval_step(logits_fn), params, examples, count=len(examples), buckets=buckets
    )
    if isinstance(model_file.model, t5.T5Config):
        processor = spm.SentencePieceProcessor(
            model_file=str(configs.resolve(model_file.data.vocab_path))
        )
        decode = training.t5_greedy_decoder(
            model_file.model, max_decode_len=model_file.data.max_target_length
        )
        result["bleu"], shown = bleu_and_samples(
            decode,
            params,
            examples,
            count=len(examples),
            samples=5,
            processor=processor,
            input_buckets=buckets[0],
        )
        for english, reference, hypothesis in shown:
            print(f"  EN  {english}\n  REF {reference}\n  HYP {hypothesis}", flush=True)
    return {"split": split, "examples": len(examples), **result}


def enable_compilation_cache(directory: str | pathlib.Path = "runs/jax_cache") -> None:
    """Persists compiled steps across restarts (one compile per bucket shape, ever)."""
    jax.config.update("jax_compilation_cache_dir", str(configs.resolve(directory)))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.train", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", required=True, help="configs/models/<name>.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    parser.add_argument("--max-steps", type=int, default=None, help="override train.max_steps")
    parser.add_argument("--tracking-uri", default=None, help="MLflow URI (default runs/mlflow.db)")
    parser.add_argument(
        "--evaluate",
        metavar="SPLIT",
        default=None,
        help="only evaluate the latest checkpoint on SPLIT (loss, accuracy, BLEU of all pairs)",
    )
    parser.add_argument(
        "--sentences",
        type=int,
        default=None,
        metavar="N",
        help="with --evaluate: only the first N full-sentence pairs of SPLIT",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point (also ``specdec train``); returns an exit status."""
    args = parse_args(argv)
    model_file = configs.load_model_config(args.config)
    enable_compilation_cache()
    command = "python -m pipelines.train " + " ".join(sys.argv[1:] if argv is None else list(argv))
    if args.sentences is not None and not args.evaluate:
        raise SystemExit("--sentences only applies with --evaluate SPLIT")
    if args.evaluate:
        result = evaluate_checkpoint(model_file, split=args.evaluate, sentences=args.sentences)
        print(json.dumps(result), flush=True)
        return 0
    trainer = Trainer(model_file, max_steps=args.max_steps)
    run = trainer.fit(resume=args.resume, tracking_uri=args.tracking_uri, command=command)
    print(
        f"done: step {run.step}, {run.wall_s / 60:.1f} min, last eval {run.last_eval}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
