"""Manual pages: ``manpages-de`` (po4a translations) against the English pages they translate.

``manpages-de`` and ``manpages-de-dev`` ship German pages under ``usr/share/man/de/``.
Their English originals come from the packages that own them (the Linux man-pages
project's ``manpages`` / ``manpages-dev``, coreutils, util-linux, ...: ``ENGLISH_PACKAGES``),
at ``usr/share/man/`` under the same section and name.

po4a keeps a page's block structure: every paragraph macro of the English page is
there in the German one, in the same order. A page is read as a sequence of *blocks*,
each started by a block macro (``.SH``, ``.SS``, ``.PP``, ``.TP``, ``.IP``, ...; the
first line after ``.TP``, the term, is a block of its own), and the two pages are
paired block by block where their sequences of block macros are identical (whole page,
or section by section when only some sections match, as ``docs`` does for HTML).

Text is rendered from roff: font macros (``.B``, ``.BR``, ``.IR``, ...) and escapes
(``\\fB``, ``\\-``, ``\\(em``, ...) become plain text, comments are dropped, and text
in no-fill mode (``.nf`` ... ``.fi``, ``.EX`` ... ``.EE``: synopses, listings) and
tables (``.TS`` ... ``.TE``) keeps the sequence aligned but is never a unit. Macro
definitions and ignored blocks (``.de``, ``.am``, ``.ig`` up to ``..``) are skipped. A page that
is a link (a symlink or a ``.so`` line) is skipped. The group is the page
(``man:man2/chdir.2``).
"""

from __future__ import annotations

import gzip
import pathlib
import re
import shlex

from pipelines.data.debian import docs
from pipelines.data.debian.common import Pair

GERMAN_PACKAGES = ("manpages-de", "manpages-de-dev")
ENGLISH_PACKAGES = (
    "manpages",
    "manpages-dev",
    "coreutils",
    "util-linux",
    "procps",
    "findutils",
    "grep",
    "sed",
    "tar",
    "diffutils",
    "gzip",
    "dpkg",
    "apt",
    "man-db",
    "passwd",
    "login",
    "psmisc",
    "e2fsprogs",
    "debianutils",
)
MAN_DIR = "usr/share/man"

BLOCK_MACROS = {"SH", "SS", "PP", "LP", "P", "TP", "TQ", "IP", "HP", "RS", "RE", "TH", "sp"}
BLOCK_MACROS |= {"nf", "fi", "EX", "EE", "TS", "TE", "in", "ti", "UR", "UE", "MT", "ME"}
NO_FILL_START = {"nf": "fi", "EX": "EE", "TS": "TE"}  # text in these is never a unit
FONT_JOINED = {"BR", "RB", "BI", "IB", "IR", "RI"}  # alternating fonts: args joined
FONT_SPACED = {"B", "I", "SM", "SB"}  # one font: args joined by spaces
_ESCAPES = {
    "-": "-",
    "e": "\\",
    "&": "",
    "~": " ",
    " ": " ",
    ":": "",
    "%": "",
    "|": "",
    "^": "",
    "0": " ",
    "c": "",
}
_NAMED = {
    "em": "—",
    "en": "–",
    "aq": "'",
    "dq": '"',
    "lq": "“",
    "rq": "”",
    "oq": "‘",
    "cq": "’",
    "Fo": "«",
    "Fc": "»",
    "fo": "‹",
    "fc": "›",
    "bu": "•",
    "co": "©",
    "rg": "®",
    "mu": "×",
    "de": "°",
    "hy": "-",
    "ti": "~",
    "ha": "^",
    "bv": "|",
    "ga": "`",
    "sq": "'",
    ">=": "≥",
    "<=": "≤",
    "->": "→",
    "<-": "←",
    "rs": "\\",
    "at": "@",
    "sh": "#",
    "Do": "$",
    "lB": "[",
    "rB": "]",
    "lC": "{",
    "rC": "}",
    "a~": "ã",
}
_ESCAPE = re.compile(
    r"\\(?:f(?:\[[^\]]*\]|\(..|.)"  # font changes
    r"|\((..)"  # \(xx named glyph
    r"|\[([^\]]*)\]"  # \[name]
    r"|\*(?:\((..)|\[([^\]]*)\]|(.))"  # \*x strings
    r"|[sS][+-]?\d"  # size
    r"|(.))"
)


HEADINGS = {"SH", "SS"}
CREDITS_HEADING = "ÜBERSETZUNG"
_DEFINITION = re.compile(r"[.'][ \t]*(de|de1|am|ig)\b")  # a macro body or ignored block
_END_OF_DEFINITION = re.compile(r"[.'][ \t]*\.[ \t]*$")  # "..", or ".  ." when indented


def render(text: str) -> str:
    """Plain text of a line of roff text (escapes resolved, font changes dropped)."""

    def replace(match: re.Match) -> str:
        named = match.group(1) or match.group(2)
        if named is not None:
            return _NAMED.get(named, "")
        string = match.group(3) or match.group(4) or match.group(5)
        if string is not None:
            return {"lq": "“", "rq": "”", "R": "®", "Tm": "™"}.get(string, "")
        single = match.group(6)
        if single is not None:
            return _ESCAPES.get(single, single)
        return ""  # a font or size change

    return _ESCAPE.sub(replace, text)


