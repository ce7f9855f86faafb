"""Tests for the seqio tasks and the SentencePiece vocabulary, on files the tests make."""

from __future__ import annotations

import importlib
import importlib.resources
import sys

import pytest

seqio = pytest.importorskip("seqio")
tf = pytest.importorskip("tensorflow")

from pipelines import tasks, vocab  # noqa: E402
from pipelines.data import ding  # noqa: E402

PAIRS = [
    ("eel stock", "Aalbestand"),
    ("It was sheer coincidence.", "Es war purer Zufall."),
    ("The dress is pure silk.", "Das Kleid ist aus reiner Seide."),
]
SEQUENCE_LENGTH = {"inputs": 64, "targets": 64}


@pytest.fixture(scope="module")
def tiny_vocab_path(tmp_path_factory):
    """A 64-piece unigram model trained on the prompts and a few sentences of each side."""
    sentences = [
        "translate English to German: summarize: ",
        *(text for pair in PAIRS for text in pair),
        "Hello world. Hallo Welt. Breaking news: the cat sat on the mat.",
        "A cat sat on a mat. Eine Katze saß auf einer Matte.",
    ] * 20
    path = tmp_path_factory.mktemp("spm") / "tiny.model"
    return vocab.train_sentencepiece(iter(sentences), path, vocab_size=64, character_coverage=1.0)


def test_vocabulary_has_t5_special_ids(tiny_vocab_path):
    vocabulary = vocab.get_vocabulary(tiny_vocab_path)
    assert (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (0, 1, 2)
    assert vocabulary.vocab_size == 64
    assert vocabulary.decode(vocabulary.encode("Es war purer Zufall.")) == "Es war purer Zufall."
    vocab_lines = tiny_vocab_path.with_suffix(".vocab").read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in vocab_lines[:3]] == ["<pad>", "</s>", "<unk>"]


def test_vocabulary_training_is_deterministic(tmp_path):
    sentences = [text for pair in PAIRS for text in pair] * 10
    first = vocab.train_sentencepiece(iter(sentences), tmp_path / "a.model", vocab_size=40)
    second = vocab.train_sentencepiece(iter(sentences), tmp_path / "b.model", vocab_size=40)
    assert first.read_bytes() == second.read_bytes()


def test_get_vocabulary_missing_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/none.model.*pipelines.vocab"):
        vocab.get_vocabulary(tmp_path / "none.model")


def _decoded_examples(task_name: str, split: str, vocabulary) -> list[tuple[str, str]]:
    """(inputs, targets) strings of a task split, checking each ends in exactly one EOS."""
    task = seqio.get_mixture_or_task(task_name)
    dataset = task.get_dataset(SEQUENCE_LENGTH, split=split, shuffle=False)
    decoded = []
    for example in dataset.as_numpy_iterator():
        for feature in ("inputs", "targets"):
            ids = example[feature].tolist()
            assert ids[-1] == vocabulary.eos_id and vocabulary.eos_id not in ids[:-1]
        decoded.append(
            (
                vocabulary.decode(example["inputs"].tolist()[:-1]),
                vocabulary.decode(example["targets"].tolist()[:-1]),
            )
        )
    return decoded


@pytest.mark.parametrize("compress", [False, True])
def test_ding_task_translates_english_to_german(tmp_path, tiny_vocab_path, compress):
    names = [f"{split}.tsv.gz" if compress else f"{split}.tsv" for split in ding.SPLITS]
    for name, pairs in zip(names, (PAIRS, PAIRS[1:], PAIRS[2:]), strict=True):
        ding.write_split(tmp_path / name, pairs)
    registered = tasks.register_tasks(
        ding_dir=tmp_path, tfds_data_dir=tmp_path / "tfds", vocab_path=tiny_vocab_path
    )
    assert registered == (
        "ding_ende",
        "debian_ende",
        "wmt_t2t_ende",
        "cnn_dailymail",
        "debian_summaries",
    )
    vocabulary = vocab.get_vocabulary(tiny_vocab_path)
    assert _decoded_examples("ding_ende", "train", vocabulary) == [
        ("translate English to German: eel stock", "Aalbestand"),
        ("translate English to German: It was sheer coincidence.", "Es war purer Zufall."),
        ("translate English to German: The dress is pure silk.", "Das Kleid ist aus reiner Seide."),
    ]
    assert _decoded_examples("ding_ende", "test", vocabulary) == [
        ("translate English to German: The dress is pure silk.", "Das Kleid ist aus reiner Seide.")
    ]
    assert tasks.read_ding_split(tmp_path, "validation") == PAIRS[1:]


