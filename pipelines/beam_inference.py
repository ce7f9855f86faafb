"""Beam's ``RunInference`` and ``ModelHandler``, imported without torch.

``apache_beam.ml.inference.base`` imports ``model_manager`` when it can, and that
module imports torch at its top, for a GPU-memory-aware ``ModelManager`` that the
jobs never use (``base`` falls back to none when the import fails). Where torch is
installed (``make install`` brings it for the HF tests), that import adds seconds to
every job's start-up, before its first record. So torch is hidden
while Beam's module is imported: ``sys.modules["torch"] = None`` makes ``import torch``
raise ImportError there, and the entry is removed at once, so that a later
``import torch`` (the HF tests, a user's own code) works as before. Where torch is
already imported, nothing is hidden.
"""

from __future__ import annotations

import sys


def _import_base():
    hide = "torch" not in sys.modules and "apache_beam.ml.inference.base" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from apache_beam.ml.inference import base
    finally:
        if hide and sys.modules.get("torch", False) is None:
            del sys.modules["torch"]
    return base


_base = _import_base()
ModelHandler = _base.ModelHandler
RunInference = _base.RunInference

__all__ = ["ModelHandler", "RunInference"]
