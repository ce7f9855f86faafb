"""pipelines.kd_data: the teacher's own translations as a Ding-style data folder that the
trainer reads (sequence-level distillation data for a draft)."""

from __future__ import annotations

import functools
import json

import pytest
import sentencepiece as spm

from pipelines import configs, kd_data, train
from pipelines.data import ding
from tests.test_train_job import PAIRS, tiny_config  # noqa: F401  (fixture)


@pytest.fixture
def trained_teacher(tiny_config, tmp_path):  # noqa: F811
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert (
        train.main(["--config", str(tiny_config), "--max-steps", "2", "--tracking-uri", uri]) == 0
    )
    return tiny_config


@pytest.mark.slow
def test_kd_folder_holds_the_teachers_translations_and_trains_a_student(trained_teacher, tmp_path):
    out = tmp_path / "kd"
    logged: list[str] = []
    info = kd_data.build(
        teacher_config=trained_teacher,
        output=out,
        temperatures=(0.0, 1.0),
        batch_size=2,
        max_new_tokens=6,
        log=logged.append,
    )
    sentences = [en for en, de in PAIRS if ding.is_sentence_pair((en, de))]
    pairs = ding.read_split(out, "train")
    # one line per (temperature, input), inputs in file order, none dropped
    assert [en for en, _ in pairs] == sentences * 2
    assert info["pairs"] == len(pairs) == 2 * len(sentences)
    assert info["teacher_step"] == 2 and info["temperatures"] == [0.0, 1.0]
    assert json.loads((out / "kd.json").read_text()) == info
    data_dir = configs.resolve(configs.load_model_config(trained_teacher).data.data_dir)
    assert ding.read_split(out, "validation") == ding.read_split(data_dir, "validation")
    assert any("wrote 4 pairs" in line for line in logged)

    # the T=0 lines are the teacher's greedy decodes, whatever the batching
    model_file = configs.load_model_config(trained_teacher)
    processor = spm.SentencePieceProcessor(
        model_file=str(configs.resolve(model_file.data.vocab_path))
    )
    encoded = [train.trim(x, 64) for x in processor.encode([kd_data.PREFIX + s for s in sentences])]
    one_by_one = kd_data.decode_all(
        kd_data.teacher_model(model_file, None),
        encoded,
        temperature=0.0,
        seed=0,
        batch_size=1,
        max_new_tokens=6,
    )
    expected = [processor.decode(ids).strip() for ids in one_by_one]
    assert [de for _, de in pairs[: len(sentences)]] == expected
    assert info["truncated"] >= sum(len(ids) >= 6 for ids in one_by_one)

    # the folder is a data_dir the trainer reads
    student = tmp_path / "student.yaml"
    text = trained_teacher.read_text().replace("name: tiny", "name: student")
    text = text.replace(f"data_dir: {data_dir}", f"data_dir: {out}")
    text = text.replace(f"{tmp_path}/train", f"{tmp_path}/s_train")
    text = text.replace(f"{tmp_path}/export", f"{tmp_path}/s_export")
    student.write_text(text)
    assert configs.load_model_config(student).data.data_dir == str(out)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert train.main(["--config", str(student), "--max-steps", "1", "--tracking-uri", uri]) == 0


def test_select_inputs_dedupes_and_limits(tiny_config):  # noqa: F811
    data = configs.load_model_config(tiny_config).data
    assert kd_data.select_inputs(data, inputs="all", limit=3) == [en for en, _ in PAIRS[:3]]
    assert kd_data.select_inputs(data, inputs="sentences", limit=0) == [
        "The house is small.",
        "I am tired!",
    ]
    with pytest.raises(ValueError, match="--inputs must be"):
        kd_data.select_inputs(data, inputs="phrases", limit=0)


def test_select_inputs_reads_the_debian_corpus_with_its_sources_interleaved():
    from pipelines.data.debian import build

    data = configs.load_model_config("configs/models/ende_target_debian.yaml").data
    english = kd_data.select_inputs(data, inputs="sentences", limit=50)
    assert len(english) == len(set(english)) == 50
    data_dir = configs.resolve(data.data_dir)
    sources = [
        name
        for name in build.sources_of(data_dir)
        if set(english) & {en for en, _ in build.read_source_split(data_dir, name, "train")}
    ]
    assert len(sources) >= 3  # the first 50 already mix several sources


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--temperatures", "0,-1"], "--temperatures must be >= 0"),
        (["--temperatures", "zero"], "comma-separated numbers"),
        (["--batch-size", "0"], "--batch-size"),
        (["--processes", "0"], "--processes must be >= 1"),
        (["--shard", "2/2"], "--shard must be I/N"),
    ],
)
def test_cli_rejects_bad_settings_before_any_work(tiny_config, tmp_path, flags, message):  # noqa: F811
    argv = ["--teacher-config", str(tiny_config), "--output", str(tmp_path / "kd"), *flags]
    with pytest.raises(SystemExit, match=message):
        kd_data.main(argv)
    assert not (tmp_path / "kd").exists()


