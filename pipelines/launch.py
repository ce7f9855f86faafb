"""The ``specdec`` console script's first steps: where log lines go
(:mod:`pipelines.log_setup`), and for a job that will run on Ray, Ray's start before the
CLI imports JAX, Beam and MLflow (:mod:`pipelines.early_ray`).

A job's start on a small machine is CPU-bound, and Ray's local instance takes the
longest of it (its daemons start one after another). Started here, before
:mod:`pipelines.cli` and what it imports (JAX, flax), it starts while they import, and
the first record comes sooner (BENCHMARKS.md "Start-up").
"""

from __future__ import annotations

import sys


def entry() -> None:
    """The ``specdec`` console script: where log lines go (:mod:`pipelines.log_setup`),
    Ray's start where the command will use it, then :func:`pipelines.cli.entry`."""
    from pipelines import early_ray, log_setup

    # before Ray, JAX, Beam and MLflow are imported: they read their settings once
    sys.argv[1:] = log_setup.configure_from_argv(sys.argv[1:])
    early_ray.begin(sys.argv[1:])
    from pipelines import cli

    cli.entry()


if __name__ == "__main__":  # python -m pipelines.launch
    entry()
