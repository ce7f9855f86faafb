"""The Debian En→De corpus: aligners on real excerpts, cleaning, group split, leakage.

The excerpts under tests/data/debian/ are small pieces of the real bookworm files
(see the header of excerpt_de.po and each file's name); nothing here needs the network.
"""

from __future__ import annotations

import json
import pathlib
import zipfile
from dataclasses import replace as dataclasses_replace

import pytest

from pipelines.data.debian import build, catalogs, common, ddtp, lohelp, mozilla, sample
from pipelines.data.debian.common import Pair, normalize_key

DATA = pathlib.Path(__file__).parent / "data" / "debian"
CORPUS = build.DEFAULT_OUTPUT


# ---------------------------------------------------------------------------- aligners


def _ddtp_pairs():
    texts = {lang: (DATA / f"Translation-{lang}").read_text() for lang in ("en", "de")}
    english = ddtp.descriptions(ddtp.parse_records(texts["en"].splitlines()), "en")
    german = ddtp.descriptions(ddtp.parse_records(texts["de"].splitlines()), "de")
    return ddtp.align(english, german)


def test_ddtp_joins_on_md5_and_pairs_paragraphs_in_order():
    pairs, counts = _ddtp_pairs()
    # 0ad, 0ad-data, 2048-qt and libx264-164 joined; libx264-164's German has one
    # paragraph less than its English, so the whole description is dropped.
    assert counts == {"descriptions_de": 4, "joined": 4, "misaligned": 1}
    by_group = {}
    for pair in pairs:
        by_group.setdefault(pair.group, []).append(pair)
    data = by_group["ddtp:26581e685027d5ae84824362a4ba59ee"]  # 0ad-data
    assert data[0].english == "Real-time strategy game of ancient warfare (data files)"
    assert data[0].german == ("Echtzeit-Strategiespiel über antike Kriegsführung (Datendateien)")
    assert data[2] == Pair(
        "This package contains the main data files required by 0 A.D.",
        "Dieses Paket enthält die wichtigsten von 0 A.D. benötigten Datendateien.",
        "ddtp:26581e685027d5ae84824362a4ba59ee",
    )
    assert data[1].english.startswith('0 A.D. (pronounced "zero ey-dee") is a free,')
    assert data[1].german.startswith("0 A.D. ist ein freies, quelloffenes,")
    assert "\n" not in data[1].english and "  " not in data[1].german  # lines joined
    assert len(by_group["ddtp:0f25c2ca95ceff4500fde9f651d74f2e"]) == 2  # 2048-qt
    assert not any(p.group == "ddtp:26cb82f3b1d51b9e59d296e836c5d5ea" for p in pairs)
    assert len(pairs) == 2 + 3 + 2  # 0ad, 0ad-data, 2048-qt


def test_mo_parser_reads_a_real_catalog_excerpt():
    entries = catalogs.parse_mo((DATA / "excerpt_de.mo").read_bytes(), name="excerpt")
    pairs = [pair for msgid, msgstr in entries for pair in catalogs.entry_pairs(msgid, msgstr)]
    assert (
        "%s: File removed before we read it",
        "%s: Datei gelöscht, bevor sie gelesen wurde",
    ) in pairs
    # plural: singular -> msgstr[0], plural -> msgstr[1]
    assert ("%s: File shrank by %s byte", "%s: Datei ist um ein Byte geschrumpft.") in pairs
    assert ("%s: File shrank by %s bytes", "%s: Datei ist um %s Bytes geschrumpft.") in pairs
    assert ("_Find", "_Suchen") in pairs  # msgctxt dropped
    assert not any(english == "" for english, _ in pairs)  # header skipped
    assert not any("Untranslated" in english for english, _ in pairs)  # msgfmt drops it
    assert len(pairs) == 7


def test_mo_parser_rejects_a_file_that_is_not_a_catalog():
    with pytest.raises(ValueError, match=r"bad\.mo: not a \.mo file"):
        catalogs.parse_mo(b"\x00" * 64, name="bad.mo")


