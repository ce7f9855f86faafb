"""Tests for the Ding dictionary parser and its train / validation / test split."""

from __future__ import annotations

import json
import random

import pytest

from pipelines.data import ding

FAKE_DICTIONARY = """\
# Version :: devel 2023-01-30
# Copyright (c) :: Frank Richter
Aalbestand {m} | Aalbestände {pl} :: eel stock | eel stocks
Lüftungsgerät {n} [techn.] | Lüftungsgeräte {pl} :: air handling unit /AHU/; air handler | \
air handling units; air handlers
(im Gedränge) aneinanderstoßen {vi} :: to jostle against each other (in a crowd)
Das ist blanker Unsinn. | Es war purer Zufall. :: That is sheer/pure nonsense. | \
It was sheer/pure coincidence.
Zwei | Drei | Vier :: two | three
Abfall… | Abfälle {pl} :: waste | wastes
Aalbestand {m} :: eel stock
{f} :: [Br.]

Arbeit (an jdn.) abgeben {vt} [ugs.] :: to farm out <> work (to sb.)
this line has no separator
"""

EXPECTED_PAIRS = [
    ("eel stock", "Aalbestand"),
    ("eel stocks", "Aalbestände"),
    ("air handling unit", "Lüftungsgerät"),
    ("air handling units", "Lüftungsgeräte"),
    ("to jostle against each other", "aneinanderstoßen"),
    ("That is sheer nonsense.", "Das ist blanker Unsinn."),
    ("It was sheer coincidence.", "Es war purer Zufall."),
    ("wastes", "Abfälle"),
    ("eel stock", "Aalbestand"),
    ("to farm out work", "Arbeit abgeben"),
]


def test_parse_dictionary_exact_pairs_and_counts():
    pairs, counts = ding.parse_dictionary(FAKE_DICTIONARY.splitlines(keepends=True))
    assert pairs == EXPECTED_PAIRS
    assert ding.dedupe(pairs) == EXPECTED_PAIRS[:8] + EXPECTED_PAIRS[9:]
    assert (counts.raw_lines, counts.comment_lines, counts.blank_lines) == (13, 2, 1)
    assert (counts.malformed_lines, counts.misaligned_lines) == (1, 1)
    assert counts.aligned_slots == 12
    assert (counts.dropped_fragment, counts.dropped_empty) == (1, 1)
    assert counts.pairs == 10


@pytest.mark.parametrize(
    ("raw", "cleaned"),
    [
        ("Aalleiter {f}; Aaltreppe {f} (Wasserbau) [techn.]", "Aalleiter; Aaltreppe"),
        ("nach {prp; +Dat.}", "nach"),
        ("sheer; pure; arrant [dated] <purer> <purest>", "sheer; pure; arrant"),
        ("Are you pulling my leg (or what)?", "Are you pulling my leg?"),
        ("in (former) stream beds (formation of (deep) hollows)", "in stream beds"),
        ("born /b./", "born"),
        ("particulate matter /PM2.5/, mostly", "particulate matter, mostly"),
        ("ballistic missile defence /defense system", "ballistic missile defence system"),
        ("stures/mechanisches Auswendiglernen", "stures Auswendiglernen"),
        ("and/or 1/4 km/h", "and/or 1/4 km/h"),
        ("to bring home <> sth. to sb.", "to bring home sth. to sb."),
        ("Tab\there", "Tab here"),
    ],
)
def test_strip_annotations(raw, cleaned):
    assert ding.strip_annotations(raw) == cleaned


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It was sheer coincidence.", True),
        ("Keep out!", True),
        ("„Musst du schon gehen?“", True),
        ("1939 stand die Welt am Rande eines Krieges.", True),
        ("approx.", False),
        ("Cheers!", False),
        ("to run away.", False),
        ("eel stock", False),
        ("Ärger gibt es immer.", True),
    ],
)
def test_is_full_sentence(text, expected):
    assert ding.is_full_sentence(text) is expected


def _synthetic_pairs() -> list[tuple[str, str]]:
    """3,000 distinct sentence pairs, phrase pairs, and a few deliberately linked ones."""
    pairs = [(f"Sentence number {i} is here.", f"Satz Nummer {i} ist hier.") for i in range(3000)]
    pairs += [(f"phrase {i}", f"Phrase {i}") for i in range(1000)]
    pairs += [
        ("The cat sleeps.", "Die Katze schläft."),
        ("The cat sleeps.", "Katze schläft"),  # not a sentence: its component must train
        ("We are done.", "Wir sind fertig."),
        ("We have finished.", "Wir sind fertig!"),  # same German key: same split as above
        ("He stood his ground / stayed put.", "Er wich nicht zurück."),  # "/": never held out
    ]
    return pairs


