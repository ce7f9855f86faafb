"""What a job's start and end cost: Beam's RunInference comes
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


class CountingEngine:
    """Stands in for an engine to count the handler's calls (no decoding: how often the
    handler decodes a batch is what is tested)."""

    def __init__(self):
        self.calls = []

    def _generations(self, requests, kind):
        from workers.batching import Generation

        self.calls.append((kind, len(requests[0].encoder_tokens)))
        return [
            Generation(
                id=r.id,
                tokens=[1],
                iterations=1,
                drafted=0,
                accepted=0,
                accepted_by_position=[],
                batch_wall_ms=1.0,
            )
            for r in requests
        ]

    def generate(self, requests):
        return self._generations(requests, "speculative")

    def generate_baseline(self, requests):
        return self._generations(requests, "baseline")

    def report(self):
        pass


def test_every_batch_is_decoded_once_per_path_whatever_its_shape():
    """No untimed first decode of a new shape: a user waits for every decode, so each
    batch goes through the speculative path and the target alone's once, a new program
    shape (api.source_width) included, compiling inside its path's time."""
    from pipelines import record_io
    from pipelines.inference import SpeculativeModelHandler, Tokenized
    from workers.batching import DecodeSettings
    from workers.engine import EngineConfig

    handler = SpeculativeModelHandler(
        target=None, draft=None, settings=DecodeSettings(gamma=2, max_new_tokens=4),
        engine=EngineConfig(), compare_baseline=True, job_id="t", progress=False,
    )  # fmt: skip
    engine = CountingEngine()

    def decode(width):
        item = Tokenized(record=record_io.Record(id="r", source="x"), encoder_tokens=(5,) * width)
        engine.calls.clear()
        handler.run_inference([item], engine)
        return [kind for kind, _ in engine.calls]

    assert decode(10) == ["speculative", "baseline"]
    assert decode(30) == ["baseline", "speculative"]  # the order alternates batch by batch
    assert decode(20) == ["speculative", "baseline"]
    assert decode(100) == ["baseline", "speculative"]  # width 128: a new program shape


def test_a_job_stops_only_a_ray_instance_it_started():
    """translate._stop_ray: a local Ray instance that the job started shuts down in the
    background once the pipeline is done; one that it joined (a cluster, the tests'
    shared instance: ensure_ray returned False) or that is still starting is left alone."""
    import threading

    from pipelines import translate
    from workers.background import Background

    assert translate._stop_ray(None) is None  # an in-process job
    joined = Background(lambda: False, name="joined")
    joined.wait()
    assert translate._stop_ray(joined) is None
    release = threading.Event()
    starting = Background(lambda: release.wait() and True, name="starting")
    assert translate._stop_ray(starting) is None  # never waits on a start that hangs
    release.set()


STOPS_ITS_RAY = """
import json, os
os.environ["RAY_AUTH_MODE"] = "disabled"
import ray
from pipelines import translate
from workers.background import Background
from workers.spec import ensure_ray
started = Background(lambda: ensure_ray(num_cpus=1), name="ray-start", hold=bool)
started.wait()
up = ray.is_initialized()
stop = translate._stop_ray(started)
stop.wait()
print(json.dumps({"up": up, "stopped": stop is not None, "down": not ray.is_initialized()}))
"""


def test_a_job_stops_the_ray_instance_it_started():
    out = _python(STOPS_ITS_RAY)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "up": True, "stopped": True, "down": True,
    }  # fmt: skip
