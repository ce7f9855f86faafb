"""Argument types shared by the ``specdec`` subcommands.

:func:`ranged` parses a number and checks its bounds; its errors name the flag, and
argparse turns them into one ``error:`` line and exit status 2 (:func:`add_ranged` adds
a flag of that type). :func:`add_overrides`
adds the repeatable ``--set SECTION.KEY=VALUE`` of the training commands.
"""

from __future__ import annotations

import argparse


def ranged(kind, name: str, *, low=None, high=None, low_open=False):
    """An argparse type that checks ``low <= x <= high`` (``low < x`` when low_open)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            message = f"{name} must be {kind.__name__}, got {text!r}"
            raise argparse.ArgumentTypeError(message) from None
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(
                f"{name} must be {'>' if low_open else '>='} {low}, got {text}"
            )
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{name} must be <= {high}, got {text}")
        return value

    return parse


def add_ranged(
    parser: argparse.ArgumentParser, flag: str, kind, *, low=None, high=None, low_open=False, **kw
) -> None:
    """``parser.add_argument(flag, type=ranged(kind, flag, ...), **kw)``."""
    parser.add_argument(flag, type=ranged(kind, flag, low=low, high=high, low_open=low_open), **kw)


def add_overrides(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--set SECTION.KEY=VALUE`` (repeatable) into ``args.overrides``: model-config
    values read as YAML and checked as the file is (``pipelines.configs``)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=help_text,
    )
