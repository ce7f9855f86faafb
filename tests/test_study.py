"""pipelines.study: α on stub models with known β, n-gram counts, grid-file errors, and
one small end-to-end study (Beam on FnApiRunner, MLflow read back with MlflowClient)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest
import yaml

from pipelines import study, text
from pipelines.configs import ConfigError
from specdec_core import sampling
from specdec_core.models import ngram

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY_STUDY = REPO_ROOT / "configs" / "studies" / "tiny_test.yaml"


# ------------------------------------------------------------------ stub models


def _ngram(name: str, probs) -> study.StudyModel:
    """A StudyModel whose next-token distribution is ``probs`` ([V] or [V, V] rows)."""
    return study.ngram_model(name, ngram.NGramParams(log_probs=jnp.log(jnp.asarray(probs))))


def _batch(batch_size: int, first_token: int, max_new: int) -> study.PromptBatch:
    return study.PromptBatch(
        ids=np.arange(batch_size),
        prompt_tokens=np.full((batch_size, 1), first_token, np.int32),
        encoder_tokens=None,
        max_new=np.full(batch_size, max_new, np.int32),
        real=np.ones(batch_size, bool),
    )


def _settings(temperature: float, max_new: int, gammas=(1, 3)) -> study.MeasureSettings:
    return study.MeasureSettings(
        sampling=sampling.SamplingConfig(temperature=temperature),
        gammas=gammas,
        max_new_tokens=max_new,
        seed=0,
        eos_id=None,
        measure_cost=False,
    )


THEORY = study.TheoryConfig(cost_coefficient=0.05, max_gamma=8, bootstrap_resamples=400)


def test_unigram_stubs_alpha_is_sum_of_min_of_the_tempered_distributions():
    p = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])
    q = np.array([0.10, 0.15, 0.30, 0.25, 0.12, 0.08])
    # At T=0.5 both models sample from p² and q², renormalised: β = Σ min of those.
    p2, q2 = p**2 / (p**2).sum(), q**2 / (q**2).sum()
    expected = np.minimum(p2, q2).sum()
    assert expected == pytest.approx(0.3028, abs=1e-4)
    target, draft = _ngram("p", p), _ngram("q", q)
    batch, settings = _batch(32, 0, 16), _settings(0.5, 16)
    [stats] = study.measure_batch(target, [draft], batch, settings)
    row = study.summarize_cell(stats, theory_config=THEORY, seed=0)
    # β is the same at every position, so α and its whole interval equal it.
    assert row["positions"] == 32 * 16
    np.testing.assert_allclose(row["alpha"], expected, rtol=1e-5)
    np.testing.assert_allclose([row["alpha_ci_low"], row["alpha_ci_high"]], expected, rtol=1e-5)
    np.testing.assert_allclose(row["beta_by_position"], [expected] * 16, rtol=1e-5)
    # Speculative runs: each test accepts with probability β, independently.
    for by_gamma in row["by_gamma"]:
        tests = by_gamma["tests"]
        standard_error = np.sqrt(expected * (1 - expected) / tests)
        assert abs(by_gamma["empirical_acceptance"] - expected) < 3.5 * standard_error
        assert by_gamma["agrees_with_alpha"]
    # Theorem 3.8 at α≈0.30, c=0.05: γ=1 1.238, γ=2 1.264, γ=3 1.232.
    assert row["optimal_gamma"] == 2
    np.testing.assert_allclose(
        row["predicted_improvement"], (1 + expected + expected**2) / 1.1, rtol=1e-5
    )


def test_greedy_unigram_stubs_accept_exactly_when_argmaxes_agree():
    p = np.array([0.1, 0.6, 0.3])
    same, other = np.array([0.2, 0.5, 0.3]), np.array([0.2, 0.3, 0.5])
    target = _ngram("p", p)
    drafts = [_ngram("same", same), _ngram("other", other)]
    stats = study.measure_batch(target, drafts, _batch(4, 0, 8), _settings(0.0, 8, (2,)))
    rows = [study.summarize_cell(s, theory_config=THEORY, seed=0) for s in stats]
    assert [r["alpha"] for r in rows] == [1.0, 0.0]
    assert [r["empirical_acceptance"] for r in rows] == [1.0, 0.0]
    assert [r["by_gamma"][0]["tokens_per_iteration"] for r in rows] == [3.0, 1.0]


def test_bigram_stubs_beta_per_position_and_alpha_follow_the_markov_chain():
    target_table = np.array(
        [[0.70, 0.10, 0.10, 0.10], [0.10, 0.10, 0.40, 0.40], [0.25] * 4, [0.05, 0.05, 0.10, 0.80]]
    )
    draft_table = np.array(
        [[0.10, 0.70, 0.10, 0.10], [0.10, 0.10, 0.40, 0.40], [0.40, 0.20, 0.20, 0.20], [0.25] * 4]
    )
    beta_of_context = np.minimum(target_table, draft_table).sum(1)  # [V]
    np.testing.assert_allclose(beta_of_context, [0.4, 1.0, 0.85, 0.45])
    target, draft = _ngram("P", target_table), _ngram("Q", draft_table)
    batch, settings, n_new = _batch(64, 0, 12), _settings(1.0, 12, (2,)), 12
    tokens, lengths = study.target_trajectories(target, batch, settings)
    [beta] = study.betas_along(target, [draft], batch, tokens, lengths, settings)
    contexts = np.concatenate([batch.prompt_tokens, tokens], 1)[:, :-1]  # token before each
    np.testing.assert_allclose(beta, beta_of_context[contexts], rtol=1e-6)
    # α analytic: mean over positions j of E[β(x_j)] with x_0 = 0 and x_j ~ e_0 · P^j.
    marginals = [np.linalg.matrix_power(target_table, j)[0] for j in range(n_new)]
    analytic = float(np.mean([m @ beta_of_context for m in marginals]))
    assert analytic == pytest.approx(0.5357, abs=1e-4)
    [stats] = study.measure_batch(target, [draft], batch, settings)
    row = study.summarize_cell(stats, theory_config=THEORY, seed=0)
    assert row["alpha_ci_low"] <= analytic <= row["alpha_ci_high"]
    assert row["alpha_ci_high"] - row["alpha_ci_low"] < 0.1
    assert row["agrees_with_alpha"]


def test_top_probability_along_is_the_targets_own_largest_probability_per_context():
    # The bigram target's largest next-token probability depends on the previous token
    # only; it is read at T=1 whatever temperature drew the trajectory, NaN past lengths.
    table = np.array(
        [[0.70, 0.10, 0.10, 0.10], [0.10, 0.10, 0.40, 0.40], [0.25] * 4, [0.05, 0.05, 0.10, 0.80]]
    )
    target = _ngram("P", table)
    batch = _batch(16, 0, 10)
    batch = dataclasses.replace(batch, max_new=np.where(np.arange(16) < 8, 10, 4))
    tokens, lengths = study.target_trajectories(target, batch, _settings(1.0, 10))
    top = study.top_probability_along(target, batch, tokens, lengths)
    contexts = np.concatenate([batch.prompt_tokens, tokens], 1)[:, :-1]
    valid = np.arange(top.shape[1])[None, :] < lengths[:, None]
    assert (lengths == np.where(np.arange(16) < 8, 10, 4)).all()
    assert len(set(contexts[valid].tolist())) == 4  # sampled paths visit every context
    np.testing.assert_allclose(top[valid], table.max(1)[contexts][valid], rtol=1e-6)
    assert np.isnan(top[~valid]).all()


def test_ngram_drafts_fit_the_training_text_counts(tmp_path):
    (tmp_path / "train.txt").write_text("ab\nabb\n")
    (tmp_path / "prompts.txt").write_text("ab\n")
    dataset = study.DatasetConfig(
        source="text",
        path=str(tmp_path / "prompts.txt"),
        train_path=str(tmp_path / "train.txt"),
        tokenizer="ascii",
        prompt_tokens=1,
    )
    a, b, bos, eos, vocab = ord("a"), ord("b"), 0, 1, study.ASCII_VOCAB
    assert study.ngram_sequences(dataset, side="english") == [[bos, a, b, eos], [bos, a, b, b, eos]]
    target = study.ModelRef(name="t", family="decoder", config=study_config_stub(vocab))
    load = lambda kind: study.load_study_model(
        study.ModelRef(name=kind, family=kind), target=target, dataset=dataset
    )
    unigram = np.exp(np.asarray(load("unigram").params.log_probs))  # [V]
    bigram = np.exp(np.asarray(load("bigram").params.log_probs))  # [V, V]
    # 9 tokens: bos 2, a 2, b 3, eos 2; add-1 smoothing over V = 128.
    np.testing.assert_allclose(
        unigram[[bos, a, b, eos, 5]], np.array([3, 3, 4, 3, 1]) / 137, rtol=1e-6
    )
    # Pairs: bos→a 2, a→b 2, b→b 1, b→eos 2.
    np.testing.assert_allclose(bigram[a, [b, a]], np.array([3, 1]) / 130, rtol=1e-6)
    np.testing.assert_allclose(bigram[b, [b, eos, a]], np.array([2, 3, 1]) / 131, rtol=1e-6)
    np.testing.assert_allclose(
        bigram[eos], np.full(vocab, 1 / vocab), rtol=1e-6
    )  # never a left token


def study_config_stub(vocab_size: int):
    from specdec_core.models import registry

    return registry.get_config("gpt_tiny_test", vocab_size=vocab_size)


# ------------------------------------------------------------------ grid-file errors


def _valid_grid(tmp_path: pathlib.Path) -> dict:
    (tmp_path / "prompts.txt").write_text("The cat sat on the mat.\nA dog barked twice.\n")
    (tmp_path / "train.txt").write_text("the cat\nthe dog\n")
    return {
        "name": "bad",
        "dataset": {
            "source": "text",
            "path": str(tmp_path / "prompts.txt"),
            "train_path": str(tmp_path / "train.txt"),
            "tokenizer": "ascii",
            "num_prompts": 2,
        },
        "decode": {"temperatures": [0.0, 1.0], "gammas": [1, 2], "max_new_tokens": 4},
        "theory": {"cost_coefficient": 0.1},
        "grid": [
            {
                "target": {"preset": "gpt_tiny_test", "random_init": True},
                "drafts": ["bigram", {"preset": "gpt_tiny_test", "random_init": True}],
            }
        ],
    }


def _write(tmp_path: pathlib.Path, grid: dict) -> pathlib.Path:
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


def _set(grid: dict, dotted: str, value) -> dict:
    grid = copy.deepcopy(grid)
    *parents, last = dotted.split(".")
    node = grid
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return grid


BAD_GRIDS = [
    ("speed", 2.0, "unknown key speed"),
    ("decode.gama", [1], "unknown key decode.gama"),
    ("grid.0.temperature", 1.0, "grid[0]: unknown key temperature"),
    ("grid.0.target", "gpt_huge", "grid[0].target: unknown model 'gpt_huge'"),
    ("grid.0.target", "unigram", "grid[0].target: 'unigram' can only be a draft"),
    ("grid.0.drafts.1", "gpt_97m", "'gpt_97m' is a registry preset: it has an architecture but no"),
    (
        "grid.0.drafts.1",
        {"preset": "gpt_tiny_test", "checkpoint": "/nonexistent/ckpt"},
        "grid[0].drafts[1]: checkpoint not found: /nonexistent/ckpt",
    ),
    (
        "grid.0.drafts.1",
        {"preset": "gpt_tiny_test", "random_init": True, "overrides": {"vocab_size": 64}},
        "has vocab_size 64",
    ),
    ("decode.temperatures", [1.0, -0.5], "temperature must be a number >= 0, got -0.5"),
    ("grid.0.temperatures", [-1], "grid[0].temperatures: temperature must be a number >= 0"),
    ("decode.gammas", [0, 2], "gamma must be an integer >= 1, got 0"),
    ("theory.cost_coefficient", "fast", "cost_coefficient must be a number >= 0 or 'measured'"),
    ("dataset.train_path", "", "n-gram drafts need dataset.train_path"),
]


@pytest.mark.parametrize(("key", "value", "message"), BAD_GRIDS, ids=[b[0] for b in BAD_GRIDS])
def test_bad_grid_files_fail_before_any_work_naming_problem_and_file(
    tmp_path, monkeypatch, key, value, message
):
    path = _write(tmp_path, _set(_valid_grid(tmp_path), key, value))
    monkeypatch.setattr(study.pipeline, "run_cells", lambda *a: pytest.fail("ran the pipeline"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(ConfigError) as error:
        study.run(path, tracking_uri=uri, progress=False)
    assert message in str(error.value)
    assert str(path) in str(error.value)
    assert not (tmp_path / "mlflow.db").exists()


def test_optional_entries_leave_out_models_without_checkpoints(tmp_path):
    grid = _valid_grid(tmp_path)
    tiny = {"preset": "gpt_tiny_test", "random_init": True, "name": "tiny"}
    grid["grid"] += [
        {"target": "gpt_97m", "drafts": ["unigram"], "optional": True},
        {"target": tiny, "drafts": ["gpt_97m", "unigram"], "optional": True},
    ]
    loaded = study.load_study_config(_write(tmp_path, grid), seed=7)
    assert loaded.seed == 7
    assert [(e.target.name, [d.name for d in e.drafts]) for e in loaded.grid] == [
        ("gpt_tiny_test", ["bigram", "gpt_tiny_test"]),
        ("tiny", ["unigram"]),
    ]
    assert loaded.grid[0].temperatures == (0.0, 1.0)
    skipped_entry, left_out_draft = loaded.skipped
    assert skipped_entry.startswith("skipped optional grid[1]: ") and "gpt_97m" in skipped_entry
    assert left_out_draft.startswith("left out: ") and "grid[2].drafts[0]" in left_out_draft


def test_t5_prompts_are_the_whole_sentence_on_the_encoder_side():
    dataset = study.DatasetConfig(tokenizer="ascii", prompt_tokens=2, bos_id=0)
    prompts = [study.Prompt(id=5, text="Hi.", tokens=(72, 105, 46))]
    batch = study.pack_prompts(
        prompts, family="t5", dataset=dataset, batch_size=2, max_new_tokens=7
    )
    encoded = [ord(c) for c in text.TRANSLATE_PREFIX + "Hi."] + [text.EOS_ID]
    assert batch.encoder_tokens.shape == (2, 48)  # padded to a multiple of 16
    assert batch.encoder_tokens[0, : len(encoded)].tolist() == encoded
    assert batch.prompt_tokens.tolist() == [[text.DECODER_START_ID]] * 2
    assert batch.max_new.tolist() == [7, 0] and batch.real.tolist() == [True, False]
    decoder_batch = study.pack_prompts(
        prompts, family="decoder", dataset=dataset, batch_size=1, max_new_tokens=7
    )
    assert decoder_batch.prompt_tokens.tolist() == [[0, 72, 105]]  # bos + 2 pieces
    assert decoder_batch.encoder_tokens is None and decoder_batch.ids.tolist() == [5]


def test_a_summarization_study_reads_jsonl_sources_with_the_summarize_prefix(tmp_path):
    (tmp_path / "records.jsonl").write_text(
        '{"id": "a", "source": "Tool one.", "reference": "x"}\n\n'
        '{"id": "b", "source": "Tool two.", "reference": "y"}\n'
    )
    dataset = study.DatasetConfig(
        source="jsonl", path=str(tmp_path / "records.jsonl"), task="summarize",
        tokenizer="ascii", prompt_tokens=1,
    )  # fmt: skip
    prompts = list(study.iter_prompts(dataset))
    assert [(p.id, p.text) for p in prompts] == [(0, "Tool one."), (1, "Tool two.")]
    batch = study.pack_prompts(
        prompts[:1], family="t5", dataset=dataset, batch_size=1, max_new_tokens=4
    )
    encoded = [ord(c) for c in text.SUMMARIZE_PREFIX + "Tool one."] + [text.EOS_ID]
    assert batch.encoder_tokens[0, : len(encoded)].tolist() == encoded
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "article": "no source"}\n')
    bad = dataclasses.replace(dataset, path=str(tmp_path / "bad.jsonl"))
    with pytest.raises(ConfigError, match=r"bad\.jsonl:1: no string field 'source'"):
        list(study.iter_prompts(bad))
    with pytest.raises(ValueError, match=r"dataset\.task must be one of"):
        study.DatasetConfig(task="classify")


def test_the_summarizer_study_grid_has_the_copy_and_the_combined_drafts():
    loaded = study.load_study_config(REPO_ROOT / "configs" / "studies" / "summaries_copy.yaml")
    (entry,) = loaded.grid
    assert entry.target.name == "summ_target"
    assert [(d.name, d.family) for d in entry.drafts] == [
        ("summ_draft", "t5"),
        ("copy", "copy"),
        ("copy+summ_draft", "copy"),
    ]
    assert entry.drafts[1].config.vocab_size == entry.target.config.vocab_size  # the target's
    assert loaded.dataset.task == "summarize" and loaded.dataset.source == "jsonl"


@pytest.mark.parametrize("entry_point", ["pipelines.study", "specdec study"])
def test_the_command_reports_a_bad_grid_in_one_line_with_status_2(tmp_path, capsys, entry_point):
    from pipelines import cli

    path = _write(tmp_path, _set(_valid_grid(tmp_path), "decode.gammas", [0]))
    args = ["--config", str(path), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    main = study.main if entry_point == "pipelines.study" else lambda a: cli.main(["study", *a])
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("specdec: error: ") and str(path) in err and "gamma" in err
    assert not (tmp_path / "mlflow.db").exists()


# ------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """configs/studies/tiny_test.yaml, run once: (StudyResult, summary rows, tmp folder)."""
    folder = tmp_path_factory.mktemp("study")
    result = study.run(
        TINY_STUDY,
        summary_json=str(folder / "summary.json"),
        tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
        progress=False,
    )
    summary = json.loads((folder / "summary.json").read_text())
    return result, summary, folder


def test_study_summary_has_one_row_per_cell_with_the_reported_numbers(tiny_study):
    result, summary, _ = tiny_study
    assert [(r["target"], r["draft"], r["temperature"]) for r in summary] == [
        ("lamda_tiny_2l", "lamda_tiny_1l", 1.0),
        ("lamda_tiny_2l", "bigram", 1.0),
    ]
    assert all(list(r) == list(study.SUMMARY_KEYS) for r in summary)
    for row, cell in zip(summary, result.rows, strict=True):
        assert row == {k: cell[k] for k in study.SUMMARY_KEYS}
        assert 0 < row["alpha_ci_low"] <= row["alpha"] <= row["alpha_ci_high"] < 1
        assert cell["sequences"] == 16 and 16 <= cell["positions"] <= 16 * 16  # EOS ends early
        assert [g["gamma"] for g in cell["by_gamma"]] == [1, 3]
    table = study.format_table(result.rows)
    assert table.splitlines()[0].split()[:5] == ["TASK", "(Mp)", "Mq", "T", "α"]
    assert f"{summary[1]['alpha']:.3f}" in table.splitlines()[3]


def test_empirical_acceptance_agrees_with_alpha_within_the_intervals(tiny_study):
    result, _, _ = tiny_study
    for cell in result.rows:
        for g in cell["by_gamma"]:
            tolerance = np.hypot(
                max(cell["alpha"] - cell["alpha_ci_low"], cell["alpha_ci_high"] - cell["alpha"]),
                max(
                    g["empirical_acceptance"] - g["empirical_acceptance_ci_low"],
                    g["empirical_acceptance_ci_high"] - g["empirical_acceptance"],
                ),
            )
            assert abs(g["empirical_acceptance"] - cell["alpha"]) <= tolerance, (cell["draft"], g)
            assert g["agrees_with_alpha"]
            # Mean accepted length (tokens per iteration) against Equation 1, 10% tolerance.
            assert g["tokens_per_iteration"] == pytest.approx(
                g["predicted_tokens_per_iteration"], rel=0.1
            )


def test_mlflow_parent_and_nested_child_runs_hold_the_reported_numbers(tiny_study):
    import mlflow
    from mlflow.tracking import MlflowClient

    result, summary, folder = tiny_study
    client = MlflowClient(tracking_uri=result.tracking_uri)
    parent = client.get_run(result.parent_run_id)
    assert client.get_experiment(parent.info.experiment_id).name == "acceptance-study"
    assert parent.info.run_name == "tiny_test"
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.mlflow.parentRunId = '{result.parent_run_id}'"
    )
    assert {c.info.run_id for c in children} == {r["mlflow_run_id"] for r in summary}
    for row, cell in zip(summary, result.rows, strict=True):
        child = client.get_run(row["mlflow_run_id"])
        assert child.data.params["draft"] == row["draft"]
        assert child.data.params["temperature"] == "1.0"
        assert child.data.params["target_checkpoint"] == "random init (seed 0, test-only)"
        metrics = child.data.metrics
        for key in ("alpha", "alpha_ci_low", "alpha_ci_high", "empirical_acceptance"):
            assert metrics[key] == pytest.approx(row[key], rel=1e-12)
        assert metrics["optimal_gamma"] == row["optimal_gamma"]
        history = client.get_metric_history(row["mlflow_run_id"], "beta_by_position")
        steps = sorted((m.step, m.value) for m in history)
        assert [s for s, _ in steps] == list(range(1, 17))
        np.testing.assert_allclose([v for _, v in steps], cell["beta_by_position"])
        improvement = client.get_metric_history(
            row["mlflow_run_id"], "predicted_improvement_by_gamma"
        )
        assert sorted(m.step for m in improvement) == list(range(1, 9))
    mlflow.set_tracking_uri(result.tracking_uri)
    table = mlflow.load_table("table3.json", run_ids=[result.parent_run_id])
    assert list(table.columns[:5]) == ["TASK", "target", "draft", "T", "alpha"]
    np.testing.assert_allclose(table["alpha"], [r["alpha"] for r in summary])
    assert list(table["draft"]) == ["lamda_tiny_1l", "bigram"]
    artifacts = {a.path for a in client.list_artifacts(result.parent_run_id, "plots")}
    assert artifacts == {
        f"plots/{name}.{ext}"
        for name in ("alpha_by_draft", "improvement_vs_gamma")
        for ext in ("csv", "png")
    }
    assert (folder / "mlartifacts").is_dir()  # artifacts beside the SQLite store
