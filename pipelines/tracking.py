"""MLflow helpers shared by every job: a local SQLite store, runs with params and tags.

MLflow 3.13+ refuses the old ``./mlruns`` file store, so the default tracking URI is a
SQLite database under the run folder (``runs/mlflow.db``); browse it with
``mlflow ui --backend-store-uri sqlite:///<abs>/runs/mlflow.db``.

Jobs use :class:`OptionalRun`: when the store cannot be written or the server does not
answer, the job goes on without a run, warns once and keeps the reason; ``specdec
log-run`` logs the run later from the saved summary.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import pathlib
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
MAX_PARAM_CHARS = 500  # MLflow rejects longer param values (limit 6000 in 3.x; keep short)


def default_tracking_uri(run_dir: str | pathlib.Path = "runs") -> str:
    """``sqlite:///<abs run_dir>/mlflow.db``; a relative run_dir is under the repo root."""
    run_dir = pathlib.Path(run_dir)
    if not run_dir.is_absolute():
        run_dir = REPO_ROOT / run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"


def git_commit(repo: str | pathlib.Path = REPO_ROOT) -> str:
    """``git rev-parse HEAD`` of ``repo``, or ``"unknown"`` outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def flatten_params(params: Mapping[str, Any], *, prefix: str = "") -> dict[str, str]:
    """Nested dicts -> ``{"a.b": "value"}``; values as strings cut at MAX_PARAM_CHARS."""
    flat: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, prefix=f"{name}."))
        else:
            text = str(value)
            if len(text) > MAX_PARAM_CHARS:
                text = text[: MAX_PARAM_CHARS - 3] + "..."
            flat[name] = text
    return flat


def artifact_root(tracking_uri: str) -> str | None:
    """``<db folder>/mlartifacts`` for a SQLite store (else MLflow's default, ./mlruns)."""
    prefix = "sqlite:///"
    if not tracking_uri.startswith(prefix):
        return None
    return str(pathlib.Path(tracking_uri[len(prefix) :]).resolve().parent / "mlartifacts")


# MLflow 3's UI opens an experiment without this tag in its GenAI view ("Evaluation
# runs", traces); this kind opens the classic run list (params, metrics, artifacts).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


# The run list's columns. MLflow keeps the columns a user picks in the browser's local
# storage, and an experiment cannot set them; what it can hold is a shared view
# (the UI's "Share" button: an experiment tag ``mlflow.sharedViewState.<key>``) that
# ``#/experiments/<id>/runs?viewStateShareKey=<key>`` opens. ``specdec`` writes one.
VIEW_KEY = "specdec"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
_JOB_COLUMNS = (
    "metrics.speedup metrics.alpha metrics.tokens_per_s metrics.baseline_tokens_per_s "
    "metrics.bleu metrics.rouge1 metrics.rougeL params.gamma params.target_name "
    "params.draft_name params.temperature"
).split()
RUN_LIST_COLUMNS: dict[str, list[str]] = {
    "translate": _JOB_COLUMNS,
    "summarize": _JOB_COLUMNS,
    "acceptance-study": (
        "metrics.alpha metrics.alpha_ci_low metrics.alpha_ci_high metrics.empirical_acceptance "
        "metrics.optimal_gamma metrics.predicted_improvement metrics.c params.target "
        "params.draft params.temperature"
    ).split(),
}


def run_list_view(columns: Sequence[str]) -> str:
    """The shared view's JSON: ``kind.name`` columns shown, newest run first."""
    selected = ["attributes.`Source`"] + [
        "{}.`{}`".format(*column.split(".", 1)) for column in columns
    ]
    return json.dumps(
        {"selectedColumns": selected, "orderByKey": "attributes.start_time", "orderByAsc": False}
    )


def run_list_path(experiment_id: str) -> str:
    """The UI's path (after the host) to an experiment's run list with specdec's columns."""
    return (
        f"/#/experiments/{experiment_id}/runs?viewStateShareKey={VIEW_KEY}"
        "&workflowType=machine_learning"
    )


def ensure_experiment(name: str, tracking_uri: str) -> str:
    """The experiment's id; created, with its artifacts beside a SQLite store, if absent
    (MLflow's default would put them in ./mlruns of whatever folder a job ran in).

    The experiment is tagged :data:`EXPERIMENT_KIND` so that the UI shows it as a run
    list; an existing experiment without the tag gets it too. Experiments named in
    :data:`RUN_LIST_COLUMNS` get the shared view :func:`run_list_path` opens.
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(name)
    tags = {}
    if name in RUN_LIST_COLUMNS:
        tags[VIEW_TAG] = run_list_view(RUN_LIST_COLUMNS[name])
    if experiment is None:
        return client.create_experiment(
            name,
            artifact_location=artifact_root(tracking_uri),
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND, **tags},
        )
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        tags[EXPERIMENT_KIND_TAG] = EXPERIMENT_KIND
    for key, value in tags.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment.experiment_id, key, value)
    return experiment.experiment_id


@contextlib.contextmanager
def start_run(
    experiment: str,
    *,
    run_name: str | None = None,
    params: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    tracking_uri: str | None = None,
) -> Iterator[Any]:
    """Opens an MLflow run in ``experiment`` (created if absent); yields the active run.

    Logs ``params`` flattened and tags ``git_commit`` plus ``tags``. The tracking URI
    defaults to :func:`default_tracking_uri`.
    """
    with _begin(
        experiment, run_name=run_name, params=params, tags=tags, tracking_uri=tracking_uri
    ) as run:
        yield run


def _begin(experiment, *, run_name, params, tags, tracking_uri, experiment_id=None):
    """Starts the active run (experiment created if absent, params and tags logged);
    ``experiment_id``: what :func:`ensure_experiment` already returned for it."""
    import mlflow

    tracking_uri = tracking_uri or default_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    if experiment_id is None:
        experiment_id = ensure_experiment(experiment, tracking_uri)
    mlflow.set_experiment(experiment_id=experiment_id)
    all_tags = {"git_commit": git_commit(), **(tags or {})}
    run = mlflow.start_run(run_name=run_name, tags=all_tags)
    try:
        if params:
            mlflow.log_params(flatten_params(params))
    except BaseException:
        _end_quietly("FAILED")
        raise
    return run


def _end_quietly(status: str) -> None:
    """Ends the active run; an unreachable store still leaves no run active here."""
    import mlflow

    try:
        mlflow.end_run(status)
    except Exception:  # the run was popped before the store was asked
        pass


def describe_error(error: BaseException) -> str:
    """``Type: first line of the message`` (at most 300 characters)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


class OptionalRun:
    """An MLflow run a job can do without.

    Used as a context manager around the job. The first MLflow failure (the store
    cannot be written, the server does not answer) is kept in ``error``, warned about
    once on stderr (with ``hint``), and turns every later :meth:`call` into a no-op;
    ``run_id`` is then None. An exception from the job itself ends the run as FAILED.
    ``store``: :func:`ensure_experiment` already started in the background (a
    :class:`workers.background.Background`), awaited on entry; its failure is the run's.
    """

    def __init__(
        self,
        experiment: str,
        *,
        run_name: str | None = None,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        tracking_uri: str | None = None,
        hint: str = "",
        store=None,
    ):
        self._begin = functools.partial(
            _begin,
            experiment,
            run_name=run_name,
            params=params,
            tags=tags,
            tracking_uri=tracking_uri,
        )
        self.tracking_uri, self.hint = tracking_uri, hint
        self.store = store  # a workers.background.Background of ensure_experiment, or None
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.error: str | None = None

    def __enter__(self) -> OptionalRun:
        try:
            # the store and experiment, set up in the background: their id
            experiment_id = None if self.store is None else self.store.wait()
            info = self._begin(experiment_id=experiment_id).info
            self.run_id, self.experiment_id = info.run_id, info.experiment_id
        except Exception as error:
            self._fail(error)
        return self

    def call(self, function, *args, **kwargs) -> Any:
        """``function(*args, **kwargs)`` against the active run, unless MLflow failed."""
        if self.run_id is None:
            return None
        try:
            return function(*args, **kwargs)
        except Exception as error:
            self._fail(error)
            return None

    def _fail(self, error: BaseException) -> None:
        self.error = describe_error(error)
        if self.run_id is not None:
            _end_quietly("FAILED")
        self.run_id = None
        log.warning(
            "specdec: warning: MLflow unavailable at %s (%s); the job goes on without an "
            "MLflow run%s",
            self.tracking_uri,
            self.error,
            self.hint,
        )

    def __exit__(self, exc_type, exc, traceback) -> bool:
        if self.run_id is not None:
            status = "FINISHED" if exc_type is None else "FAILED"
            try:
                import mlflow

                mlflow.end_run(status)
            except Exception as error:
                if exc_type is None:
                    self._fail(error)
                else:
                    self.run_id = None
        return False


def log_metrics(metrics: Mapping[str, Any], step: int | None = None) -> None:
    """Logs scalar metrics (numpy/JAX scalars converted to float) to the active run."""
    import mlflow

    mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)
