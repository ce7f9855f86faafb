"""Checks of settings shared by the layers above (their errors name the setting)."""

from __future__ import annotations

from collections.abc import Collection


def check_choice(name: str, value, choices: Collection) -> None:
    """ValueError ``"{name} must be one of {choices}, got {value!r}"`` unless ``value`` is
    one of ``choices`` (a mapping: one of its keys)."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
