"""A job prints its own lines only (pipelines.log_setup): run through the ``specdec``
console script on the tiny pair of tests/test_translate_job.py, every line on stdout
and stderr is specdec's, and the libraries' warnings are in ``runs/<command>.log``;
with ``--verbose`` the libraries' lines are on stderr instead.

Both jobs write a fresh MLflow store, so MLflow has its "Creating initial MLflow
database tables" line to say; the quiet job runs on Ray as ``make run`` does (both
models in the target's actor), the verbose one in-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.conftest import REPO_ROOT
from tests.test_translate_job import SENTENCES, job_args, tiny_pair

# specdec's lines: "specdec <command>: ...", "specdec: error: ...", and the table's and
# the progress lines' indent
OWN_LINE = re.compile(r"^(specdec[ :]| {2,}\S)")
# what the libraries print when nothing routes them (pipelines.log_setup)
THIRD_PARTY = (
    "apitools not found",
    "SIGTERM handler is not set",
    "Resource module is not available",
    "Creating initial MLflow database tables",
    "Started a local Ray instance",
    "WARNING:",
)
MLFLOW_LINE = "Creating initial MLflow database tables"


def _start(workdir, models, name: str, workers: str, *flags: str) -> subprocess.Popen:
    output = workdir / f"{name}.jsonl"
    args = job_args(
        workdir / "sentences.tsv",
        output,
        models=models,
        workers=workers,
        temperature=0.0,
        tracking_uri=f"sqlite:///{workdir}/{name}.db",
    )
    args.remove("--quiet")  # the progress lines are specdec's too
    env = {**os.environ, "SPECDEC_LOG_DIR": str(workdir / f"{name}_logs")}
    env.pop("SPECDEC_VERBOSE", None)
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.launch", *args, *flags],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(job: subprocess.Popen) -> tuple[list[str], list[str]]:
    stdout, stderr = job.communicate(timeout=600)
    assert job.returncode == 0, stdout + stderr
    return stdout.splitlines(), stderr.splitlines()


def test_a_job_prints_its_own_lines_only_and_verbose_shows_the_libraries(tmp_path):
    (tmp_path / "sentences.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in SENTENCES))
    models = tiny_pair(tmp_path)
    quiet = _start(tmp_path, models, "quiet", "ray", "--draft-placement", "target")
    verbose = _start(tmp_path, models, "verbose", "inprocess", "--verbose")  # a job's flag too
    stdout, stderr = _finish(quiet)
    verbose_stdout, verbose_stderr = _finish(verbose)

    assert stdout[0].startswith("specdec translate: done"), stdout  # the job's table
    assert any(line.startswith("  decoded ") for line in stderr), stderr  # its progress
    foreign = [line for line in stdout + stderr if not OWN_LINE.match(line)]
    assert not foreign, f"lines that specdec did not write: {foreign}"
    noisy = [line for line in stdout + stderr if any(p in line for p in THIRD_PARTY)]
    assert not noisy, noisy

    # --verbose: the libraries' lines on stderr (MLflow's on creating the store) ...
    assert verbose_stdout[0].startswith("specdec translate: done"), verbose_stdout
    shown = [line for line in verbose_stderr if not OWN_LINE.match(line)]
    assert any(MLFLOW_LINE in line for line in shown), verbose_stderr
    assert not (tmp_path / "verbose_logs").exists()  # ... and no log file
    # quiet, the warnings that --verbose shows are in runs/translate.log
    log = (tmp_path / "quiet_logs" / "translate.log").read_text()
    warned = [m[1] for line in shown if (m := re.match(r"WARNING:[\w.]+:(.*)", line))]
    assert all(message in log for message in warned), (warned, log)
