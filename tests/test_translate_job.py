"""The translate/summarize Beam jobs end to end through ``specdec`` (``cli.main``).

Models are tiny random T5s (``t5_tiny_test`` shapes, vocab 8000 = the committed
SentencePiece model), given as model config YAMLs with T5X checkpoints written here:
the draft is the target's weights plus Gaussian noise of 0.1 std per tensor, so drafts
are often but not always accepted (α ≈ 0.35 at T=0, ≈ 0.75 at T=1) and both the
accept and the recovery paths run. All 20 sentences fit one 16-token length bucket,
so each engine compiles one shape.
"""

import dataclasses
import json
import pathlib
import re

import numpy as np
import pytest
import yaml

from pipelines import (
    inference,
    job_config,
    job_prediction,
    job_report,
    job_table,
    record_io,
    text,
    transforms,
)
from pipelines.cli import main
from pipelines.job_summary import JobSummary
from pipelines.model_resolver import DEFAULT_VOCAB
from specdec_core import costs as speculative_costs
from specdec_core import theory
from workers.batching import DecodeSettings, Generation
from workers.engine import EngineConfig

SENTENCES = [
    ("She swept from the room.", "Sie rauschte aus dem Zimmer."),
    ("Feel at home!", "Fühlen Sie sich wie zu Hause!"),
    ("I had to swallow a lot.", "Ich musste viel hinunterschlucken."),
    ("Wear suitable protective clothing.", "Bei der Arbeit geeignete Schutzkleidung tragen."),
    ("Deal with him kindly.", "Geh freundlich mit ihm um."),
    ("Handle with care.", "Bitte vorsichtig behandeln!"),
    ("It serves no purpose.", "Es hat keinen Zweck."),
    ("Her mind is in the gutter.", "Sie hat ziemlich versaute Gedanken."),
    ("I wish I could stay.", "Ich würde ja gerne noch bleiben."),
    ("Who is in the cast?", "Wer spielt mit?"),
    ("It left me speechless.", "Ich bin aus allen Wolken gefallen."),
    ("Just drive carefully!", "Fahr schön vorsichtig!"),
    ("That's nothing to me!", "Das macht mir nichts aus!"),
    ("Do give over with that one!", "Hör mir damit auf!"),
    ("He's well off.", "Es geht ihm gut."),
    ("No paper error!", "Fehler: Kein Papier!"),
    ("Wear suitable protective clothing.", "Geeignete Schutzkleidung tragen."),
    ("I wish I could stay.", "Ich wäre gern geblieben."),
    ("Feel at home!", "Mach es dir bequem!"),
    ("It serves no purpose.", "Es ist zwecklos."),
]
GAMMA, BATCH, MAX_NEW, SEED = 3, 4, 8, 7
PRESET = "t5_tiny_test:vocab_size=8000"  # for the CLI error tests (random init)
DRAFT_NOISE = 0.1  # × each tensor's std
SUMMARY_KEYS = set(
    "records_in records_out records_failed speedup alpha accepted_per_drafted "
    "mean_accepted_length tokens_per_s "
    "baseline_tokens_per_s bleu identical_to_baseline mlflow_run_id".split()
)
ROW_KEYS = {"id", "source", "output", "reference", "tokens", "iterations", "accepted", "wall_ms"}


class JobRun:
    """Exit code, summary, output rows by id and dead letters of one CLI job."""

    def __init__(self, code: int, output, summary_path):
        self.code = code
        self.summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
        self.rows = {row["id"]: row for row in record_io.read_jsonl(str(output))}
        self.dead = record_io.read_jsonl(record_io.default_dead_letter_path(str(output)))


