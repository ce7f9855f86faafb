"""Bad input, fuzzed: whatever bytes the input file holds, every line becomes exactly
one record or one dead letter, nothing crashes, and every input id lands in exactly
one of the output and the dead letters (or, for two lines sharing an id, the job
refuses to start with an InputError naming it).

The property test runs the reading and validation layer (fast) plus the parts ->
assembled files path the job writes through; two fixed examples run the real job.
"""

import collections
import json
import pathlib
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import cli, job_config, part_files, record_io
from pipelines.cli import main
from tests.test_translate_job import SENTENCES, job_args, tiny_pair

FIELDS = job_config.TRANSLATE.fields
SPECIAL = [
    b"\x00", b"\xff", b"\xfe\xff", b"\xef\xbb\xbf", b"\r", b"\t", b"\xc3\x28",
    b"\xed\xa0\x80",  # an encoded surrogate: not UTF-8
    "\u2028".encode(), "\x85".encode(), b"\x1c", b"\x0b", b" ", b"\\", b'"', b"{", b"}",
]  # fmt: skip
KEYS = ["id", "source", "reference", "en", "de", "x"]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["\ud800", "a\udfffb", "\x00", "\u2028", "   ", ""]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def json_line(draw) -> bytes:
    obj = draw(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4))
    if draw(st.booleans()):
        obj.setdefault("id", draw(st.integers(0, 5) | st.sampled_from(["1", "2", "a", ""])))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate, raw: invalid UTF-8


line = st.one_of(
    st.binary(max_size=40),
    st.lists(st.sampled_from(SPECIAL) | st.binary(max_size=3), max_size=6).map(b"".join),
    st.text(max_size=30).map(lambda t: t.encode("utf-8", "surrogatepass")),
    json_line(),
    st.sampled_from(
        [
            b"x" * 300_000,  # a huge line
            b"[" * 50_000,  # nesting deeper than the JSON parser recurses
            b'{"id": ' + b"9" * 5_000 + b', "source": "a"}',  # an integer over the limit
            b'{"id": 1.5, "source": "float id"}',
            b'{"id": [1], "source": "list id"}',
            b'{"source": 3}',
            b'{"id": "q", "source": "ok", "reference": 7}',
        ]
    ),
)


@st.composite
def input_file(draw) -> bytes:
    lines = draw(st.lists(line, max_size=12))
    newline = draw(st.sampled_from([b"\n", b"\r\n"]))
    data = newline.join(lines)
    if lines and draw(st.booleans()):
        data += newline
    if draw(st.booleans()):
        data = record_io.BOM + data
    return data


def _count_lines(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


def _check(folder: pathlib.Path, suffix: str, data: bytes) -> None:
    path = folder / f"input{suffix}"
    path.write_bytes(data)
    items = list(record_io._reader_for(path, FIELDS)(path))
    assert len(items) == _count_lines(data)  # one record or dead letter per line
    assert [item.line for item in items] == list(range(1, len(items) + 1))
    for item in items:
        item.id.encode("utf-8")  # every id can be written
        if isinstance(item, record_io.Record):
            assert item.source and item.source == item.source.strip()
            item.source.encode("utf-8")
            assert item.reference is None or isinstance(item.reference, str)
        else:
            assert item.reason in record_io.REASONS and item.detail
            json.dumps(item.to_json(), ensure_ascii=False).encode("utf-8")
    ids = [item.id for item in items]
    repeated = [i for i, n in collections.Counter(ids).items() if n > 1]
    if repeated:
        with pytest.raises(record_io.InputError, match="duplicate id"):
            record_io.read_records(str(path), fields=FIELDS)
        return
    if not items:
        return
    records = record_io.read_records(str(path), fields=FIELDS)
    assert records == items
    # Route them as the job does: rows and dead letters into parts, then assembled.
    parts = folder / "out.jsonl.parts"
    part_files.start_parts(str(parts), {"job": "fuzz"})
    entries = [
        ("output", {"id": r.id, "source": r.source, "reference": r.reference})
        if isinstance(r, record_io.Record)
        else ("dead", r.to_json())
        for r in records
    ]
    for start in range(0, len(entries), 3):
        part_files.write_part(str(parts), entries[start : start + 3])
    output, dead = folder / "out.jsonl", folder / "out.jsonl.dead.jsonl"
    part_files.assemble(str(output), str(dead), *part_files.read_parts(str(parts)), order=ids)
    part_files.remove_parts(str(parts))
    rows, letters = record_io.read_jsonl(str(output)), record_io.read_jsonl(str(dead))
    record_io.check_partition(ids, [r["id"] for r in rows], [d["id"] for d in letters])
    by_id = {r.id: r for r in records}
    for row in rows:
        assert row["source"] == by_id[row["id"]].source  # the text survives the round trip


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=input_file(), suffix=st.sampled_from([".txt", ".tsv", ".jsonl"]))
def test_every_line_lands_in_exactly_one_file(data, suffix):
    with tempfile.TemporaryDirectory() as folder:
        _check(pathlib.Path(folder), suffix, data)


