"""Training by time budget, config overrides, and recipes (``specdec train-recipe``): a
tiny target and a draft distilled from it, run as a recipe on this CPU, packed into
parts and unpacked again, byte for byte."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from pipelines import configs, train
from pipelines.train import recipe
from pipelines.train.data import length_buckets
from pipelines.train.loop import TimeBudget, _progress_line
from tests.test_train_job import TINY_YAML, _write_tiny_data

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_overrides_are_checked_like_the_file(tmp_path):
    data = _write_tiny_data(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML.format(data=data, out=tmp_path), encoding="utf-8")
    loaded = configs.load_model_config(
        path, ["train.tokens_per_batch=4096", "data.length_buckets=[32, 128]", "name=other"]
    )
    assert loaded.train.tokens_per_batch == 4096 and loaded.name == "other"
    assert loaded.data.length_buckets == (32, 128)
    assert configs.load_model_config(path).train.tokens_per_batch == 64  # the file is unchanged
    for bad, message in (
        ("train.no_such_key=1", "unknown key train.no_such_key"),
        ("train.tokens_per_batch=many", "train.tokens_per_batch must be int"),
        ("optimizer.lr=1", "section must be one of"),
        ("train.max_steps", "not KEY=VALUE"),
    ):
        with pytest.raises(configs.ConfigError, match=message):
            configs.load_model_config(path, [bad])


def test_length_buckets_override_caps_each_side_at_its_maximum():
    data = configs.DataConfig(max_input_length=128, max_target_length=32, length_buckets=(32, 128))
    assert length_buckets(data) == ((32, 128), (32,))
    automatic = configs.DataConfig(max_input_length=128, max_target_length=128)
    assert length_buckets(automatic) == ((16, 32, 64, 128), (16, 32, 64, 128))


def test_time_budget_warms_up_holds_and_decays_to_zero_at_the_deadline():
    budget = TimeBudget(100.0, warmup_steps=10, decay_fraction=0.2, start=0.0)
    assert budget.scale(0, now=1.0) == pytest.approx(0.1)  # warmup, step by step
    assert budget.scale(9, now=1.0) == 1.0 and budget.scale(500, now=79.0) == 1.0
    assert budget.scale(500, now=90.0) == pytest.approx(0.5)  # half way through the decay
    assert budget.scale(500, now=100.0) == 0.0 and budget.expired(now=100.0)
    assert not budget.expired(now=99.0)
    line = _progress_line(7, None, {"loss": 1.0, "accuracy": 0.5, "grad_norm": 1.0}, 2.0,
                          eta_s=90.0, lr_scale=0.5)  # fmt: skip
    assert line.startswith("step 7 loss") and "lr x0.50" in line and "ETA 1.5m" in line
    with pytest.raises(ValueError, match="time budget must be > 0"):
        TimeBudget(0.0, warmup_steps=1)


def test_time_budget_and_max_steps_do_not_go_together(tmp_path, capsys):
    data = _write_tiny_data(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML.format(data=data, out=tmp_path), encoding="utf-8")
    with pytest.raises(SystemExit, match="--time-budget and --max-steps"):
        train.main(["--config", str(path), "--max-steps", "2", "--time-budget", "5"])


def _tiny_recipe(tmp_path, target: str = "budget_s: 20", draft: str = "budget_s: 40"):
    """A target (trained for ``target``: a budget or steps) and a draft distilled from
    it, after it, on tiny data (a ``draft`` budget counts loading the teacher and
    compiling its shapes before step 1)."""
    data = _write_tiny_data(tmp_path)
    target_yaml = tmp_path / "tiny_target.yaml"
    target_yaml.write_text(TINY_YAML.format(data=data, out=tmp_path / "target"), "utf-8")
    draft_yaml = tmp_path / "tiny_draft.yaml"
    draft_yaml.write_text(
        TINY_YAML.format(data=data, out=tmp_path / "draft").replace("name: tiny", "name: tiny_d")
        + f"teacher: {target_yaml}\n",
        encoding="utf-8",
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(
        f"""
part_bytes: 40000
stages:
  - config: {target_yaml}
    {target}
    set: [train.eval_every=1000000]
  - config: {draft_yaml}
    after: [tiny]
    {draft}
    set: [train.distill_weight=1.0, train.bleu_examples=0, train.precompile=true]
