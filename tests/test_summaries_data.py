"""The Debian description → synopsis corpus (pipelines.data.summaries)."""

from __future__ import annotations

import json

import pytest

from pipelines.data import summaries
from pipelines.data.summaries import Record

FILLER = "the program reads input files and writes reports for the user " * 3  # 33 words

TRANSLATION_EN = f"""\
Package: 0xffff
Description-md5: 183c49f6505eb3432d1b069800f1f5b6
Description-en: Open Free Fiasco Firmware Flasher
 The 0xFFFF utility implements a free userspace handler for the NOLO
 bootloader of the Nokia Internet Tablets.
 .
 Supported operations currently include, but are not limited to:
  * generating and unpacking FIASCO images on local device
  * editing Maemo firmware packages,
    with or without signatures
  * "cold" flashing for devices with bricked bootloaders
 .
 Supported are the Nokia 770, N800 and N9.

Package: tiny
Description-md5: 00000000000000000000000000000001
Description-en: A package with a short description
 Too short to summarise.

Package: libalpha1
Description-md5: 00000000000000000000000000000002
Description-en: Alpha library - runtime
 {FILLER}
 .
 This package contains the shared library.

Package: libalpha-dev
Description-md5: 00000000000000000000000000000003
Description-en: Alpha library - development files
 {FILLER}
 .
 This package contains the headers.

Package: orphan-arm64-only
Description-md5: 00000000000000000000000000000004
Description-en:   Spaced   synopsis
 {FILLER}
"""

PACKAGES = """\
Package: 0xffff
Version: 0.10-1

Package: libalpha1
Source: alpha (1.2-3)
Version: 1.2-3+b1

Package: libalpha-dev
Source: alpha
Version: 1.2-3

Package: tiny
Source: tiny-src
"""


def test_description_text_joins_paragraphs_and_removes_bullets():
    parsed = {
        package: (summary, text)
        for package, summary, text in summaries.parse_translations(TRANSLATION_EN)
    }
    summary, text = parsed["0xffff"]
    assert summary == "Open Free Fiasco Firmware Flasher"
    assert text == (
        "The 0xFFFF utility implements a free userspace handler for the NOLO bootloader of "
        "the Nokia Internet Tablets. Supported operations currently include, but are not "
        "limited to: generating and unpacking FIASCO images on local device; editing Maemo "
        'firmware packages, with or without signatures; "cold" flashing for devices with '
        "bricked bootloaders. Supported are the Nokia 770, N800 and N9."
    )
    assert " . " not in text and "*" not in text
    assert parsed["orphan-arm64-only"][0] == "Spaced synopsis"
    assert parsed["libalpha1"][1].endswith(
        "reports for the user This package contains the shared library."
    )


def test_bullet_items_end_with_semicolons_and_the_last_with_a_full_stop():
    body = " Modes:\n  - fast\n  - safe,\n    and slow\n  - done!\n After the list."
    assert summaries.description_text(body) == "Modes: fast; safe, and slow; done! After the list."
    body = " Uses:\n  o one thing\n  + another"
    assert summaries.description_text(body) == "Uses: one thing; another."


def test_parse_sources_drops_versions_and_defaults_to_the_package():
    assert summaries.parse_sources(PACKAGES) == {
        "0xffff": "0xffff",
        "libalpha1": "alpha",
        "libalpha-dev": "alpha",
        "tiny": "tiny-src",
    }


def _source_named(split: str, skip: int = 0) -> str:
    names = [f"src{i}" for i in range(2000) if summaries.split_of(f"src{i}") == split]
    return names[skip]


def test_split_of_is_a_fixed_hash_of_the_source_name():
    # Pinned: changing the hash or the salt would move sources of the committed corpus.
    assert summaries.split_of("src15") == "test"
    assert summaries.split_of("src0") == "validation"
    assert summaries.split_of("src1") == "train"
    shares = {name: 0 for name in summaries.SPLITS}
    for i in range(20000):
        shares[summaries.split_of(f"package-{i}")] += 1
    assert shares["test"] / 20000 == pytest.approx(0.03, abs=0.005)
    assert shares["validation"] / 20000 == pytest.approx(0.03, abs=0.005)


