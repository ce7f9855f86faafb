"""``specdec prepare [--corpus ding|debian|summaries] ARGS``: write a corpus.

``ding`` (default) writes the Ding En-De splits (``python -m pipelines.data.ding``),
``debian`` the Debian En-De corpus (``pipelines.data.debian.build``), ``summaries`` the
Debian description -> synopsis corpus (``pipelines.data.summaries``). Everything after
``--corpus`` goes to that builder's own parser (``specdec prepare --corpus debian
--help`` shows its flags); its usage errors exit 2.
"""

from __future__ import annotations

import argparse

CORPORA = ("ding", "debian", "summaries")
USAGE = """usage: specdec prepare [--corpus {ding,debian,summaries}] ARGS...

  --corpus ding    (default) the Ding dictionary splits: python -m pipelines.data.ding ARGS
  --corpus debian  the Debian En-De corpus (DDTP descriptions, gettext catalogs,
                   LibreOffice help, Firefox/Thunderbird language packs, plus the Ding
                   splits): python -m pipelines.data.debian.build ARGS; fetches the named
                   packages with apt-get download into runs/debian_cache (no install)
                   and writes assets/data/debian/<source>/{train,validation,test}.tsv.xz,
                   counts.json and LICENSE.md
  --corpus summaries  Debian package long description -> synopsis (Translation-en
                   and the Packages file, cached in runs/debian_cache/ddtp):
                   python -m pipelines.data.summaries ARGS; writes
                   assets/data/summaries/{train,validation,test}.tsv.xz, counts.json
                   and LICENSE.md

`specdec prepare --corpus debian --help` (or summaries) shows that corpus's ARGS.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``[--corpus ding|debian|summaries]`` and that builder's flags, passed through
    unparsed (``specdec`` hands everything after ``prepare`` to :func:`run`)."""
    parser.add_argument(
        "passthrough_args",
        nargs=argparse.REMAINDER,
        help="[--corpus ding|debian|summaries] and that builder's arguments",
    )


def run(args: argparse.Namespace) -> int:
    """Runs the chosen corpus's builder on the remaining flags; returns the exit status."""
    chooser = argparse.ArgumentParser(prog="specdec prepare", add_help=False)
    chooser.add_argument("--corpus", choices=CORPORA, default=None)
    try:
        known, rest = chooser.parse_known_args(args.passthrough_args)
    except SystemExit as exit_:  # a bad --corpus value: argparse has printed why
        return int(exit_.code or 0)
    if known.corpus is None and rest[:1] in (["-h"], ["--help"]):
        print(USAGE)
    try:
        if known.corpus == "debian":
            from pipelines.data.debian import build

            build.main(rest)
        elif known.corpus == "summaries":
            from pipelines.data import summaries

            summaries.main(rest)
        else:
            from pipelines.data import ding

            ding.main(rest)
    except SystemExit as exit_:  # its own argparse (--help, bad flags)
        return int(exit_.code or 0)
    return 0
