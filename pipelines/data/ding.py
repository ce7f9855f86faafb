"""The Ding German–English dictionary as an English→German parallel corpus.

Debian's ``trans-de-en`` package ships the Ding dictionary (GPL-2+) as one text file,
``/usr/share/trans/de-en``. Each entry is one line::

    Aalbestand {m} | Aalbestände {pl} :: eel stock | eel stocks

Terms used here:

- *side*: the text left (German) or right (English) of ``" :: "``.
- *slot*: one of the ``" | "``-separated alternatives of a side. Slot *i* of the German
  side translates slot *i* of the English side; a line whose sides have different slot
  counts is *misaligned* and all its slots are dropped.
- *synonym*: one of the ``"; "``-separated variants inside a slot. The dictionary puts
  the main term first, so a pair keeps the first synonym of each side (one pair per
  slot, ~390k pairs).
- *annotation*: grammar and usage marks that are not part of the translation:
  ``{f}``, ``{pl}``, ``{vt}``, ``{prp; +Dat.}`` (braces), ``[techn.]``, ``[Br.]``
  (brackets), ``<purer> <purest>``, ``<>`` (angle brackets), ``/AHU/`` (abbreviations
  between slashes), ``(sth.)``, ``(zoologische Familie)`` (parentheses, nested too).
  ``word/word`` alternatives keep their first word when each has three or more letters
  (``sheer/pure`` -> ``sheer``; ``and/or`` and ``km/h`` are left alone), and a
  ``word /word`` alternative is dropped (``defence /defense system`` -> ``defence system``).
- *full sentence*: both sides start with an upper-case letter (or an opening quote or a
  digit), have at least two words and end in ``.``, ``!`` or ``?``.

The split is a pure function of the pairs: pairs are grouped into components that share
a normalised English or German string, and each component goes to one split by a hash of
its key. Held-out splits take only components made entirely of clean full sentences, so
no test or validation sentence (on either side) occurs in training.

Run ``python -m pipelines.data.ding --output data/ding`` to write
``train.tsv``, ``validation.tsv``, ``test.tsv`` (``english<TAB>german``) and
``counts.json``.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import gzip
import hashlib
import io
import json
import pathlib
import re
from collections.abc import Iterable, Iterator, Sequence

DEFAULT_DICTIONARY = pathlib.Path("/usr/share/trans/de-en")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO_ROOT / "assets" / "data" / "ding"  # the committed, prepared splits
SPLITS = ("train", "validation", "test")

_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_ANGLES = re.compile(r"<[^<>]*>")
_PARENS = re.compile(r"\([^()]*\)")  # innermost group; applied until nothing changes
_ABBREVIATION = re.compile(r"(?<!\S)/[^/\s](?:[^/]*[^/\s])?/(?=[\s,;.:!?]|$)")
_SPACED_ALTERNATIVE = re.compile(r"(?<=\w) /[^\W\d_]+(?![/\w])")  # "defence /defense"
_WORD_ALTERNATIVES = re.compile(r"\b([^\W\d_]{3,})(?:/[^\W\d_]{3,})+\b")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")
_WHITESPACE = re.compile(r"\s+")
_LEFTOVER_MARKUP = re.compile(r"[{}\[\]<>()]")
_FRAGMENT = re.compile(r"…|\.\.\.|~")
_SENTENCE_END = re.compile(r"[.!?][\"'“”’»«]?$")
_OPENING_QUOTES = "\"'„“‘»«¿¡"
_NOT_KEY_CHAR = re.compile(r"[^\w\s]|_")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitConfig:
    """How held-out sentences are chosen; fractions are of the eligible components."""

    test_fraction: float = 0.09  # of components made only of clean full sentences
    validation_fraction: float = 0.055
    min_test_sentences: int = 1000  # preparation fails below this
    salt: str = "ding-ende-v1"  # changing it reshuffles the split


@dataclasses.dataclass
class ParseCounts:
    """What happened to the dictionary's lines and slots while parsing."""

    raw_lines: int = 0
    comment_lines: int = 0
    blank_lines: int = 0
    malformed_lines: int = 0  # not exactly one " :: "
    misaligned_lines: int = 0  # German and English slot counts differ
    aligned_slots: int = 0  # candidate pairs
    dropped_empty: int = 0  # a side is empty (or letterless) after cleaning
    dropped_fragment: int = 0  # "…", "..." or a "~see-also" reference
    dropped_unbalanced: int = 0  # stray brackets left after stripping annotations
    pairs: int = 0  # pairs kept, before dedupe


