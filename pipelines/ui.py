"""``specdec ui``: the MLflow UI on 127.0.0.1 over the jobs' tracking store.

Prints the URL, then becomes ``mlflow ui`` (it takes some seconds to start; Ctrl-C stops it);
``--dry-run`` prints the command instead.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from pipelines.arguments import ranged


def ui_command(tracking_uri: str, port: int) -> list[str]:
    """``mlflow ui`` on 127.0.0.1 over ``tracking_uri`` (the venv's mlflow when present).

    One server process: with mlflow's default of 4, uvicorn's supervisor kills the
    workers that miss its health check on a loaded small machine, and nothing answers.
    """
    local = pathlib.Path(sys.executable).parent / "mlflow"
    executable = str(local) if local.exists() else "mlflow"
    return [executable, "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1"]  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``specdec ui``."""
    parser.add_argument("--tracking-uri", default=None, help="default: the jobs' default store")
    parser.add_argument("--port", type=ranged(int, "--port", low=1, high=65535), default=5000)
    parser.add_argument("--dry-run", action="store_true", help="print the command, do not start it")


def run(args: argparse.Namespace) -> int:
    """Prints the URL, then replaces this process with the server (signals reach it)."""
    from pipelines import tracking

    uri = args.tracking_uri or tracking.default_tracking_uri()
    command = ui_command(uri, args.port)
    print(f"MLflow UI for {uri}: http://127.0.0.1:{args.port}  (Ctrl-C stops it)", flush=True)
    if args.dry_run:
        print(" ".join(command))
        return 0
    os.execvp(command[0], command)
