"""The training job's input pipeline: tokenized splits, length buckets, batches.

Sources (``data.source``): the ``ding_ende`` seqio task (``seqio``); the same Ding TSV
splits tokenized with the same SentencePiece model in plain Python (``tsv``: no
TensorFlow, identical ids: ``translate English to German: {en}`` + EOS -> ``{de}`` +
EOS); the Debian corpus folder (``debian``: every source's split, interleaved, read by
``pipelines.data.debian.build.read_split``) the same way; the Debian summaries corpus
(``summaries``: ``summarize: {text}`` + EOS -> ``{synopsis}`` + EOS, read by
``pipelines.data.summaries.read_split``); or one side of a Ding split as plain
language-model text (``lm``). For ``summaries`` the ``english`` / ``german`` fields of
:class:`Examples` hold the text and its summary.

Examples are bucketed by (input, target) length (:func:`length_buckets`: fine buckets
up to 64 tokens, powers of two above, so that paragraph-length data compiles few
shapes). Each step, :class:`BucketSampler` draws one bucket (by its share of the
sampling weight) and ``tokens_per_batch // S`` examples from it, from a generator
seeded by ``(seed, step)``, so a resumed run sees exactly the batches an uninterrupted
one would. ``data.sentence_weight`` oversamples full-sentence pairs over dictionary
phrases. Decoder-only models train on :func:`to_decoder_only` batches (prefix LM).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from pipelines import configs, text

PREFIX = text.TRANSLATE_PREFIX  # the translation sources' task prefix
EOS_ID = text.EOS_ID
INPUT_BUCKETS = (16, 24, 32, 48, 64)  # padded encoder lengths
TARGET_BUCKETS = (8, 16, 24, 32, 48, 64)  # padded decoder lengths
LONG_BUCKETS = (16, 32, 64, 128, 256, 512)  # both sides, when a max length exceeds 64
SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")
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


def trim(ids: Sequence[int], max_length: int) -> np.ndarray:
    """Token ids with EOS last, at most max_length long."""
    ids = list(ids)[: max_length - 1]
    return np.asarray([*ids, EOS_ID], np.int32)


def task_prefix(data: configs.DataConfig) -> str:
    """The T5 task prefix of ``data``'s inputs (summaries: ``summarize: ``)."""
    return text.SUMMARIZE_PREFIX if data.source == "summaries" else PREFIX


def read_pairs(data: configs.DataConfig, split: str) -> list[tuple[str, str]]:
    """``(input, target)`` texts of a split: Ding TSV (``tsv``), the Debian corpus
    (``debian``) or the Debian summaries (``summaries``: text, synopsis)."""
    if data.source == "summaries":
        from pipelines.data import summaries

        records = summaries.read_split(configs.resolve(data.data_dir), split)
        return [(r.text, r.summary) for r in records]
    if data.source == "debian":
        from pipelines.data.debian import build

        return build.read_split(configs.resolve(data.data_dir), split, data.sources or None)
    if data.sources:
        raise configs.ConfigError(f"data.sources applies to source 'debian', not {data.source!r}")
    from pipelines.data import ding

    return ding.read_split(configs.resolve(data.data_dir), split)


def load_examples_tsv(data: configs.DataConfig, split: str) -> Examples:
    """The split (Ding TSV, Debian corpus or summaries) tokenized with SentencePiece (no
    TensorFlow)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(configs.resolve(data.vocab_path)))
    pairs = read_pairs(data, split)
    english = [en for en, _ in pairs]
    german = [de for _, de in pairs]
    inputs = processor.encode([task_prefix(data) + en for en in english])
    targets = processor.encode(german)
    return Examples(
        inputs=[trim(x, data.max_input_length) for x in inputs],
        targets=[trim(y, data.max_target_length) for y in targets],
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
        inputs.append(trim(example["inputs"][:-1], data.max_input_length))
        targets.append(trim(example["targets"][:-1], data.max_target_length))
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
        targets=[trim(y, data.max_target_length) for y in processor.encode(lines)],
        english=lines if data.lm_side == "en" else [""] * len(lines),
        german=lines if data.lm_side == "de" else [""] * len(lines),
    )


def load_examples(data: configs.DataConfig, split: str) -> Examples:
    """The split of ``data.source`` (seqio, tsv, debian, summaries or lm), tokenized."""
    if data.source == "seqio":
        return load_examples_seqio(data, split)
    if data.source in ("tsv", "debian", "summaries"):
        return load_examples_tsv(data, split)
    if data.source == "lm":
        return load_examples_lm(data, split)
    raise ValueError(
        f"data.source must be 'seqio', 'tsv', 'debian', 'summaries' or 'lm', got {data.source!r}"
    )


def bucket_length(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket >= length (the last bucket if none)."""
    return next((b for b in buckets if b >= length), buckets[-1])


Buckets = tuple[tuple[int, ...], tuple[int, ...]]  # (input lengths, target lengths)
DEFAULT_BUCKETS: Buckets = (INPUT_BUCKETS, TARGET_BUCKETS)


def length_buckets(data: configs.DataConfig) -> Buckets:
    """Padded (input, target) lengths for a config's maximum lengths.

    ``data.length_buckets`` set: those lengths on both sides, each side capped at its
    maximum (an accelerator compiles fewer shapes and pads more cheaply). Else, up to 64
    tokens: the fine default buckets; longer: powers of two from 16 up to the maximum
    (``LONG_BUCKETS``), so a paragraph corpus compiles few batch shapes.
    """
    longest = max(data.max_input_length, data.max_target_length)
    if not data.length_buckets and longest <= INPUT_BUCKETS[-1]:
        return DEFAULT_BUCKETS
    lengths = data.length_buckets or LONG_BUCKETS
    return _capped(lengths, data.max_input_length), _capped(lengths, data.max_target_length)


def _capped(lengths: Sequence[int], max_length: int) -> tuple[int, ...]:
    """The sorted lengths below ``max_length``, then ``max_length`` itself."""
    return (*sorted(b for b in set(lengths) if b < max_length), max_length)


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
