"""The study's dataset: its config, tokenizers, prompts and n-gram training sequences."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from collections.abc import Callable, Iterator

from pipelines import configs, text
from pipelines.configs import ConfigError
from specdec_core.validation import check_choice

ASCII_VOCAB = 128  # the "ascii" tokenizer: ids 0 pad, 1 eos, 2 unk, else the code point
SOURCES = ("ding", "text", "jsonl")
TASK_PREFIXES = {"translate": text.TRANSLATE_PREFIX, "summarize": text.SUMMARIZE_PREFIX}


@dataclasses.dataclass(frozen=True, kw_only=True)
class DatasetConfig:
    source: str = "ding"  # "ding": Ding splits (English side); "text": one prompt per
    #                       line; "jsonl": one record per line, the prompt in ``field``
    path: str = "assets/data/ding"  # ding: the splits folder; text/jsonl: the prompts file
    field: str = "source"  # jsonl: the key holding the prompt (a job input's "source")
    task: str = "translate"  # T5 targets: the task prefix, "translate" | "summarize"
    split: str = "validation"  # ding: the prompts' split
    train_split: str = "train"  # ding: the split n-gram drafts are fit on
    train_path: str = ""  # text: n-gram training text, one sequence per line ("": none)
    tokenizer: str = "assets/spm/ende.model"  # SentencePiece model file, or "ascii"
    num_prompts: int = 64  # prompts read (the first that have prompt_tokens pieces)
    prompt_tokens: int = 4  # pieces of the sentence given to a decoder-only target
    bos_id: int | None = 0  # starts decoder-only prompts and n-gram sequences; null: none
    eos_id: int | None = text.EOS_ID  # ends generation and n-gram sequences; null: never stop
    ngram_smoothing: float = 1.0  # add-k of unigram/bigram drafts
    ngram_train_limit: int = 0  # training sequences for n-gram fits (0: all)

    def __post_init__(self):
        check_choice("dataset.source", self.source, SOURCES)
        check_choice("dataset.task", self.task, TASK_PREFIXES)
        for key in ("num_prompts", "prompt_tokens"):
            if getattr(self, key) < 1:
                raise ValueError(f"dataset.{key} must be >= 1, got {getattr(self, key)}")
        if self.ngram_smoothing < 0 or self.ngram_train_limit < 0:
            raise ValueError("dataset.ngram_smoothing and ngram_train_limit must be >= 0")


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    encode: Callable[[str], list[int]]
    vocab_size: int


def _ascii_encode(line: str) -> list[int]:
    return [o if 3 <= (o := ord(ch)) < ASCII_VOCAB else 2 for ch in line]


@functools.lru_cache(maxsize=4)
def load_tokenizer(spec: str) -> Tokenizer:
    """``"ascii"`` (ids = code points 3..127, else unk 2) or a SentencePiece model path."""
    if spec == "ascii":
        return Tokenizer(encode=_ascii_encode, vocab_size=ASCII_VOCAB)
    path = configs.resolve(spec)
    if not path.is_file():
        raise ConfigError(f"tokenizer not found: {path} (a SentencePiece model, or 'ascii')")
    processor = text.sentencepiece(str(path))
    return Tokenizer(encode=processor.encode, vocab_size=processor.get_piece_size())


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prompt:
    id: int  # line number in the dataset (0-based): seeds the prompt's random draws
    text: str  # the English sentence
    tokens: tuple[int, ...]  # its pieces (no bos/eos)


def _iter_lines(dataset: DatasetConfig, *, train: bool, side: int = 0) -> Iterator[str]:
    """Lines of the prompt file or training text; for Ding, one side of the pairs."""
    from pipelines.data import ding

    if dataset.source == "ding":
        split = dataset.train_split if train else dataset.split
        for pair in ding.iter_split(configs.resolve(dataset.path), split):
            yield pair[side]
        return
    path = configs.resolve(dataset.train_path if train else dataset.path)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if dataset.source == "text":
                yield line.rstrip("\n")
            elif line.strip():
                yield _jsonl_prompt(line, dataset.field, where=f"{path}:{number}")


def _jsonl_prompt(line: str, field: str, *, where: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{where}: not a JSON object ({error.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        raise ConfigError(f"{where}: no string field {field!r} (dataset.field)")
    return record[field]


def iter_prompts(dataset: DatasetConfig) -> Iterator[Prompt]:
    """The first ``num_prompts`` lines with at least ``prompt_tokens`` pieces, lazily."""
    tokenizer = load_tokenizer(dataset.tokenizer)
    prompts = (
        Prompt(id=i, text=line, tokens=tuple(tokenizer.encode(line)))
        for i, line in enumerate(_iter_lines(dataset, train=False))
    )
    long_enough = (p for p in prompts if len(p.tokens) >= dataset.prompt_tokens)
    return itertools.islice(long_enough, dataset.num_prompts)


def ngram_sequences(dataset: DatasetConfig, *, side: str) -> list[list[int]]:
    """Training sequences for n-gram drafts: [bos] + pieces + [eos] of each line.

    side: "english" (decoder-only targets continue English) or "german" (a T5 En→De
    target's decoder writes German; its start token is pipelines.text.DECODER_START_ID).
    """
    tokenizer = load_tokenizer(dataset.tokenizer)
    start = text.DECODER_START_ID if side == "german" else dataset.bos_id
    lines = _iter_lines(dataset, train=True, side=1 if side == "german" else 0)
    if dataset.ngram_train_limit:
        lines = itertools.islice(lines, dataset.ngram_train_limit)
    head = [] if start is None else [start]
    tail = [] if dataset.eos_id is None else [dataset.eos_id]
    return [head + tokenizer.encode(line) + tail for line in lines if line]
