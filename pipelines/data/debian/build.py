"""Builds the Debian En→De corpus: fetch, align, clean, dedupe, split by group, write.

``python -m pipelines.data.debian.build [--output assets/data/debian] [--cache runs/debian_cache]``
(or ``specdec prepare --corpus debian``). Steps:

1. *fetch*: each named package with ``apt-get download`` into ``<cache>/debs`` (kept
   between runs), unpacked with ``dpkg-deb -x`` (no install). A package that cannot be
   fetched is skipped with a printed message and listed under ``skipped_packages`` in
   its source's ``counts.json``; a source left with no package is written empty.
   DDTP needs ``apt-get update -o Acquire::Languages=en,de`` once beforehand.
2. *align* per source (``sources.py``: ``ddtp``, ``lohelp``, ``catalogs``, ``mozilla``,
   ``docs``, ``manpages``), then *clean* (``common.clean_text``) and *filter*
   (``common.reject_reason``: empty, letterless, over-long, key-like ids, German equal
   to English).
3. *dedupe* exact pairs across all sources (the first source in ``SOURCE_ORDER`` keeps
   a pair; ``ding`` comes first so its committed test split never changes).
4. *split by group*: groups in a fixed hash order fill ``test`` and then ``validation``
   up to their fractions of the source's pairs; the rest is ``train``. A group never
   straddles two splits. ``ding`` keeps its own committed split.
5. *leakage*: every train pair whose normalised English or German occurs in any
   source's test or validation split is removed, and every validation pair whose key
   occurs in a test split.

Output per source: ``{train,validation,test}.tsv.xz`` (``english<TAB>german``, held-out
splits in hash order), ``counts.json`` and ``LICENSE.md``; plus a top-level
``counts.json`` with the totals.
"""

from __future__ import annotations

import argparse
import json
import lzma
import pathlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence

from pipelines.data import ding
from pipelines.data.debian import common
from pipelines.data.debian.common import Pair, normalize_key
from pipelines.data.debian.sources import (
    ACCELERATORS,
    SOURCE_BUILDERS,
    SOURCE_ORDER,
    SOURCE_TITLES,
    SourceResult,
)

DEFAULT_OUTPUT = common.REPO_ROOT / "assets" / "data" / "debian"
SPLITS = ding.SPLITS
SALT = "debian-ende-v1"
TEST_FRACTION, VALIDATION_FRACTION = 0.03, 0.02


# ---------------------------------------------------------------------------------------
# Cleaning, dedupe, split, leakage (pure functions: the tests drive these)


def clean_pairs(pairs: Iterable[Pair], *, accelerators: bool) -> tuple[list[Pair], dict]:
    """Cleans both sides and drops rejected pairs; returns kept pairs and drop counts."""
    kept, dropped = [], {}
    for pair in pairs:
        english = common.clean_text(pair.english, accelerators=accelerators)
        german = common.clean_text(pair.german, accelerators=accelerators)
        reason = common.reject_reason(english, german)
        if reason:
            dropped[reason] = dropped.get(reason, 0) + 1
            continue
        kept.append(Pair(english, german, pair.group))
    return kept, dropped


def dedupe_pairs(pairs: Iterable[Pair], seen: set[tuple[str, str]]) -> list[Pair]:
    """Pairs whose ``(english, german)`` is not in ``seen`` (which is updated), first kept."""
    out = []
    for pair in pairs:
        key = (pair.english, pair.german)
        if key not in seen:
            seen.add(key)
            out.append(pair)
    return out


