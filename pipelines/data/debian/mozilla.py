"""Firefox ESR / Thunderbird language packs: ``-l10n-de`` against ``-l10n-en-gb``.

Each package ships one language pack (``langpack-<locale>@...xpi``, a zip). Its
``.ftl`` (Fluent) and ``.properties`` files have the same relative paths in both
locales once the locale name is replaced. A pair is the value of the same message id
(``id``, or ``id.attribute`` for Fluent attributes) in the same file. Fluent messages
with a selector (``{ $n -> ...}``) are skipped: their variants are not one sentence.
Placeholders (``{ $host }``, ``{ -brand-short-name }``, ``%S``, ``%1$S``) are kept.
The group is the file (``mozilla:<product>/<path>``).
"""

from __future__ import annotations

import pathlib
import re
import zipfile

from pipelines.data.debian.common import Pair

_FTL_MESSAGE = re.compile(r"^(-?[A-Za-z][\w-]*)\s*=\s?(.*)$")
_FTL_ATTRIBUTE = re.compile(r"^\s+\.([A-Za-z][\w-]*)\s*=\s?(.*)$")
_UNICODE_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")


def parse_ftl(text: str) -> dict[str, str]:
    """Message id (``id`` / ``id.attr``) -> value of one Fluent file (selectors skipped)."""
    messages: dict[str, list[str]] = {}
    current = None
    message_id = None
    for line in text.splitlines():
        if not line.strip():  # a blank line inside a multi-line value does not end it
            continue
        if line.startswith("#"):
            current = None
            continue
        if match := _FTL_MESSAGE.match(line):
            message_id = match.group(1)
            current = message_id
            messages[current] = [match.group(2)]
        elif (match := _FTL_ATTRIBUTE.match(line)) and message_id:
            current = f"{message_id}.{match.group(1)}"
            messages[current] = [match.group(2)]
        elif line[:1].isspace() and current:
            messages[current].append(line.strip())
    out = {}
    for key, parts in messages.items():
        value = " ".join(part for part in parts if part).strip()
        if value and "->" not in value and not key.startswith("-"):
            out[key] = value
    return out


def parse_properties(text: str) -> dict[str, str]:
    """Key -> value of one Java-style ``.properties`` file (``\\uXXXX`` decoded)."""
    out = {}
    logical: list[str] = []
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical.append(line[:-1])
            continue
        logical.append(line)
        entry, logical = "".join(logical), []
        key, separator, value = entry.partition("=")
        if not separator:
            continue
        value = _UNICODE_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), value.strip())
        out[key.strip()] = value.replace("\\n", " ").replace("\\t", " ")
    return out


def _langpack(root: pathlib.Path) -> pathlib.Path:
    found = sorted(root.rglob("langpack-*.xpi"))
    if not found:
        raise FileNotFoundError(f"no langpack-*.xpi under {root}")
    return found[0]


def _members(xpi: pathlib.Path, locale: str) -> dict[str, bytes]:
    """Relative path (locale name replaced by ``LOCALE``) -> bytes of .ftl/.properties."""
    out = {}
    with zipfile.ZipFile(xpi) as archive:
        for name in archive.namelist():
            if name.endswith((".ftl", ".properties")):
                out[name.replace(locale, "LOCALE")] = archive.read(name)
    return out


_KEY_SUFFIXES = (".accesskey", ".commandkey", ".key", ".keycode", ".width", ".style")


def align_files(english: str, german: str, *, kind: str, group: str) -> list[Pair]:
    """Pairs of the message ids both files have, in the English file's order.

    Access keys, shortcut keys and CSS sizes (``*.accesskey``, ``*.key``, ``*.style``,
    ...) are not text and are skipped.
    """
    parse = parse_ftl if kind == "ftl" else parse_properties
    german_messages = parse(german)
    return [
        Pair(value, german_messages[key], group)
        for key, value in parse(english).items()
        if key in german_messages and not key.lower().endswith(_KEY_SUFFIXES)
    ]


def extract(product: str, english_root: pathlib.Path, german_root: pathlib.Path) -> list[Pair]:
    """All pairs of one product's en-GB and de language packs."""
    english = _members(_langpack(english_root), "en-GB")
    german = _members(_langpack(german_root), "de")
    pairs = []
    for path in sorted(english):
        if path in german:
            pairs.extend(
                align_files(
                    english[path].decode("utf-8", errors="replace"),
                    german[path].decode("utf-8", errors="replace"),
                    kind="ftl" if path.endswith(".ftl") else "properties",
                    group=f"mozilla:{product}/{path}",
                )
            )
    return pairs
