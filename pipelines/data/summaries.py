"""A summarization corpus from Debian: package long description → its synopsis.

Every binary package in Debian has a one-line *synopsis* and a *long description*, both
written by its maintainer. ``Translation-en`` (bookworm ``main``; written under
``/var/lib/apt/lists`` by ``apt-get update -o Acquire::Languages=en``, lz4, read with
``apt-helper cat-file``) holds them as ``Description-en``: the synopsis line, then the
long description on continuation lines.

Terms:

- *text*: the long description as one line: paragraphs (separated by a `` .`` line)
  joined with a space, list bullets (``*``, ``-``, ``+``, ``o``, ``•`` before an item)
  removed, an item without final punctuation ending in ``;`` (``.`` for a list's last
  item), whitespace collapsed;
- *summary*: the synopsis, whitespace collapsed;
- *source*: the package's source package, from the ``Source:`` field of the ``Packages``
  file of bookworm ``main`` (the version in parentheses dropped); a package without a
  ``Source:`` field, or without a record in that file (another architecture's package),
  is its own source.

Build (``python -m pipelines.data.summaries`` or ``specdec prepare --corpus summaries``):

1. *read* ``Translation-en`` and the package → source map from ``<cache>/ddtp/``
   (``Translation-en`` is the same cached copy the Debian En→De build uses;
   ``package-sources.tsv`` is written from the ``Packages`` file); when a cached file
   is missing it is made from apt's lists, and when those lack it the build stops with
   a message naming the file and the ``apt-get update`` command that writes it;
2. *filter*: records whose text has fewer than ``MIN_TEXT_WORDS`` words, or no summary,
   are dropped (counted);
3. *split by source*: ``hash_fraction(source)`` below 0.03 → test, below 0.06 →
   validation, else train, so one source's binaries never straddle two splits;
4. *dedupe*: within a split, records with the same (text, summary) become one record
   listing all their packages; a train record whose text (up to case, punctuation and
   spacing) occurs in validation or test is dropped, and a validation record whose
   text occurs in test (counted as ``removed_as_leaks``).

Output in ``assets/data/summaries/``: ``{train,validation,test}.tsv.xz`` with lines
``packages<TAB>source<TAB>text<TAB>summary`` (``packages`` comma-separated; each split
in a fixed hash order, so the first N records are a random sample), ``counts.json``,
``LICENSE.md``, and ``test_sample.jsonl``: the first ``SAMPLE_RECORDS`` test records as
``{"id", "source", "reference"}`` lines (``id``: the packages), an input for
``specdec summarize --input``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import pathlib
import re
import statistics
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence

from pipelines.data import ding
from pipelines.data.debian import common, ddtp

DEFAULT_OUTPUT = common.REPO_ROOT / "assets" / "data" / "summaries"
DEFAULT_CACHE_DIR = common.DEFAULT_CACHE_DIR
SPLITS = ding.SPLITS
SALT = "debian-summaries-v1"
TEST_FRACTION, VALIDATION_FRACTION = 0.03, 0.03
MIN_TEXT_WORDS = 30
SAMPLE_RECORDS = 50
TRANSLATION_CACHE = "ddtp/Translation-en"
SOURCES_CACHE = "ddtp/package-sources.tsv"
PACKAGES_GLOB = "*_dists_bookworm_main_binary-*_Packages*"
APT_UPDATE = "apt-get update -o Acquire::Languages=en"

_BULLET = re.compile(r"^\s*(?:[*+\-•·]|o(?=\s))\s+(?=\S)")
_WHITESPACE = re.compile(r"\s+")
_FINAL_PUNCTUATION = re.compile(r"[.,;:!?]$")
_WORD = re.compile(r"[^\W_]+")


@dataclasses.dataclass(frozen=True)
class Record:
    """One corpus record: the packages sharing it, their source, text and summary."""

    packages: tuple[str, ...]
    source: str
    text: str
    summary: str


# ---------------------------------------------------------------------------------------
# Parsing


def _end_item(item: str, *, last: bool) -> str:
    """A list item ending in punctuation as it is, else with ``;`` (``.`` when last)."""
    return item if _FINAL_PUNCTUATION.search(item) else item + ("." if last else ";")


def _paragraph_text(lines: Sequence[str]) -> str:
    """One paragraph's lines as text, list bullets removed (see the module docstring)."""
    pieces: list[list[str]] = []  # runs of lines; a bullet starts a new run
    bullets: list[bool] = []
    for line in lines:
        match = _BULLET.match(line)
        if match:
            pieces.append([line[match.end() :].strip()])
            bullets.append(True)
        elif pieces and bullets[-1] and line[:1].isspace():  # an item's continuation
            pieces[-1].append(line.strip())
        else:
            if not pieces or bullets[-1]:
                pieces.append([])
                bullets.append(False)
            pieces[-1].append(line.strip())
    out = []
    for index, (piece, bullet) in enumerate(zip(pieces, bullets, strict=True)):
        text = " ".join(part for part in piece if part)
        if bullet:
            last = index + 1 == len(pieces) or not bullets[index + 1]
            text = _end_item(text, last=last)
        out.append(text)
    return " ".join(part for part in out if part)