def split_by_group(
    pairs: Sequence[Pair],
    *,
    test_fraction: float = TEST_FRACTION,
    validation_fraction: float = VALIDATION_FRACTION,
    salt: str = SALT,
) -> dict[str, list[Pair]]:
    """Assigns whole groups to test, then validation, in hash order; the rest to train.

    A group is added to a held-out split while the split stays within 120% of its
    target size (``fraction`` × pairs), so one huge group cannot swallow it.
    """
    sizes: dict[str, int] = {}
    for pair in pairs:
        sizes[pair.group] = sizes.get(pair.group, 0) + 1
    order = sorted(sizes, key=lambda group: (ding.hash_fraction(group, salt), group))
    assignment: dict[str, str] = {}
    for split, fraction in (("test", test_fraction), ("validation", validation_fraction)):
        target, filled = fraction * len(pairs), 0
        for group in order:
            if filled >= target:
                break
            if group not in assignment and filled + sizes[group] <= max(1.2 * target, 1):
                assignment[group] = split
                filled += sizes[group]
    splits: dict[str, list[Pair]] = {name: [] for name in SPLITS}
    for pair in pairs:
        splits[assignment.get(pair.group, "train")].append(pair)
    for name in ("validation", "test"):  # a fixed shuffle: evaluations take the first N
        splits[name].sort(key=lambda p: ding.hash_fraction(f"{p.english}\t{p.german}", salt))
    return splits


def held_out_keys(all_splits: Iterable[dict[str, list]], names: Sequence[str]):
    """Normalised English and German strings of the named splits of every source."""
    english, german = set(), set()
    for splits in all_splits:
        for name in names:
            for pair in splits[name]:
                english.add(normalize_key(pair[0] if isinstance(pair, tuple) else pair.english))
                german.add(normalize_key(pair[1] if isinstance(pair, tuple) else pair.german))
    return english, german


def remove_leaks(all_splits: dict[str, dict[str, list[Pair]]]) -> dict[str, dict[str, int]]:
    """Drops train pairs sharing a normalised side with any held-out pair (in place).

    Validation pairs sharing a side with any test pair are dropped too. Returns the
    removed counts per source and split.
    """
    test_en, test_de = held_out_keys(all_splits.values(), ("test",))
    held_en, held_de = held_out_keys(all_splits.values(), ("test", "validation"))
    removed = {}
    for source, splits in all_splits.items():
        removed[source] = {}
        for name, (keys_en, keys_de) in (
            ("validation", (test_en, test_de)),
            ("train", (held_en, held_de)),
        ):
            before = len(splits[name])
            splits[name] = [
                pair
                for pair in splits[name]
                if normalize_key(pair.english) not in keys_en
                and normalize_key(pair.german) not in keys_de
            ]
            removed[source][name] = before - len(splits[name])
    return removed


def check_no_leaks(all_splits: dict[str, dict[str, list[Pair]]]) -> None:
    """Raises ValueError if any train side (normalised) occurs in a held-out split."""
    held_en, held_de = held_out_keys(all_splits.values(), ("test", "validation"))
    for source, splits in all_splits.items():
        for pair in splits["train"]:
            if normalize_key(pair.english) in held_en or normalize_key(pair.german) in held_de:
                raise ValueError(f"{source} train pair leaks into a held-out split: {pair}")


# ---------------------------------------------------------------------------------------
# Files


def write_split(path: pathlib.Path, pairs: Iterable[tuple[str, str]]) -> None:
    """Writes ``english<TAB>german`` lines, xz-compressed (the bytes are reproducible)."""
    with lzma.open(path, "wt", encoding="utf-8", newline="\n", preset=9) as handle:
        for english, german in pairs:
            if "\t" in english + german or "\n" in english + german:
                raise ValueError(f"tab or newline in a cleaned pair: {english!r} / {german!r}")
            handle.write(f"{english}\t{german}\n")


