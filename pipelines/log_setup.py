"""Where a command's log lines go: specdec's own on stderr, the libraries' to a file.

By default a command prints its own lines only. The log records and Python warnings of
the libraries it uses (Beam, Ray, MLflow, JAX, absl, TensorFlow) go to
``runs/<command>.log`` (rewritten by each run; ``SPECDEC_LOG_DIR`` names another
folder), and what those libraries write from native code or from Ray's worker processes
is turned down through their own settings, which must be in the environment before they
are imported. ``specdec --verbose`` (or ``SPECDEC_VERBOSE=1``) leaves every library to
its defaults: their lines on stderr, and Ray's workers' output forwarded to the job.

The loggers of specdec's own packages write to stderr in either case (INFO and up, the
bare message). The ``specdec`` console script calls :func:`configure_from_argv` first
thing (:mod:`pipelines.launch`), before Ray, JAX, Beam or MLflow is imported;
:func:`pipelines.cli.main` on its own only puts specdec's own lines on stderr
(:func:`own_lines_to_stderr`).
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys

from workers.spec import VERBOSE_ENV, verbose_requested

VERBOSE_FLAG = "--verbose"
LOG_DIR_ENV = "SPECDEC_LOG_DIR"
DEFAULT_LOG_DIR = pathlib.Path(__file__).resolve().parents[1] / "runs"
# The packages whose loggers are specdec's own lines.
OWN_LOGGERS = ("specdec", "pipelines", "workers", "specdec_core")
# Commands left to the libraries' defaults: ui becomes the MLflow server, whose lines
# are the command's output.
UNCHANGED_COMMANDS = ("ui",)

# The libraries' own settings, in the environment before they are imported (Ray's
# daemons and workers inherit them too); a value the user set is kept.
QUIET_ENVIRONMENT = {
    # MLflow gives its loggers a stderr handler of their own at import unless told not
    # to; without it they reach the root logger, whose handler is the log file.
    "MLFLOW_CONFIGURE_LOGGING": "false",
    # TensorFlow's and XLA's C++ logging writes to the process's stderr, past Python's
    # logging: errors only.
    "TF_CPP_MIN_LOG_LEVEL": "2",
}

_configured: pathlib.Path | bool | None = None  # the log file, True when verbose


def split_verbose(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` (without the program name) less specdec's ``--verbose``, and whether it
    was given: before the command or among its flags, but not after a lone ``--``
    (Beam's options) nor after ``prepare`` (its flags are its corpus builder's)."""
    rest: list[str] = []
    verbose = False
    command = None
    for at, arg in enumerate(argv):
        if arg == "--" or command == "prepare":
            rest.extend(argv[at:])
            break
        if arg == VERBOSE_FLAG:
            verbose = True
            continue
        rest.append(arg)
        if command is None and not arg.startswith("-"):
            command = arg
    return rest, verbose


def command_of(argv: list[str]) -> str | None:
    """The subcommand of ``argv`` (the top-level parser's only flags take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def log_path(command: str) -> pathlib.Path:
    """``runs/<command>.log`` (``SPECDEC_LOG_DIR``: another folder)."""
    return pathlib.Path(os.environ.get(LOG_DIR_ENV) or DEFAULT_LOG_DIR) / f"{command}.log"


class _Stderr(logging.StreamHandler):
    """The bare message on whatever ``sys.stderr`` is when a record comes (a caller that
    redirects it, a test that captures it, sees the lines)."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ sets it
        pass


def own_lines_to_stderr() -> None:
    """specdec's own loggers (INFO and up) on stderr, once per process."""
    for name in OWN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(handler, _Stderr) for handler in logger.handlers):
            logger.addHandler(_Stderr())
        logger.setLevel(logging.INFO)
        logger.propagate = False  # not again through a handler a library puts on the root


def configure(command: str | None, verbose: bool) -> pathlib.Path | None:
    """Sends the libraries' log lines to ``runs/<command>.log`` (quiet) or leaves them
    on stderr (``verbose``), specdec's own to stderr; once per process. Returns the log
    file (None: verbose, no command, or a command left unchanged)."""
    global _configured
    if _configured is not None:
        return _configured if isinstance(_configured, pathlib.Path) else None
    if command is None or command in UNCHANGED_COMMANDS:
        return None
    verbose = verbose or verbose_requested()
    own_lines_to_stderr()
    if verbose:
        os.environ[VERBOSE_ENV] = "1"  # for Ray's start (workers.spec.ensure_ray)
        _configured = True
        return None
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    path = log_path(command)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    except OSError:  # no writable folder: the libraries' lines are dropped, not shown
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # A handler on the root logger: the libraries' records propagate to it, and
    # logging.warning() on the root (Beam's) no longer installs a stderr handler.
    logging.getLogger().addHandler(handler)
    logging.captureWarnings(True)  # warnings.warn from the libraries: to the same file
    _configured = path
    return path


def configure_from_argv(argv: list[str]) -> list[str]:
    """:func:`configure` for the command line ``argv`` (without the program name);
    returns it without ``--verbose``."""
    rest, verbose = split_verbose(argv)
    configure(command_of(rest), verbose)
    return rest
