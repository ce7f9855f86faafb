"""pipelines.configs (typed YAML, errors that name key and file) and the training job
end to end on a tiny model and a tiny TSV corpus: checkpoints, export, resume."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import pytest

from pipelines import configs, train
from specdec_core import checkpoints

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

TINY_YAML = """
name: tiny
family: t5
model: {{vocab_size: 8000, emb_dim: 16, num_heads: 2, head_dim: 8, mlp_dim: 16,
         num_encoder_layers: 1, num_decoder_layers: 1, logits_via_embedding: true}}
data: {{source: tsv, data_dir: {data}, sentence_weight: 2}}
train: {{max_steps: 4, tokens_per_batch: 64, max_batch_size: 8, warmup_steps: 2,
         log_every: 2, eval_every: 4, eval_examples: 4, bleu_examples: 2, samples: 1}}
checkpoint: {{train_dir: {out}/train, export_dir: {out}/export, every_steps: 2, keep: 1}}
"""

PAIRS = [
    ("The house is small.", "Das Haus ist klein."),
    ("good morning", "guten Morgen"),
    ("I am tired!", "Ich bin müde!"),
    ("water", "Wasser"),
]


def _write_tiny_data(tmp_path) -> pathlib.Path:
    """PAIRS as the train, validation and test TSV splits of tmp_path/data."""
    data = tmp_path / "data"
    data.mkdir()
    lines = "".join(f"{en}\t{de}\n" for en, de in PAIRS)
    for split in ("train", "validation", "test"):
        (data / f"{split}.tsv").write_text(lines, encoding="utf-8")
    return data


@pytest.fixture
def tiny_config(tmp_path) -> pathlib.Path:
    data = _write_tiny_data(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_YAML.format(data=data, out=tmp_path), encoding="utf-8")
    return path


def test_committed_model_configs_load_with_the_vocabulary_size():
    sizes = {}
    for name in ("ende_target_debian", "ende_draft_debian_seq2", "ende_draft_debian"):
        loaded = configs.load_model_config(REPO_ROOT / "configs" / "models" / f"{name}.yaml")
        assert loaded.name == name
        assert loaded.model.vocab_size == 16000
        assert loaded.export_dir == REPO_ROOT / "assets" / "checkpoints" / name
        sizes[name] = configs.param_count(loaded.model)
    assert sizes["ende_draft_debian_seq2"] == sizes["ende_draft_debian"]  # the same shape
    assert sizes["ende_draft_debian_seq2"] < sizes["ende_target_debian"] / 10


def _megabytes(folders) -> float:
    return sum(p.stat().st_size for f in folders for p in f.rglob("*") if p.is_file()) / 1e6


def test_every_committed_checkpoint_is_a_model_configs_export():
    exports = {
        configs.load_model_config(path).export_dir
        for path in (REPO_ROOT / "configs" / "models").glob("*.yaml")
    }
    folders = sorted(p for p in (REPO_ROOT / "assets" / "checkpoints").iterdir() if p.is_dir())
    orphans = [f.name for f in folders if f not in exports]
    assert not orphans, f"checkpoints that no configs/models file names: {orphans}"
    debian = [f for f in folders if "debian" in f.name]
    assert {f.name for f in debian} == {
        "ende_target_debian",
        "ende_draft_debian_seq2",
        "ende_draft_debian_target_encoder",
    }
    assert _megabytes(debian) <= 200, f"the Debian pair takes {_megabytes(debian):.1f} MB"


def test_committed_english_lm_configs_are_decoder_pairs_within_30_mb():
    sizes = {}
    for name in ("gpt_en_target", "gpt_en_draft", "lamda_en_target", "lamda_en_draft"):
        loaded = configs.load_model_config(REPO_ROOT / "configs" / "models" / f"{name}.yaml")
        assert loaded.family == "decoder" and loaded.model.vocab_size == 8000
        assert loaded.model.variant == name.split("_")[0]
        assert loaded.data.source == "lm" and loaded.data.lm_side == "en"
        sizes[name] = configs.param_count(loaded.model)
    assert sizes["gpt_en_draft"] < sizes["gpt_en_target"] / 5
    assert sizes["lamda_en_draft"] < sizes["lamda_en_target"] / 5
    assert 2 * sum(sizes.values()) < 30e6  # bfloat16 exports: the 30 MB budget


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: {}\nbogus: 1\n", "unknown key bogus"),
        ("model: {vocab_size: 8, emb_dim: 4, num_heads: 1, wings: 2}\n", "unknown key model.wings"),
        ("model: {}\ntrain: {learning_rate: fast}\n", "train.learning_rate must be float"),
        ("model: {}\ntrain: {max_steps: 1.5}\n", "train.max_steps must be int"),
        ("family: rnn\nmodel: {}\n", "family must be one of"),
        ("data: {}\n", "missing key model"),
    ],
)
def test_config_errors_name_the_key_and_the_file(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(configs.ConfigError, match=message) as error:
        configs.load_model_config(path)
    assert str(path) in str(error.value)


def test_sampler_is_deterministic_per_step_and_batches_shift_targets(tiny_config):
    model_file = configs.load_model_config(tiny_config)
    examples = train.load_examples(model_file.data, "train")
    assert examples.is_sentence.tolist() == [True, False, True, False]
    sampler = train.BucketSampler.build(examples, model_file.train, sentence_weight=2.0)
    key, indices = sampler.draw(3)
    again_key, again = sampler.draw(3)
    assert key == again_key
    np.testing.assert_array_equal(indices, again)
    assert set(indices.tolist()) <= set(sampler.buckets[key].tolist())
    assert len(indices) == sampler.batch_size(key) == 8  # 64 tokens // 16 -> 4, at least 8
    batch = train.make_batch(examples, [3], input_len=16, target_len=8)
    target = batch["decoder_target_tokens"][0]
    assert target[target > 0][-1] == train.EOS_ID
    length = int((target > 0).sum())
    np.testing.assert_array_equal(batch["decoder_input_tokens"][0, 1:length], target[: length - 1])
    assert not batch["decoder_input_tokens"][0, length:].any()  # EOS is never an input
    assert batch["decoder_input_tokens"][0, 0] == 0


@pytest.mark.slow
def test_train_job_checkpoints_exports_and_resumes(tiny_config, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert train.main(["--config", str(tiny_config), "--tracking-uri", uri]) == 0
    model_file = configs.load_model_config(tiny_config)
    assert [step for step, _ in train.complete_checkpoints(model_file.train_dir)] == [4]
    info = json.loads((model_file.export_dir / "training.json").read_text())
    assert info["step"] == 4 and set(info["validation"]) >= {"loss", "accuracy", "bleu"}
    exported = checkpoints.load_t5x(model_file.export_dir / "checkpoint_4")
    assert exported["decoder"]["decoder_norm"]["scale"].dtype.name == "bfloat16"
    trainer = train.Trainer(model_file, max_steps=6)
    params, _, run = trainer.initial_state(resume=True)
    assert run.step == 4 and run.last_eval == info["validation"]
    saved = checkpoints.load_t5x(model_file.train_dir / "checkpoint_4")
    np.testing.assert_array_equal(
        np.asarray(params["token_embedder"]["embedding"]), saved["token_embedder"]["embedding"]
    )
    final = trainer.fit(resume=True, tracking_uri=uri, command="test")
    assert final.step == 6
    assert [step for step, _ in train.complete_checkpoints(model_file.train_dir)] == [6]
    result = train.evaluate_checkpoint(model_file, split="test")
    assert result["examples"] == 4 and 0.0 <= result["bleu"] <= 100.0
    assert result["tokens"] == sum(
        len(y) for y in train.load_examples(model_file.data, "test").targets
    )
    # --sentences N: the first N full-sentence pairs only (PAIRS 0 and 2).
    examples = train.load_examples(model_file.data, "train")
    result = train.evaluate_checkpoint(model_file, split="train", sentences=2)
    assert result["examples"] == 2
    assert result["tokens"] == len(examples.targets[0]) + len(examples.targets[2])
    with pytest.raises(ValueError, match="holds 2 full-sentence pairs, fewer than --sentences 3"):
        train.evaluate_checkpoint(model_file, split="train", sentences=3)
    with pytest.raises(ValueError, match="--sentences must be at least 1, got 0"):
        train.evaluate_checkpoint(model_file, split="train", sentences=0)
    with pytest.raises(SystemExit, match="only applies with --evaluate"):
        train.main(["--config", str(tiny_config), "--sentences", "2"])


def test_resume_without_train_state_warm_starts_from_the_export(tiny_config, tmp_path):
    """A fresh checkout has the committed bfloat16 export but no runs/train state."""
    import shutil

    import optax

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert (
        train.main(["--config", str(tiny_config), "--max-steps", "2", "--tracking-uri", uri]) == 0
    )
    model_file = configs.load_model_config(tiny_config)
    shutil.rmtree(model_file.train_dir)
    trainer = train.Trainer(model_file, max_steps=4)
    params, opt_state, run = trainer.initial_state(resume=True)
    info = json.loads((model_file.export_dir / "training.json").read_text())
    assert run.step == 2 and run.last_eval == info["validation"]
    exported = checkpoints.load_t5x(model_file.export_dir / "checkpoint_2")
    np.testing.assert_array_equal(
        np.asarray(params["token_embedder"]["embedding"]),
        exported["token_embedder"]["embedding"].astype(np.float32),
    )
    # The learning-rate schedule continues at step 2; the moments start afresh.
    counts = [
        int(node.count)
        for node in jax.tree.leaves(
            opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState)
        )
        if isinstance(node, optax.ScaleByScheduleState)
    ]
    assert counts == [2]
    *_, fresh_run = trainer.initial_state(resume=False)
    assert fresh_run.step == 0


@pytest.mark.slow
def test_init_from_starts_a_distilled_student_from_another_export(tiny_config, tmp_path):
    """``checkpoint.init_from`` + ``teacher``: a draft fine-tuned towards the target from a
    committed export (how a distilled draft can start); training.json says where it came from."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert (
        train.main(["--config", str(tiny_config), "--max-steps", "2", "--tracking-uri", uri]) == 0
    )
    teacher = configs.load_model_config(tiny_config)
    student_yaml = tmp_path / "student.yaml"
    text = tiny_config.read_text().replace("name: tiny", "name: student")
    text = text.replace(f"{tmp_path}/train", f"{tmp_path}/student_train")
    text = text.replace(
        f"export_dir: {tmp_path}/export,",
        f"export_dir: {tmp_path}/student_export, init_from: {teacher.export_dir},",
    )
    text += f"teacher: {tiny_config}\n"
    student_yaml.write_text(
        text.replace("warmup_steps: 2,", "warmup_steps: 2, distill_weight: 1.0,")
    )
    student = configs.load_model_config(student_yaml)
    assert student.init_from == teacher.export_dir and student.train.distill_weight == 1.0
    params, _, run = train.Trainer(student, max_steps=4).initial_state(resume=True)
    exported = checkpoints.load_t5x(teacher.export_dir / "checkpoint_2")
    assert run.step == 0
    np.testing.assert_array_equal(
        np.asarray(params["token_embedder"]["embedding"]),
        exported["token_embedder"]["embedding"].astype(np.float32),
    )
    assert (
        train.main(["--config", str(student_yaml), "--max-steps", "2", "--tracking-uri", uri]) == 0
    )
    info = json.loads((student.export_dir / "training.json").read_text())
    assert info["step"] == 2
    assert info["init_from"] == str(teacher.export_dir) and info["teacher"] == str(tiny_config)

    student_yaml.write_text(text.replace(str(teacher.export_dir), str(tmp_path / "nowhere")))
    with pytest.raises(RuntimeError, match=r"init_from .*nowhere"):
        train.Trainer(configs.load_model_config(student_yaml)).initial_state(resume=False)


