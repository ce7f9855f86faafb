"""gettext catalogs: the German ``.mo`` files of named packages, ``msgid`` → ``msgstr``.

A ``.mo`` file is read with a small parser of its own (the GNU format: magic, revision,
count, two offset tables; no code from the file is ever executed). Context prefixes
(``msgctxt`` + ``\\x04``) are dropped; a plural entry gives two pairs (singular →
``msgstr[0]``, plural → ``msgstr[1]``), German having two forms. The header entry
(empty ``msgid``) and untranslated entries (empty ``msgstr``) are skipped. The group of
every pair is its file (``gettext:<package>/<path>``).
"""

from __future__ import annotations

import pathlib
import struct

from pipelines.data.debian.common import Pair

MAGIC_LE, MAGIC_BE = 0x950412DE, 0xDE120495
LOCALE_GLOBS = ("**/de/LC_MESSAGES/*.mo",)  # /usr/share/locale/de, LibreOffice's resource/de


def parse_mo(data: bytes, *, name: str = "<mo>") -> list[tuple[str, str]]:
    """``(msgid, msgstr)`` entries of one ``.mo`` file, in file order.

    Plural entries keep their ``\\x00``-separated forms, context its ``\\x04`` prefix.
    Raises ValueError naming ``name`` when the data is not a ``.mo`` file.
    """
    if len(data) < 28:
        raise ValueError(f"{name}: too short for a .mo file ({len(data)} bytes)")
    (magic,) = struct.unpack("<I", data[:4])
    if magic == MAGIC_LE:
        order = "<"
    elif magic == MAGIC_BE:
        order = ">"
    else:
        raise ValueError(f"{name}: not a .mo file (magic {data[:4].hex()})")
    _, count, ids_at, strs_at = struct.unpack(order + "4I", data[4:20])
    entries = []
    for index in range(count):
        id_len, id_at = struct.unpack(
            order + "2I", data[ids_at + 8 * index : ids_at + 8 * index + 8]
        )
        str_len, str_at = struct.unpack(
            order + "2I", data[strs_at + 8 * index : strs_at + 8 * index + 8]
        )
        if id_at + id_len > len(data) or str_at + str_len > len(data):
            raise ValueError(f"{name}: entry {index} points past the end of the file")
        msgid = data[id_at : id_at + id_len].decode("utf-8", errors="replace")
        msgstr = data[str_at : str_at + str_len].decode("utf-8", errors="replace")
        entries.append((msgid, msgstr))
    return entries


def entry_pairs(msgid: str, msgstr: str) -> list[tuple[str, str]]:
    """The translation pairs of one entry (context dropped, plurals split)."""
    if "\x04" in msgid:
        msgid = msgid.split("\x04", 1)[1]
    if not msgid or not msgstr:
        return []
    ids, strs = msgid.split("\x00"), msgstr.split("\x00")
    if len(ids) == 1:
        return [(ids[0], strs[0])]
    return [(english, german) for english, german in zip(ids[:2], strs[:2], strict=False) if german]


def mo_files(root: pathlib.Path) -> list[pathlib.Path]:
    """German ``.mo`` files under an unpacked package tree, sorted."""
    found = {path for pattern in LOCALE_GLOBS for path in root.glob(pattern)}
    return sorted(path for path in found if path.is_file())


def extract(package: str, root: pathlib.Path) -> list[Pair]:
    """All pairs of the German catalogs of one unpacked package."""
    pairs = []
    for path in mo_files(root):
        relative = path.relative_to(root).as_posix()
        group = f"gettext:{package}/{relative}"
        for msgid, msgstr in parse_mo(path.read_bytes(), name=relative):
            pairs.extend(Pair(en, de, group) for en, de in entry_pairs(msgid, msgstr))
    return pairs
