"""Every ``specdec translate`` flag that no other test drives, end to end through the
CLI on the tiny pair of ``tests/test_translate_job.py`` (real Ray actors where the flag
is the Ray engine's), each with an assertion that a wrong implementation fails:

- ``--top-k`` / ``--top-p``: at T = 1, ``--top-k 1`` and a tiny ``--top-p`` leave one
  token per step, so the job must write the greedy job's outputs; a wider setting gives
  the same sampled tokens through Ray workers as in-process;
- ``--transport ray`` and ``--draft-placement worker``: the same tokens as in-process at
  T = 1, with the loop's traffic counted;
- ``--dead-letter PATH``: the records that fail land in that file, not beside the output;
- ``--vocab PATH``: the job encodes with that SentencePiece model and records it; one
  whose size is not the models' is refused before any work;
- ``--limit N``: the first N records only;
- ``--gamma 0``: the same job without speculation, through the same engine;
- ``--draft none``: the same, with no draft model: ``--gamma 0``'s tokens, named so in
  the table and MLflow, and refused beside a γ that would draft;
- without ``--quiet``: the progress lines.
"""

from __future__ import annotations

import re

import pytest

from pipelines import cli, record_io
from pipelines.cli import main
from pipelines.model_resolver import DEFAULT_VOCAB, REPO_ROOT
from tests.test_translate_job import SENTENCES, JobRun, job_args, tiny_pair