LM_YAML = """
name: tiny_lm
family: decoder
model: {{vocab_size: 8000, emb_dim: 16, num_heads: 2, head_dim: 8, mlp_dim: 32,
         num_layers: 1, variant: {variant}, max_len: 64}}
data: {{source: lm, lm_side: {side}, data_dir: {data}, max_target_length: 16}}
train: {{max_steps: 2, tokens_per_batch: 64, max_batch_size: 8, warmup_steps: 1,
         log_every: 1, eval_every: 2, eval_examples: 4, bleu_examples: 0}}
checkpoint: {{train_dir: {out}/train_lm, export_dir: {out}/export_lm, every_steps: 2}}
"""


@pytest.mark.parametrize("variant,side", [("gpt", "en"), ("lamda", "de")])
def test_lm_source_trains_decoder_only_models_on_one_side(tiny_config, tmp_path, variant, side):
    data = tiny_config.parent / "data"
    with (data / "train.tsv").open("a", encoding="utf-8") as handle:
        handle.write("water\tWasser\n")  # a duplicate line: the LM sees each line once
    path = tmp_path / "lm.yaml"
    path.write_text(LM_YAML.format(variant=variant, side=side, data=data, out=tmp_path))
    model_file = configs.load_model_config(path)
    examples = train.load_examples(model_file.data, "train")
    column = 0 if side == "en" else 1
    assert len(examples) == len(PAIRS)
    texts = examples.english if side == "en" else examples.german
    assert texts == [pair[column] for pair in PAIRS]
    assert examples.is_sentence.tolist() == [True, False, True, False]
    assert all(len(x) == 0 for x in examples.inputs)
    batch = train.to_decoder_only(train.make_batch(examples, [0], input_len=16, target_len=16))
    target = examples.targets[0]
    # Loss on every token of the line (EOS included), after the start id 0.
    assert batch["decoder_loss_weights"][0].sum() == len(target)
    np.testing.assert_array_equal(batch["decoder_target_tokens"][0, : len(target)], target)
    assert batch["decoder_input_tokens"][0, 0] == 0
    assert train.main(["--config", str(path), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 0
    info = json.loads((model_file.export_dir / "training.json").read_text())
    assert info["step"] == 2 and np.isfinite(info["validation"]["loss"])


def test_lm_source_rejects_an_unknown_side(tiny_config, tmp_path):
    path = tmp_path / "lm.yaml"
    data = tiny_config.parent / "data"
    path.write_text(LM_YAML.format(variant="gpt", side="fr", data=data, out=tmp_path))
    with pytest.raises(configs.ConfigError, match="lm_side"):
        train.load_examples(configs.load_model_config(path).data, "train")


def test_dropout_keys_follow_the_step_so_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    data = _write_tiny_data(tmp_path)
    with_dropout = TINY_YAML.replace(
        "logits_via_embedding: true", "logits_via_embedding: true, dropout_rate: 0.2"
    )
    finals = {}
    for name, text, stops in (
        ("straight", with_dropout, [4]),
        ("resumed", with_dropout, [2, 4]),
        ("no_dropout", TINY_YAML, [4]),
    ):
        out = tmp_path / name
        path = tmp_path / f"{name}.yaml"
        path.write_text(text.format(data=data, out=out), encoding="utf-8")
        model_file = configs.load_model_config(path)
        for stop in stops:
            trainer = train.Trainer(model_file, max_steps=stop)
            trainer.fit(resume=True, tracking_uri=f"sqlite:///{out / 'mlflow.db'}", command="t")
        assert (trainer.dropout_key(3) is None) == (name == "no_dropout")
        finals[name] = jax.tree.leaves(checkpoints.load_t5x(model_file.train_dir / "checkpoint_4"))
    for a, b in zip(finals["straight"], finals["resumed"], strict=True):
        np.testing.assert_array_equal(a, b)
    # the trainer really drops: the same steps without dropout end elsewhere
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(finals["straight"], finals["no_dropout"], strict=True)
    )
