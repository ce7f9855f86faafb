"""Debian documentation: the English and German HTML of the same manual, block by block.

The German manuals are translations of the same DocBook / Sphinx sources (po4a or
Sphinx gettext), so a translated page has the English page's block structure: the same
sequence of paragraphs, headings, list items, table cells and terms. A page is read as
that sequence of *blocks* (``p``, ``h1``-``h6``, ``li``, ``dt``, ``dd``, ``td``, ``th``,
``pre``, ``title``; text outside any block is not a unit). The two pages of a chapter
are paired block by block where their sequences of block tags are identical:

- the whole page when the sequences match;
- otherwise section by section (a section starts at each heading), for the sections
  whose tag sequences match, when both pages have the same number of sections;
- otherwise not at all (a page whose structure differs is skipped and counted).

``pre`` blocks (commands, listings) keep the sequence aligned but are not units; page
navigation (``class="docnav"``, ``navheader``, ``navfooter``) is left out. A pair
whose two sides differ in length by more than ``MAX_LENGTH_RATIO`` is taken as a
misalignment and dropped. The group is the chapter (``docs:debian-reference/ch01``).

The manuals, their packages and file layouts are in ``MANUALS``.
"""

from __future__ import annotations

import dataclasses
import html.parser
import pathlib
import re
from collections.abc import Callable

from pipelines.data.debian.common import Pair

BLOCK_TAGS = {"p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "dt", "dd", "td", "th", "pre"}
BLOCK_TAGS |= {"title", "desc", "screen"}  # Mallard (GNOME help) adds desc and screen
HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
NOT_UNITS = {"pre", "screen"}  # kept in the sequence (alignment) but never paired
# DocBook / Publican page navigation ("Prev", "Next", the neighbours' titles): not text
NAVIGATION_CLASSES = {"docnav", "navheader", "navfooter"}
_SKIPPED_TAGS = {"script", "style", "comment"}  # Mallard editor comments: never translated
MAX_LENGTH_RATIO = 3.0


@dataclasses.dataclass(frozen=True)
class Manual:
    """One manual: its English and German packages and where each keeps a chapter."""

    name: str
    english_package: str
    german_package: str
    english_dir: str  # inside the unpacked English package
    german_dir: str
    pattern: str  # glob of the English chapter files
    german_name: Callable[[str], str]  # English file name -> German file name
    skip: tuple[str, ...] = ()  # English file names that are not chapters


def _swap_suffix(name: str) -> str:
    return re.sub(r"\.en\.html$", ".de.html", name)


def _same_name(name: str) -> str:
    return name


MANUALS = (
    Manual(
        "debian-reference",
        "debian-reference-en",
        "debian-reference-de",
        "usr/share/debian-reference",
        "usr/share/debian-reference",
        "*.en.html",
        _swap_suffix,
    ),
    Manual(
        "developers-reference",
        "developers-reference",
        "developers-reference-de",
        "usr/share/developers-reference",
        "usr/share/developers-reference/de",
        "*.html",
        _same_name,
        # the one-page edition repeats every chapter; search.html is a form
        skip=("developers-reference.html", "search.html"),
    ),
    Manual(
        "maint-guide",
        "maint-guide",
        "maint-guide-de",
        "usr/share/doc/maint-guide/html",
        "usr/share/doc/maint-guide-de/html",
        "*.en.html",
        _swap_suffix,
    ),
    Manual(
        "debian-faq",
        "debian-faq",
        "debian-faq-de",
        "usr/share/doc/debian/FAQ",
        "usr/share/doc/debian/FAQ/de",
        "*.en.html",
        _swap_suffix,
    ),
    Manual(
        "debian-handbook",
        "debian-handbook",
        "debian-handbook",  # one package holds every language
        "usr/share/doc/debian-handbook/html/en-US",
        "usr/share/doc/debian-handbook/html/de-DE",
        "*.html",
        _same_name,
    ),
    Manual(
        "installation-guide",
        "installation-guide-amd64",
        "installation-guide-amd64",
        "usr/share/doc/installation-guide-amd64/en",
        "usr/share/doc/installation-guide-amd64/de",
        "*.html",
        _same_name,
    ),
    Manual(
        "gnome-help",
        "gnome-user-docs",
        "gnome-user-docs",
        "usr/share/help/C/gnome-help",  # Mallard pages, translated by itstool
        "usr/share/help/de/gnome-help",
        "*.page",
        _same_name,
    ),
    Manual(
        "gnome-system-admin-guide",
        "gnome-user-docs",
        "gnome-user-docs",
        "usr/share/help/C/system-admin-guide",
        "usr/share/help/de/system-admin-guide",
        "*.page",
        _same_name,
    ),
)
PACKAGES = tuple(
    dict.fromkeys(name for m in MANUALS for name in (m.english_package, m.german_package))
)


class _BlockParser(html.parser.HTMLParser):
    """The page as ``[(tag, text)]``: the text of each block, innermost block first.

    Text belongs to the innermost open block; a nested block (a ``p`` in an ``li``)
    closes the text gathered so far and starts its own, so every character of the page
    lands in exactly one block and the sequence is the document order.
    """

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[str, str]] = []
        self._open: list[tuple[str, list[str]]] = []
        self._skip = 0
        self._navigation: list = []  # [tag, how many of it are open] inside a nav element

    def _flush(self):
        if self._open and "".join(self._open[-1][1]).strip():
            tag, parts = self._open[-1]
            self.blocks.append((tag, "".join(parts)))
        if self._open:
            self._open[-1] = (self._open[-1][0], [])

    def handle_starttag(self, tag, attrs):
        if self._navigation:
            self._navigation[1] += tag == self._navigation[0]
        elif NAVIGATION_CLASSES & set((dict(attrs).get("class") or "").split()):
            self._navigation = [tag, 1]
        elif tag in _SKIPPED_TAGS:
            self._skip += 1
        elif tag in BLOCK_TAGS:
            self._flush()
            self._open.append((tag, []))
        elif tag == "br":
            self.handle_data(" ")

    def handle_startendtag(self, tag, attrs):
        if tag == "br":
            self.handle_data(" ")

    def handle_endtag(self, tag):
        if self._navigation:
            self._navigation[1] -= tag == self._navigation[0]
            if not self._navigation[1]:
                self._navigation = []
        elif tag in _SKIPPED_TAGS:
            self._skip = max(0, self._skip - 1)
        elif tag in BLOCK_TAGS and any(open_tag == tag for open_tag, _ in self._open):
            while self._open:  # closes the block and any left open inside it
                self._flush()
                open_tag, _ = self._open.pop()
                if open_tag == tag:
                    break

    def handle_data(self, data):
        if not self._skip and not self._navigation and self._open:
            self._open[-1][1].append(data)

    def close(self):
        super().close()
        while self._open:
            self._flush()
            self._open.pop()


