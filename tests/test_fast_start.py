"""What a job's start and end cost (issue 20, "a fast start"): Beam's RunInference comes
without torch (pipelines.beam_inference), and the ``specdec`` console script ends a job's
process once its exit handlers have run (pipelines.cli.entry)."""

import importlib.util
import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO_ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )


IMPORTS = """
import json, sys
import pipelines.inference, pipelines.transforms
hidden = "torch" not in sys.modules
usable = None
try:
    import torch
    usable = torch.zeros(2).sum().item() == 0.0
except ImportError:
    pass
print(json.dumps({"hidden": hidden, "usable": usable}))
"""


def test_the_jobs_beam_modules_do_not_import_torch_and_torch_still_imports_later():
    out = _python(IMPORTS)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["hidden"]  # Beam's ModelManager would have imported it (1.2-2.5 s)
    if importlib.util.find_spec("torch") is not None:
        assert seen["usable"]  # hidden only while Beam's module was imported


ENTRY = """
import atexit, pathlib, sys
marker = pathlib.Path(sys.argv[1])
atexit.register(marker.write_text, "exit handlers ran")
sys.argv = ["specdec", *sys.argv[2:]]
from pipelines.cli import entry
entry()
print("not reached")
"""


def test_entry_runs_the_exit_handlers_and_keeps_the_jobs_exit_status(tmp_path):
    marker = tmp_path / "marker"
    missing = str(tmp_path / "missing.tsv")
    # A job command that cannot start: status 2, through the fast exit.
    out = _python(ENTRY, str(marker), "translate", "--input", missing, "--output", "o.jsonl")
    assert out.returncode == 2, out.stderr
    assert "specdec: error:" in out.stderr and "not reached" not in out.stdout
    assert marker.read_text() == "exit handlers ran"
    marker.unlink()
    # Other commands exit as usual (sys.exit).
    out = _python(ENTRY, str(marker), "ui", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert marker.read_text() == "exit handlers ran"