def test_catalog_cleaning_strips_accelerators_and_keeps_placeholders():
    entries = catalogs.parse_mo((DATA / "excerpt_de.mo").read_bytes())
    raw = [
        Pair(e, g, "g") for msgid, msgstr in entries for e, g in catalogs.entry_pairs(msgid, msgstr)
    ]
    kept, dropped = build.clean_pairs(raw, accelerators=True)
    pairs = {(p.english, p.german) for p in kept}
    assert ("Save As…", "Speichern unter …") in pairs
    assert ("Find", "Suchen") in pairs
    assert ("Find", "Suchen nach") in pairs  # "F_ind " -> mid-word mark removed
    assert ("%s: File shrank by %s bytes", "%s: Datei ist um %s Bytes geschrumpft.") in pairs
    assert dropped == {"same_text": 1}  # "gedit" -> "gedit"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("~Open", "Open"),
        ("Save _As", "Save As"),
        ("Re_place All", "Replace All"),
        ("&Open File", "Open File"),
        ("file_name", "file_name"),  # an identifier, not a mark
        ("%s_%d", "%s_%d"),
        ("Copy {0} to { $host }", "Copy {0} to { $host }"),
        ("Click <b>OK</b> &amp; wait", "Click OK & wait"),
        ("line one<br/>line two", "line one line two"),
        ("a\ttab\nand newline", "a tab and newline"),
        ("AT&T & Co", "AT&T & Co"),  # two marks: left alone
    ],
)
def test_clean_text(raw, clean):
    assert common.clean_text(raw) == clean


def test_lohelp_pairs_the_same_paragraph_id_of_the_same_file():
    english = (DATA / "lohelp_01020000.en-US.html").read_text()
    german = (DATA / "lohelp_01020000.de.html").read_text()
    pairs = lohelp.align_documents(english, german, "lohelp:text/shared/optionen/01020000.html")
    as_tuples = [(p.english.strip(), p.german) for p in pairs]
    assert as_tuples[0] == ("Load/Save options", "Optionen Laden/Speichern")  # hd_id3147291
    assert ("Reset", "Zurücksetzen") in as_tuples
    assert (
        "In the General section, you can select default settings for saving documents, "
        "and can select default file formats.",
        "Im Bereich Allgemein können Sie Standardeinstellungen für das Speichern von "
        "Dokumenten und Standarddateiformate vorgeben.",
    ) in as_tuples
    assert len(pairs) == 13
    assert not any("Hilfe für LibreOffice" in p.german for p in pairs)  # header has no id


def test_mozilla_fluent_pairs_by_message_id_and_skips_selectors():
    english = (DATA / "mozilla_htmlForm.en-GB.ftl").read_text()
    german = (DATA / "mozilla_htmlForm.de.ftl").read_text()
    pairs = mozilla.align_files(english, german, kind="ftl", group="g")
    by_english = {p.english: p.german for p in pairs}
    assert by_english["Security Warning"] == "Sicherheitswarnung"
    assert by_english["Continue"] == "Fortfahren"
    message = next(e for e in by_english if e.startswith("The information you have entered"))
    assert message.endswith("Are you sure you want to send this information?")  # blank line kept
    assert by_english[message].endswith("Sollen diese Daten wirklich gesendet werden?")
    assert len(pairs) == 3  # input-file-and-more-files has a selector: skipped


def test_mozilla_properties_pairs_skip_access_keys(tmp_path):
    english = (DATA / "mozilla_browser.en-GB.properties").read_text()
    german = (DATA / "mozilla_browser.de.properties").read_text()
    pairs = mozilla.align_files(english, german, kind="properties", group="g")
    assert ("Search with %S in a Private Window", "Mit %S in privatem Fenster suchen") in [
        (p.english, p.german) for p in pairs
    ]
    assert ("Search %1$S for “%2$S”", '%1$S-Suche nach "%2$S"') in [
        (p.english, p.german) for p in pairs
    ]
    assert all(len(p.english) > 1 for p in pairs)  # no "S" / "h" access keys
    assert len(pairs) == 8


def test_mozilla_extract_reads_language_pack_zips(tmp_path):
    for locale, suffix in (("en-GB", "en-GB"), ("de", "de")):
        root = tmp_path / locale
        root.mkdir()
        with zipfile.ZipFile(root / f"langpack-{locale}@firefox-esr.mozilla.org.xpi", "w") as xpi:
            xpi.writestr(
                f"localization/{locale}/toolkit/global/htmlForm.ftl",
                (DATA / f"mozilla_htmlForm.{suffix}.ftl").read_bytes(),
            )
    pairs = mozilla.extract("firefox-esr", tmp_path / "en-GB", tmp_path / "de")
    assert {p.group for p in pairs} == {
        "mozilla:firefox-esr/localization/LOCALE/toolkit/global/htmlForm.ftl"
    }
    assert len(pairs) == 3


