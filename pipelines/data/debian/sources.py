"""The sources of the Debian corpus: which packages each reads, and how it reads them.

Each builder takes the package cache folder and returns a ``SourceResult``: the raw
pairs (before cleaning), the packages it opened (for the licence file), the packages
it could not fetch (``skipped``, never a silent hole) and counts of its own.
``SOURCE_ORDER`` is the build order: a pair found by two sources is kept by the first.
"""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys
from collections.abc import Callable, Iterable

from pipelines.data.debian import catalogs, common, ddtp, docs, lohelp, manpages, mozilla
from pipelines.data.debian.common import Pair

CATALOG_PACKAGES = (
    "libreoffice-l10n-de",
    "gcc-12-locales",
    "gimp-data",
    "gramps",
    "vlc-l10n",
    "evolution-common",
    "gnucash-common",
    "aptitude-common",
    "libc-l10n",
    "util-linux-locales",
    "gnupg-l10n",
    "coreutils",
    "tar",
    "inkscape",
    "libgtk-3-common",
    "libglib2.0-data",
    "gnumeric-common",
    "abiword-common",
    "audacity-data",
    "digikam-data",
    "pidgin-data",
    "hexchat-common",
    "transmission-common",
    "filezilla-common",
    "freeciv-data",
    "claws-mail-i18n",
    "apt",
    "dpkg",
    "debconf-i18n",
    "synaptic",
    "grub-common",
    "binutils-common",
    "gettext",
    "gdb",
    "wget",
    "findutils",
    "grep",
    "sed",
    "diffutils",
    "evolution-data-server-common",
    "gnome-shell-common",
    "nautilus-data",
    "gedit-common",
    "gnome-control-center-data",
    "darktable",
    "geany-common",
    "mutt",
    "rhythmbox-data",
    "totem-common",
    "shotwell-common",
    "evince-common",
)
HELP_PACKAGES = ("libreoffice-help-en-us", "libreoffice-help-de")
MOZILLA_PRODUCTS = {
    "firefox-esr": ("firefox-esr-l10n-en-gb", "firefox-esr-l10n-de"),
    "thunderbird": ("thunderbird-l10n-en-gb", "thunderbird-l10n-de"),
}
SOURCE_ORDER = ("ding", "ddtp", "lohelp", "catalogs", "mozilla", "docs", "manpages")
SOURCE_TITLES = {
    "ding": "Ding German-English dictionary (Debian trans-de-en), existing splits",
    "ddtp": "Debian package descriptions and their DDTP German translations (bookworm main)",
    "lohelp": "LibreOffice help, English (en-US) and German",
    "catalogs": "gettext catalogs (German .mo files) of Debian packages",
    "mozilla": "Firefox ESR and Thunderbird language packs, en-GB and de",
    "docs": "Debian documentation (manuals, FAQ, handbook, installation guide, GNOME help)",
    "manpages": "Manual pages: manpages-de's German pages and their English originals",
}
# Whether clean_text strips accelerator marks: only UI catalogs carry them.
ACCELERATORS = {
    "ddtp": False,
    "lohelp": False,
    "catalogs": True,
    "mozilla": False,
    "docs": False,
    "manpages": False,
}


@dataclasses.dataclass
class SourceResult:
    """What one source produced before the cross-source steps."""

    pairs: list[Pair]
    packages: list[common.PackageInfo] = dataclasses.field(default_factory=list)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # package -> why
    counts: dict[str, int] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------
# Sources


def _open_all(names: Iterable[str], cache: pathlib.Path, result: SourceResult) -> dict:
    """Opens each package; a failure is printed and recorded in ``result.skipped``."""
    opened = {}
    for name in names:
        try:
            info = common.open_package(name, cache)
        except (common.PackageUnavailable, OSError, ValueError) as error:
            print(f"prepare: SKIPPED package {name}: {error}", file=sys.stderr)
            result.skipped[name] = str(error)
            continue
        opened[name] = info
        result.packages.append(info)
    return opened


def source_ddtp(cache: pathlib.Path) -> SourceResult:
    try:
        pairs, counts = ddtp.extract(cache)
    except (FileNotFoundError, subprocess.CalledProcessError) as error:
        print(f"prepare: SKIPPED DDTP Translation-en/-de: {error}", file=sys.stderr)
        return SourceResult(pairs=[], skipped={"Translation-en/de (apt lists)": str(error)})
    return SourceResult(pairs=pairs, counts=counts)


def source_catalogs(cache: pathlib.Path) -> SourceResult:
    result = SourceResult(pairs=[])
    for name, info in _open_all(CATALOG_PACKAGES, cache, result).items():
        found = catalogs.extract(name, info.root)
        result.counts[f"raw_pairs_{name}"] = len(found)
        result.pairs.extend(found)
    return result


def source_lohelp(cache: pathlib.Path) -> SourceResult:
    result = SourceResult(pairs=[])
    opened = _open_all(HELP_PACKAGES, cache, result)
    if len(opened) == len(HELP_PACKAGES):
        english, german = (opened[name].root for name in HELP_PACKAGES)
        result.pairs = lohelp.extract(english, german)
    return result


def source_mozilla(cache: pathlib.Path) -> SourceResult:
    result = SourceResult(pairs=[])
    for product, (english_name, german_name) in MOZILLA_PRODUCTS.items():
        opened = _open_all((english_name, german_name), cache, result)
        if len(opened) == 2:
            found = mozilla.extract(product, opened[english_name].root, opened[german_name].root)
            result.counts[f"raw_pairs_{product}"] = len(found)
            result.pairs.extend(found)
    return result


def source_docs(cache: pathlib.Path) -> SourceResult:
    result = SourceResult(pairs=[])
    opened = _open_all(docs.PACKAGES, cache, result)
    for manual in docs.MANUALS:
        if manual.english_package in opened and manual.german_package in opened:
            english, german = opened[manual.english_package], opened[manual.german_package]
            found, counts = docs.extract(manual, english.root, german.root)
            result.counts[f"raw_pairs_{manual.name}"] = len(found)
            for key, value in counts.items():
                result.counts[f"{key}_{manual.name}"] = value
            result.pairs.extend(found)
    return result


def source_manpages(cache: pathlib.Path) -> SourceResult:
    result = SourceResult(pairs=[])
    german = _open_all(manpages.GERMAN_PACKAGES, cache, result)
    english = _open_all(manpages.ENGLISH_PACKAGES, cache, result)
    if german and english:
        result.pairs, result.counts = manpages.extract(
            [info.root for info in german.values()], [info.root for info in english.values()]
        )
    return result


SOURCE_BUILDERS: dict[str, Callable[[pathlib.Path], SourceResult]] = {
    "ddtp": source_ddtp,
    "lohelp": source_lohelp,
    "catalogs": source_catalogs,
    "mozilla": source_mozilla,
    "docs": source_docs,
    "manpages": source_manpages,
}
