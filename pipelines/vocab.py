"""The project's SentencePiece vocabulary, trained on the Ding corpus (English and German).

One unigram model covers both languages, so the encoder and decoder share embeddings
the way T5's do. Special ids follow T5: ``pad=0``, ``eos=1``, ``unk=2``, no BOS, and no
extra ids (the models never see span-corruption sentinels).

Why 8,000 pieces: the corpus is small (~380k short phrase pairs, ~18k sentences) and so
are the models. A tiny draft's step cost is dominated by its ``d_model × V`` output
projection, so every extra piece slows the draft without helping it approximate the
target, while fewer pieces lengthen every sequence (more decoding steps). Measured on the
test sentences (pieces per word, English / German): 4k 1.88 / 2.10, **8k 1.65 / 1.85**,
16k 1.48 / 1.63. Going 8k -> 16k shortens sequences by ~11% but doubles the output
layer; 8k -> 4k halves it but lengthens sequences by ~14%. T5's 32k vocabulary would
quadruple the output layer of a 2M-parameter draft.

Run ``specdec vocab`` (or ``python -m pipelines.vocab``) to retrain
``assets/spm/ende.model`` from the committed train split; training is deterministic (one
thread, fixed seed, no sampling).

The Debian corpus (``pipelines.data.debian``) has its own model,
``assets/spm/ende_debian.model``: ``specdec vocab --corpus debian``
(a seeded sample of ``DEBIAN_SAMPLE_SENTENCES`` of the train sides of every source).
``--measure 8000,32000`` trains each size into ``runs/spm_measure/`` and ``--compare
A.model,B.model`` measures given models: pieces per sentence and the unknown-character
rate on every source's test split, beside the Ding model's; the choice and the figures
are in BENCHMARKS.md ("Debian corpus and vocabulary").
"""

from __future__ import annotations

import argparse
import functools
import io
import pathlib
from collections.abc import Iterator, Sequence

from pipelines.arguments import ranged
from pipelines.data import ding

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_VOCAB_PATH = REPO_ROOT / "assets" / "spm" / "ende.model"
DEFAULT_DATA_DIR = ding.DEFAULT_DATA_DIR
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2  # T5's ids
DEFAULT_VOCAB_SIZE = 8000
DEBIAN_VOCAB_PATH = REPO_ROOT / "assets" / "spm" / "ende_debian.model"
DEBIAN_VOCAB_SIZE = 16000  # chosen by measurement (BENCHMARKS.md)
DEBIAN_SAMPLE_SENTENCES = 100_000  # of ~1.15M train sides: SentencePiece's seeded sample


def training_sentences(data_dir: str | pathlib.Path, split: str = "train") -> Iterator[str]:
    """Both sides of every pair of ``split``: English, then German, pair by pair."""
    for english, german in ding.iter_split(data_dir, split):
        yield english
        yield german


def debian_training_sentences(data_dir: str | pathlib.Path) -> Iterator[str]:
    """Both sides of every train pair of every Debian-corpus source (English, then German)."""
    from pipelines.data.debian import build

    for english, german in build.read_split(data_dir, "train"):
        yield english
        yield german


def train_sentencepiece(
    sentences: Iterator[str],
    model_path: str | pathlib.Path,
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    character_coverage: float = 1.0,  # the corpus has only ~120 distinct characters
    seed: int = 0,
    write_vocab_file: bool = True,
    input_sentence_size: int = 0,
) -> pathlib.Path:
    """Trains a unigram SentencePiece model on ``sentences`` and writes it to ``model_path``.

    ``model_path`` must end in ``.model``; a ``.vocab`` file (piece and score per line)
    is written beside it when ``write_vocab_file``. ``input_sentence_size > 0`` trains on
    that many sentences drawn by SentencePiece's seeded sampler (0: every sentence, in
    order). Returns the model path.
    """
    import sentencepiece as spm

    model_path = pathlib.Path(model_path)
    if model_path.suffix != ".model":
        raise ValueError(f"model path must end in .model, got {model_path}")
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    spm.SentencePieceTrainer.train(
        sentence_iterator=sentences,
        model_writer=model,
        model_type="unigram",
        vocab_size=vocab_size,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        bos_id=-1,
        input_sentence_size=input_sentence_size,  # 0: every sentence, no sampling
        shuffle_input_sentence=input_sentence_size > 0,  # seeded: the same sample each run
        num_threads=1,  # summation order fixed: the same bytes on every run
        minloglevel=1,
    )
    model_path.parent.mkdir(parents=True, exist_ok=True)
    model_path.write_bytes(model.getvalue())
    if write_vocab_file:
        _write_vocab_file(model_path)
    return model_path


def _write_vocab_file(model_path: pathlib.Path) -> None:
    """Writes ``piece<TAB>score`` lines next to the model, as spm_train does."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    lines = (
        f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n"
        for i in range(processor.get_piece_size())
    )
    model_path.with_suffix(".vocab").write_text("".join(lines), encoding="utf-8")


@functools.lru_cache(maxsize=8)
def get_vocabulary(path: str | pathlib.Path = DEFAULT_VOCAB_PATH):
    """The SentencePiece model at ``path`` as a ``seqio.SentencePieceVocabulary``.

    Raises FileNotFoundError naming ``path`` (and the command that makes it) if absent.
    """
    import seqio

    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"SentencePiece model not found at {path}; train it with "
            f"`python -m pipelines.vocab --output {path}`"
        )
    return seqio.SentencePieceVocabulary(str(path), extra_ids=0)


def pieces_per_word(model_path: str | pathlib.Path, texts: Sequence[str]) -> float:
    """Average number of pieces per whitespace-separated word over ``texts``."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    n_pieces = sum(len(ids) for ids in processor.encode(list(texts)))
    n_words = sum(len(text.split()) for text in texts)
    return n_pieces / max(n_words, 1)