# ------------------------------------------------------------- filter, split, leakage


def test_german_equal_to_english_is_dropped():
    raw = [
        Pair("Firefox", "Firefox", "g1"),  # untranslated: language packs fill with English
        Pair("Microsoft Office", "Microsoft office.", "g1"),  # equal once normalised
        Pair("Open File", "Datei öffnen", "g2"),
    ]
    kept, dropped = build.clean_pairs(raw, accelerators=False)
    assert [(p.english, p.german) for p in kept] == [("Open File", "Datei öffnen")]
    assert dropped == {"same_text": 2}


def _synthetic_pairs(groups: int = 400, per_group: int = 5) -> list[Pair]:
    pairs = []
    for g in range(groups):
        for i in range(per_group):
            pairs.append(Pair(f"Sentence {i} of group {g}.", f"Satz {i} der Gruppe {g}.", f"g{g}"))
    return pairs


def test_split_by_group_never_straddles_and_hits_its_fractions():
    pairs = _synthetic_pairs()
    splits = build.split_by_group(pairs, test_fraction=0.1, validation_fraction=0.05)
    owner = {}
    for name, members in splits.items():
        for pair in members:
            assert owner.setdefault(pair.group, name) == name, pair.group
    assert sum(len(v) for v in splits.values()) == len(pairs)
    assert 0.1 * len(pairs) <= len(splits["test"]) <= 0.12 * len(pairs)
    assert 0.05 * len(pairs) <= len(splits["validation"]) <= 0.06 * len(pairs)
    # a pure function of the pairs: the same split from shuffled input
    again = build.split_by_group(list(reversed(pairs)), test_fraction=0.1, validation_fraction=0.05)
    assert {p.group for p in again["test"]} == {p.group for p in splits["test"]}


def test_leak_removal_drops_train_pairs_sharing_a_normalised_side():
    splits = {
        "a": {
            "train": [
                Pair("Open the file.", "Öffnen Sie die Datei!", "t1"),  # English leaks (case/punct)
                Pair("Close", "schließen", "t2"),  # German leaks into b's validation
                Pair("Keep me", "Behalte mich", "t3"),
            ],
            "validation": [Pair("open the FILE", "Datei öffnen", "v1")],  # shares with test
            "test": [Pair("Open the file", "Die Datei öffnen", "x1")],
        },
        "b": {
            "train": [],
            "validation": [Pair("Shut", "Schließen", "v2")],
            "test": [],
        },
    }
    removed = build.remove_leaks(splits)
    assert [p.english for p in splits["a"]["train"]] == ["Keep me"]
    assert splits["a"]["validation"] == []
    assert removed == {"a": {"validation": 1, "train": 2}, "b": {"validation": 0, "train": 0}}
    build.check_no_leaks(splits)


def test_check_no_leaks_raises_on_a_leak():
    splits = {
        "a": {
            "train": [Pair("Hello", "Hallo", "t")],
            "validation": [],
            "test": [Pair("hello!", "Servus", "x")],
        }
    }
    with pytest.raises(ValueError, match="leaks into a held-out split"):
        build.check_no_leaks(splits)


def test_a_package_that_cannot_be_fetched_is_reported(tmp_path, monkeypatch, capsys):
    def unavailable(name, cache_dir):  # the fault: the registry has no such package
        raise common.PackageUnavailable(f"{name}: apt-get download failed: E: Unable to locate")

    monkeypatch.setattr(common, "fetch_package", unavailable)
    totals = build.build(tmp_path / "out", cache=tmp_path / "cache", sources=["mozilla"])
    assert set(totals["skipped_packages"]) == {
        "firefox-esr-l10n-en-gb",
        "firefox-esr-l10n-de",
        "thunderbird-l10n-en-gb",
        "thunderbird-l10n-de",
    }
    counts = json.loads((tmp_path / "out" / "mozilla" / "counts.json").read_text())
    assert counts["split_pairs"] == {"train": 0, "validation": 0, "test": 0}
    assert "firefox-esr-l10n-de" in counts["skipped_packages"]
    assert (
        "Skipped (not fetched): thunderbird-l10n-de"
        in (tmp_path / "out" / "mozilla" / "LICENSE.md").read_text()
    )
    assert "prepare: SKIPPED package firefox-esr-l10n-en-gb" in capsys.readouterr().err