def test_split_is_deterministic_disjoint_and_sentence_only():
    pairs = _synthetic_pairs()
    splits = ding.assign_splits(pairs)
    shuffled = list(pairs)
    random.Random(0).shuffle(shuffled)
    splits_from_shuffled = ding.assign_splits(shuffled)
    for name in ding.SPLITS:
        assert splits[name] == splits_from_shuffled[name]  # same pairs in the same order
    assert sum(len(split) for split in splits.values()) == len(pairs)
    ding.check_disjoint(splits)
    counts = ding.split_counts(splits)
    assert counts["split_pairs"] == {"train": 3583, "validation": 167, "test": 255}
    assert counts["split_sentences"] == {"train": 2582, "validation": 167, "test": 255}
    held_out = splits["validation"] + splits["test"]
    assert all(ding.is_sentence_pair(pair) for pair in held_out)
    assert ("The cat sleeps.", "Die Katze schläft.") in splits["train"]
    assert ("He stood his ground / stayed put.", "Er wich nicht zurück.") in splits["train"]
    linked = [name for name in ding.SPLITS for pair in splits[name] if pair[1].startswith("Wir")]
    assert len(set(linked)) == 1


def test_check_disjoint_names_the_leak():
    splits = {
        "train": [("It rains.", "Es regnet.")],
        "validation": [],
        "test": [("it rains", "Regen fällt.")],
    }
    with pytest.raises(ValueError, match="test pair also in train: 'it rains'"):
        ding.check_disjoint(splits)


def _write_fake_corpus(path, n_sentences: int = 400) -> None:
    """The fake dictionary plus ``n_sentences`` numbered sentence lines."""
    lines = [FAKE_DICTIONARY]
    lines += [f"Das ist Satz {i}. :: This is sentence {i}.\n" for i in range(n_sentences)]
    path.write_text("".join(lines), encoding="utf-8")


def test_prepare_writes_splits_counts_and_gzip(tmp_path):
    dictionary = tmp_path / "de-en"
    _write_fake_corpus(dictionary)
    config = ding.SplitConfig(min_test_sentences=10)
    counts = ding.prepare(dictionary, tmp_path / "out", compress=["train"], config=config)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "counts.json",
        "test.tsv",
        "train.tsv.gz",
        "validation.tsv",
    ]
    written = json.loads((tmp_path / "out" / "counts.json").read_text())
    assert written == counts
    assert (counts["raw_lines"], counts["pairs"], counts["unique_pairs"]) == (413, 410, 409)
    assert counts["sentence_pairs"] == 402
    assert counts["split_pairs"] == {"train": 345, "validation": 28, "test": 36}
    read = {name: ding.read_split(tmp_path / "out", name) for name in ding.SPLITS}
    assert {name: len(pairs) for name, pairs in read.items()} == counts["split_pairs"]
    assert read["train"][0] == ("This is sentence 194.", "Das ist Satz 194.")  # hash order
    assert ("eel stock", "Aalbestand") in read["train"]
    assert all(ding.is_sentence_pair(pair) for pair in read["test"])
    again = ding.prepare(dictionary, tmp_path / "again", compress=["train"], config=config)
    assert again == counts
    for name in ("train.tsv.gz", "test.tsv"):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


def test_prepare_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/missing.*apt-get install"):
        ding.prepare(tmp_path / "missing", tmp_path / "out")
    dictionary = tmp_path / "de-en"
    _write_fake_corpus(dictionary, n_sentences=20)
    with pytest.raises(ValueError, match=r"test split has \d+ full sentences, fewer than"):
        ding.prepare(dictionary, tmp_path / "out")
    with pytest.raises(FileNotFoundError, match=f"no test.tsv or test.tsv.gz in {tmp_path}"):
        ding.read_split(tmp_path, "test")


def test_pick_samples_keeps_clean_moderate_sentences_in_hash_order():
    pairs = [(f"This is sample sentence {i}.", f"Das ist Beispielsatz {i}.") for i in range(10)]
    pairs += [
        ("Too short.", "Zu kurz."),
        ("He said 'no' to that.", "Er sagte „nein“ dazu."),
        ("not a sentence at all", "kein Satz"),
    ]
    samples = ding.pick_samples(pairs, n=4)
    assert len(samples) == 4
    assert set(samples) < set(pairs[:10])
    assert samples == ding.pick_samples(list(reversed(pairs)), n=4)


def test_committed_splits_match_counts_and_hold_out_sentences():
    data_dir = ding.DEFAULT_DATA_DIR
    counts = json.loads((data_dir.parent / "ding_counts.json").read_text())
    splits = {name: ding.read_split(data_dir, name) for name in ding.SPLITS}
    assert ding.split_counts(splits) == {
        "split_pairs": counts["split_pairs"],
        "split_sentences": counts["split_sentences"],
    }
    assert counts["split_sentences"]["test"] >= 1000
    assert counts["split_pairs"]["test"] == counts["split_sentences"]["test"]
    ding.check_disjoint(splits)
    samples = list(ding.iter_pairs(ding.REPO_ROOT / "assets" / "samples" / "en_de_sample.tsv"))
    assert len(samples) == 50 and set(samples) <= set(splits["test"])