def strip_annotations(text: str) -> str:
    """Removes the dictionary's annotations from one slot and tidies the spacing.

    >>> strip_annotations("Aalleiter {f}; Aaltreppe {f} (Wasserbau) [techn.]")
    'Aalleiter; Aaltreppe'
    """
    text = text.replace("\t", " ")
    for pattern in (_BRACES, _BRACKETS, _ANGLES, _ABBREVIATION, _SPACED_ALTERNATIVE):
        text = pattern.sub(" ", text)
    previous = None
    while previous != text:
        previous, text = text, _PARENS.sub(" ", text)
    text = _WORD_ALTERNATIVES.sub(r"\1", text)
    text = _WHITESPACE.sub(" ", text)
    return _SPACE_BEFORE_PUNCT.sub(r"\1", text).strip()


def first_synonym(slot: str) -> str:
    """The first non-empty ``"; "``-separated synonym of a cleaned slot ('' if none)."""
    for synonym in slot.split(";"):
        synonym = synonym.strip()
        if synonym:
            return synonym
    return ""


def _clean_slot(slot: str) -> tuple[str, str]:
    """Cleans one slot; returns (text, reason) where reason is '' when the text is kept."""
    text = first_synonym(strip_annotations(slot))
    if not any(char.isalpha() for char in text):
        return "", "empty"
    if _FRAGMENT.search(text):
        return "", "fragment"
    if _LEFTOVER_MARKUP.search(text):
        return "", "unbalanced"
    return text, ""


def parse_line(line: str, counts: ParseCounts) -> list[tuple[str, str]]:
    """Parses one dictionary line into ``(english, german)`` pairs, updating ``counts``."""
    counts.raw_lines += 1
    line = line.rstrip("\n")
    if not line.strip():
        counts.blank_lines += 1
        return []
    if line.startswith("#"):
        counts.comment_lines += 1
        return []
    sides = line.split(" :: ")
    if len(sides) != 2:
        counts.malformed_lines += 1
        return []
    german_slots, english_slots = (side.split(" | ") for side in sides)
    if len(german_slots) != len(english_slots):
        counts.misaligned_lines += 1
        return []
    pairs = []
    for german_slot, english_slot in zip(german_slots, english_slots, strict=True):
        counts.aligned_slots += 1
        english, english_reason = _clean_slot(english_slot)
        german, german_reason = _clean_slot(german_slot)
        reason = english_reason or german_reason
        if reason:
            setattr(counts, f"dropped_{reason}", getattr(counts, f"dropped_{reason}") + 1)
            continue
        pairs.append((english, german))
    counts.pairs += len(pairs)
    return pairs


def parse_dictionary(lines: Iterable[str]) -> tuple[list[tuple[str, str]], ParseCounts]:
    """Parses dictionary lines into ``(english, german)`` pairs in file order (with dupes)."""
    counts = ParseCounts()
    pairs = [pair for line in lines for pair in parse_line(line, counts)]
    return pairs, counts