def test_build_splits_keeps_sources_whole_merges_duplicates_and_removes_leaks():
    test_source, validation_source = _source_named("test"), _source_named("validation")
    train_sources = [_source_named("train", i) for i in range(3)]

    def text(tag: str) -> str:
        return f"{tag} {FILLER}".strip()

    entries = [
        # one test source with two binaries (one shares its text with a train source)
        (f"{test_source}-bin", "Shared tool", text("shared")),
        (f"{test_source}-doc", "Docs", text("docs")),
        (f"{validation_source}-bin", "Validation tool", text("validation")),
        # two binaries of one train source with the same text and synopsis: merged
        (f"{train_sources[0]}-a", "Same", text("same")),
        (f"{train_sources[0]}-b", "Same", text("same")),
        # a train record whose text (case and punctuation aside) is the test one: dropped
        (f"{train_sources[1]}-bin", "Other synopsis", text("SHARED,")),
        # a train record whose text is in validation: dropped
        (f"{train_sources[2]}-bin", "Third", text("validation")),
        (f"{train_sources[2]}-short", "Short", "only a few words"),
        ("no-packages-record", "Orphan", text("orphan")),
    ]
    sources = {package: package.rsplit("-", 1)[0] for package, _, _ in entries[:-1]}
    splits, counts = summaries.build_splits(entries, sources)
    summaries.check_splits(splits)
    assert sorted(r.packages for r in splits["test"]) == [
        (f"{test_source}-bin",),
        (f"{test_source}-doc",),
    ]
    assert {r.source for r in splits["test"]} == {test_source}
    assert {r.source for r in splits["validation"]} == {validation_source}
    train = {r.packages: r for r in splits["train"]}
    orphan_split = summaries.split_of("no-packages-record")
    expected_train = {(f"{train_sources[0]}-a", f"{train_sources[0]}-b")}
    if orphan_split == "train":
        expected_train.add(("no-packages-record",))
    assert set(train) == expected_train
    assert train[(f"{train_sources[0]}-a", f"{train_sources[0]}-b")].source == train_sources[0]
    assert counts["removed_as_leaks"] == {"validation": 0, "train": 2}
    assert counts["merged_duplicates_train"] == 1
    assert counts["dropped_short_text"] == 1
    assert counts["packages_without_packages_record"] == 1
    assert counts["translation_records"] == len(entries)


def test_check_splits_rejects_a_source_in_two_splits_and_a_leaked_text():
    record = Record(("a",), "src", "some text", "sum")
    with pytest.raises(ValueError, match="source 'src' is in both train and test"):
        summaries.check_splits({"train": [record], "validation": [], "test": [record]})
    other = Record(("b",), "other", "Some text!", "sum")
    with pytest.raises(ValueError, match="occurs in a held-out split"):
        summaries.check_splits({"train": [record], "validation": [other], "test": []})


def test_synopsis_word_share_counts_summary_words_found_in_the_text():
    records = [Record(("a",), "a", "A fast Tool for editing files", "Fast file editor")]
    assert summaries.synopsis_word_share(records) == pytest.approx(1 / 3)  # "fast" only


def _lists_dir(tmp_path):
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en").write_text(
        TRANSLATION_EN
    )
    (lists / "deb.debian.org_debian_dists_bookworm_main_binary-amd64_Packages").write_text(PACKAGES)
    return lists