def test_a_bom_is_dropped_and_crlf_is_one_line_break(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(record_io.BOM + b'{"id": "a", "source": "One."}\r\n{"source": "Two.\\r"}\r\n')
    assert record_io.read_records(str(path)) == [
        record_io.Record(id="a", source="One.", line=1),
        record_io.Record(id="2", source="Two.", line=2),
    ]


@pytest.mark.parametrize(
    ("text", "detail"),
    [
        ('{"id": 1.5, "source": "x"}', "id must be a non-empty string or an integer, got float"),
        ('{"id": true, "source": "x"}', "id must be a non-empty string or an integer, got bool"),
        ('{"id": "", "source": "x"}', "id must be a non-empty string or an integer, got an"),
        ('{"id": "\\ud800", "source": "x"}', "id must be a non-empty string or an integer"),
        ('{"id": "s", "source": "\\udfff"}', "source or reference holds a lone surrogate"),
        ("[" * 20_000, "invalid JSON: RecursionError"),
        ('{"id": ' + "9" * 5_000 + "}", "invalid JSON: ValueError: Exceeds the limit"),
    ],
)
def test_malformed_json_lines_are_named_dead_letters(tmp_path, text, detail):
    path = tmp_path / "in.jsonl"
    path.write_text(text + "\n")
    (item,) = record_io.read_records(str(path))
    assert isinstance(item, record_io.DeadLetter) and item.reason == record_io.BAD_RECORD
    assert item.detail.startswith(detail), item.detail


def test_read_jsonl_splits_rows_at_newlines_only(tmp_path):
    path = tmp_path / "rows.jsonl"
    rows = [{"id": "1", "output": "a\u2028b\x85c\x1cd"}, {"id": "2", "output": "\x00"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    assert record_io.read_jsonl(str(path)) == rows


# ------------------------------------------------------------------------ the real job


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz_models")
    return tiny_pair(root)


def _job(tmp_path, models, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    output = tmp_path / f"{name}.out.jsonl"
    args = job_args(
        path,
        output,
        models=models,
        workers="inprocess",
        temperature=0.0,
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
    )
    code = main(args)
    rows = record_io.read_jsonl(str(output))
    dead = record_io.read_jsonl(record_io.default_dead_letter_path(str(output)))
    return code, {r["id"]: r for r in rows}, {d["id"]: d for d in dead}


def test_a_hostile_jsonl_file_through_the_job(tmp_path, models):
    lines = [
        record_io.BOM + json.dumps({"id": "bom", "source": SENTENCES[0][0]}).encode(),
        json.dumps({"id": "nul", "source": "a\x00b " + SENTENCES[1][0]}).encode(),
        json.dumps({"id": "sep", "source": "x\u2028y\x85z"}, ensure_ascii=False).encode(),
        b'{"id": "bad", "source": "caf\xe9"}',
        json.dumps({"id": "huge", "source": "word " * 20_000}).encode(),
        b'{"id": 3.5, "source": "float id"}',
        b'{"id": "sur", "source": "\\ud800"}',
        b'{"id": "typ", "source": ["a"]}',
        b"[" * 30_000,
        json.dumps({"id": 10, "en": SENTENCES[2][0], "de": SENTENCES[2][1]}).encode(),
    ]
    code, rows, dead = _job(tmp_path, models, "hostile.jsonl", b"\r\n".join(lines) + b"\r\n")
    assert code == cli.EXIT_DEAD_LETTERS
    assert sorted(rows) == ["10", "bom", "nul", "sep"]
    assert rows["10"]["reference"] == SENTENCES[2][1]
    assert rows["sep"]["source"] == "x\u2028y\x85z"  # read back whole, not split at U+2028
    assert {k: d["reason"] for k, d in dead.items()} == {
        "4": "invalid_utf8",
        "huge": "too_long",
        "6": "bad_record",
        "sur": "bad_record",
        "typ": "bad_record",
        "9": "bad_record",
    }
    assert not set(rows) & set(dead)


def test_a_text_file_of_odd_but_valid_lines_exits_0(tmp_path, models):
    lines = [SENTENCES[0][0], "tab\there", "nul\x00inside", "bell\x07 and \u2028 sep", "\ufeffbom"]
    data = b"\r\n".join(t.encode() for t in lines)  # no final line break
    code, rows, dead = _job(tmp_path, models, "odd.txt", data)
    assert code == cli.EXIT_OK and dead == {}
    assert [rows[str(i)]["source"] for i in range(1, 6)] == [t.strip() for t in lines]
