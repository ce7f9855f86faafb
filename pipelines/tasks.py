"""seqio tasks: the local Ding and Debian En→De corpora, WMT T2T En→De, CNN/DailyMail,
and the Debian package-description summaries.

``register_tasks(ding_dir=..., debian_dir=..., summaries_dir=..., tfds_data_dir=...,
vocab_path=...)`` (re)registers

- ``ding_ende``: the TSV splits written by ``python -m pipelines.data.ding``
  (``{split}.tsv`` or ``{split}.tsv.gz``, ``english<TAB>german``);
- ``debian_ende``: the Debian corpus written by ``specdec prepare --corpus debian``
  (``<source>/{split}.tsv.xz`` per source, read with
  ``pipelines.data.debian.build.read_split``: all sources, interleaved);
- ``wmt_t2t_ende``: TFDS ``wmt_t2t_translate/de-en:1.0.0``;
- ``cnn_dailymail``: TFDS ``cnn_dailymail:3.4.0``;
- ``debian_summaries``: long description → synopsis of Debian packages, written by
  ``specdec prepare --corpus summaries`` (``{split}.tsv.xz``, read with
  ``pipelines.data.summaries.read_split``) and yielded as ``{"article", "highlights"}``
  like ``cnn_dailymail``, so the two differ by task name alone;

all with T5's preprocessing (``translate English to German: {en}`` -> ``{de}``;
``summarize: {article}`` -> ``{highlights}``), tokenized with the project's SentencePiece
vocabulary and EOS appended to inputs and targets.

TFDS data is read only from the prepared folder under ``tfds_data_dir``; nothing is ever
downloaded. When the folder is missing, asking for a dataset raises
``DatasetNotPreparedError`` naming the folder and the command that prepares it.

For jobs that need no TensorFlow, ``pipelines.data.ding.read_split`` reads the same
Ding TSV files as plain Python (re-exported here as ``read_ding_split``).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable, Mapping

import seqio
import tensorflow as tf

from pipelines import vocab as vocab_lib
from pipelines.data import ding, summaries
from pipelines.data.debian import build as debian_build

read_ding_split = ding.read_split  # plain-Python reader of the Ding TSV splits

DING_ENDE = "ding_ende"
DEBIAN_ENDE = "debian_ende"
WMT_T2T_ENDE = "wmt_t2t_ende"
CNN_DAILYMAIL = "cnn_dailymail"
DEBIAN_SUMMARIES = "debian_summaries"
TASK_NAMES = (DING_ENDE, DEBIAN_ENDE, WMT_T2T_ENDE, CNN_DAILYMAIL, DEBIAN_SUMMARIES)
DEFAULT_DING_DIR = vocab_lib.DEFAULT_DATA_DIR
DEFAULT_DEBIAN_DIR = debian_build.DEFAULT_OUTPUT
DEFAULT_SUMMARIES_DIR = summaries.DEFAULT_OUTPUT
DEFAULT_TFDS_DATA_DIR = pathlib.Path(
    os.environ.get("TFDS_DATA_DIR", pathlib.Path.home() / "tensorflow_datasets")
)


class DatasetNotPreparedError(FileNotFoundError):
    """A TFDS dataset the task needs is not prepared in the configured data dir."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TfdsSpec:
    """Where a prepared TFDS dataset lives: ``{data_dir}/{name}/{config}/{version}``."""

    name: str  # builder name, e.g. "wmt_t2t_translate"
    config: str | None  # builder config, e.g. "de-en"; None when the builder has none
    version: str  # e.g. "1.0.0"
    splits: tuple[str, ...] = ("train", "validation", "test")

    @property
    def full_name(self) -> str:
        """``name/config:version`` as TFDS writes it."""
        config = f"/{self.config}" if self.config else ""
        return f"{self.name}{config}:{self.version}"

    def directory(self, data_dir: str | pathlib.Path) -> pathlib.Path:
        """The folder a prepared copy has under ``data_dir``."""
        path = pathlib.Path(data_dir) / self.name
        return (path / self.config if self.config else path) / self.version


WMT_T2T_SPEC = TfdsSpec(name="wmt_t2t_translate", config="de-en", version="1.0.0")
CNN_DAILYMAIL_SPEC = TfdsSpec(name="cnn_dailymail", config=None, version="3.4.0")


def prepared_tfds_directory(spec: TfdsSpec, data_dir: str | pathlib.Path) -> pathlib.Path:
    """The prepared dataset's folder; raises DatasetNotPreparedError saying how to make it."""
    directory = spec.directory(data_dir)
    if not (directory / "dataset_info.json").is_file():
        config = f" --config {spec.config}" if spec.config else ""
        raise DatasetNotPreparedError(
            f"TFDS dataset {spec.full_name} is not prepared: no dataset_info.json in "
            f"{directory}. specdec never downloads data; prepare it once on a machine with "
            f"network access with `tfds build {spec.name}{config} --data_dir {data_dir}` "
            f"(or copy a prepared {directory.relative_to(data_dir)} folder there)."
        )
    return directory


def tfds_dataset_fn(spec: TfdsSpec, data_dir: str | pathlib.Path) -> Callable[..., tf.data.Dataset]:
    """A seqio ``dataset_fn`` reading a prepared TFDS folder (never downloads)."""

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        import tensorflow_datasets as tfds

        builder = tfds.builder_from_directory(prepared_tfds_directory(spec, data_dir))
        read_config = tfds.ReadConfig(shuffle_seed=seed)
        return builder.as_dataset(split=split, shuffle_files=shuffle_files, read_config=read_config)

    return dataset_fn


