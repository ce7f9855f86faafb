"""Job inputs: readers, dead letters with reasons, the partition check, JSONL read-back."""

import json

import pytest

from pipelines import record_io


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_text_lines_are_keyed_by_line_number_and_bad_lines_are_dead_letters(tmp_path):
    path = _write(tmp_path / "in.txt", b"Hello there.\n\n  \nbad \xff byte\r\nLast one.")
    items = record_io.read_records(str(path))
    assert [type(i).__name__ for i in items] == [
        "Record",
        "DeadLetter",
        "DeadLetter",
        "DeadLetter",
        "Record",
    ]
    assert items[0] == record_io.Record(id="1", source="Hello there.", line=1)
    assert items[4] == record_io.Record(id="5", source="Last one.", line=5)
    assert [(d.id, d.reason) for d in items[1:4]] == [
        ("2", record_io.EMPTY),
        ("3", record_io.EMPTY),
        ("4", record_io.INVALID_UTF8),
    ]
    assert items[3].detail == "byte 0xff at column 5 is not UTF-8"
    assert items[3].source == "bad \\xff byte"
    assert items[3].to_json() == {
        "id": "4",
        "reason": "invalid_utf8",
        "detail": "byte 0xff at column 5 is not UTF-8",
        "line": 4,
        "source": "bad \\xff byte",
    }


def test_tsv_reads_references_and_rejects_extra_columns(tmp_path):
    path = _write(tmp_path / "in.tsv", b"A cat.\tEine Katze.\nNo reference.\nx\ty\tz\n\tonly ref\n")
    items = record_io.read_records(str(path))
    assert items[0] == record_io.Record(id="1", source="A cat.", reference="Eine Katze.", line=1)
    assert items[1] == record_io.Record(id="2", source="No reference.", reference=None, line=2)
    assert (items[2].reason, items[2].detail) == (
        record_io.BAD_RECORD,
        "expected source<TAB>reference, got 3 tab-separated fields",
    )
    assert (items[3].id, items[3].reason) == ("4", record_io.EMPTY)


def test_jsonl_uses_own_ids_field_aliases_and_reports_malformed_lines(tmp_path):
    lines = [
        json.dumps({"id": "a", "source": "One.", "reference": "Eins."}),
        json.dumps({"source": "No id."}),
        "{not json",
        json.dumps({"id": 7, "text": "no source"}),
        json.dumps(["a", "list"]),
        json.dumps({"id": "e", "article": "   "}),
        json.dumps({"id": "f", "article": "A story.", "summary": "Short."}),
    ]
    path = _write(tmp_path / "in.jsonl", ("\n".join(lines) + "\n").encode())
    fields = record_io.FieldNames(source=("source", "article"), reference=("reference", "summary"))
    items = record_io.read_records(str(path), fields=fields)
    assert items[0] == record_io.Record(id="a", source="One.", reference="Eins.", line=1)
    assert items[1] == record_io.Record(id="2", source="No id.", line=2)
    assert (items[2].id, items[2].reason) == ("3", record_io.BAD_RECORD)
    assert items[2].detail.startswith("invalid JSON: Expecting property name")
    assert (items[3].id, items[3].detail) == ("7", "no source field (one of source, article)")
    assert (items[4].id, items[4].detail) == ("5", "expected a JSON object, got list")
    assert (items[5].id, items[5].reason) == ("e", record_io.EMPTY)
    assert items[6] == record_io.Record(id="f", source="A story.", reference="Short.", line=7)


def test_duplicate_ids_missing_files_and_bad_specs_are_input_errors(tmp_path):
    lines = [json.dumps({"id": "x", "source": "a"}), json.dumps({"id": "x", "source": "b"})]
    path = _write(tmp_path / "dup.jsonl", "\n".join(lines).encode())
    with pytest.raises(record_io.InputError, match=r"duplicate id 'x' \(lines 1 and 2\)"):
        record_io.read_records(str(path))
    with pytest.raises(record_io.InputError, match=r"input file not found: .*nope\.txt"):
        record_io.read_records(str(tmp_path / "nope.txt"))
    with pytest.raises(record_io.InputError, match="is a directory"):
        record_io.read_records(str(tmp_path))
    with pytest.raises(record_io.InputError, match="seqio:TASK:SPLIT"):
        record_io.read_records("seqio:ding_ende")


def test_limit_stops_reading(tmp_path):
    path = _write(tmp_path / "in.txt", b"a\nb\nc\nd\n")
    assert [r.id for r in record_io.read_records(str(path), limit=2)] == ["1", "2"]


def test_too_long_and_engine_error_dead_letters():
    record = record_io.Record(id="9", source="words", line=9)
    assert record_io.too_long(record, 12, 12) is None
    dead = record_io.too_long(record, 13, 12)
    assert (dead.id, dead.reason, dead.detail) == (
        "9",
        record_io.TOO_LONG,
        "13 input tokens > --max-input-tokens 12",
    )
    dead = record_io.engine_error(record, RuntimeError("actor died"))
    assert (dead.reason, dead.detail, dead.line) == (
        record_io.ENGINE_ERROR,
        "RuntimeError: actor died",
        9,
    )


def test_check_partition_accepts_a_partition_and_names_every_problem():
    record_io.check_partition(["1", "2", "3"], ["1", "3"], ["2"])
    with pytest.raises(record_io.PartitionError) as error:
        record_io.check_partition(["1", "2", "3", "4"], ["1", "1", "2"], ["2", "9"])
    message = str(error.value)
    assert "ids repeated in the output file: '1'" in message
    assert "ids in both files: '2'" in message
    assert "input ids in neither file: '3', '4'" in message
    assert "ids not in the input: '9'" in message


def test_read_jsonl_reads_rows_and_treats_a_missing_file_as_empty(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "1"}\n\n{"id": "2", "x": "ü"}\n', encoding="utf-8")
    assert record_io.read_jsonl(str(path)) == [{"id": "1"}, {"id": "2", "x": "ü"}]
    assert record_io.read_jsonl(str(tmp_path / "absent.jsonl")) == []
    assert record_io.default_dead_letter_path("out/x.jsonl") == "out/x.jsonl.dead.jsonl"


def test_seqio_split_reads_the_tasks_text_without_its_prefix():
    from pipelines.data import ding

    items = record_io.read_records("seqio:ding_ende:validation", limit=3)
    expected = ding.read_split(ding.DEFAULT_DATA_DIR, "validation")[:3]
    assert [(r.id, r.source, r.reference) for r in items] == [
        (str(i), en, de) for i, (en, de) in enumerate(expected, start=1)
    ]
    with pytest.raises(record_io.InputError, match="has no split 'dev'"):
        record_io.read_records("seqio:ding_ende:dev")