def test_register_tasks_is_idempotent_and_uses_the_last_directories(tmp_path, tiny_vocab_path):
    for directory, pairs in ((tmp_path / "a", PAIRS[:1]), (tmp_path / "b", PAIRS[1:2])):
        directory.mkdir()
        for split in ding.SPLITS:
            ding.write_split(directory / f"{split}.tsv", pairs)
    for directory in (tmp_path / "a", tmp_path / "b"):
        tasks.register_tasks(ding_dir=directory, tfds_data_dir=tmp_path, vocab_path=tiny_vocab_path)
    vocabulary = vocab.get_vocabulary(tiny_vocab_path)
    assert _decoded_examples("ding_ende", "validation", vocabulary) == [
        ("translate English to German: It was sheer coincidence.", "Es war purer Zufall.")
    ]


def test_missing_ding_files_name_the_directory(tmp_path, tiny_vocab_path):
    tasks.register_tasks(
        ding_dir=tmp_path / "nowhere", tfds_data_dir=tmp_path, vocab_path=tiny_vocab_path
    )
    task = seqio.get_mixture_or_task("ding_ende")
    with pytest.raises(
        FileNotFoundError, match=f"no train.tsv or train.tsv.gz in {tmp_path}/nowhere"
    ):
        task.get_dataset(SEQUENCE_LENGTH, split="train", shuffle=False)


@pytest.mark.parametrize(
    ("task_name", "expected_dir", "command"),
    [
        (
            "wmt_t2t_ende",
            "wmt_t2t_translate/de-en/1.0.0",
            "tfds build wmt_t2t_translate --config de-en",
        ),
        ("cnn_dailymail", "cnn_dailymail/3.4.0", "tfds build cnn_dailymail --data_dir"),
    ],
)
def test_missing_tfds_data_names_the_directory(
    tmp_path, tiny_vocab_path, task_name, expected_dir, command
):
    tasks.register_tasks(ding_dir=tmp_path, tfds_data_dir=tmp_path, vocab_path=tiny_vocab_path)
    task = seqio.get_mixture_or_task(task_name)
    with pytest.raises(tasks.DatasetNotPreparedError) as error:
        task.get_dataset(SEQUENCE_LENGTH, split="validation", shuffle=False)
    message = str(error.value)
    assert f"no dataset_info.json in {tmp_path}/{expected_dir}" in message
    assert command in message
    assert "never downloads" in message
    assert not any(tmp_path.iterdir())  # nothing was created, let alone downloaded


def _store_tfds_dataset(monkeypatch, data_dir, *, name, config, version, columns) -> None:
    """Writes a prepared TFDS dataset with one 'validation' split from string columns."""
    try:  # TFDS's writer (not its reader) imports this backport; the stdlib one serves
        importlib.import_module("importlib_resources")
    except ImportError:
        monkeypatch.setitem(sys.modules, "importlib_resources", importlib.resources)
    import tensorflow_datasets as tfds

    features = tfds.features.FeaturesDict({key: tfds.features.Text() for key in columns})
    tfds.dataset_builders.store_as_tfds_dataset(
        name=name,
        version=version,
        config=config,
        features=features,
        split_datasets={"validation": tf.data.Dataset.from_tensor_slices(columns)},
        data_dir=str(data_dir),
    )


def test_tfds_tasks_read_prepared_data_with_t5_preprocessing(
    monkeypatch, tmp_path, tiny_vocab_path
):
    _store_tfds_dataset(
        monkeypatch,
        tmp_path,
        name="wmt_t2t_translate",
        config="de-en",
        version="1.0.0",
        columns={"de": ["Hallo Welt."], "en": ["Hello world."]},
    )
    _store_tfds_dataset(
        monkeypatch,
        tmp_path,
        name="cnn_dailymail",
        config=None,
        version="3.4.0",
        columns={
            "article": ["Breaking news: the cat sat on the mat."],
            "highlights": ["A cat sat on a mat."],
            "id": ["0"],
        },
    )
    tasks.register_tasks(ding_dir=tmp_path, tfds_data_dir=tmp_path, vocab_path=tiny_vocab_path)
    vocabulary = vocab.get_vocabulary(tiny_vocab_path)
    assert _decoded_examples("wmt_t2t_ende", "validation", vocabulary) == [
        ("translate English to German: Hello world.", "Hallo Welt.")
    ]
    assert _decoded_examples("cnn_dailymail", "validation", vocabulary) == [
        ("summarize: Breaking news: the cat sat on the mat.", "A cat sat on a mat.")
    ]


def test_committed_vocabulary_round_trips_a_test_sentence():
    vocabulary = vocab.get_vocabulary()
    assert vocabulary.vocab_size == 8000
    assert (vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id) == (0, 1, 2)
    english, german = ding.read_split(ding.DEFAULT_DATA_DIR, "test")[0]
    for text in (english, german, "translate English to German: Straßenbahn über Brücken."):
        ids = vocabulary.encode(text)
        assert vocabulary.unk_id not in ids
        assert vocabulary.decode(ids) == text