def job_args(input_path, output, *, models, workers, temperature, tracking_uri, kind="translate"):
    return [
        kind,
        "--input", str(input_path),
        "--output", str(output),
        "--target", str(models["target"]),
        "--draft", str(models["draft"]),
        "--workers", workers,
        "--temperature", str(temperature),
        "--gamma", str(GAMMA),
        "--batch-size", str(BATCH),
        "--max-new-tokens", str(MAX_NEW),
        "--seed", str(SEED),
        "--tracking-uri", tracking_uri,
        "--summary-json", f"{output}.summary.json",
        "--quiet",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("translate_job")
    (root / "sentences.tsv").write_text("".join(f"{en}\t{de}\n" for en, de in SENTENCES))
    return root


def _write_model(root, name: str, config, params, **extra) -> pathlib.Path:
    """A model config YAML whose export folder holds ``params`` as a T5X checkpoint
    (``extra``: more top-level keys)."""
    from specdec_core import checkpoints

    checkpoints.save_t5x(params, root / "checkpoints" / name, step=1)
    fields = {
        k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(config).items()
    }
    body = {
        "name": name,
        "family": "t5",
        "model": fields,
        "checkpoint": {"export_dir": str(root / "checkpoints" / name)},
        **extra,
    }
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def tiny_pair(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Model YAMLs ``tiny_target`` and ``tiny_draft`` (target + noise) with checkpoints
    under ``root``: the job tests' pair (t5_tiny_test, 8k vocabulary)."""
    import jax

    from specdec_core.models import registry, t5

    config = registry.get_config("t5_tiny_test", vocab_size=8000)
    params = jax.tree_util.tree_map(np.asarray, t5.init_params(config, jax.random.key(0)))
    rng = np.random.default_rng(0)
    noisy = jax.tree_util.tree_map(
        lambda x: (x + DRAFT_NOISE * x.std() * rng.standard_normal(x.shape)).astype(x.dtype), params
    )
    return {
        "target": _write_model(root, "tiny_target", config, params),
        # a tiny job has too few batches to earn back compiling a speculative loop, and
        # --gamma auto would leave it to the target alone (workers.gamma): priced free,
        # the job tests' auto jobs speculate
        "draft": _write_model(
            root, "tiny_draft", config, noisy, gamma_prior={"loop_compile_s": 0.0}
        ),
    }


@pytest.fixture(scope="module")
def models(workdir):
    """Model YAMLs ``tiny_target`` and ``tiny_draft`` (target + noise) with checkpoints."""
    return tiny_pair(workdir)


@pytest.fixture(scope="module")
def tracking_uri(workdir):
    return f"sqlite:///{workdir}/mlflow.db"


@pytest.fixture(scope="module")
def run_job(workdir, models, tracking_uri):
    """Runs each (workers, temperature) job once per module; later calls reuse it."""
    done: dict[tuple, JobRun] = {}

    def run(workers: str, temperature: float, *extra: str) -> JobRun:
        key = (workers, temperature, extra)
        if key not in done:
            output = workdir / f"{workers}_t{temperature}.jsonl"
            args = job_args(
                workdir / "sentences.tsv",
                output,
                models=models,
                workers=workers,
                temperature=temperature,
                tracking_uri=tracking_uri,
            )
            done[key] = JobRun(
                main([*args, *extra]), output, output.with_suffix(".jsonl.summary.json")
            )
        return done[key]

    return run


def test_sentences_fit_one_length_bucket():
    processor = text.sentencepiece(str(DEFAULT_VOCAB))
    lengths = [len(text.encode(processor, job_config.TRANSLATE.prefix, en)) for en, _ in SENTENCES]
    assert max(lengths) <= text.LENGTH_BUCKET and min(lengths) > 0


def test_greedy_job_writes_every_record_and_equals_the_baseline(run_job):
    job = run_job("inprocess", 0.0, "--compare-baseline")
    assert job.code == 0
    assert job.dead == []
    assert sorted(job.rows, key=int) == [str(i) for i in range(1, 21)]
    processor = text.sentencepiece(str(DEFAULT_VOCAB))
    for number, (en, de) in enumerate(SENTENCES, start=1):
        row = job.rows[str(number)]
        assert ROW_KEYS <= set(row)
        assert (row["source"], row["reference"]) == (en, de)
        assert row["tokens"] == len(row["output_ids"]) <= MAX_NEW
        assert row["output"] == text.decode(processor, row["output_ids"], text.EOS_ID)
        assert row["matches_baseline"] and row["baseline_output"] == row["output"]
        assert row["drafted"] == GAMMA * row["iterations"]
    summary = job.summary
    accepted = sum(r["accepted"] for r in job.rows.values())
    drafted = sum(r["drafted"] for r in job.rows.values())
    iterations = sum(r["iterations"] for r in job.rows.values())
    assert (summary["records_in"], summary["records_out"], summary["records_failed"]) == (20, 20, 0)
    assert summary["identical_to_baseline"] is True
    full = sum(r["accepted_by_position"][-1] for r in job.rows.values())
    assert summary["alpha"] == pytest.approx(accepted / (accepted + iterations - full))
    assert summary["accepted_per_drafted"] == pytest.approx(accepted / drafted)
    # drafted counts the positions after a rejection, which are never tested
    assert summary["accepted_per_drafted"] <= summary["alpha"]
    assert 0.1 < summary["alpha"] < 0.9  # the noisy draft: often, not always, accepted
    assert summary["mean_accepted_length"] == pytest.approx((accepted + iterations) / iterations)
    assert summary["speedup_loop"] == pytest.approx(
        summary["tokens_per_s"] / summary["baseline_tokens_per_s"]
    )
    # the headline: the whole decode paths, as the job's phases timed them
    phases, tokens = summary["time_breakdown"], sum(r["tokens"] for r in job.rows.values())
    assert summary["decode_path_s"] == phases["decode"] > 0
    assert summary["baseline_path_s"] == phases["baseline"] > 0
    assert summary["speedup"] == pytest.approx(phases["baseline"] / phases["decode"])  # T = 0
    assert summary["decode_path_s"] >= summary["tokens"] / summary["tokens_per_s"]
    assert tokens == summary["tokens"]
    assert summary["tokens_per_s"] > 0 and summary["baseline_tokens_per_s"] > 0
    assert 0.0 <= summary["bleu"] < 5.0  # random weights: (almost) no n-gram matches
    assert summary["rouge1"] is None and summary["bytes_per_iteration"] is None
    assert re.fullmatch(r"[0-9a-f]{32}", summary["mlflow_run_id"])
    assert SUMMARY_KEYS <= set(summary)
    # the JSON is the typed summary, every field of it (log-run's field only where MLflow failed)
    fields = {f.name for f in dataclasses.fields(JobSummary)}
    assert set(summary) == fields - {"mlflow_pending"}
    assert JobSummary.from_mapping(summary).to_dict() == summary
    # the cost model's prediction, from the model calls timed after the run
    assert summary["predicted_speedup"] > 0 and summary["baseline_at_limit"] > 0
    assert summary["efficiency"] == pytest.approx(
        summary["speedup_loop"] / summary["predicted_speedup"]
    )
    assert set(summary["step_costs_ms"]["target"]) == {"1", "2", str(GAMMA + 1)}
    assert summary["step_costs_ms"]["measured_in"] == "in-process engine"
    assert summary["time_breakdown"]["cost_probe"] > 0


def test_the_printed_time_counts_from_the_process_start(run_job):
    summary = run_job("inprocess", 0.0, "--compare-baseline").summary
    phases = summary["time_breakdown"]
    printed = job_table._job_time(JobSummary.from_mapping(summary))  # the table's first line
    total = float(printed.split(" s after the process started")[0])
    before = phases["startup"] + phases.get("ray_start", 0.0)  # imports, Ray's start
    assert total == pytest.approx(summary["job_s"] + before, abs=0.05)
    assert total > summary["first_record_s"] > phases["startup"]
    assert f"first record at {summary['first_record_s']:.1f} s" in printed


def test_mlflow_run_has_params_metrics_and_artifacts(run_job, models, tracking_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    job = run_job("inprocess", 0.0, "--compare-baseline")
    client = MlflowClient(tracking_uri=tracking_uri)
    run = client.get_run(job.summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "translate"
    metrics, params = run.data.metrics, run.data.params
    for key in (
        "speedup",
        "alpha",
        "mean_accepted_length",
        "tokens_per_s",
        "baseline_tokens_per_s",
        "c_estimate",
        "bleu",
    ):
        assert metrics[key] == pytest.approx(job.summary[key]), key
    assert (
        metrics["records_out"],
        metrics["records_failed"],
        metrics["identical_to_baseline"],
    ) == (20.0, 0.0, 1.0)
    assert metrics["acceptance_at_position_1"] == pytest.approx(
        job.summary["acceptance_by_position"][0]
    )
    assert (params["gamma"], params["temperature"], params["batch_size"], params["seed"]) == (
        "3",
        "0.0",
        "4",
        "7",
    )
    assert (params["target_name"], params["draft_name"]) == ("tiny_target", "tiny_draft")
    assert params["draft_source"] == str(models["draft"])
    assert params["target_checkpoint"] == str(models["target"].parent / "checkpoints/tiny_target")
    assert params["dataset"].endswith("sentences.tsv") and params["workers"] == "inprocess"
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", params["git_commit"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {
        "job_config.json",
        "samples.json",
        "summary.json",
        "acceptance_by_position.png",
        "acceptance_by_position.csv",
        "model_configs",
    } <= artifacts
    samples = json.loads(
        open(client.download_artifacts(run.info.run_id, "samples.json", str(tmp_path))).read()
    )
    assert len(samples["data"]) == 20 and samples["columns"][:3] == ["id", "source", "output"]
    config = json.loads(
        open(client.download_artifacts(run.info.run_id, "job_config.json", str(tmp_path))).read()
    )
    assert config["target_config"]["vocab_size"] == config["draft_config"]["vocab_size"] == 8000
    assert config["draft_checkpoint"] == str(models["draft"].parent / "checkpoints/tiny_draft")


def _assert_same_records(job: JobRun, expected: JobRun) -> None:
    assert job.code == 0 and job.dead == []
    assert sorted(job.rows) == sorted(expected.rows)
    for record_id, row in expected.rows.items():
        other = job.rows[record_id]
        assert (other["output_ids"], other["iterations"], other["accepted"]) == (
            row["output_ids"],
            row["iterations"],
            row["accepted"],
        ), record_id


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ray_workers_give_the_inprocess_outputs(ray_local, run_job, temperature):
    inprocess = (
        run_job("inprocess", temperature)
        if temperature
        else run_job("inprocess", 0.0, "--compare-baseline")
    )
    # sampled: the pipelined loop; greedy: the cost probe, timed in the workers
    extra = ("--pipelined",) if temperature else ("--compare-baseline",)
    ray_job = run_job("ray", temperature, *extra)
    _assert_same_records(ray_job, inprocess)
    if not temperature:
        summary = ray_job.summary
        assert summary["predicted_speedup"] > 0 and summary["identical_to_baseline"] is True
        assert summary["step_costs_ms"]["measured_in"] == "workers"
        assert set(summary["step_costs_ms"]["target"]) == {"1", "2", str(GAMMA + 1)}
    assert 0.1 < ray_job.summary["alpha"] < 0.98  # accepted and rejected drafts both occur
    # Traffic is logged, and per iteration it stays below γ vocabulary-sized vectors per row.
    assert 0 < ray_job.summary["bytes_per_iteration"] < GAMMA * BATCH * 8000 * 4
    early = ray_job.summary["early_blocks"]
    if temperature:  # pipelined: every iteration settled an early block (the draft counts)
        assert 0 < early["proposed"] and 0 <= early["kept"] <= early["proposed"], early
        assert early["kept_share"] == early["kept"] / early["proposed"]
    else:
        assert early is None


MULTI_PROCESS = ("--", "--direct_num_workers", "2", "--direct_running_mode", "multi_processing")


def test_beam_worker_processes_give_the_single_process_outputs(run_job):
    """Beam's multi-process mode: each worker process builds its own engine (in
    DoFn.setup), and what the engines did comes back as Beam metrics."""
    expected = run_job("inprocess", 1.0)
    job = run_job("inprocess", 1.0, "--compare-baseline", *MULTI_PROCESS)
    _assert_same_records(job, expected)
    phases = job.summary["time_breakdown"]
    assert phases["engine_start"] > 0 and phases["decode"] > 0, phases  # from the workers
    # no engine in this process: the cost probe loads the models here
    assert job.summary["step_costs_ms"]["measured_in"] == "job process"
    assert job.summary["predicted_speedup"] > 0
    assert 0 < job.summary["first_record_s"] < job.summary["job_s"] + phases["startup"] + 60


@pytest.mark.slow
def test_beam_worker_processes_join_the_jobs_ray_instance(ray_local, run_job):
    expected = run_job("inprocess", 1.0)
    job = run_job("ray", 1.0, *MULTI_PROCESS)
    _assert_same_records(job, expected)
    assert 0 < job.summary["bytes_per_iteration"] < GAMMA * BATCH * 8000 * 4
    assert set(job.summary["placement"]) == {"target", "draft"}
    node = ray_local.get_runtime_context().get_node_id()
    assert set(job.summary["placement"].values()) == {node}  # one node: both engines there
    assert job.summary["worker_restarts"] == {"target": 0, "draft": 0, "coordinator": 0}


def test_bad_lines_are_dead_letters_and_no_id_is_lost(workdir, models, tracking_uri):
    good = [en for en, _ in SENTENCES[:5]]
    lines = [good[0].encode(), b"", good[1].encode(), b"caf\xe9 au lait", good[2].encode(),
             b"This sentence is far too long for the sixteen tokens the job allows here.",
             good[3].encode(), b"   ", good[4].encode()]  # fmt: skip
    path = workdir / "bad.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    output = workdir / "bad_out.jsonl"
    args = job_args(
        path, output, models=models, workers="inprocess", temperature=0.0, tracking_uri=tracking_uri
    )
    job = JobRun(
        main([*args, "--max-input-tokens", "16"]), output, workdir / "bad_out.jsonl.summary.json"
    )
    assert job.code == 3  # cli.EXIT_DEAD_LETTERS: some records did not come out
    assert sorted(job.rows, key=int) == ["1", "3", "5", "7", "9"]
    assert [(d["id"], d["reason"]) for d in sorted(job.dead, key=lambda d: int(d["id"]))] == [
        ("2", "empty"),
        ("4", "invalid_utf8"),
        ("6", "too_long"),
        ("8", "empty"),
    ]
    dead = {d["id"]: d for d in job.dead}
    assert dead["4"]["detail"] == "byte 0xe9 at column 4 is not UTF-8"
    assert re.fullmatch(r"\d+ input tokens > --max-input-tokens 16", dead["6"]["detail"])
    assert job.summary["failed_by_reason"] == {"empty": 2, "invalid_utf8": 1, "too_long": 1}
    assert (
        job.summary["records_in"],
        job.summary["records_out"],
        job.summary["records_failed"],
    ) == (9, 5, 4)


def test_a_lost_record_fails_the_job_loudly(workdir, models, tracking_uri, capsys, monkeypatch):
    from mlflow.tracking import MlflowClient

    read_jsonl = record_io.read_jsonl
    monkeypatch.setattr(record_io, "read_jsonl", lambda path: read_jsonl(path)[1:])  # drop one row
    output = workdir / "lossy.jsonl"
    args = job_args(
        workdir / "sentences.tsv",
        output,
        models=models,
        workers="inprocess",
        temperature=0.0,
        tracking_uri=tracking_uri,
    )
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "specdec: error: records lost or duplicated: input ids in neither file: '" in err
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("translate")
    (run,) = client.search_runs([experiment.experiment_id], "params.dataset != ''", max_results=1)
    assert run.info.status == "FAILED" and "records_out" not in run.data.metrics


def test_summarize_job_scores_rouge_in_its_own_experiment(workdir, models, tracking_uri):
    from mlflow.tracking import MlflowClient

    path = workdir / "articles.jsonl"
    articles = [
        {"id": f"a{i}", "article": en, "summary": de} for i, (en, de) in enumerate(SENTENCES[:4])
    ]
    path.write_text("".join(json.dumps(a) + "\n" for a in articles))
    output = workdir / "summaries.jsonl"
    args = job_args(
        path,
        output,
        models=models,
        workers="inprocess",
        temperature=0.0,
        tracking_uri=tracking_uri,
        kind="summarize",
    )
    job = JobRun(main(args), output, workdir / "summaries.jsonl.summary.json")
    assert job.code == 0 and sorted(job.rows) == ["a0", "a1", "a2", "a3"]
    assert job.rows["a0"]["reference"] == SENTENCES[0][1]
    assert job.summary["bleu"] is None
    assert all(0.0 <= job.summary[k] <= 100.0 for k in ("rouge1", "rouge2", "rougeL"))
    run = MlflowClient(tracking_uri=tracking_uri).get_run(job.summary["mlflow_run_id"])
    assert (
        MlflowClient(tracking_uri=tracking_uri).get_experiment(run.info.experiment_id).name
        == "summarize"
    )
    assert run.data.metrics["rouge1"] == pytest.approx(job.summary["rouge1"])


# ------------------------------------------------------------------------ CLI errors


def _error(capsys, args) -> tuple[int, str]:
    code = main(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


def _args(workdir, *extra, target=PRESET, draft=PRESET, random_init=True):
    args = [
        "translate",
        "--input",
        str(workdir / "sentences.tsv"),
        "--output",
        str(workdir / "e.jsonl"),
    ]
    args += ["--target", target, "--draft", draft, "--workers", "inprocess"]
    return args + (["--allow-random-init"] if random_init else []) + list(extra)


def test_missing_input_file_is_a_clear_error(workdir, capsys):
    args = _args(workdir)
    args[2] = str(workdir / "missing.txt")
    code, err = _error(capsys, args)
    assert code == 2 and f"specdec: error: input file not found: {workdir / 'missing.txt'}" in err


def test_unknown_model_lists_the_known_ones(workdir, capsys):
    code, err = _error(capsys, _args(workdir, target="nope"))
    assert code == 2 and "--target: unknown model 'nope'" in err
    assert "t5_tiny_test" in err and "lamda_137b" in err


def test_unknown_config_key_in_a_model_yaml_names_key_and_file(workdir, capsys):
    path = workdir / "bad_model.yaml"
    path.write_text("family: t5\nmodel:\n  vocab_size: 8000\n  emb_dimension: 8\n")
    code, err = _error(capsys, _args(workdir, draft=str(path)))
    assert code == 2 and f"{path}: unknown key model.emb_dimension" in err


def test_unknown_preset_override_is_named(workdir, capsys):
    code, err = _error(capsys, _args(workdir, target="t5_tiny_test:vocab_size=8000,layers=3"))
    assert code == 2 and "--target: unknown field(s) ['layers'] for preset 't5_tiny_test'" in err


def test_models_without_checkpoints_need_the_test_flag(workdir, capsys):
    code, err = _error(capsys, _args(workdir, random_init=False))
    assert (
        code == 2 and "'t5_tiny_test' is a registry preset" in err and "--allow-random-init" in err
    )
    path = workdir / "untrained.yaml"
    path.write_text(
        f"name: untrained\nmodel:\n  vocab_size: 8000\ncheckpoint:\n  export_dir: {workdir}/none\n"
    )
    code, err = _error(capsys, _args(workdir, target=str(path), random_init=False))
    assert (
        code == 2
        and f"--target: model 'untrained' ({path}) has no checkpoint at {workdir}/none" in err
    )


def test_vocabulary_mismatch_is_named(workdir, capsys):
    code, err = _error(capsys, _args(workdir, draft="t5_tiny_test:vocab_size=100"))
    assert (
        code == 2
        and "--draft: 't5_tiny_test' has vocab_size 100 but the SentencePiece model has 8000 pieces"
        in err
    )


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--gamma", "-1", "argument --gamma: --gamma must be >= 0, got -1"),
        ("--top-p", "1.5", "argument --top-p: --top-p must be <= 1.0, got 1.5"),
        ("--temperature", "hot", "argument --temperature: --temperature must be float, got 'hot'"),
        ("--workers", "gpu", "argument --workers: invalid choice: 'gpu'"),
        ("--transport", "pigeon", "argument --transport: invalid choice: 'pigeon'"),
    ],
)
def test_bad_flag_values_exit_2_with_the_flag_named(workdir, capsys, flag, value, message):
    code, err = _error(capsys, _args(workdir, flag, value))
    assert code == 2 and message in err


def test_ui_serves_the_store_on_localhost(capsys):
    code = main(
        ["ui", "--tracking-uri", "sqlite:////tmp/x/mlflow.db", "--port", "5123", "--dry-run"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "http://127.0.0.1:5123" in out
    expected = "ui --backend-store-uri sqlite:////tmp/x/mlflow.db --host 127.0.0.1 --port 5123"
    assert f"{expected} --workers 1" in out


def test_prepare_forwards_to_the_ding_preparation(capsys, tmp_path):
    code = main(
        ["prepare", "--dictionary", str(tmp_path / "no-such-file"), "--output", str(tmp_path)]
    )
    assert code == 2 and "Ding dictionary not found at" in capsys.readouterr().err


# ------------------------------------------------------------------------ pieces


def test_default_runner_is_the_in_process_fn_api_runner():
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    runner, _ = transforms.pipeline_options([])
    assert isinstance(runner, FnApiRunner)
    runner, options = transforms.pipeline_options(["--runner=DirectRunner"])
    assert runner is None and options.get_all_options()["runner"] == "DirectRunner"


class _FakeEngine:
    """Two tokens per request; raises for any batch holding the id 'bad'."""

    settings = DecodeSettings(gamma=2, batch_size=4, max_new_tokens=4)

    def generate(self, requests):
        if any(r.id == "bad" for r in requests):
            raise RuntimeError("cannot decode 'bad'")
        return [
            Generation(id=r.id, tokens=[5, 1], iterations=1, drafted=2, accepted=1,
                       accepted_by_position=[1, 0], batch_wall_ms=2.0)
            for r in requests
        ]  # fmt: skip

    generate_baseline = generate


def _handler() -> inference.SpeculativeModelHandler:
    """A handler with --compare-baseline over an engine the test passes in."""
    return inference.SpeculativeModelHandler(
        target=None, draft=None, settings=_FakeEngine.settings,
        engine=EngineConfig(kind="inprocess"), compare_baseline=True, job_id="test",
        progress=False,
    )  # fmt: skip


def test_an_engine_error_costs_only_the_failing_record():
    handler = _handler()
    items = [
        inference.Tokenized(record=record_io.Record(id=i, source=i, line=n), encoder_tokens=(7, 1))
        for n, i in enumerate(["ok1", "bad", "ok2"], start=1)
    ]
    results = handler.run_inference(items, inference.MeteredEngine(_FakeEngine(), start_s=0.0))
    assert [type(r).__name__ for r in results] == ["Decoded", "DeadLetter", "Decoded"]
    assert (results[1].id, results[1].reason, results[1].detail) == (
        "bad",
        record_io.ENGINE_ERROR,
        "RuntimeError: cannot decode 'bad'",
    )
    assert results[0].generation.tokens == [5, 1] and results[0].baseline.tokens == [5, 1]


class _OrderEngine(_FakeEngine):
    """Records which of the paired calls ran first."""

    def __init__(self):
        self.calls = []

    def generate(self, requests):
        self.calls.append("speculative")
        return super().generate(requests)

    def generate_baseline(self, requests):
        self.calls.append("baseline")
        return super().generate(requests)


def test_the_paired_calls_alternate_their_order_batch_by_batch():
    handler = _handler()
    engine = _OrderEngine()
    for n in range(4):
        item = inference.Tokenized(
            record=record_io.Record(id=str(n), source="x", line=n + 1), encoder_tokens=(7, 1)
        )
        (decoded,) = handler.run_inference([item], inference.MeteredEngine(engine, start_s=0.0))
        assert decoded.baseline.tokens == decoded.generation.tokens == [5, 1]
    firsts = engine.calls[0::2]
    assert firsts == ["speculative", "baseline", "speculative", "baseline"]
    assert sorted(engine.calls) == ["baseline"] * 4 + ["speculative"] * 4


class _FakeRayEngine:
    """Ray-engine figures in the order a job sees them: 10 iterations / 1000 bytes, then
    a coordinator restart (its count starts again from 0) and 4 / 300 more."""

    def __init__(self):
        self.reports = iter([(10, 1000, 0, "n1"), (4, 300, 1, "n2")])

    def traffic(self):
        self.now = next(self.reports)
        return {"iterations": self.now[0], "bytes": self.now[1]}

    def restarts(self):
        return {"target": 0, "coordinator": self.now[2]}

    def placement(self):
        return {"target": "n1", "draft": self.now[3]}


def test_engine_figures_travel_as_beam_metrics_across_a_coordinator_restart():
    import apache_beam as beam

    class Report(beam.DoFn):  # as RunInference: the engine is built in setup
        def setup(self):
            self.engine = inference.MeteredEngine(_FakeRayEngine(), start_s=2.5)

        def process(self, _):
            inference.add_phase("decode", 0.25)
            self.engine.report()

    pipeline = beam.Pipeline(runner=transforms.pipeline_options([])[0])
    _ = pipeline | beam.Create([1, 2], reshuffle=False) | beam.ParDo(Report())
    result = pipeline.run()
    result.wait_until_finish()
    figures = inference.read_metrics(result)
    assert figures.phases == {"engine_start": 2.5, "decode": 0.5}
    # the restarted coordinator's 4 / 300 are added whole, not as 4 - 10 / 300 - 1000
    assert figures.traffic["iterations"] == 14 and figures.traffic["bytes"] == 1300
    assert figures.traffic["worker_restarts"] == {"target": 0, "coordinator": 1}
    assert figures.traffic["placement"] == {"draft": ["n1", "n2"], "target": "n1"}
    assert figures.first_record_at is None  # no record was decoded


def _row(record_id, batch, wall_ms, tokens, iterations, accepted, by_position, base_ms, match):
    return {
        "id": record_id, "batch": batch, "wall_ms": wall_ms, "tokens": tokens,
        "iterations": iterations, "drafted": 3 * iterations, "accepted": accepted,
        "accepted_by_position": by_position, "baseline_wall_ms": base_ms,
        "baseline_tokens": tokens, "matches_baseline": match,
        "output": "the cat sat on the mat", "reference": "the cat sat on the mat",
    }  # fmt: skip


def test_the_probe_times_the_call_sizes_that_decoded_a_tenth_of_the_tokens():
    """job_prediction.probe_ks: k = 1, 2 and γ + 1 of each γ with >= 10% of the tokens
    timed; an exploring γ's k interpolated (each timed k cost the job ~0.6 s)."""
    rows = [
        {"accepted_by_position": [1, 0], "tokens": 80},  # γ = 2: timed (k = 3)
        {"accepted_by_position": [1, 1, 0, 0], "tokens": 5},  # γ = 4: 5%, k = 5 interpolated
        {"accepted_by_position": [], "tokens": 15},  # γ = 0: no k of its own
    ]
    assert job_prediction.probe_ks(rows) == ([1, 2, 3], [5])
    assert job_prediction.probe_ks(rows, share=0.05) == ([1, 2, 3, 5], [])
    filled = job_prediction.with_interpolated({1: 5.0, 2: 5.2, 4: 6.0}, [3, 6])
    assert filled == pytest.approx({1: 5.0, 2: 5.2, 3: 5.6, 4: 6.0, 6: 6.8})
    # beyond the largest timed k, never below its cost (a noisy slope downwards)
    assert job_prediction.with_interpolated({1: 5.0, 2: 4.8}, [4])[4] == pytest.approx(4.8)
    with pytest.raises(ValueError, match="two timed call sizes"):
        job_prediction.with_interpolated({1: 5.0}, [2])


def test_the_headline_speedup_is_the_whole_decode_paths():
    rows = [
        {"id": "1", "tokens": 10, "baseline_tokens": 10},
        {"id": "2", "tokens": 6, "baseline_tokens": 8},
        {"id": "3", "tokens": 50, "baseline_tokens": 50},  # resumed: not in these phases
    ]
    got = job_report.path_speedup(rows, {"decode": 2.0, "baseline": 3.0}, {"3"})
    assert got["speedup"] == pytest.approx((16 / 2.0) / (18 / 3.0))
    assert (got["decode_path_s"], got["baseline_path_s"]) == (2.0, 3.0)
    assert job_report.path_speedup(rows, {"decode": 2.0}, set())["speedup"] is None


def test_summary_figures_from_rows():
    rows = [
        _row("1", "a", 100.0, 6, 2, 4, [2, 1, 1], 300.0, True),
        _row("2", "a", 100.0, 4, 2, 2, [1, 1, 0], 300.0, True),
        _row("3", "b", 80.0, 2, 1, 1, [1, 0, 0], 100.0, False),
    ]
    summary = job_report.compute_summary(
        rows, [{"id": "4", "reason": "empty"}], records_in=4,
        settings=DecodeSettings(gamma=3), compare_baseline=True, quality_metric="bleu",
    )  # fmt: skip
    assert (summary["records_in"], summary["records_out"], summary["records_failed"]) == (4, 3, 1)
    assert summary["failed_by_reason"] == {"empty": 1}
    assert summary["tokens_per_s"] == pytest.approx(12 / 0.18)  # batches a (100 ms) + b (80 ms)
    assert summary["baseline_tokens_per_s"] == pytest.approx(12 / 0.4)
    assert summary["speedup_loop"] == pytest.approx((12 / 0.18) / (12 / 0.4))
    assert summary["speedup"] is None  # from the job's phases: path_speedup
    # 7 accepted in 5 iterations, 1 of which accepted all 3: 7 + (5 - 1) rejections = 11 tests
    assert summary["alpha"] == pytest.approx(7 / 11)
    assert summary["accepted_per_drafted"] == pytest.approx(7 / 15)
    assert summary["mean_accepted_length"] == pytest.approx((7 + 5) / 5)
    assert summary["acceptance_by_position"] == pytest.approx([0.8, 0.4, 0.2])
    # One target step 0.4 s / (6 + 2) steps; one iteration 0.18 s / (2 + 1) = γ·c·t + t.
    assert summary["c_estimate"] == pytest.approx((0.06 / 0.05 - 1) / 3)
    assert summary["identical_to_baseline"] is False
    assert summary["bleu"] == pytest.approx(100.0)
    assert job_report.quality(rows, "rouge")["rougeL"] == pytest.approx(100.0)
    # The cost model: target 40 ms on 1 token, 50 ms on 4; a draft step 4 ms. The
    # target-alone decode spent 50 ms a step, so 10 ms of loop work per step. An
    # iteration: 3 x 4 + 50 + 10 = 72 ms for 1 + 0.8 + 0.4 + 0.2 = 2.4 tokens, 30 ms a
    # token against 50: 5/3 predicted; measured (12/0.18)/(12/0.4) = 20/9.
    costs = theory.StepCosts(target_s={1: 0.04, 4: 0.05}, draft_step_s=0.004)
    predicted = job_prediction.prediction(rows, summary, costs)
    assert predicted["predicted_speedup"] == pytest.approx(5 / 3)
    assert predicted["efficiency"] == pytest.approx((20 / 9) / (5 / 3))
    assert predicted["baseline_at_limit"] == pytest.approx(0.8)
    step_ms = predicted["step_costs_ms"]
    assert step_ms["target"] == pytest.approx({"1": 40.0, "4": 50.0})
    assert (step_ms["draft_step"], step_ms["loop_per_step"]) == pytest.approx((4.0, 10.0))
    # tokens decoded by the target alone (γ = 0) cost a target-alone token each
    mixed = dataclasses.replace(costs, overhead_s=0.01, baseline_overhead_s=0.01)
    assert speculative_costs.predicted_tokens_speedup(
        [0.8, 0.4, 0.2], {0: 10, 3: 12}, mixed
    ) == pytest.approx(22 * 0.05 / (10 * 0.05 + 12 * 0.03))
    with pytest.raises(ValueError, match="no acceptance measured at position 3"):
        speculative_costs.predicted_tokens_speedup([0.8], {3: 12}, mixed)


def test_the_prediction_speeds_up_the_loop_not_the_batches_fixed_work():
    """Where the engine times its loops apart (``loop_ms``), a batch's encoder, prefill
    and setup (its wall time beyond its loop) are charged to both sides as they are,
    not per step; and a drafted token's cost is read from the loop's own iterations."""
    rows = [
        _row("1", "a", 100.0, 6, 2, 4, [2, 1, 1], 300.0, True),
        _row("2", "a", 100.0, 4, 2, 2, [1, 1, 0], 300.0, True),
        _row("3", "b", 80.0, 2, 1, 1, [1, 0, 0], 100.0, True),
    ]
    loops = zip(rows, (90.0, 90.0, 70.0), (240.0, 240.0, 80.0), strict=True)
    for row, loop_ms, base_loop_ms in loops:
        row |= {"loop_ms": loop_ms, "baseline_loop_ms": base_loop_ms}
    summary = job_report.compute_summary(
        rows, [], records_in=3, settings=DecodeSettings(gamma=3), compare_baseline=True,
        quality_metric="bleu",
    )  # fmt: skip
    costs = theory.StepCosts(target_s={1: 0.03, 4: 0.035}, draft_step_s=0.004)
    predicted = job_prediction.prediction(rows, summary, costs)
    # the target alone's loops: 0.32 s for 8 steps (40 ms: a 30 ms call + 10 ms of the
    # loop's work); its batches' fixed work 0.08 s. An iteration 3 x 4 + 35 + 10 = 57 ms
    # for 2.4 tokens: the loop 40 / (57 / 2.4) faster; the job (0.08 + 0.32) / (0.08 +
    # 0.32 / that)
    in_loop = 0.04 / (0.057 / 2.4)
    assert predicted["predicted_speedup"] == pytest.approx(0.4 / (0.08 + 0.32 / in_loop))
    assert predicted["baseline_at_limit"] == pytest.approx(0.75)
    assert predicted["step_costs_ms"]["loop_per_step"] == pytest.approx(10.0)
    assert predicted["step_costs_ms"]["batch_fixed"] == pytest.approx(40.0)
    # the loops at γ = 3: 0.16 s for 3 iterations; beyond the 40 ms target-alone step and
    # the target's 5 ms for 3 more tokens, per drafted token, over the 30 ms call
    assert predicted["draft_c_loop"] == pytest.approx((0.16 / 3 - 0.04 - 0.005) / (3 * 0.03))
    # a probe that timed T(4) below T(1) (noise) charges the target no growth, not a
    # negative one that the draft would be charged for
    noisy = theory.StepCosts(target_s={1: 0.03, 4: 0.025}, draft_step_s=0.004)
    assert job_prediction.prediction(rows, summary, noisy)["draft_c_loop"] == pytest.approx(
        (0.16 / 3 - 0.04) / (3 * 0.03)
    )
    # without loop times: the wall time per step, as before, and no draft_c_loop
    for row in rows:
        row["baseline_loop_ms"] = None
    walled = job_prediction.prediction(rows, summary, costs)
    assert walled["draft_c_loop"] is None and walled["step_costs_ms"]["batch_fixed"] is None
    assert walled["baseline_at_limit"] == pytest.approx(0.03 / 0.05)


def test_a_summary_names_the_fields_it_lacks_or_does_not_know():
    figures = {f.name: None for f in dataclasses.fields(JobSummary)}
    assert JobSummary.from_mapping(figures).to_dict().keys() == figures.keys() - {"mlflow_pending"}
    with pytest.raises(ValueError, match=r"unknown \['speedup_typo'\], missing \['alpha'\]"):
        JobSummary.from_mapping(
            {k: v for k, v in figures.items() if k != "alpha"} | {"speedup_typo": 1}
        )