OTHER_VOCAB = REPO_ROOT / "assets" / "spm" / "ende_debian.model"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("job_flags")
    (root / "sentences.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in SENTENCES[:8]))
    good = "".join(f"{en}\t{de}\n" for en, de in SENTENCES[:4]).encode()
    (root / "with_bad.tsv").write_bytes(good + b"\t\n" + b"\xff\xfe bad\tschlecht\n")
    return root


@pytest.fixture(scope="module")
def models(workdir):
    return tiny_pair(workdir)


@pytest.fixture(scope="module")
def job(workdir, models):
    """Runs ``main`` on the tiny pair; each (input, temperature, workers, flags) once."""
    done: dict[tuple, JobRun] = {}

    def run(*flags: str, temperature=1.0, workers="inprocess", input_name="sentences.tsv"):
        key = (input_name, temperature, workers, flags)
        if key not in done:
            output = workdir / f"out{len(done)}.jsonl"
            args = job_args(
                workdir / input_name,
                output,
                models=models,
                workers=workers,
                temperature=temperature,
                tracking_uri=f"sqlite:///{workdir}/mlflow.db",
            )
            done[key] = JobRun(
                main([*args, *flags]), output, workdir / f"{output.name}.summary.json"
            )
        return done[key]

    return run


def _mlflow_params(run: JobRun) -> dict[str, str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=run.summary["tracking_uri"])
    return client.get_run(run.summary["mlflow_run_id"]).data.params


def _tokens(run: JobRun) -> dict[str, list[int]]:
    assert run.code == 0, run.code
    return {record_id: row["output_ids"] for record_id, row in run.rows.items()}


@pytest.mark.parametrize("flags", [("--top-k", "1"), ("--top-p", "1e-6")])
def test_a_filter_that_leaves_one_token_gives_the_greedy_outputs(job, flags):
    greedy = _tokens(job(temperature=0.0))
    sampled = _tokens(job(temperature=1.0))
    assert _tokens(job(*flags, temperature=1.0)) == greedy
    assert sampled != greedy  # T = 1 without the filter does sample


@pytest.mark.slow
@pytest.mark.parametrize(
    "flags",
    [
        ("--top-k", "3", "--top-p", "0.9"),
        ("--draft-placement", "worker"),
        ("--draft-placement", "coordinator", "--transport", "ray"),
    ],
)
def test_ray_flags_give_the_inprocess_tokens(ray_local, job, flags):
    sampling = tuple(f for f in flags if f.startswith("--top") or f[0].isdigit())
    ray_run = job(*flags, workers="ray")
    assert _tokens(ray_run) == _tokens(job(*sampling))
    params = _mlflow_params(ray_run)
    assert (params["workers"], params["transport"]) == (
        "ray",
        _flag(flags, "--transport", "socket"),
    )
    assert params["draft_placement"] == _flag(flags, "--draft-placement", "coordinator")
    if "--draft-placement" in flags:
        assert ray_run.summary["bytes_per_iteration"] > 0  # the loop crossed processes
        assert set(ray_run.summary["placement"]) == {"target", "draft"}


def _flag(flags: tuple[str, ...], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def test_dead_letters_go_to_the_named_file(job, workdir):
    path = workdir / "rejected" / "dead.jsonl"
    run = job("--dead-letter", str(path), input_name="with_bad.tsv")
    assert run.code == 3  # some records failed
    dead = record_io.read_jsonl(str(path))
    assert [(row["id"], row["reason"]) for row in dead] == [("5", "empty"), ("6", "invalid_utf8")]
    assert sorted(run.rows, key=int) == ["1", "2", "3", "4"]
    assert run.dead == []  # nothing at the default place beside the output
    assert run.summary["dead_letter"] == str(path)
    assert run.summary["failed_by_reason"] == {"empty": 1, "invalid_utf8": 1}


def test_vocab_names_the_sentencepiece_model_the_job_encodes_with(job, capsys):
    default = job(temperature=0.0)
    named = job("--vocab", str(DEFAULT_VOCAB), temperature=0.0)
    assert _tokens(named) == _tokens(default)
    assert _mlflow_params(named)["vocab"] == str(DEFAULT_VOCAB)
    capsys.readouterr()
    other = job("--vocab", str(OTHER_VOCAB), temperature=0.0)  # 16,000 pieces
    assert other.code == cli.EXIT_CANNOT_START and other.summary is None
    assert "vocab_size 8000 but the SentencePiece model has 16000 pieces" in capsys.readouterr().err


def test_without_quiet_the_job_prints_its_progress(workdir, models, capsys):
    def printed(output: str, *flags: str) -> str:
        args = job_args(
            workdir / "sentences.tsv",
            workdir / output,
            models=models,
            workers="inprocess",
            temperature=0.0,
            tracking_uri=f"sqlite:///{workdir}/mlflow.db",
        )
        capsys.readouterr()
        assert main([a for a in args if a != "--quiet"] + list(flags)) == 0
        out = capsys.readouterr()
        return out.out + out.err

    assert re.search(r"decoded 8/8 records \(\d+ s\)", printed("loud.jsonl"))
    assert "decoded" not in printed("quiet.jsonl", "--quiet")


@pytest.mark.parametrize("workers", ["inprocess", pytest.param("ray", marks=pytest.mark.slow)])
def test_gamma_zero_runs_the_same_job_without_speculation(request, job, workers):
    if workers == "ray":
        request.getfixturevalue("ray_local")
    run = job("--gamma", "0", "--compare-baseline", temperature=0.0, workers=workers)
    assert run.code == 0 and run.summary["identical_to_baseline"] is True
    assert run.summary["gamma_histogram"] == {"0": len({r["batch"] for r in run.rows.values()})}
    assert all(r["drafted"] == 0 and r["accepted_by_position"] == [] for r in run.rows.values())
    assert run.summary["alpha"] is None and run.summary["speedup"] > 0
    assert _tokens(run) == _tokens(job(temperature=0.0))  # the speculative job's tokens
    assert _mlflow_params(run)["gamma"] == "0"


@pytest.mark.parametrize("workers", ["inprocess", pytest.param("ray", marks=pytest.mark.slow)])
def test_draft_none_runs_the_target_alone(request, job, workers, capsys):
    if workers == "ray":
        request.getfixturevalue("ray_local")
    capsys.readouterr()
    run = job("--gamma", "0", "--draft", "none", "--compare-baseline", temperature=0.0,
              workers=workers)  # fmt: skip
    assert run.code == 0 and run.summary["identical_to_baseline"] is True
    assert "draft none" in capsys.readouterr().out  # the table's models line
    assert run.summary["gamma_histogram"] == {"0": len({r["batch"] for r in run.rows.values()})}
    assert all(r["drafted"] == 0 for r in run.rows.values())
    assert _tokens(run) == _tokens(job("--gamma", "0", temperature=0.0, workers=workers))
    params = _mlflow_params(run)
    assert params["draft_name"] == "none" and params["gamma"] == "0"


def test_draft_none_with_a_drafting_gamma_is_refused_and_without_gamma_means_zero(job, capsys):
    assert job("--draft", "none", temperature=0.0).code == cli.EXIT_CANNOT_START  # --gamma 2
    assert "--draft none runs the target alone" in capsys.readouterr().err
    parse = cli.build_parser().parse_args
    common = ["translate", "--input", "x.tsv", "--output", "y.jsonl"]
    assert cli._job_gamma(parse([*common, "--draft", "none"])) == 0
    assert cli._job_gamma(parse(common)) == "auto"
    assert cli._job_gamma(parse([*common, "--gamma", "3"])) == 3


def test_gamma_below_zero_and_gamma_zero_with_pipelined_are_refused(job, capsys):
    assert job("--gamma", "-1").code == cli.EXIT_CANNOT_START
    assert "--gamma must be >= 0" in capsys.readouterr().err
    refused = job("--gamma", "0", "--pipelined", workers="ray")
    assert refused.code == cli.EXIT_CANNOT_START
    assert "--pipelined needs a draft to propose" in capsys.readouterr().err


def test_limit_reads_only_the_first_records(job):
    run = job("--limit", "3", temperature=0.0)
    assert run.code == 0 and sorted(run.rows, key=int) == ["1", "2", "3"]
    assert run.summary["records_in"] == 3
    assert _tokens(run) == {
        k: v for k, v in _tokens(job(temperature=0.0)).items() if k in {"1", "2", "3"}
    }


@pytest.mark.parametrize(
    "temperature, flags", [(1.0, ()), (0.7, ("--top-k", "50", "--top-p", "0.9"))]
)
def test_sampling_invariant_outputs_are_the_target_alones_for_any_draft(
    job, models, temperature, flags
):
    runs = [
        job(
            "--sampling", "invariant", "--compare-baseline", *flags, *draft, temperature=temperature
        )
        for draft in ((), ("--draft", str(models["target"])))  # the noisy draft, the target
    ]
    for run in runs:
        assert run.code == 0 and run.summary["identical_to_baseline"] is True
        assert all(row["matches_baseline"] for row in run.rows.values())
    assert _tokens(runs[0]) == _tokens(runs[1])
    assert _mlflow_params(runs[0])["sampling_rule"] == "invariant"
    # the default rule is the invariant one; the paper's samples other tokens from the seed
    assert _tokens(job(*flags, temperature=temperature)) == _tokens(runs[0])
    paper = job("--sampling", "paper", *flags, temperature=temperature)
    assert _tokens(paper) != _tokens(runs[0])
    assert _mlflow_params(paper)["sampling_rule"] == "paper"


@pytest.mark.slow
def test_sampling_invariant_through_ray_gives_the_inprocess_tokens(ray_local, job):
    flags = ("--sampling", "invariant", "--gamma", "2")
    assert _tokens(job(*flags, workers="ray")) == _tokens(job(*flags))
