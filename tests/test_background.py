"""workers.background.Background: start-up work in a thread, awaited where needed."""

from __future__ import annotations

import threading
import time

import pytest

from workers.background import Background


def test_wait_returns_the_result_and_the_caller_overlaps_with_it():
    release = threading.Event()
    job = Background(lambda: (release.wait(5), 42)[1], name="test-result")
    assert not job.done()  # started, and the caller goes on meanwhile
    release.set()
    assert job.wait() == 42
    assert job.done()


def test_wait_raises_the_error_in_the_waiting_thread():
    def fail():
        raise ConnectionError("no Ray at 10.0.0.1:6379")

    job = Background(fail, name="test-error")
    with pytest.raises(ConnectionError, match="no Ray at"):
        job.wait()
    with pytest.raises(ConnectionError):  # every wait, not only the first
        job.wait()


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_hold_keeps_the_thread_alive_only_when_asked_by_the_result():
    held = Background(lambda: True, name="test-held", hold=lambda started: started)
    released = Background(lambda: False, name="test-released", hold=lambda started: started)
    assert held.wait() is True and released.wait() is False
    deadline = time.monotonic() + 5
    while _threads("test-released") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _threads("test-released")  # ended once fn returned
    time.sleep(0.1)
    assert [t.is_alive() for t in _threads("test-held")] == [True]  # lives on (daemon)
    assert all(t.daemon for t in _threads("test-held"))


@pytest.mark.slow
def test_a_fresh_process_ray_job_keeps_the_instance_it_started_in_the_background(tmp_path):
    """``specdec translate --workers ray`` in a new process (the console script's module,
    pipelines.launch) starts its local Ray instance in a background thread before the
    CLI's imports: the instance's daemons must outlive that start (they die with the
    thread that started them unless it is held), the job must take that instance
    rather than start its own, and it reports only the time it waited for Ray. It runs
    as ``make run`` does, with the draft in the target's actor (the coordinator in the
    job's process: no actor of its own)."""
    import json
    import os
    import subprocess
    import sys

    from pipelines.cli import REPO_ROOT

    source = tmp_path / "in.txt"
    source.write_text("Handle with care.\nFeel at home!\nIt serves no purpose.\n")
    summary = tmp_path / "out.summary.json"
    command = [
        sys.executable, "-m", "pipelines.launch", "translate",
        "--input", str(source), "--output", str(tmp_path / "out.jsonl"),
        "--target", "t5_tiny_test:vocab_size=8000", "--draft", "t5_tiny_test:vocab_size=8000",
        "--allow-random-init", "--workers", "ray", "--draft-placement", "target",
        "--max-new-tokens", "4", "--compare-baseline",
        "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
        "--summary-json", str(summary), "--quiet",
    ]  # fmt: skip
    env = {**os.environ, "SPECDEC_COMPILE_CACHE": str(tmp_path / "cache")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert result["records_out"] == 3 and result["records_failed"] == 0
    assert result["mlflow_run_id"] and result["mlflow_error"] is None
    phases = result["time_breakdown"]
    assert 0.0 <= phases["ray_start"] and phases["startup"] > 0.0
    assert result["placement"]["draft"] == result["placement"]["target"] is not None
    assert result["ray_started_early"] is True
    assert result["speedup"] > 0


def test_only_a_job_that_will_use_ray_starts_it_before_the_clis_imports(tmp_path):
    from pipelines.early_ray import early_ray_address

    source = tmp_path / "in.txt"
    source.write_text("Feel at home!\n")
    job = ["translate", "--input", str(source), "--output", "o.jsonl"]
    assert early_ray_address(job) == (True, None)
    assert early_ray_address(["summarize", *job[1:], "--ray-address", "10.0.0.1:6379"]) == (
        True,
        "10.0.0.1:6379",
    )
    assert early_ray_address([*job, "--workers=ray"]) == (True, None)
    assert early_ray_address(["translate", "--input", "seqio:wmt_ende:test"])[0]
    for argv in (
        [*job, "--workers", "inprocess"],
        [*job, "--help"],
        [*job, "--", "--direct_num_workers", "2"],  # Beam options: maybe more engines
        ["translate", "--input", str(tmp_path / "missing.txt")],  # exits 2 at once
        ["ui"],
        [],
    ):
        assert early_ray_address(argv)[0] is False, argv