@pytest.mark.slow
def test_a_stopped_run_resumes_from_its_parts_and_a_larger_limit_keeps_them(
    trained_teacher, tmp_path, monkeypatch
):
    monkeypatch.setattr(kd_data, "PART_INPUTS", 2)
    real_decode, calls, stop = kd_data.decode_all, [], [True]

    class Stopped(Exception):
        pass

    def decode_all(model, encoded, **kwargs):
        calls.append(kwargs["first_id"])
        if kwargs["first_id"] == 2 and stop:
            stop.pop()
            raise Stopped  # the first run is stopped in its second part, once
        return real_decode(model, encoded, **kwargs)

    monkeypatch.setattr(kd_data, "decode_all", decode_all)
    build = functools.partial(
        kd_data.build,
        teacher_config=trained_teacher,
        inputs="all",
        temperatures=(0.0, 1.0),
        batch_size=2,
        max_new_tokens=6,
        log=lambda line: None,
    )
    out = tmp_path / "kd"
    with pytest.raises(Stopped):
        build(output=out, limit=3)
    assert calls == [0, 2] and not (out / "train.tsv").exists()
    assert len(list((out / "parts").glob("T0_*.json"))) == 1  # the first part was kept

    calls.clear()
    info = build(output=out, limit=3)
    assert calls == [2, 0, 2]  # T=0: only the missing part; T=1: both
    assert info["reused_from_parts"] == 2 and info["pairs"] == 6

    # a larger limit keeps every whole part; the last part's inputs changed, so it is new
    calls.clear()
    info = build(output=out, limit=4)  # all 4 inputs: parts [0, 1] (kept) and [2, 3] (new)
    assert calls == [2, 2] and info["reused_from_parts"] == 4

    # the same as a run that started from nothing (T=1 included: a sample's seed is its
    # input's index, not its batch)
    calls.clear()
    fresh = tmp_path / "fresh"
    build(output=fresh, limit=4)
    assert calls == [0, 2, 0, 2]
    assert ding.read_split(out, "train") == ding.read_split(fresh, "train")

    # a part that does not read back as token ids is decoded again, not trusted
    part = sorted((out / "parts").glob("T0_00000000_*.json"))[0]
    part.write_text('{"outputs": [["x"], []]}')
    calls.clear()
    build(output=out, limit=4)
    assert calls == [0]
    assert ding.read_split(out, "train") == ding.read_split(fresh, "train")


@pytest.mark.slow
def test_shards_split_the_parts_and_processes_give_the_one_process_folder(
    trained_teacher, tmp_path, monkeypatch
):
    build = functools.partial(
        kd_data.build,
        teacher_config=trained_teacher,
        inputs="all",
        limit=5,
        temperatures=(0.0,),
        batch_size=2,
        max_new_tokens=6,
        log=lambda line: None,
    )
    one = tmp_path / "one"
    build(output=one)  # one process, one part: the folder to match

    monkeypatch.setattr(kd_data, "PART_INPUTS", 1)  # the 4 inputs, a part each
    real_decode, calls = kd_data.decode_all, []

    def decode_all(model, encoded, **kwargs):
        calls.append(kwargs["first_id"])
        return real_decode(model, encoded, **kwargs)

    monkeypatch.setattr(kd_data, "decode_all", decode_all)
    out = tmp_path / "sharded"
    assert build(output=out, shard=(1, 2))["shard"] == [1, 2]
    assert calls == [1, 3] and not (out / "train.tsv").exists()
    build(output=out, shard=(0, 2))
    assert calls == [1, 3, 0, 2]
    build(output=out)  # every part is there: nothing decoded, the folder written
    assert calls == [1, 3, 0, 2]
    assert ding.read_split(out, "train") == ding.read_split(one, "train")

    # --processes 2 through the command line: a child process decodes shard 1
    monkeypatch.undo()
    cli = tmp_path / "cli"
    argv = ["--teacher-config", str(trained_teacher), "--output", str(cli), "--inputs", "all"]
    argv += ["--limit", "5", "--temperatures", "0", "--batch-size", "2"]
    info = kd_data.main([*argv, "--max-new-tokens", "6", "--processes", "2"])
    assert info["pairs"] == 4
    assert ding.read_split(cli, "train") == ding.read_split(one, "train")