def test_split_files_round_trip(tmp_path):
    pairs = [("Open File", "Datei öffnen"), ("%s: File removed", "%s: Datei gelöscht")]
    build.write_split(tmp_path / "train.tsv.xz", pairs)
    assert list(build.iter_split_file(tmp_path / "train.tsv.xz")) == pairs
    with pytest.raises(ValueError, match="tab or newline"):
        build.write_split(tmp_path / "bad.tsv.xz", [("a\tb", "c")])


# ------------------------------------------------------------------- committed corpus


@pytest.mark.slow  # reads all ~590k committed pairs
def test_committed_corpus_has_no_leaks_and_matches_its_counts():
    totals = json.loads((CORPUS / "counts.json").read_text())
    held_en, held_de = set(), set()
    for source in totals["sources"]:
        for split in ("validation", "test"):
            for english, german in build.read_source_split(CORPUS, source, split):
                held_en.add(normalize_key(english))
                held_de.add(normalize_key(german))
    for source in totals["sources"]:
        train = build.read_source_split(CORPUS, source, "train")
        assert len(train) == totals["pairs"][source]["train"]
        leaks = [
            pair
            for pair in train
            if normalize_key(pair[0]) in held_en or normalize_key(pair[1]) in held_de
        ]
        assert leaks == [], (source, leaks[:3])
        if source != "ding":  # Ding's phrases are a dictionary; the rest drops EN == DE
            assert not any(normalize_key(en) == normalize_key(de) for en, de in train)


def test_read_split_interleaves_sources():
    sources = build.sources_of(CORPUS)
    first = build.read_split(CORPUS, "test")[: len(sources)]
    heads = [build.read_source_split(CORPUS, source, "test")[0] for source in sources]
    assert first == heads


def test_data_sources_selects_corpus_sources_and_names_unknown_ones():
    from pipelines import configs
    from pipelines.train.data import read_pairs

    data = configs.DataConfig(source="debian", data_dir=str(CORPUS), sources=("ddtp", "lohelp"))
    pairs = read_pairs(data, "test")
    assert pairs == build.read_split(CORPUS, "test", ["ddtp", "lohelp"])
    counts = json.loads((CORPUS / "counts.json").read_text())["pairs"]
    assert len(pairs) == counts["ddtp"]["test"] + counts["lohelp"]["test"]
    with pytest.raises(ValueError, match="has no source 'nope'"):
        read_pairs(dataclasses_replace(data, sources=("nope",)), "test")
    with pytest.raises(configs.ConfigError, match=r"data\.sources applies to source .debian."):
        read_pairs(dataclasses_replace(data, source="tsv"), "test")


# ------------------------------------------------------------------------- trainer


def test_trainer_reads_the_debian_corpus_with_long_buckets(tmp_path):
    import sentencepiece as spm

    from pipelines import configs, train

    corpus = {
        "a": [("Open File", "Datei öffnen"), ("Reset", "Zurücksetzen")],
        "b": [("Security Warning", "Sicherheitswarnung")],
    }
    for source, pairs in corpus.items():
        (tmp_path / source).mkdir()
        for split in build.SPLITS:
            build.write_split(tmp_path / source / f"{split}.tsv.xz", pairs)
    (tmp_path / "counts.json").write_text(json.dumps({"sources": ["a", "b"]}))
    vocab = "assets/spm/ende.model"
    data = configs.DataConfig(
        source="debian",
        data_dir=str(tmp_path),
        vocab_path=vocab,
        max_input_length=128,
        max_target_length=128,
    )
    examples = train.load_examples(data, "train")
    assert examples.english == ["Open File", "Security Warning", "Reset"]  # interleaved
    processor = spm.SentencePieceProcessor(model_file=str(configs.resolve(vocab)))
    expected = [*processor.encode(train.PREFIX + "Security Warning"), train.EOS_ID]
    assert examples.inputs[1].tolist() == expected
    assert examples.targets[1].tolist() == [*processor.encode("Sicherheitswarnung"), 1]
    buckets = train.length_buckets(data)
    assert buckets == ((16, 32, 64, 128), (16, 32, 64, 128))
    sampler = train.BucketSampler.build(examples, configs.TrainConfig(), 1.0, buckets)
    assert set(sampler.buckets) <= {(s, t) for s in buckets[0] for t in buckets[1]}
    short = configs.DataConfig(max_input_length=64, max_target_length=64)
    assert train.length_buckets(short) == (train.INPUT_BUCKETS, train.TARGET_BUCKETS)
    assert train.length_buckets(configs.DataConfig(max_input_length=96, max_target_length=64)) == (
        (16, 32, 64, 96),
        (16, 32, 64),
    )