def test_build_is_deterministic_caches_its_inputs_and_counts_match_the_files(tmp_path):
    lists = _lists_dir(tmp_path)
    first = summaries.build(tmp_path / "out1", cache=tmp_path / "cache", lists_dir=lists)
    assert (tmp_path / "cache" / summaries.SOURCES_CACHE).read_text().splitlines()[1] == (
        "libalpha-dev\talpha"
    )
    for path in lists.iterdir():  # the second build reads only the cache
        path.unlink()
    second = summaries.build(tmp_path / "out2", cache=tmp_path / "cache", lists_dir=lists)
    assert first == second
    names = ("train.tsv.xz", "validation.tsv.xz", "test.tsv.xz", "test_sample.jsonl")
    for name in (*names, "counts.json", "LICENSE.md"):
        assert (tmp_path / "out1" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()
    _assert_counts_match_files(tmp_path / "out1")
    records = [r for s in summaries.SPLITS for r in summaries.read_split(tmp_path / "out1", s)]
    assert sorted(p for r in records for p in r.packages) == [
        "0xffff",
        "libalpha-dev",
        "libalpha1",
        "orphan-arm64-only",
    ]
    alpha = [r for r in records if r.source == "alpha"]
    assert len(alpha) == 2
    assert first["all"]["records"] == 4
    assert first["dropped_short_text"] == 1  # tiny


def test_missing_inputs_name_the_file_and_the_apt_command(tmp_path, capsys):
    empty = tmp_path / "lists"
    empty.mkdir()
    with pytest.raises(summaries.InputsMissing, match=r"Translation-en.*apt-get update -o Acquire"):
        summaries.build(tmp_path / "out", cache=tmp_path / "cache", lists_dir=empty)
    argv = [
        "--output",
        str(tmp_path / "out"),
        "--cache",
        str(tmp_path / "c"),
        "--lists",
        str(empty),
    ]
    with pytest.raises(SystemExit) as exit_:
        summaries.main(argv)
    assert exit_.value.code == 2
    assert "apt-get update -o Acquire::Languages=en" in capsys.readouterr().err


def test_read_split_rejects_a_malformed_line(tmp_path):
    import lzma

    with lzma.open(tmp_path / "train.tsv.xz", "wt") as handle:
        handle.write("pkg\tsrc\tonly three fields\n")
    with pytest.raises(ValueError, match=r"train.tsv.xz:1: expected 'packages<TAB>source"):
        summaries.read_split(tmp_path, "train")
    with pytest.raises(FileNotFoundError, match="specdec prepare --corpus summaries"):
        summaries.read_split(tmp_path, "test")


def _assert_counts_match_files(folder):
    counts = json.loads((folder / "counts.json").read_text())
    splits = {name: summaries.read_split(folder, name) for name in summaries.SPLITS}
    for name in summaries.SPLITS:
        assert counts["splits"][name] == summaries.split_counts(splits[name])
    every = [r for name in summaries.SPLITS for r in splits[name]]
    assert counts["all"] == summaries.split_counts(every)
    summaries.check_splits(splits)
    return counts, splits


def test_committed_corpus_matches_its_counts_and_keeps_sources_whole():
    folder = summaries.DEFAULT_OUTPUT
    counts, splits = _assert_counts_match_files(folder)
    assert counts["all"]["records"] > 40000
    assert min(len(r.text.split()) for s in splits.values() for r in s) >= summaries.MIN_TEXT_WORDS
    for name, records in splits.items():
        assert {summaries.split_of(r.source) for r in records} == {name}
    assert "debian/copyright" in (folder / "LICENSE.md").read_text()
    sample = [json.loads(line) for line in (folder / "test_sample.jsonl").read_text().splitlines()]
    assert sample == [
        {"id": ",".join(r.packages), "source": r.text, "reference": r.summary}
        for r in splits["test"][: summaries.SAMPLE_RECORDS]
    ]
    assert len(sample) == summaries.SAMPLE_RECORDS


def test_the_test_sample_reads_as_summarize_job_input():
    from pipelines import job_config, record_io

    path = summaries.DEFAULT_OUTPUT / "test_sample.jsonl"
    records = list(record_io.read_records(str(path), fields=job_config.SUMMARIZE.fields))
    assert len(records) == summaries.SAMPLE_RECORDS
    first = summaries.read_split(summaries.DEFAULT_OUTPUT, "test")[0]
    assert (records[0].id, records[0].source, records[0].reference) == (
        ",".join(first.packages),
        first.text,
        first.summary,
    )


def test_seqio_task_reads_the_summaries_like_cnn_dailymail(tmp_path):
    import seqio

    from pipelines import tasks, vocab

    records = [
        Record(("a",), "a", "A tool that edits files quickly.", "File editor"),
        Record(("b", "c"), "b", "Fonts for the console.", "Console fonts"),
    ]
    for split in summaries.SPLITS:
        summaries.write_split(tmp_path / f"{split}.tsv.xz", records)
    registered = tasks.register_tasks(
        ding_dir=tmp_path, debian_dir=tmp_path, summaries_dir=tmp_path, tfds_data_dir=tmp_path
    )
    assert tasks.DEBIAN_SUMMARIES in registered
    vocabulary = vocab.get_vocabulary(vocab.DEFAULT_VOCAB_PATH)
    task = seqio.get_mixture_or_task(tasks.DEBIAN_SUMMARIES)
    cnn = seqio.get_mixture_or_task(tasks.CNN_DAILYMAIL)
    assert task.output_features.keys() == cnn.output_features.keys()
    for name, feature in task.output_features.items():
        assert feature.add_eos == cnn.output_features[name].add_eos
    dataset = task.get_dataset(None, split="test", shuffle=False, use_cached=False)
    decoded = [
        (
            vocabulary.decode(example["inputs"].tolist()[:-1]),
            vocabulary.decode(example["targets"].tolist()[:-1]),
            example["inputs"].tolist()[-1],
            example["inputs_pretokenized"].decode(),
        )
        for example in dataset.as_numpy_iterator()
    ]
    assert decoded == [
        (
            "summarize: A tool that edits files quickly.",
            "File editor",
            vocabulary.eos_id,
            "summarize: A tool that edits files quickly.",
        ),
        (
            "summarize: Fonts for the console.",
            "Console fonts",
            vocabulary.eos_id,
            "summarize: Fonts for the console.",
        ),
    ]


def test_specdec_prepare_corpus_summaries_builds_the_corpus(tmp_path, capsys):
    from pipelines import cli

    lists = _lists_dir(tmp_path)
    paths = ["--output", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")]
    assert cli.main(["prepare", "--corpus", "summaries", *paths, "--lists", str(lists)]) == 0
    assert json.loads((tmp_path / "out" / "counts.json").read_text())["all"]["records"] == 4
    empty = tmp_path / "empty"
    empty.mkdir()
    paths = ["--output", str(tmp_path / "o2"), "--cache", str(tmp_path / "c2")]
    assert cli.main(["prepare", "--corpus", "summaries", *paths, "--lists", str(empty)]) == 2
    assert "Translation-en" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


def test_the_trainer_reads_the_summaries_with_the_summarize_prefix():
    """data.source summaries: summarize: {text} + EOS -> {synopsis} + EOS, as the seqio
    task and the summarize job tokenize them."""
    from pipelines import configs, text
    from pipelines.train import data

    model_file = configs.load_model_config("configs/models/summ_target.yaml")
    examples = data.load_examples(model_file.data, "validation")
    records = summaries.read_split(summaries.DEFAULT_OUTPUT, "validation")
    assert len(examples) == len(records)
    processor = text.sentencepiece(str(configs.resolve(model_file.data.vocab_path)))
    first = records[0]
    assert (examples.english[0], examples.german[0]) == (first.text, first.summary)
    pieces = text.encode(processor, text.SUMMARIZE_PREFIX, first.text)[:-1]  # EOS dropped
    limit = model_file.data.max_input_length
    assert list(examples.inputs[0]) == [*pieces[: limit - 1], text.EOS_ID]
    summary = processor.encode(first.summary)[: model_file.data.max_target_length - 1]
    assert list(examples.targets[0]) == [*summary, text.EOS_ID]
    assert data.task_prefix(model_file.data) == text.SUMMARIZE_PREFIX
    translate_file = configs.load_model_config("configs/models/ende_target_debian.yaml")
    assert data.task_prefix(translate_file.data) == text.TRANSLATE_PREFIX