def iter_split_file(path: pathlib.Path) -> Iterator[tuple[str, str]]:
    """Yields ``(english, german)`` from one ``.tsv.xz`` split file."""
    with lzma.open(path, "rt", encoding="utf-8", newline="\n") as handle:
        for number, line in enumerate(handle, start=1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 2:
                raise ValueError(f"{path}:{number}: expected 'english<TAB>german', got {line!r}")
            yield fields[0], fields[1]


def sources_of(data_dir: str | pathlib.Path) -> list[str]:
    """The sources listed in ``data_dir/counts.json`` (in build order)."""
    counts = pathlib.Path(data_dir) / "counts.json"
    if not counts.is_file():
        raise FileNotFoundError(
            f"no counts.json in {data_dir}; build the corpus with `specdec prepare --corpus debian`"
        )
    return list(json.loads(counts.read_text())["sources"])


def read_source_split(data_dir: str | pathlib.Path, source: str, split: str):
    """``(english, german)`` pairs of one source's split."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    path = pathlib.Path(data_dir) / source / f"{split}.tsv.xz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; run `specdec prepare --corpus debian`")
    return list(iter_split_file(path))


def read_split(
    data_dir: str | pathlib.Path, split: str, sources: Sequence[str] | None = None
) -> list[tuple[str, str]]:
    """One split of all (or the named) sources, interleaved round-robin by source.

    Interleaving makes the first N pairs of a held-out split a mix of every source.
    """
    known = sources_of(data_dir)
    names = list(sources) if sources else known
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"{data_dir} has no source {unknown[0]!r} (it has: {', '.join(known)})")
    per_source = [read_source_split(data_dir, name, split) for name in names]
    out = []
    for index in range(max((len(pairs) for pairs in per_source), default=0)):
        out.extend(pairs[index] for pairs in per_source if index < len(pairs))
    return out


def license_text(source: str, result: SourceResult) -> str:
    """The LICENSE.md of one source: packages, versions, copyright files, licences."""
    lines = [f"# {SOURCE_TITLES[source]}", ""]
    if source == "ding":
        lines += [
            "From Debian's `trans-de-en` package (`/usr/share/trans/de-en`), the Ding",
            "dictionary by Frank Richter, GPL-2+ (`/usr/share/doc/trans-de-en/copyright`).",
            "Prepared by `pipelines.data.ding`; see `assets/data/ding/counts.json`.",
        ]
    elif source == "ddtp":
        lines += [
            "English descriptions from bookworm `main` (`Translation-en`), German ones from",
            "the Debian Description Translation Project (`Translation-de`,",
            "https://ddtp.debian.org), read from `/var/lib/apt/lists` after",
            "`apt-get update -o Acquire::Languages=en,de`. Each description is part of its",
            "package's `debian/control` and is distributed under that package's licence",
            "(see `/usr/share/doc/<package>/copyright` of the package named in the records).",
        ]
    else:
        lines += [
            "| package | version | copyright file (in the .deb) | licences |",
            "|---|---|---|---|",
        ]
        for info in result.packages:
            licenses = ", ".join(info.licenses) or "(see the copyright file)"
            lines.append(f"| {info.name} | {info.version} | `{info.copyright_path}` | {licenses} |")
    for name, why in result.skipped.items():
        lines.append(f"\nSkipped (not fetched): {name}: {why}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# The build


def ding_result(ding_dir: pathlib.Path) -> tuple[SourceResult, dict[str, list[Pair]]]:
    """The committed Ding splits as pairs (group: the split itself; never re-split)."""
    splits = {
        name: [Pair(en, de, f"ding:{name}") for en, de in ding.iter_split(ding_dir, name)]
        for name in SPLITS
    }
    return SourceResult(pairs=[p for name in SPLITS for p in splits[name]]), splits


def build(
    output: pathlib.Path = DEFAULT_OUTPUT,
    *,
    cache: pathlib.Path = common.DEFAULT_CACHE_DIR,
    sources: Sequence[str] = SOURCE_ORDER,
    ding_dir: pathlib.Path = ding.DEFAULT_DATA_DIR,
    builders: dict[str, Callable[[pathlib.Path], SourceResult]] | None = None,
) -> dict:
    """Runs the whole build and writes the files; returns the top-level counts."""
    builders = {**SOURCE_BUILDERS, **(builders or {})}
    seen: set[tuple[str, str]] = set()
    results: dict[str, SourceResult] = {}
    all_splits: dict[str, dict[str, list[Pair]]] = {}
    stats: dict[str, dict] = {}
    for source in sources:
        print(f"prepare: {source} ...", file=sys.stderr)
        if source == "ding":
            result, ding_splits = ding_result(ding_dir)
            all_splits[source] = {n: dedupe_pairs(p, seen) for n, p in ding_splits.items()}
            stats[source] = {"raw_pairs": len(result.pairs)}
        else:
            result = builders[source](cache)
            cleaned, dropped = clean_pairs(result.pairs, accelerators=ACCELERATORS[source])
            unique = dedupe_pairs(cleaned, seen)
            all_splits[source] = split_by_group(unique)
            stats[source] = {
                "raw_pairs": len(result.pairs),
                "dropped": dropped,
                "after_cleaning": len(cleaned),
                "unique_new_pairs": len(unique),
                "groups": len({pair.group for pair in unique}),
                **result.counts,
            }
        results[source] = result
    removed = remove_leaks(all_splits)
    check_no_leaks(all_splits)
    return write_outputs(pathlib.Path(output), all_splits, results, stats, removed)


def write_outputs(output, all_splits, results, stats, removed) -> dict:
    """Writes every source's splits, counts and licence file, and the totals."""
    totals = {"sources": list(all_splits), "pairs": {}, "skipped_packages": {}}
    for source, splits in all_splits.items():
        folder = output / source
        folder.mkdir(parents=True, exist_ok=True)
        for name in SPLITS:
            write_split(folder / f"{name}.tsv.xz", ((p.english, p.german) for p in splits[name]))
        counts = {
            "source": SOURCE_TITLES[source],
            "split_pairs": {name: len(splits[name]) for name in SPLITS},
            "split_groups": {name: len({p.group for p in splits[name]}) for name in SPLITS},
            "split_english_words": {
                name: sum(len(p.english.split()) for p in splits[name]) for name in SPLITS
            },
            "removed_as_leaks": removed[source],
            "packages": {info.name: info.version for info in results[source].packages},
            "skipped_packages": results[source].skipped,
            **stats[source],
        }
        (folder / "counts.json").write_text(json.dumps(counts, indent=2, ensure_ascii=False) + "\n")
        (folder / "LICENSE.md").write_text(license_text(source, results[source]))
        totals["pairs"][source] = counts["split_pairs"]
        totals["skipped_packages"].update(results[source].skipped)
    totals["total_pairs"] = sum(sum(c.values()) for c in totals["pairs"].values())
    (output / "counts.json").write_text(json.dumps(totals, indent=2, ensure_ascii=False) + "\n")
    return totals


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="specdec prepare --corpus debian", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--output", default=str(DEFAULT_OUTPUT), help="corpus folder")
    parser.add_argument("--cache", default=str(common.DEFAULT_CACHE_DIR), help=".deb cache")
    parser.add_argument(
        "--sources", default=",".join(SOURCE_ORDER), help=f"comma list of {SOURCE_ORDER}"
    )
    args = parser.parse_args(argv)
    sources = [name.strip() for name in args.sources.split(",") if name.strip()]
    unknown = [name for name in sources if name not in SOURCE_ORDER]
    if unknown:
        parser.error(f"unknown source(s) {unknown}; expected some of {SOURCE_ORDER}")
    partial = set(sources) != set(SOURCE_ORDER)
    if partial and pathlib.Path(args.output).resolve() == DEFAULT_OUTPUT.resolve():
        parser.error(
            f"--sources {','.join(sources)} builds a corpus of those sources only (their "
            f"splits, dedupe and leakage rule see no other); it would replace the committed "
            f"corpus in {DEFAULT_OUTPUT}, which is built from all of {','.join(SOURCE_ORDER)}. "
            "Give --output for a partial corpus"
        )
    totals = build(pathlib.Path(args.output), cache=pathlib.Path(args.cache), sources=sources)
    print(json.dumps(totals, indent=2))
    return totals


if __name__ == "__main__":
    main()
