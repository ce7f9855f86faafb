"""Job inputs, dead letters, and the check that no record is lost.

Terms:

- *input spec*: what ``--input`` names. A file path, read by its extension —
  ``.tsv`` (``source<TAB>reference``), ``.jsonl``/``.json`` (one object per line,
  ``{"id", "source", "reference"?}``), anything else plain text (one source per line) —
  or ``seqio:TASK:SPLIT`` (a registered seqio task, see :mod:`pipelines.tasks`).
- *record*: one unit of work, keyed by ``id``: the 1-based line number for text and
  TSV files (and JSONL lines without an id), the object's own ``id`` in JSONL, the
  1-based example number for seqio splits.
- *dead letter*: a record that cannot be processed, written to the dead-letter JSONL
  with its ``id``, a ``reason`` code (:data:`REASONS`) and a human ``detail``.

Every input id ends up in exactly one of the job's two files (outputs or dead
letters); :func:`check_partition` is the job's final assertion of that.

Readers run in the launching process (records are then handed to Beam with
``beam.Create``), so line numbers are exact and a duplicate id is caught before any
work starts. Bytes are decoded here, line by line, so one bad line costs one record.
Lines end at ``\n`` only (a ``\r`` before it is dropped); a UTF-8 byte-order mark at
the start of the file is dropped; a JSONL ``id`` is a non-empty string or an integer.

*Parts* make a job resumable: as records finish, the job writes them in batches to a
temporary file in ``<output>.parts/`` and renames it to ``part-<uuid>.jsonl`` (a
rename is atomic, so a part is either whole or absent; a killed job leaves at most a
``.tmp`` file, which is ignored). A rerun skips every id found in a part, and the
final output and dead-letter files are assembled from the parts at the end, each
written to a temporary file and renamed into place (:mod:`pipelines.part_files`).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
from collections.abc import Iterable, Iterator, Sequence

from pipelines.text import strip_task_prefix

EMPTY = "empty"  # nothing but whitespace
INVALID_UTF8 = "invalid_utf8"  # the line's bytes are not UTF-8
BAD_RECORD = "bad_record"  # malformed JSON / TSV, or no source field
TOO_LONG = "too_long"  # more tokens than --max-input-tokens after tokenization
ENGINE_ERROR = "engine_error"  # decoding raised for this record
REASONS = (EMPTY, INVALID_UTF8, BAD_RECORD, TOO_LONG, ENGINE_ERROR)

BOM = b"\xef\xbb\xbf"  # UTF-8 byte-order mark, dropped at the start of a file
SEQIO_SCHEME = "seqio:"


class InputError(ValueError):
    """The input as a whole is unusable (missing file, bad spec, duplicate ids)."""


class ResumeError(InputError):
    """The parts folder belongs to another job (other settings) or is corrupt."""


class PartitionError(RuntimeError):
    """Output and dead-letter ids do not partition the input ids: a record was lost."""


class JobFailed(RuntimeError):
    """The job started but its pipeline raised; finished records stay in the parts
    folder, so a rerun continues from them."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    id: str
    source: str  # the text to decode from, without the task prefix
    reference: str | None = None  # expected output, when the input has one
    line: int | None = None  # 1-based line (or example) number

    def dead_letter(self, reason: str, detail: str) -> DeadLetter:
        """This record as a dead letter (``reason``: one of REASONS)."""
        return DeadLetter(
            id=self.id, reason=reason, detail=detail, line=self.line, source=self.source
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeadLetter:
    id: str
    reason: str  # one of REASONS
    detail: str  # what was wrong, for a human
    line: int | None = None
    source: str | None = None  # the text, when it could be decoded at all

    def to_json(self) -> dict:
        """The dead-letter JSONL row."""
        row = {"id": self.id, "reason": self.reason, "detail": self.detail, "line": self.line}
        if self.source is not None:
            row["source"] = self.source
        return row


@dataclasses.dataclass(frozen=True, kw_only=True)
class FieldNames:
    """JSONL keys accepted for the source and the reference, first match wins."""

    source: tuple[str, ...] = ("source",)
    reference: tuple[str, ...] = ("reference",)


# ------------------------------------------------------------------------ readers


def read_records(
    spec: str, *, fields: FieldNames = FieldNames(), limit: int | None = None
) -> list[Record | DeadLetter]:
    """All records of an input spec (at most ``limit``), bad ones as dead letters.

    Raises InputError for a missing file, a malformed seqio spec, or a duplicate id.
    """
    if spec.startswith(SEQIO_SCHEME):
        items: Iterable[Record | DeadLetter] = read_seqio(spec)
    else:
        path = pathlib.Path(spec)
        if not path.is_file():
            what = "is a directory, not a file" if path.is_dir() else "not found"
            raise InputError(f"input file {what}: {spec}")
        items = _reader_for(path, fields)(path)
    records = []
    for item in items:
        if limit is not None and len(records) >= limit:
            break
        records.append(item)
    check_unique_ids(records)
    return records


def _reader_for(path: pathlib.Path, fields: FieldNames):
    suffix = path.suffix.lower()
    if suffix == ".tsv":
        return read_tsv
    if suffix in (".jsonl", ".json"):
        return lambda p: read_jsonl_records(p, fields=fields)
    return read_text


def _lines(path: pathlib.Path) -> Iterator[tuple[int, bytes]]:
    """(1-based number, bytes without the line break) for every line of a file."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            yield number, raw.rstrip(b"\r\n")


def _decode(number: int, raw: bytes) -> str | DeadLetter:
    """The line as text, or a dead letter naming the first undecodable byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return DeadLetter(
            id=str(number),
            reason=INVALID_UTF8,
            detail=f"byte {raw[error.start]:#04x} at column {error.start + 1} is not UTF-8",
            line=number,
            source=raw.decode("utf-8", errors="backslashreplace"),
        )


def _empty(record_id: str, number: int) -> DeadLetter:
    return DeadLetter(id=record_id, reason=EMPTY, detail="the source text is empty", line=number)


def _texts(path: pathlib.Path) -> Iterator[tuple[int, str | DeadLetter]]:
    """(line number, its text) per line; an undecodable or blank line as its dead letter."""
    for number, raw in _lines(path):
        text = _decode(number, raw)
        if not isinstance(text, DeadLetter) and not text.strip():
            text = _empty(str(number), number)
        yield number, text


def read_text(path: pathlib.Path) -> Iterator[Record | DeadLetter]:
    """One source per line, keyed by line number."""
    for number, text in _texts(path):
        if isinstance(text, DeadLetter):
            yield text
        else:
            yield Record(id=str(number), source=text.strip(), line=number)


def read_tsv(path: pathlib.Path) -> Iterator[Record | DeadLetter]:
    """``source<TAB>reference`` per line (the reference may be absent), keyed by line."""
    for number, raw in _lines(path):
        text = _decode(number, raw)
        if isinstance(text, DeadLetter):
            yield text
            continue
        fields = text.split("\t")
        if len(fields) > 2:
            yield DeadLetter(
                id=str(number),
                reason=BAD_RECORD,
                detail=f"expected source<TAB>reference, got {len(fields)} tab-separated fields",
                line=number,
                source=text,
            )
        elif not fields[0].strip():
            yield _empty(str(number), number)
        else:
            reference = fields[1].strip() if len(fields) == 2 and fields[1].strip() else None
            yield Record(id=str(number), source=fields[0].strip(), reference=reference, line=number)


def read_jsonl_records(
    path: pathlib.Path, *, fields: FieldNames = FieldNames()
) -> Iterator[Record | DeadLetter]:
    """One JSON object per line; keyed by its ``id`` (or the line number without one)."""
    for number, text in _texts(path):
        if isinstance(text, DeadLetter):
            yield text
        else:
            yield _parse_json_line(number, text, fields)


def _first(obj: dict, keys: Sequence[str]):
    return next((obj[k] for k in keys if k in obj), None)


def _parse_json_line(number: int, text: str, fields: FieldNames) -> Record | DeadLetter:
    def bad(record_id: str, detail: str) -> DeadLetter:
        return DeadLetter(id=record_id, reason=BAD_RECORD, detail=detail, line=number, source=text)

    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        return bad(str(number), f"invalid JSON: {error.msg} at column {error.colno}")
    except (ValueError, RecursionError) as error:  # over-long integers, deep nesting
        return bad(str(number), f"invalid JSON: {type(error).__name__}: {str(error)[:200]}")
    if not isinstance(obj, dict):
        return bad(str(number), f"expected a JSON object, got {type(obj).__name__}")
    raw_id = obj.get("id")
    if raw_id is None:
        record_id = str(number)
    elif isinstance(raw_id, int) and not isinstance(raw_id, bool):
        record_id = str(raw_id)
    elif isinstance(raw_id, str) and raw_id and _encodable(raw_id):
        record_id = raw_id
    else:
        what = type(raw_id).__name__ if not isinstance(raw_id, str) else "an invalid string"
        return bad(str(number), f"id must be a non-empty string or an integer, got {what}")
    source, reference = _first(obj, fields.source), _first(obj, fields.reference)
    if source is None:
        return bad(record_id, f"no source field (one of {', '.join(fields.source)})")
    if not isinstance(source, str) or not (reference is None or isinstance(reference, str)):
        return bad(record_id, "source and reference must be strings")
    if not _encodable(source) or not (reference is None or _encodable(reference)):
        return bad(record_id, "source or reference holds a lone surrogate (\\ud800-\\udfff)")
    if not source.strip():
        return _empty(record_id, number)
    return Record(
        id=record_id,
        source=source.strip(),
        reference=reference.strip() if reference and reference.strip() else None,
        line=number,
    )


def _encodable(text: str) -> bool:
    """False for strings JSON can hold but UTF-8 cannot (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_seqio_spec(spec: str) -> tuple[str, str]:
    """``seqio:TASK:SPLIT`` -> (task, split); raises InputError when malformed."""
    parts = spec.split(":")
    if len(parts) != 3 or parts[0] != "seqio" or not parts[1] or not parts[2]:
        raise InputError(
            f"a seqio input is seqio:TASK:SPLIT (e.g. seqio:ding_ende:test), got {spec!r}"
        )
    return parts[1], parts[2]


def read_seqio(spec: str) -> Iterator[Record | DeadLetter]:
    """Examples of a seqio task split, keyed by 1-based example number.

    Uses the task's own pretokenized text (its prefix stripped: the job adds its own).
    Imports TensorFlow, so only this input kind pays for it.
    """
    task_name, split = parse_seqio_spec(spec)
    import seqio

    from pipelines import tasks

    tasks.register_tasks()
    try:
        task = seqio.get_mixture_or_task(task_name)
    except ValueError as error:
        raise InputError(
            f"unknown seqio task {task_name!r}; known: {', '.join(tasks.TASK_NAMES)}"
        ) from error
    if split not in task.splits:
        raise InputError(
            f"task {task_name!r} has no split {split!r}; splits: {', '.join(task.splits)}"
        )
    dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False, use_cached=False)
    for number, example in enumerate(dataset.as_numpy_iterator(), start=1):
        source = strip_task_prefix(example["inputs_pretokenized"].decode("utf-8")).strip()
        reference = example["targets_pretokenized"].decode("utf-8").strip() or None
        if not source:
            yield _empty(str(number), number)
        else:
            yield Record(id=str(number), source=source, reference=reference, line=number)


# ------------------------------------------------------------------------ checks


def check_unique_ids(items: Sequence[Record | DeadLetter]) -> None:
    """Raises InputError naming the first id that two input lines share."""
    seen: dict[str, int | None] = {}
    for item in items:
        if item.id in seen:
            raise InputError(
                f"duplicate id {item.id!r} (lines {seen[item.id]} and {item.line}): "
                "every record needs its own id"
            )
        seen[item.id] = item.line


def too_long(record: Record, n_tokens: int, max_tokens: int) -> DeadLetter | None:
    """A dead letter when the tokenized input (prefix and EOS included) is over-long."""
    if n_tokens <= max_tokens:
        return None
    return record.dead_letter(
        TOO_LONG, f"{n_tokens} input tokens > --max-input-tokens {max_tokens}"
    )


def engine_error(record: Record, error: BaseException) -> DeadLetter:
    """The dead letter for a record whose decoding raised ``error``."""
    return record.dead_letter(ENGINE_ERROR, f"{type(error).__name__}: {error}")


def check_partition(
    input_ids: Iterable[str], output_ids: Iterable[str], dead_ids: Iterable[str]
) -> None:
    """Raises PartitionError unless every input id is in exactly one of the two files."""
    input_ids, output_ids, dead_ids = list(input_ids), list(output_ids), list(dead_ids)
    problems = []
    for name, ids in (("output", output_ids), ("dead-letter", dead_ids)):
        repeated = sorted(i for i, n in collections.Counter(ids).items() if n > 1)
        if repeated:
            problems.append(f"ids repeated in the {name} file: {_few(repeated)}")
    both = sorted(set(output_ids) & set(dead_ids))
    if both:
        problems.append(f"ids in both files: {_few(both)}")
    missing = sorted(set(input_ids) - set(output_ids) - set(dead_ids))
    if missing:
        problems.append(f"input ids in neither file: {_few(missing)}")
    unknown = sorted((set(output_ids) | set(dead_ids)) - set(input_ids))
    if unknown:
        problems.append(f"ids not in the input: {_few(unknown)}")
    if problems:
        raise PartitionError("records lost or duplicated: " + "; ".join(problems))


def _few(ids: Sequence[str], n: int = 10) -> str:
    shown = ", ".join(repr(i) for i in ids[:n])
    return shown + (f" and {len(ids) - n} more" if len(ids) > n else "")


# ------------------------------------------------------------------------ JSONL files


def read_jsonl(path: str) -> list[dict]:
    """Rows of a JSONL file on any Beam filesystem (a missing file reads as empty)."""
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.exists(path):
        return []
    with FileSystems.open(path) as handle:
        text = handle.read().decode("utf-8")
    # "\n" only: str.splitlines() would also split at U+2028, U+0085, ... inside a row.
    return [json.loads(line) for line in text.split("\n") if line.strip()]


def default_dead_letter_path(output: str) -> str:
    """``<output>.dead.jsonl`` beside the output."""
    return f"{output}.dead.jsonl"