def description_text(body: str) -> str:
    """The long description (continuation lines of ``Description-en``) as one line."""
    paragraphs: list[list[str]] = [[]]
    for line in body.split("\n"):
        line = line[1:] if line.startswith(" ") else line  # the field's own indent
        if line.strip() == ".":
            paragraphs.append([])
        elif line.strip():
            paragraphs[-1].append(line)
    text = " ".join(_paragraph_text(lines) for lines in paragraphs if lines)
    return _WHITESPACE.sub(" ", common.clean_text(text, markup=False, accelerators=False))


def parse_translations(text: str) -> Iterator[tuple[str, str, str]]:
    """``(package, summary, text)`` of every record of a ``Translation-en`` file."""
    for record in ddtp.parse_records(text.splitlines()):
        description = record.get("Description-en")
        package = record.get("Package")
        if description is None or not package:
            continue
        synopsis, _, body = description.partition("\n")
        summary = common.clean_text(synopsis, markup=False, accelerators=False)
        yield package, summary, description_text(body)


def parse_sources(text: str) -> dict[str, str]:
    """Package → source package from a ``Packages`` file (itself when no ``Source:``)."""
    sources: dict[str, str] = {}
    for record in ddtp.parse_records(text.splitlines()):
        package = record.get("Package")
        if package:
            source = record.get("Source", package).split("(")[0].strip() or package
            sources.setdefault(package, source)
    return sources


def word_count(text: str) -> int:
    """Whitespace-separated words."""
    return len(text.split())


# ---------------------------------------------------------------------------------------
# Split and dedupe (pure functions: the tests drive these)


def split_of(source: str, *, salt: str = SALT) -> str:
    """The split of every record of ``source`` (a fixed hash of its name)."""
    fraction = ding.hash_fraction(source, salt)
    if fraction < TEST_FRACTION:
        return "test"
    if fraction < TEST_FRACTION + VALIDATION_FRACTION:
        return "validation"
    return "train"


def build_splits(
    entries: Iterable[tuple[str, str, str]],
    sources: Mapping[str, str],
    *,
    min_words: int = MIN_TEXT_WORDS,
    salt: str = SALT,
) -> tuple[dict[str, list[Record]], dict]:
    """Filters, splits by source and dedupes ``(package, summary, text)`` entries.

    Returns the splits (each in a fixed hash order) and counts of every step.
    """
    counts = {
        "translation_records": 0,
        "dropped_short_text": 0,
        "dropped_empty_summary": 0,
        "packages_without_packages_record": 0,
    }
    grouped: dict[str, dict[tuple[str, str], list[tuple[str, str]]]] = {s: {} for s in SPLITS}
    for package, summary, text in entries:
        counts["translation_records"] += 1
        if word_count(text) < min_words:
            counts["dropped_short_text"] += 1
            continue
        if not summary:
            counts["dropped_empty_summary"] += 1
            continue
        if package not in sources:
            counts["packages_without_packages_record"] += 1
        source = sources.get(package, package)
        found = grouped[split_of(source, salt=salt)].setdefault((text, summary), [])
        found.append((package, source))
    splits = {}
    for name in SPLITS:
        records = []
        for (text, summary), members in grouped[name].items():
            packages = tuple(sorted({package for package, _ in members}))
            source = min(source for _, source in members)
            records.append(Record(packages, source, text, summary))
        counts[f"merged_duplicates_{name}"] = sum(len(m) for m in grouped[name].values()) - len(
            records
        )
        records.sort(key=lambda r: (ding.hash_fraction(f"{r.text}\t{r.summary}", salt), r))
        splits[name] = records
    counts["removed_as_leaks"] = remove_leaks(splits)
    return splits, counts


def remove_leaks(splits: dict[str, list[Record]]) -> dict[str, int]:
    """Drops train records whose text occurs in a held-out split, validation's in test.

    Texts compare by ``normalize_key`` (case, punctuation and spacing ignored). Changes
    ``splits`` in place; returns the removed counts.
    """
    test = {common.normalize_key(r.text) for r in splits["test"]}
    held = test | {common.normalize_key(r.text) for r in splits["validation"]}
    removed = {}
    for name, keys in (("validation", test), ("train", held)):
        before = len(splits[name])
        splits[name] = [r for r in splits[name] if common.normalize_key(r.text) not in keys]
        removed[name] = before - len(splits[name])
    return removed