""",
        encoding="utf-8",
    )
    return path


def test_recipe_trains_stages_in_order_packs_and_unpacks_byte_for_byte(tmp_path, capsys):
    # Steps, not budgets: a budget that loading and compiling spend before the first
    # step would make the outcome depend on the machine's speed.
    path = _tiny_recipe(tmp_path, target="steps: 3", draft="steps: 2")
    returned = tmp_path / "returned"
    argv = ["run", str(path), "--out", str(tmp_path / "out"), "--return-dir", str(returned)]
    argv += ["--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    assert recipe.main([*argv, "--return-parts", "1", "--set", "train.log_every=1"]) == 0
    out = capsys.readouterr().out
    assert out.index("tiny: done") < out.index("] tiny_d: ")  # the draft waited
    manifest = json.loads((returned / recipe.MANIFEST).read_text())
    assert [s["status"] for s in manifest["stages"]] == ["done", "done"]
    # the draft compiled its bucket shapes (teacher bound) before its first step
    assert "precompiled the train step for" in (tmp_path / "out" / "tiny_d.log").read_text()
    assert all(s["step"] > 0 for s in manifest["stages"])
    assert len(manifest["parts"]) > 1 and all(p["bytes"] <= 40000 for p in manifest["parts"])
    assert sorted(p.name for p in returned.iterdir()) == [recipe.MANIFEST, "models.tar.part00"]
    assert "not returned yet" in out

    root = tmp_path / "unpacked"
    with pytest.raises(recipe.RecipeError, match=r"models\.tar\.part01 is in none"):
        recipe.unpack([returned], root=root)
    recipe.unpack([returned, tmp_path / "out" / "parts"], root=root)
    for name in ("target", "draft"):
        export = tmp_path / name / "export"
        copy = root / str(export).lstrip("/")
        files = sorted(f.relative_to(export) for f in export.rglob("*") if f.is_file())
        assert files and files == sorted(
            f.relative_to(copy) for f in copy.rglob("*") if f.is_file()
        )
        assert all((export / f).read_bytes() == (copy / f).read_bytes() for f in files)
    info = json.loads((tmp_path / "draft" / "export" / "training.json").read_text())
    assert info["teacher"].endswith("tiny_target.yaml")
    assert "--max-steps 2" in info["command"] and "--set train.log_every=1" in info["command"]

    part = tmp_path / "out" / "parts" / "models.tar.part01"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    with pytest.raises(recipe.RecipeError, match="SHA-256 differs"):
        recipe.unpack([returned, tmp_path / "out" / "parts"], root=root)


def test_recipe_skips_the_stages_after_a_failed_one(tmp_path, capsys):
    path = _tiny_recipe(tmp_path)
    text = path.read_text().replace(
        "set: [train.eval_every=1000000]", "set: [data.data_dir=/nowhere]"
    )
    path.write_text(text)
    argv = ["run", str(path), "--out", str(tmp_path / "out")]
    assert recipe.main([*argv, "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]) == 1
    captured = capsys.readouterr()
    assert (
        "tiny: failed" in captured.out and "tiny_d: skipped (tiny did not finish)" in captured.out
    )
    assert "stages not finished: tiny, tiny_d" in captured.err


def test_recipe_deadline_cuts_budgets_and_skips_what_cannot_fit(tmp_path, capsys):
    path = _tiny_recipe(tmp_path)  # a target that fails at once (no data), then its draft
    path.write_text(path.read_text().replace("train.eval_every=1000000", "data.data_dir=/x"))
    out_dir = tmp_path / "out"
    loaded = recipe.load_recipe(path)
    recipe.run_stages(loaded, out_dir=out_dir, scale=3.0, python="python", deadline_s=40,
                      reserve_s=5)  # fmt: skip
    out = capsys.readouterr().out
    assert re.search(r"--time-budget 3[45] ", out)  # 3 x 20 s, cut to end 5 s before 40 s
    runs = recipe.run_stages(loaded, out_dir=out_dir, scale=3.0, python="python",
                             deadline_s=20, reserve_s=5)  # fmt: skip
    assert [(r.status, r.reason) for r in runs] == [
        ("skipped", "the deadline leaves 15s"),
        ("skipped", "tiny did not finish"),
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("stages: []", "non-empty list"),
        ("stages: [{config: configs/models/summ_draft.yaml}]", "one of `budget_s` and `steps`"),
        ("stages: [{config: configs/models/summ_draft.yaml, budget_s: 1, steps: 2}]",
         "not both"),
        ("stages: [{config: configs/models/summ_draft.yaml, steps: 0}]", "positive integer"),
        ("stages: [{config: configs/models/summ_draft.yaml, budget_s: 1, when: x}]",
         "unknown key when"),
        ("stages: [{config: configs/models/summ_draft.yaml, budget_s: 1, after: [x]}]",
         "after 'x' names no earlier stage"),
        ("stages: [{config: configs/models/summ_draft.yaml, budget_s: -1}]", "positive number"),
        ("stages: [{config: configs/models/nope.yaml, budget_s: 1}]", "config file not found"),
    ],
)  # fmt: skip
def test_recipe_errors_name_the_stage_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(recipe.RecipeError, match=message):
        recipe.load_recipe(path)


def test_committed_recipe_loads_and_fits_the_return_limits():
    loaded = recipe.load_recipe(REPO_ROOT / "configs" / "recipes" / "debian_pair.yaml")
    names = [s.name for s in loaded.stages]
    assert names == ["ende_target_debian", "ende_draft_debian", "ende_draft_debian_base"]
    assert loaded.part_bytes <= 16 * 2**20
    assert all("train.precompile=true" in stage.overrides for stage in loaded.stages)
    for stage in loaded.stages[1:]:
        assert stage.after == ("ende_target_debian",)


def test_summarizer_recipe_trains_a_pair_sized_as_the_translation_pair():
    loaded = recipe.load_recipe(REPO_ROOT / "configs" / "recipes" / "summ_pair.yaml")
    assert [s.name for s in loaded.stages] == ["summ_large_target", "summ_large_draft"]
    assert loaded.stages[1].after == ("summ_large_target",)
    assert loaded.part_bytes <= 16 * 2**20
    assert all("train.precompile=true" in stage.overrides for stage in loaded.stages)
    target = configs.load_model_config(REPO_ROOT / "configs/models/summ_large_target.yaml")
    draft = configs.load_model_config(REPO_ROOT / "configs/models/summ_large_draft.yaml")
    translation = configs.load_model_config(REPO_ROOT / "configs/models/ende_target_debian.yaml")
    assert target.model == translation.model  # the same T5-small shape
    assert target.data.source == draft.data.source == "summaries"
    assert configs.resolve(draft.teacher) == configs.resolve(
        "configs/models/summ_large_target.yaml"
    )
    assert draft.train.distill_weight > 0
