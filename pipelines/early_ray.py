"""Ray's start begun by the ``specdec`` console script (:mod:`pipelines.launch`) before the
CLI imports JAX, Beam and MLflow, and taken by the job that will use it
(:func:`pipelines.translate.run_job`): a module of its own, below both, that holds the
start between them.

Only a ``translate`` / ``summarize`` command that will use Ray starts early: ``--workers
ray`` (the default), an ``--input`` that exists (or a seqio task), no ``--help`` and no
Beam options (which may ask for more engines, so more CPUs). JAX's compilation cache is
set first: the actors that Ray's daemons start read it from their environment.
"""

from __future__ import annotations

import argparse
import os

from workers.background import Background

EARLY_NAME = "ray-early-start"  # its thread's name (Background.name)
_EARLY: Background | None = None  # Ray's start begun by begin(), until a job takes it


def early_ray_address(argv: list[str]) -> tuple[bool, str | None]:
    """Whether the command ``argv`` (without the program name) should start Ray before
    the CLI's imports, and the ``--ray-address`` it names (None: a local instance)."""
    if argv[:1] not in (["translate"], ["summarize"]) or "--" in argv:
        return False, None
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--workers", default="ray")
    parser.add_argument("--input")
    parser.add_argument("--ray-address")
    parser.add_argument("-h", "--help", action="store_true")
    flags, _ = parser.parse_known_args(argv[1:])
    source = flags.input or ""
    wanted = (
        flags.workers == "ray"
        and not flags.help
        and (source.startswith("seqio:") or os.path.isfile(source))
    )
    return wanted, flags.ray_address


def start_early_ray(argv: list[str]) -> Background | None:
    """Ray's start (:func:`workers.spec.ensure_ray`) in a background thread for a job
    command that will use it (:func:`early_ray_address`); None for any other command."""
    wanted, address = early_ray_address(argv)
    if not wanted:
        return None
    from pipelines.compile_cache import enable_compile_cache
    from workers.spec import ensure_ray, ray_cpus

    enable_compile_cache()
    return Background(
        lambda: ensure_ray(address, num_cpus=ray_cpus()),
        name=EARLY_NAME,
        hold=lambda started_local: started_local,
    )


def take_early_ray() -> Background | None:
    """The Ray start that :func:`begin` began (once; None when it began none)."""
    global _EARLY
    early, _EARLY = _EARLY, None
    return early


def begin(argv: list[str]) -> None:
    """Starts Ray early for the command ``argv`` where it will use Ray
    (:func:`start_early_ray`); a job takes it with :func:`take_early_ray`."""
    global _EARLY
    _EARLY = start_early_ray(argv)