def check_splits(splits: Mapping[str, Sequence[Record]]) -> None:
    """Raises ValueError if a source is in two splits or a held-out text is in train."""
    owner: dict[str, str] = {}
    for name in SPLITS:
        for record in splits[name]:
            if owner.setdefault(record.source, name) != name:
                raise ValueError(
                    f"source {record.source!r} is in both {owner[record.source]} and {name}"
                )
    held = {common.normalize_key(r.text) for n in ("validation", "test") for r in splits[n]}
    for record in splits["train"]:
        if common.normalize_key(record.text) in held:
            raise ValueError(f"train text of {record.packages} occurs in a held-out split")


# ---------------------------------------------------------------------------------------
# Statistics


def synopsis_word_share(records: Iterable[Record]) -> float:
    """Share of summary words (case-folded word tokens) that occur among the text's words."""
    found = total = 0
    for record in records:
        text_words = {word.casefold() for word in _WORD.findall(record.text)}
        summary_words = [word.casefold() for word in _WORD.findall(record.summary)]
        total += len(summary_words)
        found += sum(word in text_words for word in summary_words)
    return found / total if total else 0.0


def split_counts(records: Sequence[Record]) -> dict:
    """Records, sources, words and medians of one split."""
    text_words = [word_count(r.text) for r in records]
    summary_words = [word_count(r.summary) for r in records]
    return {
        "records": len(records),
        "packages": sum(len(r.packages) for r in records),
        "sources": len({r.source for r in records}),
        "text_words": sum(text_words),
        "summary_words": sum(summary_words),
        "median_text_words": float(statistics.median(text_words)) if records else 0.0,
        "median_summary_words": float(statistics.median(summary_words)) if records else 0.0,
        "summary_word_share_in_text": round(synopsis_word_share(records), 4),
    }


# ---------------------------------------------------------------------------------------
# Inputs (cache and apt lists)


class InputsMissing(FileNotFoundError):
    """An input file is neither in the cache nor in apt's lists."""


def _list_files(pattern: str, lists_dir: pathlib.Path, what: str) -> list[pathlib.Path]:
    found = sorted(pathlib.Path(lists_dir).glob(pattern))
    if not found:
        raise InputsMissing(
            f"{what} is missing: not cached and no {pattern} under {lists_dir}; "
            f"run `{APT_UPDATE}` (needs network to the Debian archive), then rerun"
        )
    return found


def cached_inputs(
    cache_dir: pathlib.Path, lists_dir: pathlib.Path = ddtp.LISTS_DIR
) -> tuple[str, dict[str, str]]:
    """``Translation-en`` text and the package → source map, cached under ``cache_dir``.

    Each is read from the cache when there; otherwise it is made from apt's lists and
    cached. Raises InputsMissing naming the file and the command when neither has it.
    """
    cache_dir = pathlib.Path(cache_dir)
    translation = cache_dir / TRANSLATION_CACHE
    if not translation.is_file():
        files = _list_files(
            "*_dists_bookworm_main_i18n_Translation-en*",
            lists_dir,
            f"Translation-en ({translation})",
        )
        text = "\n".join(ddtp.read_list_file(path) for path in files)
        translation.parent.mkdir(parents=True, exist_ok=True)
        translation.write_text(text, encoding="utf-8")
    sources_path = cache_dir / SOURCES_CACHE
    if not sources_path.is_file():
        files = _list_files(PACKAGES_GLOB, lists_dir, f"the Packages file ({sources_path})")
        sources: dict[str, str] = {}
        for path in files:
            for package, source in parse_sources(ddtp.read_list_file(path)).items():
                sources.setdefault(package, source)
        sources_path.parent.mkdir(parents=True, exist_ok=True)
        lines = (f"{package}\t{source}\n" for package, source in sorted(sources.items()))
        sources_path.write_text("".join(lines), encoding="utf-8")
    sources = dict(
        line.split("\t", 1) for line in sources_path.read_text(encoding="utf-8").splitlines()
    )
    return translation.read_text(encoding="utf-8"), sources


# ---------------------------------------------------------------------------------------
# Files


def write_split(path: pathlib.Path, records: Iterable[Record]) -> None:
    """Writes ``packages<TAB>source<TAB>text<TAB>summary`` lines, xz-compressed."""
    with lzma.open(path, "wt", encoding="utf-8", newline="\n", preset=9) as handle:
        for record in records:
            fields = (",".join(record.packages), record.source, record.text, record.summary)
            if any("\t" in field or "\n" in field for field in fields):
                raise ValueError(f"tab or newline in a record of {record.packages}")
            handle.write("\t".join(fields) + "\n")