def blocks(document: str) -> list[tuple[str, str]]:
    """``(tag, text)`` of every non-empty block of one HTML page, in document order."""
    parser = _BlockParser()
    parser.feed(document)
    parser.close()
    return parser.blocks


def _sections(page: list[tuple[str, str]], headings: set[str]) -> list[list[tuple[str, str]]]:
    """The page cut before every heading."""
    sections: list[list[tuple[str, str]]] = [[]]
    for block in page:
        if block[0] in headings and sections[-1]:
            sections.append([])
        sections[-1].append(block)
    return sections


def _tags(page) -> list[str]:
    return [tag for tag, _ in page]


def _html_unit(tag: str) -> bool:
    return tag not in NOT_UNITS


def aligned_blocks(
    english: list, german: list, *, headings: set[str] = HEADINGS, is_unit=_html_unit
) -> tuple[list[tuple[str, str]], int]:
    """``([(english text, german text)], English units left unpaired)`` of two pages.

    ``headings`` start sections (the fallback when the whole sequences differ);
    ``is_unit(tag)`` says which blocks are translation units.
    """
    if _tags(english) == _tags(german):
        matched = [(english, german)]
    else:
        en_sections, de_sections = _sections(english, headings), _sections(german, headings)
        if len(en_sections) != len(de_sections):
            return [], sum(is_unit(tag) for tag, _ in english)
        matched = [
            (en, de)
            for en, de in zip(en_sections, de_sections, strict=True)
            if _tags(en) == _tags(de)
        ]
    pairs = [
        (en_text, de_text)
        for en, de in matched
        for (tag, en_text), (_, de_text) in zip(en, de, strict=True)
        if is_unit(tag)
    ]
    return pairs, sum(is_unit(tag) for tag, _ in english) - len(pairs)


def plausible(english: str, german: str) -> bool:
    """False when the two sides' lengths differ too much to be one unit translated."""
    short, long = sorted((len(english.strip()) or 1, len(german.strip()) or 1))
    return long / short <= MAX_LENGTH_RATIO or long < 20


def paired_blocks(english: list, german: list, group: str, **rules) -> tuple[list[Pair], dict]:
    """The plausible pairs of two pages' blocks (``aligned_blocks(**rules)``) and counts
    (``unaligned_blocks``, ``implausible``); the manual pages' aligner shares it."""
    pairs, unaligned = aligned_blocks(english, german, **rules)
    kept = [Pair(en, de, group) for en, de in pairs if plausible(en, de)]
    return kept, {"unaligned_blocks": unaligned, "implausible": len(pairs) - len(kept)}


def align_documents(english: str, german: str, group: str) -> tuple[list[Pair], dict]:
    """Pairs of two HTML pages and counts (``unaligned_blocks``, ``implausible``)."""
    return paired_blocks(blocks(english), blocks(german), group)


def extract(manual: Manual, english_root: pathlib.Path, german_root: pathlib.Path):
    """``(pairs, counts)`` of every chapter of ``manual`` present in both packages."""
    english_dir, german_dir = english_root / manual.english_dir, german_root / manual.german_dir
    pairs: list[Pair] = []
    counts = {"chapters": 0, "missing_german": 0, "unaligned_blocks": 0, "implausible": 0}
    for path in sorted(english_dir.glob(manual.pattern)):
        if path.name in manual.skip:
            continue
        other = german_dir / manual.german_name(path.name)
        if not other.is_file():
            counts["missing_german"] += 1
            continue
        chapter = re.sub(r"(\.en)?\.(html|page)$", "", path.name)
        found, page_counts = align_documents(
            path.read_text(errors="replace"),
            other.read_text(errors="replace"),
            f"docs:{manual.name}/{chapter}",
        )
        pairs.extend(found)
        counts["chapters"] += 1
        for key, value in page_counts.items():
            counts[key] += value
    return pairs, counts
