"""Debian package descriptions (English) and their German DDTP translations.

``apt-get update -o Acquire::Languages=en,de`` writes ``Translation-en`` and
``Translation-de`` (lz4) under ``/var/lib/apt/lists``; ``apt-helper cat-file`` reads them.
The build keeps a decompressed copy in ``<cache>/ddtp/`` (a later plain ``apt-get
update`` deletes the lists' copies) and runs that update itself when neither exists.
Each record has ``Package``, ``Description-md5`` and ``Description-<lang>``: a synopsis
line, then the long description, whose paragraphs are separated by a line `` .``.

Alignment: records with the same ``Description-md5`` describe the same English text;
the synopsis pairs with the synopsis and paragraph *i* with paragraph *i*. A description
whose paragraph counts differ is *misaligned* and dropped whole. The group of every pair
is the description (``ddtp:<md5>``).
"""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Iterable, Iterator

from pipelines.data.debian.common import Pair

LISTS_DIR = pathlib.Path("/var/lib/apt/lists")
APT_HELPER = "/usr/lib/apt/apt-helper"


def translation_files(language: str, lists_dir: pathlib.Path = LISTS_DIR) -> list[pathlib.Path]:
    """The main-archive ``Translation-<language>`` files apt has downloaded (sorted)."""
    found = sorted(lists_dir.glob(f"*_dists_bookworm_main_i18n_Translation-{language}*"))
    if not found:
        raise FileNotFoundError(
            f"no Translation-{language} under {lists_dir}; run "
            "`apt-get update -o Acquire::Languages=en,de` first"
        )
    return found


def cached_translations(cache_dir: pathlib.Path, lists_dir: pathlib.Path = LISTS_DIR):
    """``{"en": text, "de": text}`` from ``cache_dir/ddtp``, filled from apt's lists.

    Runs ``apt-get update -o Acquire::Languages=en,de`` when apt's lists lack a file;
    raises FileNotFoundError saying what is missing when that does not help.
    """
    folder = pathlib.Path(cache_dir) / "ddtp"
    texts = {}
    for language in ("en", "de"):
        cached = folder / f"Translation-{language}"
        if not cached.is_file():
            try:
                files = translation_files(language, lists_dir)
            except FileNotFoundError:
                subprocess.run(
                    ["apt-get", "update", "-o", "Acquire::Languages=en,de"],
                    capture_output=True,
                    check=False,
                )
                files = translation_files(language, lists_dir)
            folder.mkdir(parents=True, exist_ok=True)
            cached.write_text("\n".join(read_list_file(path) for path in files), encoding="utf-8")
        texts[language] = cached.read_text(encoding="utf-8")
    return texts


def read_list_file(path: pathlib.Path) -> str:
    """The text of an apt list file (``apt-helper cat-file`` decompresses lz4/xz/gz)."""
    result = subprocess.run([APT_HELPER, "cat-file", str(path)], capture_output=True, check=True)
    return result.stdout.decode("utf-8", errors="replace")


def parse_records(lines: Iterable[str]) -> Iterator[dict[str, str]]:
    """Deb822 records: field name -> value (continuation lines joined with newlines)."""
    record: dict[str, str] = {}
    field = None
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if record:
                yield record
            record, field = {}, None
        elif line[0] in " \t" and field is not None:
            record[field] += "\n" + line
        elif ":" in line:
            field, value = line.split(":", 1)
            record[field] = value.strip()
    if record:
        yield record


def description_units(description: str) -> list[str]:
    """Synopsis, then each long-description paragraph as one line of text."""
    synopsis, _, body = description.partition("\n")
    units = [synopsis.strip()]
    paragraph: list[str] = []
    for line in body.split("\n"):
        text = line[1:] if line.startswith(" ") else line
        if text.strip() == ".":
            if paragraph:
                units.append(" ".join(paragraph))
            paragraph = []
        elif text.strip():
            paragraph.append(text.strip())
    if paragraph:
        units.append(" ".join(paragraph))
    return units


def descriptions(records: Iterable[dict[str, str]], language: str) -> dict[str, str]:
    """``Description-md5`` -> description text, first record per md5."""
    out: dict[str, str] = {}
    for record in records:
        md5, text = record.get("Description-md5"), record.get(f"Description-{language}")
        if md5 and text is not None:
            out.setdefault(md5, text)
    return out


def align(english: dict[str, str], german: dict[str, str]) -> tuple[list[Pair], dict[str, int]]:
    """Pairs of the descriptions both languages have, in the German file's order."""
    pairs: list[Pair] = []
    counts = {"descriptions_de": len(german), "joined": 0, "misaligned": 0}
    for md5, german_text in german.items():
        if md5 not in english:
            continue
        counts["joined"] += 1
        english_units = description_units(english[md5])
        german_units = description_units(german_text)
        if len(english_units) != len(german_units):
            counts["misaligned"] += 1
            continue
        pairs.extend(
            Pair(en, de, f"ddtp:{md5}") for en, de in zip(english_units, german_units, strict=True)
        )
    return pairs, counts


def extract(cache_dir: pathlib.Path, lists_dir: pathlib.Path = LISTS_DIR):
    """All aligned description pairs (and counts) from the Translation files."""
    texts = cached_translations(cache_dir, lists_dir)
    english = descriptions(parse_records(texts["en"].splitlines()), "en")
    german = descriptions(parse_records(texts["de"].splitlines()), "de")
    return align(english, german)
