"""A killed job resumes: SIGKILL the driver at a random point, run the same command
again, and the output holds every input id exactly once, no half line, no record
decoded twice, and the same outputs as an uninterrupted run (T=0).

The job runs as a subprocess (``python -m pipelines.cli translate ...``) on the tiny
T5 pair of tests/test_translate_job.py, a record per batch so that parts appear one
by one. The kill point (after the k-th part, plus a delay) comes from a seed printed
by the test; ``RESUME_TEST_SEED=N`` replays it. The killed job holds for good a few
parts after k (``tests.held_job``), so the kill lands mid-run however fast the machine
is: before the hold, the kill may still land in a decode or a part's write.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from pipelines import cli, part_files, record_io
from pipelines.cli import main
from tests.test_translate_job import SENTENCES, job_args, tiny_pair

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINES = SENTENCES * 3  # enough records that the kill lands before the last one is done
N = len(LINES)
COMPARED = ("output", "output_ids", "iterations", "accepted", "source", "reference")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    (root / "in.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in LINES))
    return root


@pytest.fixture(scope="module")
def models(workdir):
    return tiny_pair(workdir)


def _args(workdir, models, output, *extra):
    args = job_args(
        workdir / "in.tsv",
        output,
        models=models,
        workers="inprocess",
        temperature=0.0,
        tracking_uri=f"sqlite:///{workdir}/mlflow.db",
    )
    return [*args, "--batch-size", "1", "--max-new-tokens", "24", *extra]


def re_line(text: str, name: str) -> str:
    """The value of row ``name`` in the printed summary table."""
    (line,) = [row for row in text.splitlines() if row.strip().startswith(name)]
    return line.strip()[len(name) :].strip()


def _parts(folder) -> list[str]:
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    # finished parts only: a part being written is part-<uuid>.jsonl.<hex>.tmp
    return sorted(
        n
        for n in names
        if n.startswith(part_files.PART_PREFIX) and n.endswith(part_files.PART_SUFFIX)
    )


def _start(args, workdir, name, *, hold_after_parts: int | None = None):
    """The job as a subprocess; ``hold_after_parts``: it holds for good after writing
    that many part files (``tests.held_job``)."""
    env = dict(os.environ, SPECDEC_COMPILE_CACHE=str(workdir / "jax_cache"))
    log = open(workdir / f"{name}.log", "wb")
    entry = ["pipelines.cli"]
    if hold_after_parts is not None:
        entry = ["tests.held_job", str(hold_after_parts)]
    return subprocess.Popen(
        [sys.executable, "-m", *entry, *args],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the kill takes all of it
    )


@pytest.mark.slow
def test_a_job_killed_at_a_random_point_resumes_without_loss_or_repeat(workdir, models):
    seed = int(os.environ.get("RESUME_TEST_SEED") or random.randrange(2**31))
    rng = random.Random(seed)
    after_parts, delay = rng.randint(1, N // 6), rng.uniform(0.0, 0.02)
    hold = after_parts + rng.randint(0, 2)  # the job writes no more parts than this
    print(
        f"resume test: seed {seed}: kill after part {after_parts} + {delay:.3f} s "
        f"(the job holds after part {hold})"
    )
    output = workdir / "killed.jsonl"
    parts = part_files.parts_dir(str(output))
    args = _args(workdir, models, output)

    job = _start(args, workdir, "killed", hold_after_parts=hold)
    deadline = time.monotonic() + 600
    while len(_parts(parts)) < after_parts:
        assert job.poll() is None, (workdir / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no parts appeared"
        time.sleep(0.005)
    time.sleep(delay)
    os.killpg(job.pid, signal.SIGKILL)
    assert job.wait() == -signal.SIGKILL
    assert not output.exists()  # the output is assembled only when every record is done

    rows, dead = part_files.read_parts(parts)  # raises on a half-written part
    done = {r["id"]: r for r in rows}
    assert dead == [] and after_parts <= len(done) <= hold < N
    half = [n for n in os.listdir(parts) if n.endswith(part_files.TMP_SUFFIX)]  # ignored on resume
    print(f"resume test: {len(done)} of {N} records were done at the kill; {len(half)} .tmp")

    # Other settings do not resume someone else's parts: exit 2, parts untouched.
    assert main([*args, "--seed", "8"]) == cli.EXIT_CANNOT_START
    assert part_files.read_parts(parts)[0] == rows

    rerun = _start(args, workdir, "rerun")
    assert rerun.wait(timeout=600) == 0, (workdir / "rerun.log").read_text()[-3000:]
    text = output.read_text()
    assert text.endswith("\n")
    lines = text.split("\n")[:-1]
    final = [json.loads(line) for line in lines]  # no half line
    assert sorted(r["id"] for r in final) == sorted(str(i) for i in range(1, N + 1))
    assert record_io.read_jsonl(record_io.default_dead_letter_path(str(output))) == []
    assert not os.path.exists(parts)
    summary = json.loads((workdir / "killed.jsonl.summary.json").read_text())
    assert summary["records_resumed"] == len(done)
    log = (workdir / "rerun.log").read_text()
    assert f"resuming: {len(done)} of {N} records are done" in log
    assert re_line(log, "resumed records") == str(len(done))
    assert (summary["records_in"], summary["records_out"]) == (N, N)
    by_id = {r["id"]: r for r in final}
    for record_id, row in done.items():
        # not decoded again: the same batch (a fresh id per decoded batch) and time
        assert (by_id[record_id]["batch"], by_id[record_id]["wall_ms"]) == (
            row["batch"],
            row["wall_ms"],
        )

    whole = workdir / "whole.jsonl"
    assert main(_args(workdir, models, whole)) == cli.EXIT_OK
    uninterrupted = {r["id"]: r for r in record_io.read_jsonl(str(whole))}
    assert sorted(uninterrupted) == sorted(by_id)
    for record_id, row in uninterrupted.items():
        assert {k: by_id[record_id].get(k) for k in COMPARED} == {
            k: row.get(k) for k in COMPARED
        }, record_id


def test_parts_are_whole_or_absent(tmp_path):
    folder = str(tmp_path / "out.jsonl.parts")
    part_files.start_parts(folder, {"seed": 1})
    part_files.write_part(folder, [("output", {"id": "1", "output": "a"}), ("dead", {"id": "2"})])
    part_files.write_part(folder, [("output", {"id": "1", "output": "a"})])  # a retried bundle
    # What a kill in the middle of a write leaves: a temporary file with a half line.
    (tmp_path / "out.jsonl.parts" / "part-x.jsonl.0123.tmp").write_text('{"kind": "outp')
    rows, dead = part_files.read_parts(folder)
    assert rows == [{"id": "1", "output": "a"}] and dead == [{"id": "2"}]
    with pytest.raises(record_io.ResumeError, match=r"other settings \(seed differ\)"):
        part_files.start_parts(folder, {"seed": 2})
    part_files.start_parts(folder, {"seed": 1})  # the same job: continues
    part_files.assemble(
        str(tmp_path / "out.jsonl"), str(tmp_path / "dead.jsonl"), rows, dead, ["2", "1"]
    )
    assert (tmp_path / "out.jsonl").read_text() == '{"id": "1", "output": "a"}\n'
    assert not [p for p in os.listdir(tmp_path) if p.endswith(part_files.TMP_SUFFIX)]


def test_a_corrupt_part_is_named(tmp_path):
    folder = tmp_path / "o.parts"
    part_files.start_parts(str(folder), {})
    (folder / "part-bad.jsonl").write_text('{"kind": "output"}\n')
    with pytest.raises(record_io.ResumeError, match=r"corrupt part .*part-bad\.jsonl"):
        part_files.read_parts(str(folder))


@pytest.mark.parametrize("name", ["run[2].jsonl.parts", "run*2?.jsonl.parts"])
def test_parts_are_read_from_a_folder_named_with_glob_characters(tmp_path, name):
    """An output path is a path, not a pattern: its parts are found, and a sibling folder
    that the name would match as a pattern is not read."""

    def job_parts(folder, record_id):
        part_files.start_parts(folder, {"job": "glob"})
        part_files.write_part(folder, [(part_files.OUTPUT_KIND, {"id": record_id})])

    job_parts(str(tmp_path / name), "mine")
    job_parts(str(tmp_path / "run2.jsonl.parts"), "sibling")
    rows, dead = part_files.read_parts(str(tmp_path / name))
    assert [row["id"] for row in rows] == ["mine"] and dead == []
    part_files.remove_parts(str(tmp_path / name))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run2.jsonl.parts"]
    assert part_files.read_parts(str(tmp_path / "run2.jsonl.parts"))[0] == [{"id": "sibling"}]
