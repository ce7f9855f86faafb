"""JAX's persistent compilation cache for the job commands (a module of its own, light to
import: the ``specdec`` console script sets it before starting Ray, :mod:`pipelines.launch`)."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

DEFAULT_COMPILE_CACHE = pathlib.Path(__file__).resolve().parents[1] / "runs" / "jax_cache"


def compile_cache_settings(path: str | os.PathLike) -> dict[str, Any]:
    """JAX's config for a persistent compilation cache in ``path`` that keeps every
    program, however small or quick to compile."""
    return {
        "jax_compilation_cache_dir": str(path),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }


def compile_cache_environment(settings: dict[str, Any]) -> dict[str, str]:
    """``settings`` as the environment variables JAX reads when a process imports it."""
    return {name.upper(): str(value) for name, value in settings.items()}


def enable_compile_cache(directory: str | os.PathLike | None = None) -> pathlib.Path | None:
    """Turns on JAX's persistent compilation cache for the job commands.

    Compiled programs are written to ``directory`` (default ``$SPECDEC_COMPILE_CACHE``,
    else ``runs/jax_cache`` under the repository; ``SPECDEC_COMPILE_CACHE=off``
    disables it), so a second job with the same models and shapes loads them instead
    of compiling. Every program is cached, however small or quick to compile (the
    loop's are both). Set through the environment, so that the processes the job
    starts (Ray workers) read it when they import JAX, and through ``jax.config`` when
    this process has already imported JAX. Returns the folder, or None when disabled.
    """
    chosen = directory or os.environ.get("SPECDEC_COMPILE_CACHE") or DEFAULT_COMPILE_CACHE
    if str(chosen).lower() == "off":
        return None
    path = pathlib.Path(chosen).resolve()
    path.mkdir(parents=True, exist_ok=True)
    settings = compile_cache_settings(path)
    os.environ.update(compile_cache_environment(settings))
    if "jax" in sys.modules:
        import jax

        for name, value in settings.items():
            jax.config.update(name, value)
    return path