def dedupe(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Drops exact repeats of a pair, keeping the first occurrence's position."""
    return list(dict.fromkeys(pairs))


def is_full_sentence(text: str) -> bool:
    """Whether ``text`` reads as a full sentence: capitalised, >= 2 words, ends in .!?"""
    first = text.lstrip(_OPENING_QUOTES)[:1]
    starts_well = first.isupper() or first.isdigit()
    return starts_well and bool(_SENTENCE_END.search(text)) and len(text.split()) >= 2


def is_sentence_pair(pair: tuple[str, str]) -> bool:
    """Whether both sides of ``(english, german)`` are full sentences."""
    return is_full_sentence(pair[0]) and is_full_sentence(pair[1])


def collapse_whitespace(text: str) -> str:
    """Each run of whitespace as one space, none at either end."""
    return _WHITESPACE.sub(" ", text).strip()


def normalize_key(text: str) -> str:
    """Case-, punctuation- and spacing-insensitive form used to detect shared strings."""
    return collapse_whitespace(_NOT_KEY_CHAR.sub(" ", text.casefold()))


def _is_held_out_eligible(pair: tuple[str, str]) -> bool:
    """Clean full-sentence pairs only: no leftover ``/`` alternatives on either side."""
    return is_sentence_pair(pair) and "/" not in pair[0] and "/" not in pair[1]


def _find(parent: dict[str, str], key: str) -> str:
    """Union-find root of ``key`` with path halving."""
    while parent[key] != key:
        parent[key] = parent[parent[key]]
        key = parent[key]
    return key


def components(pairs: Sequence[tuple[str, str]]) -> list[str]:
    """For each pair, the key of its component (pairs linked by a shared en or de string).

    The component key is its smallest member string, so it does not depend on order.
    """
    parent: dict[str, str] = {}
    for english, german in pairs:
        a, b = "en:" + normalize_key(english), "de:" + normalize_key(german)
        parent.setdefault(a, a)
        parent.setdefault(b, b)
        root_a, root_b = _find(parent, a), _find(parent, b)
        if root_a != root_b:
            low, high = sorted((root_a, root_b))
            parent[high] = low
    return [_find(parent, "en:" + normalize_key(english)) for english, _ in pairs]


def hash_fraction(key: str, salt: str) -> float:
    """A stable pseudo-random number in [0, 1) from ``key`` (sha256, not Python's hash)."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_splits(
    pairs: Sequence[tuple[str, str]], config: SplitConfig = SplitConfig()
) -> dict[str, list[tuple[str, str]]]:
    """Splits deduped pairs into train / validation / test.

    A component goes to a held-out split only when all its pairs are clean full
    sentences; every other component is training data. Each split is put in hash order
    (a fixed shuffle that does not depend on input order): the dictionary is sorted by
    headword, and a reader with a small shuffle buffer would otherwise see one topic at
    a time.
    """
    keys = components(pairs)
    eligible: dict[str, bool] = collections.defaultdict(lambda: True)
    for key, pair in zip(keys, pairs, strict=True):
        eligible[key] = eligible[key] and _is_held_out_eligible(pair)
    splits: dict[str, list[tuple[str, str]]] = {name: [] for name in SPLITS}
    for key, pair in zip(keys, pairs, strict=True):
        splits[_split_of(key, eligible[key], config)].append(pair)
    for split in splits.values():
        split.sort(key=lambda pair: hash_fraction("\t".join(pair), config.salt))
    return splits


def _split_of(key: str, eligible: bool, config: SplitConfig) -> str:
    """The split of one component."""
    if not eligible:
        return "train"
    fraction = hash_fraction(key, config.salt)
    if fraction < config.test_fraction:
        return "test"
    if fraction < config.test_fraction + config.validation_fraction:
        return "validation"
    return "train"


def check_disjoint(splits: dict[str, list[tuple[str, str]]]) -> None:
    """Raises ValueError if a held-out English or German string also occurs in train."""
    train_en = {normalize_key(en) for en, _ in splits["train"]}
    train_de = {normalize_key(de) for _, de in splits["train"]}
    for name in ("validation", "test"):
        for english, german in splits[name]:
            if normalize_key(english) in train_en or normalize_key(german) in train_de:
                raise ValueError(f"{name} pair also in train: {english!r} / {german!r}")


# ---------------------------------------------------------------------------------------
# Files


def split_path(data_dir: str | pathlib.Path, split: str) -> pathlib.Path:
    """The file holding ``split`` in ``data_dir``: ``{split}.tsv`` or ``{split}.tsv.gz``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    data_dir = pathlib.Path(data_dir)
    for name in (f"{split}.tsv", f"{split}.tsv.gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise FileNotFoundError(
        f"no {split}.tsv or {split}.tsv.gz in {data_dir}; "
        f"prepare it with `python -m pipelines.data.ding --output {data_dir}`"
    )


def _open_text(path: pathlib.Path, mode: str) -> io.TextIOBase:
    """Opens a UTF-8 text file, gzip-compressed when the name ends in ``.gz``."""
    if path.suffix == ".gz":
        if "w" in mode:  # mtime=0 makes the bytes reproducible
            raw = gzip.GzipFile(path, mode="wb", mtime=0, compresslevel=9)
            return io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
        return gzip.open(path, "rt", encoding="utf-8", newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


def iter_pairs(path: str | pathlib.Path) -> Iterator[tuple[str, str]]:
    """Yields ``(english, german)`` from one ``english<TAB>german`` file (.tsv or .tsv.gz)."""
    path = pathlib.Path(path)
    with _open_text(path, "r") as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 2:
                raise ValueError(f"{path}:{number}: expected 'english<TAB>german', got {line!r}")
            yield fields[0], fields[1]


def iter_split(data_dir: str | pathlib.Path, split: str) -> Iterator[tuple[str, str]]:
    """Yields ``(english, german)`` pairs of one split (plain Python, no TensorFlow).

    ``DEFAULT_DATA_DIR`` holds the committed splits.
    """
    return iter_pairs(split_path(data_dir, split))


def read_split(data_dir: str | pathlib.Path, split: str) -> list[tuple[str, str]]:
    """All ``(english, german)`` pairs of one split, in file order."""
    return list(iter_split(data_dir, split))


def write_split(path: pathlib.Path, pairs: Iterable[tuple[str, str]]) -> None:
    """Writes pairs as ``english<TAB>german`` lines (gzip when ``path`` ends in .gz)."""
    with _open_text(path, "w") as handle:
        for english, german in pairs:
            handle.write(f"{english}\t{german}\n")


def split_counts(splits: dict[str, list[tuple[str, str]]]) -> dict[str, dict[str, int]]:
    """Pairs and full-sentence pairs per split."""
    return {
        "split_pairs": {name: len(pairs) for name, pairs in splits.items()},
        "split_sentences": {
            name: sum(map(is_sentence_pair, pairs)) for name, pairs in splits.items()
        },
    }


def prepare(
    dictionary: str | pathlib.Path = DEFAULT_DICTIONARY,
    output: str | pathlib.Path = "data/ding",
    *,
    compress: Iterable[str] = (),
    counts_path: str | pathlib.Path | None = None,
    config: SplitConfig = SplitConfig(),
) -> dict:
    """Parses the dictionary, splits it, writes the TSV files and the counts JSON.

    Splits named in ``compress`` are written as ``{split}.tsv.gz``, the others as ``.tsv``.
    Returns the counts. Raises FileNotFoundError naming ``dictionary`` if it is missing
    and ValueError if the test split ends up with fewer than ``min_test_sentences``.
    """
    dictionary = pathlib.Path(dictionary)
    if not dictionary.is_file():
        raise FileNotFoundError(
            f"Ding dictionary not found at {dictionary}; install it with "
            "`apt-get install -y trans-de-en` or pass --dictionary PATH"
        )
    with open(dictionary, encoding="utf-8") as handle:
        pairs, parse_counts = parse_dictionary(handle)
    unique = dedupe(pairs)
    splits = assign_splits(unique, config)
    check_disjoint(splits)
    counts = {
        "source": str(dictionary),
        **dataclasses.asdict(parse_counts),
        "unique_pairs": len(unique),
        "sentence_pairs": sum(map(is_sentence_pair, unique)),
        "held_out_eligible_sentence_pairs": sum(map(_is_held_out_eligible, unique)),
        **split_counts(splits),
        "split_config": dataclasses.asdict(config),
    }
    if counts["split_sentences"]["test"] < config.min_test_sentences:
        raise ValueError(
            f"test split has {counts['split_sentences']['test']} full sentences, "
            f"fewer than min_test_sentences={config.min_test_sentences}"
        )
    _write_outputs(pathlib.Path(output), splits, counts, compress=compress, counts_path=counts_path)
    return counts


def _write_outputs(
    output: pathlib.Path,
    splits: dict[str, list[tuple[str, str]]],
    counts: dict,
    *,
    compress: Iterable[str],
    counts_path: str | pathlib.Path | None,
) -> None:
    """Writes the three splits (removing a stale copy in the other format) and the counts."""
    output.mkdir(parents=True, exist_ok=True)
    compress = set(compress)
    for name, pairs in splits.items():
        path = output / (f"{name}.tsv.gz" if name in compress else f"{name}.tsv")
        stale = output / (f"{name}.tsv" if name in compress else f"{name}.tsv.gz")
        stale.unlink(missing_ok=True)
        write_split(path, pairs)
    counts_path = pathlib.Path(counts_path) if counts_path else output / "counts.json"
    counts_path.parent.mkdir(parents=True, exist_ok=True)
    counts_path.write_text(json.dumps(counts, indent=2, ensure_ascii=False) + "\n")


def pick_samples(
    pairs: Sequence[tuple[str, str]], n: int = 50, *, min_words: int = 4, max_words: int = 20
) -> list[tuple[str, str]]:
    """``n`` full-sentence pairs of moderate length without quotes, chosen by hash order."""
    quotes = "\"'„“”‘»«"
    candidates = [
        (english, german)
        for english, german in pairs
        if is_sentence_pair((english, german))
        and min_words <= len(english.split()) <= max_words
        and not any(char in quotes for char in english + german)
    ]
    return sorted(candidates, key=lambda pair: hash_fraction(pair[0], "samples"))[:n]


def write_samples(data_dir: str | pathlib.Path, samples_dir: str | pathlib.Path) -> None:
    """Writes ``en_sentences.txt`` and ``en_de_sample.tsv`` from the test split."""
    samples = pick_samples(read_split(data_dir, "test"))
    samples_dir = pathlib.Path(samples_dir)
    samples_dir.mkdir(parents=True, exist_ok=True)
    text = "".join(f"{english}\n" for english, _ in samples)
    (samples_dir / "en_sentences.txt").write_text(text, encoding="utf-8")
    write_split(samples_dir / "en_de_sample.tsv", samples)


def main(argv: Sequence[str] | None = None) -> dict:
    """Command line: ``python -m pipelines.data.ding --output data/ding``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dictionary", default=str(DEFAULT_DICTIONARY), help="Ding file")
    parser.add_argument("--output", default="data/ding", help="directory for the TSV splits")
    parser.add_argument(
        "--gzip",
        nargs="*",
        default=(),
        choices=SPLITS,
        metavar="SPLIT",
        help="splits to write as .tsv.gz (e.g. --gzip train); the others are plain .tsv",
    )
    parser.add_argument("--counts", default=None, help="counts JSON (default OUTPUT/counts.json)")
    parser.add_argument("--samples", default=None, help="also write 50 test sentences here")
    args = parser.parse_args(argv)
    counts = prepare(args.dictionary, args.output, compress=args.gzip, counts_path=args.counts)
    if args.samples:
        write_samples(args.output, args.samples)
    print(json.dumps({k: counts[k] for k in ("unique_pairs", "split_pairs", "split_sentences")}))
    return counts


if __name__ == "__main__":
    main()
