"""Shared pieces of the Debian corpus: pairs, cleaning, package fetching and unpacking.

Cleaning (``clean_text``) turns one UI string or paragraph into plain text:

- *markup*: HTML/XML tags are removed (``<b>``, ``<span ...>``; ``<br>`` becomes a
  space) and entities unescaped (``&amp;`` → ``&``);
- *accelerator marks*: the one ``~`` (LibreOffice), ``_`` (GTK) or ``&`` (Qt) before a
  letter that marks a keyboard shortcut is dropped (``~Open`` → ``Open``,
  ``Save _As`` → ``Save As``); identifiers such as ``file_name`` are left alone;
- *placeholders* (``%s``, ``%1$s``, ``{0}``, ``{ $host }``, ``$VAR``) are kept intact;
- whitespace (tabs, newlines) collapses to single spaces.
"""

from __future__ import annotations

import dataclasses
import html
import pathlib
import re
import shutil
import subprocess

from pipelines.data import ding

REPO_ROOT = pathlib.Path(__file__).resolve().parents[3]
DEFAULT_CACHE_DIR = REPO_ROOT / "runs" / "debian_cache"  # .deb files and unpacked trees
MAX_CHARS = 1500  # a side longer than this is dropped (not a translation unit)

_TAG = re.compile(r"</?([A-Za-z][A-Za-z0-9:_-]*)(?:\s[^<>]*)?/?>")
_BREAKING_TAGS = {"br", "p", "li", "div", "tr", "td", "th", "ul", "ol", "h1", "h2", "h3"}
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_TILDE_MARK = re.compile(r"~(?=\w)")
_AMP_MARK = re.compile(r"&(?=[^\W\d_])(?![A-Za-z]+;|#\d+;)")
_UNDERSCORE_MARK = re.compile(r"(?:(?<=^)|(?<=[\s(]))_(?=[^\W_])|(?<=[^\W\d_])_(?=[^\W\d_])")
_KEY_LIKE = re.compile(r"^[a-z0-9]+(?:[_:.\-][a-z0-9]+)+$")
normalize_key = ding.normalize_key  # case-, punctuation- and spacing-insensitive


@dataclasses.dataclass(frozen=True)
class Pair:
    """One aligned translation unit and the group the split keeps together."""

    english: str
    german: str
    group: str  # e.g. "ddtp:<md5>", "gettext:gimp-data/gimp20.mo"


def strip_markup(text: str) -> str:
    """Removes tags (block tags become a space) and unescapes HTML entities."""

    def replace(match: re.Match) -> str:
        return " " if match.group(1).lower() in _BREAKING_TAGS else ""

    return html.unescape(_TAG.sub(replace, text))


def strip_accelerators(text: str) -> str:
    """Drops one keyboard-accelerator mark (``~``, ``&`` or ``_`` before a letter).

    A mark is only taken as an accelerator when it occurs once in the string, so
    ``a_b_c`` identifiers and ``AT&T``-like text with several marks stay as they are;
    an underscore between two lower-case letters in a string without spaces
    (``file_name``) is an identifier, not a mark.
    """
    if text.count("~") == 1:
        text = _TILDE_MARK.sub("", text)
    if text.count("&") == 1:
        text = _AMP_MARK.sub("", text)
    if text.count("_") == 1:
        match = _UNDERSCORE_MARK.search(text)
        identifier = " " not in text.strip() and re.search(r"[a-z]_[a-z]", text)
        if match and not identifier:
            text = text[: match.start()] + text[match.end() :]
    return text


def clean_text(text: str, *, markup: bool = True, accelerators: bool = True) -> str:
    """One side of a pair as plain single-line text (see the module docstring)."""
    if markup:
        text = strip_markup(text)
    if accelerators:
        text = strip_accelerators(text)
    return ding.collapse_whitespace(_CONTROL.sub(" ", text))


