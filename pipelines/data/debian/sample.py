"""The main job's Debian sample: a few held-out test sentences of every source.

``write_sample(assets/data/debian, assets/samples/en_de_debian_sample.tsv)`` reproduces
the committed file from the committed splits (tests/test_debian_corpus.py checks it).
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from pipelines.data import ding
from pipelines.data.debian.build import read_source_split

# The sources the committed sample draws from: the corpus the committed pair was trained
# on. The pair never saw the documentation and manual-page sources in training, so the
# sample leaves them out; their test splits are measured on their own (BENCHMARKS.md).
SAMPLE_SOURCES = ("ding", "ddtp", "lohelp", "catalogs", "mozilla")


def pick_sample(
    data_dir: str | pathlib.Path,
    *,
    per_source: int = 10,
    max_words: int = 30,
    sources: Sequence[str] = SAMPLE_SOURCES,
) -> list[tuple[str, str]]:
    """``per_source`` full-sentence test pairs of each source, in hash order (the main
    job's sample: ``assets/samples/en_de_debian_sample.tsv``, sources interleaved)."""
    picked = [
        ding.pick_samples(
            read_source_split(data_dir, name, "test"), per_source, max_words=max_words
        )
        for name in sources
    ]
    return [pair for row in zip(*picked, strict=False) for pair in row]


def write_sample(data_dir: str | pathlib.Path, path: str | pathlib.Path, **kwargs) -> int:
    """Writes :func:`pick_sample` as ``english<TAB>german`` lines; returns the count."""
    sample = pick_sample(data_dir, **kwargs)
    ding.write_split(pathlib.Path(path), sample)
    return len(sample)
