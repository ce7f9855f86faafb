"""Exit statuses of the job commands, through the real CLI entry (``cli.main``).

0 only when every record came out, 3 when some went to the dead letters (the summary
counts them per reason), 2 when the job could not start, 1 when it failed after it
started. The models are the tiny T5 pair of tests/test_translate_job.py.
"""

import json

import pytest

from pipelines import cli, part_files, record_io, transforms, translate
from pipelines.cli import main
from tests.test_translate_job import SENTENCES, job_args, tiny_pair


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("exit_codes")
    (root / "good.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in SENTENCES[:4]))
    return root


@pytest.fixture(scope="module")
def models(workdir):
    return tiny_pair(workdir)


def _args(workdir, models, input_path, name):
    output = workdir / f"{name}.jsonl"
    args = job_args(
        input_path,
        output,
        models=models,
        workers="inprocess",
        temperature=0.0,
        tracking_uri=f"sqlite:///{workdir}/mlflow.db",
    )
    return args, output


def test_the_codes_are_distinct_and_named_in_the_help(capsys):
    assert (cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_CANNOT_START, cli.EXIT_DEAD_LETTERS) == (
        0,
        1,
        2,
        3,
    )
    assert set(cli.EXIT_CODES) == {0, 1, 2, 3}
    assert main(["translate", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse rewraps the epilog
    for code, meaning in cli.EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in text


def test_every_record_out_exits_0(workdir, models, capsys):
    args, output = _args(workdir, models, workdir / "good.tsv", "good")
    assert main(args) == cli.EXIT_OK
    summary = json.loads((workdir / "good.jsonl.summary.json").read_text())
    assert (summary["records_in"], summary["records_out"], summary["records_failed"]) == (4, 4, 0)
    assert [row["id"] for row in record_io.read_jsonl(str(output))] == ["1", "2", "3", "4"]
    assert "specdec: error" not in capsys.readouterr().err


def test_dead_letters_exit_3_and_the_summary_counts_them_per_reason(workdir, models, capsys):
    lines = [SENTENCES[0][0].encode(), b"", b"caf\xe9", SENTENCES[1][0].encode(), b"  "]
    path = workdir / "some_bad.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    args, output = _args(workdir, models, path, "some_bad")
    assert main(args) == cli.EXIT_DEAD_LETTERS
    err = capsys.readouterr().err
    assert (
        "specdec: error: 3 of 5 records went to the dead letters (2 empty, 1 invalid_utf8)" in err
    )
    summary = json.loads((workdir / "some_bad.jsonl.summary.json").read_text())
    assert summary["failed_by_reason"] == {"empty": 2, "invalid_utf8": 1}
    assert (summary["records_out"], summary["records_failed"]) == (2, 3)
    assert sorted(row["id"] for row in record_io.read_jsonl(str(output))) == ["1", "4"]


def test_every_record_dead_also_exits_3(workdir, models, capsys):
    path = workdir / "all_bad.txt"
    path.write_bytes(b"\n\xff\xfe\n")
    args, _ = _args(workdir, models, path, "all_bad")
    assert main(args) == cli.EXIT_DEAD_LETTERS
    err = capsys.readouterr().err
    assert "specdec: error: all 2 records went to the dead letters (1 empty, 1 invalid_utf8)" in err


def _cannot_start(capsys, args, message):
    assert main(args) == cli.EXIT_CANNOT_START
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err, err


def test_missing_or_unreadable_input_exits_2(workdir, models, capsys):
    args, _ = _args(workdir, models, workdir / "nope.tsv", "nope")
    _cannot_start(capsys, args, f"input file not found: {workdir / 'nope.tsv'}")
    args, _ = _args(workdir, models, workdir, "folder")
    _cannot_start(capsys, args, f"input file is a directory, not a file: {workdir}")
    (workdir / "empty.txt").write_bytes(b"")
    args, _ = _args(workdir, models, workdir / "empty.txt", "empty")
    _cannot_start(capsys, args, "no records in")


def test_missing_checkpoint_and_bad_config_exit_2(workdir, models, capsys):
    untrained = workdir / "untrained.yaml"
    untrained.write_text(
        f"name: untrained\nmodel:\n  vocab_size: 8000\ncheckpoint:\n  export_dir: {workdir}/none\n"
    )
    args, _ = _args(workdir, models, workdir / "good.tsv", "untrained")
    args[args.index("--target") + 1] = str(untrained)
    _cannot_start(capsys, args, f"has no checkpoint at {workdir}/none")
    bad = workdir / "bad_key.yaml"
    bad.write_text("family: t5\nmodel:\n  vocab_size: 8000\n  emb_dimension: 8\n")
    args[args.index("--target") + 1] = str(bad)
    _cannot_start(capsys, args, f"{bad}: unknown key model.emb_dimension")
    args, _ = _args(workdir, models, workdir / "good.tsv", "flag")
    _cannot_start(capsys, [*args, "--gamma", "-1"], "--gamma must be >= 0, got -1")


def test_a_pipeline_failure_exits_1_and_keeps_the_finished_records(
    workdir, models, capsys, monkeypatch
):
    def broken(records, *, job, handler, parts=None):
        part_files.start_parts(parts, translate.resume_settings(job))
        raise RuntimeError("disk on fire")  # the fault: the pipeline raises

    monkeypatch.setattr(transforms, "run_pipeline", broken)  # translate imports it per job
    args, output = _args(workdir, models, workdir / "good.tsv", "broken")
    assert main(args) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "specdec: error: the pipeline failed (RuntimeError: disk on fire)" in err
    assert f"kept in {output}.parts: rerun the same command to continue" in err
    assert not output.exists()