def reject_reason(english: str, german: str) -> str:
    """Why a cleaned pair is dropped ('' when it is kept)."""
    if not english or not german:
        return "empty"
    if not any(c.isalpha() for c in english) or not any(c.isalpha() for c in german):
        return "no_letters"
    if len(english) > MAX_CHARS or len(german) > MAX_CHARS:
        return "too_long"
    if _KEY_LIKE.match(english):
        return "key_like"  # "translator-credits", "calendar:week_start:0"
    if normalize_key(english) == normalize_key(german):
        return "same_text"  # untranslated (language packs fill gaps with English)
    return ""


# ---------------------------------------------------------------------------------------
# Packages


class PackageUnavailable(RuntimeError):
    """``apt-get download`` could not fetch a package (the build records it as skipped)."""


def fetch_package(name: str, cache_dir: pathlib.Path = DEFAULT_CACHE_DIR) -> pathlib.Path:
    """The ``.deb`` of ``name`` in ``cache_dir/debs`` (``apt-get download`` when absent).

    Raises PackageUnavailable naming the package and apt's message when it fails.
    """
    debs = pathlib.Path(cache_dir) / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{name}_*.deb"))
    if found:
        return found[-1]
    if shutil.which("apt-get") is None:
        raise PackageUnavailable(f"{name}: apt-get is not available on this machine")
    result = subprocess.run(
        ["apt-get", "download", name], cwd=debs, capture_output=True, text=True, check=False
    )
    found = sorted(debs.glob(f"{name}_*.deb"))
    if result.returncode != 0 or not found:
        message = (result.stderr or result.stdout).strip().splitlines()
        raise PackageUnavailable(f"{name}: apt-get download failed: {' '.join(message[-2:])}")
    return found[-1]


def package_version(deb: pathlib.Path) -> str:
    """The ``Version`` field of a ``.deb`` (``dpkg-deb -f``)."""
    result = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def unpack_package(deb: pathlib.Path, cache_dir: pathlib.Path = DEFAULT_CACHE_DIR) -> pathlib.Path:
    """Unpacks ``deb`` with ``dpkg-deb -x`` (no install) into ``cache_dir/unpacked/<stem>``."""
    target = pathlib.Path(cache_dir) / "unpacked" / deb.stem
    marker = target / ".unpacked"
    if not marker.is_file():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
        marker.touch()
    return target


@dataclasses.dataclass(frozen=True)
class PackageInfo:
    """A fetched and unpacked package and its licence summary (for LICENSE.md)."""

    name: str
    version: str
    root: pathlib.Path  # the unpacked tree
    copyright_path: str  # inside the package
    licenses: tuple[str, ...]  # distinct ``License:`` short names of the copyright file


def copyright_licenses(text: str) -> tuple[str, ...]:
    """Distinct ``License:`` short names of a machine-readable copyright file, in order."""
    found = re.findall(r"^License:[ \t]*(\S.*)$", text, flags=re.MULTILINE)
    return tuple(dict.fromkeys(name.strip() for name in found))


def open_package(name: str, cache_dir: pathlib.Path = DEFAULT_CACHE_DIR) -> PackageInfo:
    """Fetches (if needed), unpacks and describes one package; raises PackageUnavailable."""
    deb = fetch_package(name, cache_dir)
    root = unpack_package(deb, cache_dir)
    doc = root / "usr" / "share" / "doc" / name
    copyright_file = doc / "copyright"
    text = copyright_file.read_text(errors="replace") if copyright_file.is_file() else ""
    if text:
        where = f"/usr/share/doc/{name}/copyright"
    elif doc.is_symlink():  # e.g. gcc-12-locales -> gcc-12-base: the licence is there
        where = f"/usr/share/doc/{name} -> {doc.readlink()} (copyright file of that package)"
    else:
        where = "(no copyright file in the package)"
    return PackageInfo(
        name=name,
        version=package_version(deb),
        root=root,
        copyright_path=where,
        licenses=copyright_licenses(text),
    )
