"""LibreOffice help: ``libreoffice-help-en-us`` against ``libreoffice-help-de``.

Both packages ship the same HTML files under ``usr/share/libreoffice/help/<lang>/``;
every paragraph and heading carries a stable ``id`` (``par_id3146957``,
``hd_id3147291``). A pair is the text of the same ``id`` in the same file. The group is
the file (``lohelp:text/shared/optionen/01020000.html``).
"""

from __future__ import annotations

import html.parser
import pathlib
import re

from pipelines.data.debian.common import Pair

HELP_DIR = "usr/share/libreoffice/help"
_UNIT_ID = re.compile(r"^(?:par|hd)_id")
_SKIPPED_TAGS = {"script", "style"}


class _UnitParser(html.parser.HTMLParser):
    """Collects the text of every element whose ``id`` is a paragraph/heading id."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.units: dict[str, str] = {}
        self._open: list[tuple[str, str, int]] = []  # (id, tag, depth at start)
        self._depth = 0
        self._texts: dict[str, list[str]] = {}
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._depth += 1
        if tag in _SKIPPED_TAGS:
            self._skip += 1
        unit_id = dict(attrs).get("id") or ""
        if _UNIT_ID.match(unit_id) and unit_id not in self._texts:
            self._open.append((unit_id, tag, self._depth))
            self._texts[unit_id] = []
        elif tag == "br":
            self.handle_data(" ")

    def handle_endtag(self, tag):
        if tag in _SKIPPED_TAGS and self._skip:
            self._skip -= 1
        while self._open and self._open[-1][2] >= self._depth:
            unit_id, _, _ = self._open.pop()
            self.units[unit_id] = "".join(self._texts[unit_id])
        self._depth -= 1

    def handle_startendtag(self, tag, attrs):
        if tag == "br":
            self.handle_data(" ")

    def handle_data(self, data):
        if not self._skip:
            for unit_id, _, _ in self._open[-1:]:  # innermost unit only
                self._texts[unit_id].append(data)


_VOID = re.compile(r"<(br|img|input|meta|link|hr)(\s[^<>]*)?>", re.IGNORECASE)


def paragraphs(document: str) -> dict[str, str]:
    """``id`` -> text of each ``par_id``/``hd_id`` element of one help page."""
    parser = _UnitParser()
    parser.feed(_VOID.sub(lambda m: f"<{m.group(1)}/>", document))  # keep depths balanced
    parser.close()
    return parser.units


def align_documents(english: str, german: str, group: str) -> list[Pair]:
    """Pairs of the ids both pages have, in the English page's order."""
    german_units = paragraphs(german)
    return [
        Pair(text, german_units[unit_id], group)
        for unit_id, text in paragraphs(english).items()
        if unit_id in german_units
    ]


def extract(english_root: pathlib.Path, german_root: pathlib.Path) -> list[Pair]:
    """All pairs of the help files present in both unpacked packages."""
    english_dir, german_dir = english_root / HELP_DIR / "en-US", german_root / HELP_DIR / "de"
    pairs = []
    for path in sorted(english_dir.rglob("*.html")):
        relative = path.relative_to(english_dir).as_posix()
        other = german_dir / relative
        if other.is_file():
            pairs.extend(
                align_documents(
                    path.read_text(errors="replace"),
                    other.read_text(errors="replace"),
                    f"lohelp:{relative}",
                )
            )
    return pairs
