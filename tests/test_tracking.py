"""pipelines.tracking against a real SQLite MLflow store, read back with MlflowClient."""

from __future__ import annotations

import json
import pathlib

from pipelines import tracking


def test_default_tracking_uri_is_sqlite_under_the_run_dir(tmp_path):
    uri = tracking.default_tracking_uri(tmp_path / "runs")
    assert uri == f"sqlite:///{(tmp_path / 'runs').resolve()}/mlflow.db"
    assert (tmp_path / "runs").is_dir()


def test_flatten_params_nests_and_truncates():
    flat = tracking.flatten_params({"a": {"b": 1, "c": {"d": "x"}}, "long": "y" * 900})
    assert flat["a.b"] == "1"
    assert flat["a.c.d"] == "x"
    assert len(flat["long"]) == tracking.MAX_PARAM_CHARS
    assert flat["long"].endswith("...")


def test_start_run_logs_params_tags_and_metrics(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = tracking.default_tracking_uri(tmp_path)
    params = {"model": {"emb_dim": 512, "mlp_activations": ("gelu", "linear")}, "lr": 1e-3}
    with tracking.start_run(
        "train", run_name="tiny", params=params, tags={"model": "tiny"}, tracking_uri=uri
    ) as run:
        tracking.log_metrics({"loss": 2.5, "accuracy": 0.25}, step=10)
        tracking.log_metrics({"loss": 1.5}, step=20)
    client = MlflowClient(tracking_uri=uri)
    stored = client.get_run(run.info.run_id)
    assert client.get_experiment(stored.info.experiment_id).name == "train"
    assert stored.info.run_name == "tiny"
    assert stored.data.params == {
        "model.emb_dim": "512",
        "model.mlp_activations": "('gelu', 'linear')",
        "lr": "0.001",
    }
    assert stored.data.tags["model"] == "tiny"
    assert stored.data.tags["git_commit"] == tracking.git_commit()
    history = client.get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(10, 2.5), (20, 1.5)]
    assert stored.data.metrics["accuracy"] == 0.25


def test_git_commit_outside_a_repository_is_unknown(tmp_path: pathlib.Path):
    assert tracking.git_commit(tmp_path) == "unknown"
    assert len(tracking.git_commit()) in (40, len("unknown"))


def test_experiments_are_tagged_to_open_in_the_classic_run_view(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = tracking.default_tracking_uri(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    with tracking.start_run("translate", tracking_uri=uri) as run:
        pass
    created = client.get_experiment(run.info.experiment_id)
    assert created.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert created.artifact_location == tracking.artifact_root(uri)
    view = json.loads(created.tags[tracking.VIEW_TAG])  # the run list's columns
    wanted = {"metrics.`speedup`", "metrics.`alpha`", "params.`gamma`"}
    assert wanted <= set(view["selectedColumns"])
    # An experiment made before the tag existed (or by plain MLflow) gets it on next use.
    old_id = client.create_experiment("made-elsewhere")
    assert tracking.EXPERIMENT_KIND_TAG not in client.get_experiment(old_id).tags
    assert tracking.ensure_experiment("made-elsewhere", uri) == old_id
    tags = client.get_experiment(old_id).tags
    assert tags[tracking.EXPERIMENT_KIND_TAG] == tracking.EXPERIMENT_KIND
    # A kind someone chose by hand is left alone.
    client.set_experiment_tag(old_id, tracking.EXPERIMENT_KIND_TAG, "genai_development")
    tracking.ensure_experiment("made-elsewhere", uri)
    assert client.get_experiment(old_id).tags[tracking.EXPERIMENT_KIND_TAG] == "genai_development"