def unknown_character_rate(model_path: str | pathlib.Path, texts: Sequence[str]) -> float:
    """Share of the non-space characters of ``texts`` that the model encodes as ``unk``.

    Counted on the encoder's own output (the surface text of each unk piece), so
    characters that normalisation maps to known ones (``…`` -> ``...``) are not unknown.
    Decoding gives ``⁇`` for an unknown character.
    """
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    unknown = total = 0
    for text in texts:
        total += sum(not char.isspace() for char in text)
        for piece in processor.encode(text, out_type="immutable_proto").pieces:
            if piece.id == processor.unk_id():
                unknown += sum(not char.isspace() for char in piece.surface)
    return unknown / max(total, 1)


def pieces_per_sentence(model_path: str | pathlib.Path, texts: Sequence[str]) -> float:
    """Average number of pieces per text (EOS not counted)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    return sum(len(ids) for ids in processor.encode(list(texts))) / max(len(texts), 1)


def measure_debian(data_dir, model_paths: dict[str, pathlib.Path]) -> list[dict]:
    """Pieces per sentence and unknown-character rate per model, source and side."""
    from pipelines.data.debian import build

    rows = []
    for source in build.sources_of(data_dir):
        test = build.read_source_split(data_dir, source, "test")
        for side, texts in (("en", [en for en, _ in test]), ("de", [de for _, de in test])):
            for name, path in model_paths.items():
                rows.append(
                    {
                        "model": name,
                        "source": source,
                        "side": side,
                        "pieces_per_sentence": pieces_per_sentence(path, texts),
                        "unknown_char_rate": unknown_character_rate(path, texts),
                    }
                )
    return rows


def _measure(args) -> None:
    """Trains each size of ``--measure`` (or takes the ``--compare`` model files) and
    prints the table (markdown)."""
    scratch = REPO_ROOT / "runs" / "spm_measure"  # the same bytes as a --corpus debian run
    models = {"ende.model (Ding, 8k)": DEFAULT_VOCAB_PATH}
    for path in args.compare.split(",") if args.compare else []:
        models[pathlib.Path(path).name] = pathlib.Path(path)
    for size in [int(size) for size in args.measure.split(",")] if args.measure else []:
        models[f"debian {size // 1000}k"] = train_sentencepiece(
            debian_training_sentences(args.data),
            scratch / f"debian_{size}.model",
            vocab_size=size,
            input_sentence_size=args.sample_sentences or DEBIAN_SAMPLE_SENTENCES,
        )
    rows = measure_debian(args.data, models)
    print("| model | source | side | pieces/sentence | unknown chars |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['model']} | {row['source']} | {row['side']} | "
            f"{row['pieces_per_sentence']:.2f} | {row['unknown_char_rate']:.5f} |"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``specdec vocab`` / ``python -m pipelines.vocab``."""
    parser.add_argument("--corpus", choices=("ding", "debian"), default="ding")
    parser.add_argument("--data", default=None, help="split directory (default per corpus)")
    parser.add_argument("--output", default=None, help="model path (.model)")
    parser.add_argument("--vocab-size", type=ranged(int, "--vocab-size", low=1), default=None)
    parser.add_argument("--measure", default=None, help="debian: comma list of sizes to compare")
    parser.add_argument("--compare", default=None, help="debian: comma list of .model files")
    parser.add_argument(
        "--sample-sentences",
        type=ranged(int, "--sample-sentences", low=1),
        default=None,
        help=f"debian: sentences sampled for training (default {DEBIAN_SAMPLE_SENTENCES})",
    )


def build_from_args(args: argparse.Namespace) -> pathlib.Path | None:
    """Trains the chosen corpus's model (or measures, with --measure/--compare); returns
    the model's path (None when measuring)."""
    if args.corpus != "debian" and (args.measure or args.compare):
        raise ValueError("--measure and --compare only apply with --corpus debian")
    if args.corpus == "debian":
        from pipelines.data.debian import build

        args.data = args.data or str(build.DEFAULT_OUTPUT)
        if args.measure or args.compare:
            _measure(args)
            return None
        path = train_sentencepiece(
            debian_training_sentences(args.data),
            args.output or DEBIAN_VOCAB_PATH,
            vocab_size=args.vocab_size or DEBIAN_VOCAB_SIZE,
            input_sentence_size=args.sample_sentences or DEBIAN_SAMPLE_SENTENCES,
        )
        for row in measure_debian(args.data, {path.name: path}):
            print(
                f"{row['source']} {row['side']}: {row['pieces_per_sentence']:.2f} pieces per "
                f"sentence, unknown characters {row['unknown_char_rate']:.5f}"
            )
        return path
    args.data = args.data or str(DEFAULT_DATA_DIR)
    args.output = args.output or str(DEFAULT_VOCAB_PATH)
    args.vocab_size = args.vocab_size or DEFAULT_VOCAB_SIZE
    path = train_sentencepiece(
        training_sentences(args.data), args.output, vocab_size=args.vocab_size
    )
    test = ding.read_split(args.data, "test")
    for side, texts in (("English", [en for en, _ in test]), ("German", [de for _, de in test])):
        print(f"{side} test sentences: {pieces_per_word(path, texts):.2f} pieces per word")
    return path


def run(args: argparse.Namespace) -> int:
    """``specdec vocab``: :func:`build_from_args`; returns the exit status."""
    build_from_args(args)
    return 0


def main(argv: Sequence[str] | None = None) -> pathlib.Path | None:
    """Command line: ``python -m pipelines.vocab [--corpus ding|debian] [--output PATH]``."""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.vocab", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    return build_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    main()