def ding_dataset_fn(ding_dir: str | pathlib.Path) -> Callable[..., tf.data.Dataset]:
    """A seqio ``dataset_fn`` yielding ``{"en", "de"}`` from the Ding TSV files."""

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        del shuffle_files, seed  # one file per split; seqio shuffles examples
        path = ding.split_path(ding_dir, split)
        compression = "GZIP" if path.suffix == ".gz" else ""
        lines = tf.data.TextLineDataset(str(path), compression_type=compression)
        return lines.map(_parse_tsv_line, num_parallel_calls=tf.data.AUTOTUNE)

    return dataset_fn


def debian_dataset_fn(debian_dir: str | pathlib.Path) -> Callable[..., tf.data.Dataset]:
    """A seqio ``dataset_fn`` yielding ``{"en", "de"}`` from the Debian corpus (xz files)."""

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        del shuffle_files, seed  # read in the corpus's order; seqio shuffles examples
        pairs = debian_build.read_split(debian_dir, split)  # raises naming the folder
        english = [en for en, _ in pairs]
        german = [de for _, de in pairs]
        return tf.data.Dataset.from_tensor_slices({"en": english, "de": german})

    return dataset_fn


def summaries_dataset_fn(summaries_dir: str | pathlib.Path) -> Callable[..., tf.data.Dataset]:
    """A seqio ``dataset_fn`` yielding ``{"article", "highlights"}`` (CNN/DM's features)."""

    def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
        del shuffle_files, seed  # one file per split, in a fixed hash order
        records = summaries.read_split(summaries_dir, split)  # raises naming the file
        articles = [record.text for record in records]
        highlights = [record.summary for record in records]
        return tf.data.Dataset.from_tensor_slices(
            {
                "article": tf.constant(articles, tf.string),
                "highlights": tf.constant(highlights, tf.string),
            }
        )

    return dataset_fn


def _parse_tsv_line(line: tf.Tensor) -> dict[str, tf.Tensor]:
    """``english<TAB>german`` -> ``{"en": english, "de": german}`` (no quoting rules)."""
    english, german = tf.io.decode_csv(
        line, record_defaults=["", ""], field_delim="\t", use_quote_delim=False
    )
    return {"en": english, "de": german}


def translate(
    dataset: tf.data.Dataset, *, source_language: str = "en", target_language: str = "de"
) -> tf.data.Dataset:
    """T5's translate preprocessor: ``translate English to German: {en}`` -> ``{de}``."""
    names = {"en": "English", "de": "German", "fr": "French", "ro": "Romanian"}
    prefix = f"translate {names[source_language]} to {names[target_language]}: "

    def to_inputs_targets(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {
            "inputs": tf.strings.join([prefix, example[source_language]]),
            "targets": example[target_language],
        }

    return dataset.map(to_inputs_targets, num_parallel_calls=tf.data.AUTOTUNE)


def summarize(
    dataset: tf.data.Dataset, *, article_key: str = "article", summary_key: str = "highlights"
) -> tf.data.Dataset:
    """T5's summarize preprocessor: ``summarize: {article}`` -> ``{highlights}``."""

    def to_inputs_targets(example: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {
            "inputs": tf.strings.join(["summarize: ", example[article_key]]),
            "targets": example[summary_key],
        }

    return dataset.map(to_inputs_targets, num_parallel_calls=tf.data.AUTOTUNE)


def output_features(vocabulary: seqio.Vocabulary) -> dict[str, seqio.Feature]:
    """``inputs`` and ``targets`` in one shared vocabulary, each with EOS appended."""
    return {
        "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True),
        "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
    }


def _add_task(name: str, source: seqio.DataSource, text_preprocessor, vocabulary) -> None:
    """(Re)registers one text-to-text task: preprocess, tokenize, append EOS."""
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=[
            text_preprocessor,
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=output_features(vocabulary),
    )


def register_tasks(
    *,
    ding_dir: str | pathlib.Path = DEFAULT_DING_DIR,
    debian_dir: str | pathlib.Path = DEFAULT_DEBIAN_DIR,
    summaries_dir: str | pathlib.Path = DEFAULT_SUMMARIES_DIR,
    tfds_data_dir: str | pathlib.Path = DEFAULT_TFDS_DATA_DIR,
    vocab_path: str | pathlib.Path = vocab_lib.DEFAULT_VOCAB_PATH,
) -> tuple[str, ...]:
    """Registers (or re-registers) the five tasks with these locations; returns their names.

    Idempotent: calling again replaces the tasks, so the last call's directories win.
    Nothing is read until a dataset is requested.
    """
    vocabulary = vocab_lib.get_vocabulary(vocab_path)
    ding_source = seqio.FunctionDataSource(ding_dataset_fn(ding_dir), splits=ding.SPLITS)
    _add_task(DING_ENDE, ding_source, translate, vocabulary)
    debian_source = seqio.FunctionDataSource(
        debian_dataset_fn(debian_dir), splits=debian_build.SPLITS
    )
    _add_task(DEBIAN_ENDE, debian_source, translate, vocabulary)
    sources = {
        WMT_T2T_ENDE: (WMT_T2T_SPEC, translate),
        CNN_DAILYMAIL: (CNN_DAILYMAIL_SPEC, summarize),
    }
    for name, (spec, preprocessor) in sources.items():
        dataset_fn = tfds_dataset_fn(spec, tfds_data_dir)
        source = seqio.FunctionDataSource(dataset_fn, splits=spec.splits)
        _add_task(name, source, preprocessor, vocabulary)
    summaries_source = seqio.FunctionDataSource(
        summaries_dataset_fn(summaries_dir), splits=summaries.SPLITS
    )
    _add_task(DEBIAN_SUMMARIES, summaries_source, summarize, vocabulary)
    return TASK_NAMES