def test_seqio_task_reads_the_debian_corpus(tmp_path):
    import seqio

    from pipelines import tasks, vocab

    (tmp_path / "a").mkdir()
    pairs = [("Open File", "Datei öffnen"), ("Reset", "Zurücksetzen")]
    for split in build.SPLITS:
        build.write_split(tmp_path / "a" / f"{split}.tsv.xz", pairs)
    (tmp_path / "counts.json").write_text(json.dumps({"sources": ["a"]}))
    vocab_path = vocab.DEFAULT_VOCAB_PATH
    tasks.register_tasks(
        ding_dir=tmp_path, debian_dir=tmp_path, tfds_data_dir=tmp_path, vocab_path=vocab_path
    )
    vocabulary = vocab.get_vocabulary(vocab_path)
    task = seqio.get_mixture_or_task(tasks.DEBIAN_ENDE)
    dataset = task.get_dataset(None, split="validation", shuffle=False, use_cached=False)
    decoded = [
        (
            vocabulary.decode(example["inputs"].tolist()[:-1]),
            vocabulary.decode(example["targets"].tolist()[:-1]),
            example["targets"].tolist()[-1],
        )
        for example in dataset.as_numpy_iterator()
    ]
    assert decoded == [
        ("translate English to German: Open File", "Datei öffnen", vocabulary.eos_id),
        ("translate English to German: Reset", "Zurücksetzen", vocabulary.eos_id),
    ]


def test_debian_vocabulary_covers_what_the_ding_one_maps_to_unknown():
    import sentencepiece as spm

    from pipelines import vocab

    texts = ["Wählen Sie »Datei - Öffnen« <Strg+O> und/oder { $host } … %1$s ~/.config"]
    assert vocab.unknown_character_rate(vocab.DEFAULT_VOCAB_PATH, texts) > 0.05  # », «, <, >, {, }
    assert vocab.unknown_character_rate(vocab.DEBIAN_VOCAB_PATH, texts) == 0.0
    processor = spm.SentencePieceProcessor(model_file=str(vocab.DEBIAN_VOCAB_PATH))
    assert processor.get_piece_size() == vocab.DEBIAN_VOCAB_SIZE
    assert (processor.pad_id(), processor.eos_id(), processor.unk_id()) == (0, 1, 2)
    assert processor.decode(processor.encode(texts[0])) == texts[0].replace("…", "...")


def test_committed_debian_sample_is_the_corpus_pick_of_every_source(tmp_path):
    """assets/samples/en_de_debian_sample.tsv (the Debian pair's sample) is reproduced
    from the committed test splits: 10 full sentences of each of its five sources,
    sources interleaved, none of them in any training split."""
    root = pathlib.Path(__file__).resolve().parents[1]
    data_dir = root / "assets" / "data" / "debian"
    path = tmp_path / "sample.tsv"
    assert sample.write_sample(data_dir, path) == 50
    committed = root / "assets" / "samples" / "en_de_debian_sample.tsv"
    assert path.read_text(encoding="utf-8") == committed.read_text(encoding="utf-8")
    pairs = [line.split("\t") for line in committed.read_text(encoding="utf-8").splitlines()]
    sources = build.sources_of(data_dir)
    assert set(sample.SAMPLE_SOURCES) < set(sources)  # docs and manpages came later
    train = {en for name in sources for en, _ in build.read_source_split(data_dir, name, "train")}
    assert not train & {en for en, _ in pairs}
