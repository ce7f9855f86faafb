"""A job whose MLflow store cannot be written, or whose tracking server does not
answer, still writes every output, warns once, exits 0 and says why in its summary;
``specdec log-run`` logs the run afterwards into a real SQLite store.
"""

import json
import re
import socket
import time

import pytest

from pipelines import cli, record_io
from pipelines.cli import main
from tests.test_translate_job import SENTENCES, job_args, tiny_pair

WARNING = "specdec: warning: MLflow unavailable"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow_unavailable")
    (root / "in.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in SENTENCES[:6]))
    return root


@pytest.fixture(scope="module")
def models(workdir):
    return tiny_pair(workdir)


def _run(workdir, models, name, tracking_uri, *, summary=True):
    output = workdir / f"{name}.jsonl"
    args = job_args(
        workdir / "in.tsv",
        output,
        models=models,
        workers="inprocess",
        temperature=0.0,
        tracking_uri=tracking_uri,
    )
    if not summary:  # the job then writes <output>.summary.json because MLflow failed
        at = args.index("--summary-json")
        del args[at : at + 2]
    return main(args), output, workdir / f"{name}.jsonl.summary.json"


def _unwritable_store(workdir) -> str:
    """A SQLite URI no process can create: its folder is a regular file (a read-only
    folder would not stop root, which the tests may run as)."""
    blocker = workdir / "not_a_folder"
    blocker.write_text("a file where the store's folder should be\n")
    return f"sqlite:///{blocker}/mlflow.db"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


def _check_job_without_mlflow(code, output, summary_path, err):
    assert code == cli.EXIT_OK
    rows = record_io.read_jsonl(str(output))
    assert [row["id"] for row in rows] == [str(i) for i in range(1, 7)]
    assert all(row["output_ids"] and row["tokens"] > 0 for row in rows)
    assert record_io.read_jsonl(record_io.default_dead_letter_path(str(output))) == []
    assert err.count(WARNING) == 1, err
    assert f"specdec log-run --summary-json {summary_path}" in err
    summary = json.loads(summary_path.read_text())
    assert summary["mlflow_run_id"] is None
    assert isinstance(summary["mlflow_error"], str) and summary["mlflow_error"]
    assert summary["mlflow_pending"]["experiment"] == "translate"
    assert (summary["records_out"], summary["records_failed"]) == (6, 0)
    return summary


def test_an_unwritable_store_leaves_the_outputs_and_says_why(workdir, models, capfd):
    code, output, summary_path = _run(workdir, models, "ro", _unwritable_store(workdir))
    out, err = capfd.readouterr()
    assert "MLflow run" in out and "(specdec log-run logs it later)" in out
    summary = _check_job_without_mlflow(code, output, summary_path, err)
    reason = summary["mlflow_error"]  # MLflow fails making the folder, or SQLite opening it
    assert "not_a_folder" in reason or reason.startswith("OperationalError"), reason
    # log-run against a store still unavailable: an error, and the summary unchanged
    args = [
        "log-run",
        "--summary-json",
        str(summary_path),
        "--tracking-uri",
        summary["tracking_uri"],
    ]
    assert main(args) == cli.EXIT_FAILED
    assert "specdec: error: " in capfd.readouterr().err
    assert json.loads(summary_path.read_text()) == summary


def test_a_tracking_server_that_does_not_answer(workdir, models, capfd, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    uri = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    code, output, summary_path = _run(workdir, models, "http", uri, summary=False)
    assert time.monotonic() - started < 120
    err = capfd.readouterr().err
    summary = _check_job_without_mlflow(code, output, summary_path, err)
    assert summary["tracking_uri"] == uri
    assert f"MLflow unavailable at {uri}" in err


def test_log_run_logs_the_saved_run_as_the_job_would_have(workdir, models, capfd, tmp_path):
    from mlflow.tracking import MlflowClient

    store = f"sqlite:///{workdir}/later.db"
    code, _, summary_path = _run(workdir, models, "later", _unwritable_store(workdir))
    assert code == cli.EXIT_OK
    capfd.readouterr()
    assert main(["log-run", "--summary-json", str(summary_path), "--tracking-uri", store]) == 0
    out = capfd.readouterr().out.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", out), out
    summary = json.loads(summary_path.read_text())
    assert summary["mlflow_run_id"] == out and summary["mlflow_error"] is None
    assert "mlflow_pending" not in summary and summary["tracking_uri"] == store

    # The same job with the store working: the run logged later has the same params,
    # the same metrics (timings aside) and the same artifacts.
    code, _, direct_path = _run(workdir, models, "direct", store)
    assert code == cli.EXIT_OK
    direct_id = json.loads(direct_path.read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=store)
    later, direct = client.get_run(out), client.get_run(direct_id)
    assert later.info.status == "FINISHED"
    assert client.get_experiment(later.info.experiment_id).name == "translate"
    ignore = {"git_commit"}  # another commit may land between the two runs
    assert {k: v for k, v in later.data.params.items() if k not in ignore} == {
        k: v for k, v in direct.data.params.items() if k not in ignore
    }
    assert set(later.data.metrics) == set(direct.data.metrics)
    for key in ("records_out", "records_failed", "tokens", "alpha", "mean_accepted_length"):
        assert later.data.metrics[key] == pytest.approx(direct.data.metrics[key]), key
    assert later.data.tags["logged_by"] == "specdec log-run"

    def artifacts(run_id):
        return {a.path for a in client.list_artifacts(run_id)}

    assert artifacts(out) == artifacts(direct_id)
    assert {"summary.json", "samples.json", "job_config.json", "model_configs"} <= artifacts(out)
    logged = json.loads(open(client.download_artifacts(out, "summary.json", str(tmp_path))).read())
    assert logged["mlflow_run_id"] == out and logged["records_out"] == 6

    # A second log-run refuses: the run exists.
    assert main(["log-run", "--summary-json", str(summary_path), "--tracking-uri", store]) == 2
    assert f"already logged as MLflow run {out}" in capfd.readouterr().err
