"""Part files: the finished records of a running (or killed) job, so a rerun resumes.

A job writes its rows and dead letters a batch at a time to ``<output>.parts/``
(:func:`write_part`, each file written atomically), under a manifest of the job's
settings (:func:`start_parts`: a rerun with other settings is a
:class:`~pipelines.record_io.ResumeError`). At the end :func:`assemble` writes the
output and dead-letter JSONL in input order and :func:`remove_parts` deletes the folder.
Paths may be on any Beam filesystem.
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from collections.abc import Sequence

from pipelines.record_io import ResumeError, read_jsonl

PART_PREFIX, PART_SUFFIX, TMP_SUFFIX = "part-", ".jsonl", ".tmp"
MANIFEST = "job.json"  # the settings of the job the parts belong to
OUTPUT_KIND, DEAD_KIND = "output", "dead"  # the two kinds of part entries


def parts_dir(output: str) -> str:
    """``<output>.parts``: the finished records of a running (or killed) job."""
    return f"{output}.parts"


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}"


def write_atomic(path: str, text: str) -> None:
    """Writes ``text`` to a temporary file beside ``path``, then renames it to ``path``:
    a reader (or a rerun after a kill) sees the whole file or none of it."""
    from apache_beam.io.filesystems import CompressionTypes, FileSystems

    tmp = f"{path}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}"
    with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(text.encode("utf-8"))
        if hasattr(handle, "fileno"):  # a local file: on disk before the rename
            import os

            handle.flush()
            os.fsync(handle.fileno())
    FileSystems.rename([tmp], [path])


def start_parts(folder: str, settings: dict) -> None:
    """Starts a parts folder (its manifest holds ``settings``), or checks that the one
    there was started by a job with the same ``settings`` (else ResumeError)."""
    from apache_beam.io.filesystems import FileSystems

    settings = json.loads(json.dumps(settings, sort_keys=True, default=str))
    path = _join(folder, MANIFEST)
    if not FileSystems.exists(path):
        write_atomic(path, json.dumps(settings, indent=2, sort_keys=True) + "\n")
        return
    try:
        with FileSystems.open(path) as handle:
            saved = json.loads(handle.read().decode("utf-8"))
    except ValueError as error:
        raise ResumeError(f"{path} is not a parts manifest ({error}); delete {folder}") from None
    differ = sorted(k for k in saved.keys() | settings.keys() if saved.get(k) != settings.get(k))
    if differ:
        raise ResumeError(
            f"{folder} holds the records of an unfinished job with other settings "
            f"({', '.join(differ)} differ): rerun it with the same settings to resume it, "
            "or delete the folder to start afresh"
        )


def write_part(folder: str, items: Sequence[tuple[str, dict]]) -> str:
    """One part file of ``(kind, row)`` items (kind OUTPUT_KIND or DEAD_KIND), written
    atomically; returns its path."""
    lines = "".join(
        json.dumps({"kind": kind, "row": row}, ensure_ascii=False) + "\n" for kind, row in items
    )
    path = _join(folder, f"{PART_PREFIX}{uuid.uuid4().hex}{PART_SUFFIX}")
    write_atomic(path, lines)
    return path


def read_parts(folder: str) -> tuple[list[dict], list[dict]]:
    """(output rows, dead letters) of every finished part in ``folder`` (none if absent).

    An id found twice (a bundle that a distributed runner retried after its part was
    written) is kept once; temporary files of a killed job are ignored.
    """
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.exists(folder):
        return [], []
    # the folder is a path, not a pattern: a '[' in it (an output named "run[2].jsonl")
    # would otherwise start a character class and match none of its parts
    pattern = _join(glob.escape(folder), f"{PART_PREFIX}*{PART_SUFFIX}")
    paths = sorted(m.path for r in FileSystems.match([pattern]) for m in r.metadata_list)
    rows: list[dict] = []
    dead: list[dict] = []
    seen: set[str] = set()
    for path in paths:
        try:
            entries = read_jsonl(path)
        except ValueError as error:
            raise ResumeError(f"corrupt part {path} ({error}); delete {folder}") from None
        for entry in entries:
            kind, row = entry.get("kind"), entry.get("row")
            if kind not in (OUTPUT_KIND, DEAD_KIND) or not isinstance(row, dict) or "id" not in row:
                raise ResumeError(f"corrupt part {path}: {str(entry)[:200]}; delete {folder}")
            if row["id"] not in seen:
                seen.add(row["id"])
                (rows if kind == OUTPUT_KIND else dead).append(row)
    return rows, dead


def assemble(
    output: str, dead_letter: str, rows: Sequence[dict], dead: Sequence[dict], order: Sequence[str]
) -> None:
    """Writes the final output and dead-letter JSONL (rows in input ``order``), each
    atomically."""
    position = {record_id: i for i, record_id in enumerate(order)}

    def key(row: dict) -> int:
        return position.get(row["id"], len(position))

    for path, items in ((output, rows), (dead_letter, dead)):
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in sorted(items, key=key))
        write_atomic(path, text)


def remove_parts(folder: str) -> None:
    """Deletes a finished job's parts folder."""
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.exists(folder):
        return
    if glob.escape(folder) == folder:
        FileSystems.delete([folder])
        return
    # Beam deletes what a path matches as a pattern, and a pattern matches files only:
    # a folder named with [ * ? goes file by file, each escaped, then (local) the folder.
    matched = FileSystems.match([_join(glob.escape(folder), "**")])
    files = [m.path for r in matched for m in r.metadata_list]
    if files:
        FileSystems.delete([glob.escape(path) for path in files])
    if os.path.isdir(folder):
        os.rmdir(folder)
