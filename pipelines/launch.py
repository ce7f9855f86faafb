"""The ``specdec`` console script's first step: a job that will run on Ray starts Ray,
and opens its MLflow store, before the CLI imports JAX, Beam and MLflow.

A job's start on a small machine is CPU-bound, and Ray's local instance takes the
longest of it (its daemons start one after another, 2-3.5 s on 2 idle cores). Started
here, before :mod:`pipelines.cli` and what it imports (JAX, flax: ~1 s), its start
overlaps those imports, and the first record came ~0.9 s sooner (BENCHMARKS.md
"Start-up"). :func:`pipelines.translate.run_job` takes the instance started here
(:func:`take_early_ray`) instead of starting its own, and the MLflow store's start
(:func:`take_early_store`: its experiment made or found) likewise.

Only a ``translate`` / ``summarize`` command that will use Ray starts early: ``--workers
ray`` (the default), an ``--input`` that exists (or a seqio task), no ``--help`` and no
Beam options (which may ask for more engines, so more CPUs). JAX's compilation cache is
set first: the actors that Ray's daemons start read it from their environment.
"""

from __future__ import annotations

import argparse
import os
import sys

from workers.background import Background

EARLY_NAME = "ray-early-start"  # its thread's name (Background.name)
_EARLY: Background | None = None  # Ray's start begun by entry(), until a job takes it
# (experiment, tracking URI, the store's start) begun by entry(), until a job takes it
_EARLY_STORE: tuple[str, str, Background] | None = None


def early_ray_address(argv: list[str]) -> tuple[bool, str | None]:
    """Whether the command ``argv`` (without the program name) should start Ray before
    the CLI's imports, and the ``--ray-address`` it names (None: a local instance)."""
    if argv[:1] not in (["translate"], ["summarize"]) or "--" in argv:
        return False, None
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--workers", default="ray")
    parser.add_argument("--input")
    parser.add_argument("--ray-address")
    parser.add_argument("--tracking-uri")
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


def start_early_store(argv: list[str]) -> tuple[str, str, Background] | None:
    """The job's MLflow store (:func:`pipelines.tracking.ensure_experiment` of the
    command's experiment at ``--tracking-uri`` or the default store) started in a
    background thread, for the commands that start Ray early; None for others."""
    wanted, _ = early_ray_address(argv)
    if not wanted:
        return None
    from pipelines import tracking

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tracking-uri")
    uri = parser.parse_known_args(argv[1:])[0].tracking_uri or tracking.default_tracking_uri()
    experiment = argv[0]  # the job kind's name: its MLflow experiment
    start = Background(lambda: tracking.ensure_experiment(experiment, uri), name="mlflow-store")
    return experiment, uri, start


def take_early_store(experiment: str, tracking_uri: str) -> Background | None:
    """The store's start that :func:`entry` began, if it was for ``experiment`` at
    ``tracking_uri`` (once; else None, and the job starts its own)."""
    global _EARLY_STORE
    early, _EARLY_STORE = _EARLY_STORE, None
    if early is None or early[:2] != (experiment, tracking_uri):
        return None
    return early[2]


def take_early_ray() -> Background | None:
    """The Ray start that :func:`entry` began (once; None when it began none)."""
    global _EARLY
    early, _EARLY = _EARLY, None
    return early


def entry() -> None:
    """The ``specdec`` console script: Ray's start where the command will use it, then
    :func:`pipelines.cli.entry`."""
    global _EARLY, _EARLY_STORE
    _EARLY = start_early_ray(sys.argv[1:])
    _EARLY_STORE = start_early_store(sys.argv[1:])
    from pipelines import cli

    cli.entry()


if __name__ == "__main__":  # python -m pipelines.launch: the state lives in the module
    from pipelines import launch

    launch.entry()