def _arguments(rest: str) -> list[str]:
    try:
        return shlex.split(rest.replace("\\", "\\\\"), posix=True)
    except ValueError:  # an unbalanced quote: plain words
        return rest.split()


def _macro_text(name: str, rest: str) -> str | None:
    """The text a font macro line renders to (None for other macros)."""
    if name in FONT_JOINED:
        return "".join(_arguments(rest))
    if name in FONT_SPACED:
        return " ".join(_arguments(rest))
    return None


def blocks(page: str) -> list[tuple[str, str]]:
    """``(macro, text)`` of every non-empty block of one roff page, in order.

    A block in no-fill mode has its macro prefixed ``nf:`` (kept, never a unit). The
    term line after ``.TP`` is a block of its own (``TP-term``).
    """
    out: list[tuple[str, str]] = []
    current, parts, no_fill_end, term_next = "top", [], None, False

    def flush():
        text = " ".join(p for p in parts if p.strip())
        if text.strip():
            out.append((current if no_fill_end is None else f"nf:{current}", text))
        parts.clear()

    definition = False  # inside .de / .am / .ig, up to "..": macro bodies, not text
    for line in page.splitlines():
        if definition:
            definition = not _END_OF_DEFINITION.match(line)
            continue
        if line.startswith(('.\\"', "'\\\"", '\\"')) or line.strip() in {".", "'"}:
            continue
        if _DEFINITION.match(line):
            definition = True
            continue
        if line[:1] in {".", "'"}:
            name, _, rest = line[1:].strip().partition(" ")
            text = _macro_text(name, rest)
            if text is None:
                if name in NO_FILL_START and no_fill_end is None:
                    flush()
                    current, no_fill_end = name, NO_FILL_START[name]
                    continue
                if no_fill_end is not None and name == no_fill_end:
                    flush()
                    current, no_fill_end = name, None
                    continue
                if name in BLOCK_MACROS:
                    flush()
                    current = name
                    term_next = name in {"TP", "TQ"}
                    if name in HEADINGS and rest.strip():  # the heading on the macro line
                        parts.append(render(" ".join(_arguments(rest))))
                        flush()
                        current = f"{name}-body"
                continue  # other requests (.ad, .hy, .ne, ...) carry no text
            line = text
        if term_next:
            flush()
            current, term_next = "TP-term", False
            parts.append(render(line))
            flush()
            current = "TP-body"
            continue
        parts.append(render(line))
    flush()
    return out


def is_unit(macro: str) -> bool:
    """Whether a block is a translation unit (not no-fill text, not the page header)."""
    return not macro.startswith("nf:") and macro not in {"TH", "top"}


def without_credits(german: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The German page less the translators' section that manpages-de appends
    (``.SH ÜBERSETZUNG``: who translated it, where to report errors)."""
    for index, (macro, text) in enumerate(german):
        if macro == "SH" and text.strip() == CREDITS_HEADING:
            return german[:index]
    return german


def _is_so_page(text: str) -> bool:
    """A page that only includes another (``.so man3/getcwd.3``)."""
    head = text[:200].lstrip()
    return head.startswith(".so ") and len(head.splitlines()) <= 2


def read_page(path: pathlib.Path) -> str:
    """A page's text (gzipped or not)."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", errors="replace")


def align_pages(english: str, german: str, group: str) -> tuple[list[Pair], dict]:
    """Pairs of two roff pages and counts (``unaligned_blocks``, ``implausible``)."""
    german_blocks = without_credits(blocks(german))
    return docs.paired_blocks(
        blocks(english), german_blocks, group, headings=HEADINGS, is_unit=is_unit
    )


def extract(german_roots: list[pathlib.Path], english_roots: list[pathlib.Path]):
    """``(pairs, counts)`` of every German page whose English original is found."""
    english_pages: dict[str, pathlib.Path] = {}
    for root in english_roots:
        for path in sorted((root / MAN_DIR).glob("man*/*")):
            english_pages.setdefault(path.relative_to(root / MAN_DIR).as_posix(), path)
    pairs: list[Pair] = []
    counts = {"pages": 0, "no_english": 0, "links": 0, "unaligned_blocks": 0, "implausible": 0}
    for root in german_roots:
        for path in sorted((root / MAN_DIR / "de").glob("man*/*")):
            relative = path.relative_to(root / MAN_DIR / "de").as_posix()
            english = english_pages.get(relative)
            if english is None:
                counts["no_english"] += 1
                continue
            if path.is_symlink() or english.is_symlink():
                counts["links"] += 1
                continue
            english_text, german_text = read_page(english), read_page(path)
            if _is_so_page(german_text) or _is_so_page(english_text):
                counts["links"] += 1
                continue
            group = "man:" + re.sub(r"\.gz$", "", relative)
            found, page_counts = align_pages(english_text, german_text, group)
            pairs.extend(found)
            counts["pages"] += 1
            for key, value in page_counts.items():
                counts[key] += value
    return pairs, counts
