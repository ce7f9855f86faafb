"""``--batch-size auto`` (:mod:`pipelines.batch_choice`): the plan of a job's batches at
each size, the choice from the timed steps, and a whole job that chooses its batch size,
decodes at it and reports it, with the outputs of a job at a given size."""

from __future__ import annotations

import math

import pytest

from pipelines import batch_choice
from pipelines.cli import main
from tests.test_translate_job import SENTENCES, JobRun, job_args, tiny_pair

# two buckets in input order: bucket 1 holds lengths 5, 7, 3; bucket 2 holds 20
BUCKETS, LENGTHS = [1, 1, 2, 1], [5, 7, 20, 3]


@pytest.mark.parametrize(
    ("rows", "steps"),
    [
        (1, 5 + 7 + 20 + 3),  # every record its own batch
        (2, 7 + 20 + 3),  # [5, 7] runs 7 steps; 20 and 3 are their buckets' last batches
        (4, 7 + 20),  # one batch per bucket
    ],
)
def test_a_batch_runs_for_its_longest_record_and_buckets_batch_apart(rows, steps):
    assert batch_choice.planned_steps(BUCKETS, LENGTHS, rows) == steps


def test_the_choice_takes_the_least_predicted_time_and_a_tie_the_smaller_size():
    # at 4 rows the plan runs 27 steps, at 1 row 35: a 4-row step costing 1.2 pays
    assert batch_choice.choose({1: 1.0, 4: 1.2}, BUCKETS, LENGTHS).batch_size == 4
    # ... and one costing 1.5 does not (40.5 > 35)
    slow = batch_choice.choose({1: 1.0, 4: 1.5}, BUCKETS, LENGTHS)
    assert slow.batch_size == 1
    assert slow.planned_steps == {1: 35, 4: 27}
    assert slow.predicted_s == {1: 35.0, 4: pytest.approx(40.5)}
    assert batch_choice.choose({1: 27.0, 4: 35.0}, BUCKETS, LENGTHS).batch_size == 1  # a tie


def test_candidates_stop_at_the_first_size_that_holds_every_record():
    assert batch_choice.candidates(1) == [1]
    assert batch_choice.candidates(5) == [1, 4, 16]
    assert batch_choice.candidates(16) == [1, 4, 16]
    assert batch_choice.candidates(1000) == list(batch_choice.CANDIDATES)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: batch_choice.candidates(0), "at least one record"),
        (lambda: batch_choice.planned_steps([1], [1, 2], 1), "1 buckets for 2 lengths"),
        (lambda: batch_choice.planned_steps([1], [1], 0), "rows must be >= 1"),
        (lambda: batch_choice.choose({}, [1], [1]), "no candidate batch size"),
    ],
)
def test_bad_inputs_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_choice")
    (root / "in.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in SENTENCES))
    models = tiny_pair(root)

    def run(*flags: str) -> JobRun:
        output = root / f"out{len(list(root.glob('out*.jsonl')))}.jsonl"
        args = job_args(
            root / "in.tsv", output, models=models, workers="inprocess", temperature=0.0,
            tracking_uri=f"sqlite:///{root}/mlflow.db",
        )  # fmt: skip
        return JobRun(main([*args, *flags]), output, root / f"{output.name}.summary.json")

    return run


def test_an_auto_job_decodes_at_the_size_it_chose_and_reports_why(jobs, capsys):
    from mlflow.tracking import MlflowClient

    given = jobs("--batch-size", "4")
    capsys.readouterr()
    auto = jobs("--batch-size", "auto", "--gamma", "auto")
    table = capsys.readouterr().out
    assert auto.code == 0 and given.code == 0
    # the same outputs as a job at a given size (T = 0: the target's greedy tokens)
    assert {i: r["output_ids"] for i, r in auto.rows.items()} == {
        i: r["output_ids"] for i, r in given.rows.items()
    }
    choice = auto.summary["batch_choice"]
    sizes = [int(b) for b in choice["step_ms"]]
    assert sizes == batch_choice.candidates(len(SENTENCES)) == [1, 4, 16, 64]
    predicted = {int(b): s for b, s in choice["predicted_s"].items()}
    assert choice["batch_size"] == min(predicted, key=lambda b: (predicted[b], b))
    # the 20 sentences share one length bucket: ceil(20 / size) batches were decoded
    batches = sum(auto.summary["gamma_histogram"].values())
    assert batches == math.ceil(len(SENTENCES) / choice["batch_size"])
    assert f"batch=auto ({choice['batch_size']})" in table
    run = MlflowClient(tracking_uri=auto.summary["tracking_uri"]).get_run(
        auto.summary["mlflow_run_id"]
    )
    assert run.data.params["batch_size"] == "auto"
    assert run.data.metrics["batch_size_chosen"] == choice["batch_size"]
    assert given.summary["batch_choice"] is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "argument --batch-size: --batch-size must be >= 1, got 0"),
        ("many", "argument --batch-size: --batch-size must be auto or int, got 'many'"),
    ],
)
def test_a_bad_batch_size_exits_2_with_the_flag_named(tmp_path, capsys, value, message):
    args = job_args(
        tmp_path / "in.tsv", tmp_path / "out.jsonl", models={"target": "t", "draft": "d"},
        workers="inprocess", temperature=0.0, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
    )  # fmt: skip
    assert main([*args, "--batch-size", value]) == 2
    assert message in capsys.readouterr().err