def iter_split_file(path: pathlib.Path) -> Iterator[Record]:
    """The records of one ``.tsv.xz`` split file."""
    with lzma.open(path, "rt", encoding="utf-8", newline="\n") as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 4:
                raise ValueError(
                    f"{path}:{number}: expected 'packages<TAB>source<TAB>text<TAB>summary'"
                    f", got {len(fields)} field(s)"
                )
            packages, source, text, summary = fields
            yield Record(tuple(packages.split(",")), source, text, summary)


def read_split(data_dir: str | pathlib.Path, split: str) -> list[Record]:
    """One split's records; raises naming the file and the command when it is missing."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    path = pathlib.Path(data_dir) / f"{split}.tsv.xz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `specdec prepare --corpus summaries`")
    return list(iter_split_file(path))


LICENSE_TEXT = """\
# Debian package descriptions (long description → synopsis)

Source: the English package descriptions of Debian 12 "bookworm" `main`, as published
in the archive's `Translation-en` file (`dists/bookworm/main/i18n/Translation-en`,
fetched by `apt-get update -o Acquire::Languages=en`), with the source package of each
binary package taken from `dists/bookworm/main/binary-amd64/Packages`.

Licence: a package description is part of its source package's `debian/control` file.
The Debian archive states no separate licence for the descriptions; each one is
distributed under the licence of its own package, as stated in that package's
`debian/copyright` (installed as `/usr/share/doc/<package>/copyright`). These licences
differ from package to package (all meet the Debian Free Software Guidelines, as the
packages are in `main`). This corpus does not record them one by one: the first
column of every line names the binary packages whose description it is, and the
second their source package, whose `debian/copyright` applies. Whoever redistributes
the corpus should treat it as a collection of texts under those licences, not under
this repository's licence.

The text was changed only in form: paragraphs and lines joined, list bullets removed
(with `;`/`.` after an item that had no final punctuation), whitespace collapsed.
"""


def write_sample(path: pathlib.Path, records: Sequence[Record]) -> None:
    """``{"id", "source", "reference"}`` JSONL of ``records`` (the job's input format)."""
    ids = [",".join(record.packages) for record in records]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two sample records share packages: {sorted(ids)}")
    lines = (
        json.dumps({"id": id_, "source": r.text, "reference": r.summary}, ensure_ascii=False)
        for id_, r in zip(ids, records, strict=True)
    )
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_outputs(output: pathlib.Path, splits: Mapping[str, Sequence[Record]], counts) -> dict:
    """Writes the splits, the test sample, ``counts.json`` and ``LICENSE.md``; returns counts."""
    output.mkdir(parents=True, exist_ok=True)
    for name in SPLITS:
        write_split(output / f"{name}.tsv.xz", splits[name])
    write_sample(output / "test_sample.jsonl", splits["test"][:SAMPLE_RECORDS])
    every = [record for name in SPLITS for record in splits[name]]
    totals = {
        "corpus": "Debian bookworm main package descriptions: long description -> synopsis",
        "splits": {name: split_counts(splits[name]) for name in SPLITS},
        "all": split_counts(every),
        "min_text_words": MIN_TEXT_WORDS,
        "split_rule": f"sha256 hash of the source package name (salt {SALT!r}): "
        f"< {TEST_FRACTION} test, < {TEST_FRACTION + VALIDATION_FRACTION} validation, else train",
        **counts,
    }
    (output / "counts.json").write_text(json.dumps(totals, indent=2) + "\n")
    (output / "LICENSE.md").write_text(LICENSE_TEXT)
    return totals


def build(
    output: pathlib.Path = DEFAULT_OUTPUT,
    *,
    cache: pathlib.Path = DEFAULT_CACHE_DIR,
    lists_dir: pathlib.Path = ddtp.LISTS_DIR,
) -> dict:
    """Reads the inputs, builds the splits, checks and writes them; returns the counts."""
    translation, sources = cached_inputs(cache, lists_dir)
    splits, counts = build_splits(parse_translations(translation), sources)
    check_splits(splits)
    return write_outputs(pathlib.Path(output), splits, counts)


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="specdec prepare --corpus summaries", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="corpus folder")
    parser.add_argument(
        "--cache",
        default=str(DEFAULT_CACHE_DIR),
        help=f"cache folder (reads {TRANSLATION_CACHE} and {SOURCES_CACHE} there)",
    )
    parser.add_argument("--lists", default=str(ddtp.LISTS_DIR), help="apt's lists folder")
    args = parser.parse_args(argv)
    try:
        totals = build(
            pathlib.Path(args.output),
            cache=pathlib.Path(args.cache),
            lists_dir=pathlib.Path(args.lists),
        )
    except InputsMissing as error:
        print(f"prepare: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps({name: totals["splits"][name]["records"] for name in SPLITS}))
    return totals


if __name__ == "__main__":
    main()
