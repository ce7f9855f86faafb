"""Sequence-level distillation data: the target's own translations as training pairs.

``specdec kd-data --teacher-config configs/models/ende_target_debian.yaml --output
runs/kd/ende_target_debian`` (or ``python -m pipelines.kd_data``, the same flags) decodes
English inputs of the teacher's training split with the teacher (greedy at T=0, sampled
at T=1, ...) and writes the result as a Ding-style data folder: ``train.tsv`` holds
``english<TAB>teacher's German`` (one line per input and temperature),
``validation.tsv`` / ``test.tsv`` are copied unchanged (so evaluation still scores
against real references), and ``kd.json`` records the teacher, its step, the settings
and the counts.

Why: speculative decoding accepts a drafted token with probability min(1, p/q) along the
*target's* trajectories, and at T=0 only the target's argmax is ever accepted. A draft
distilled (KL to the teacher, ``train.distill_weight``) on prefixes the teacher itself
writes sees the distributions it will be asked to match; on the reference German it
sees prefixes the target never produces. Point a draft config's ``data.data_dir`` at the
output folder (``configs/models/ende_draft_debian_seq2.yaml``).

Every input gets a line (a decode that hits ``--max-new-tokens`` is written truncated
and counted); the output is a pure function of the teacher, the inputs and the seed.

``--processes N`` decodes the parts in N processes (part i in process i mod N), for a
machine whose cores one decoding process leaves idle; the first process then writes the
folder from every part. A long run loses little when it stops: the inputs are decoded in parts of
:data:`PART_INPUTS`, each written to ``parts/`` as soon as it is done (token ids as JSON,
named by a hash of the teacher's parameter values, the settings and the part's inputs). A
rerun with the same flags decodes only the parts that are missing, and a rerun with a
larger ``--limit`` keeps every whole part of the smaller one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import shutil
import sys
import time
from collections.abc import Sequence

from pipelines import configs, train
from pipelines.data import ding
from specdec_core.models import families

PREFIX = train.PREFIX
EOS_ID = train.EOS_ID
PART_INPUTS = 1024  # inputs per part file: a stopped run loses at most one part's work


def select_inputs(data: configs.DataConfig, *, inputs: str, limit: int) -> list[str]:
    """English sides of a data config's training split (a Ding folder, or the Debian
    corpus with its sources interleaved): full sentences only, or all pairs; the first
    ``limit`` (0 = all), each distinct English line once, in file order."""
    if inputs not in ("sentences", "all"):
        raise ValueError(f"--inputs must be 'sentences' or 'all', got {inputs!r}")
    seen: set[str] = set()
    english = []
    for pair in train.read_pairs(data, "train"):
        if inputs == "sentences" and not ding.is_sentence_pair(pair):
            continue
        if pair[0] not in seen:
            seen.add(pair[0])
            english.append(pair[0])
        if limit and len(english) == limit:
            break
    if not english:
        raise ValueError(f"no {inputs} inputs in the train split of {data.data_dir}")
    return english


def teacher_model(model_file: configs.ModelFileConfig, checkpoint: pathlib.Path | None):
    """The teacher as a BoundModel (its latest checkpoint unless ``checkpoint``)."""
    return _teacher(model_file, checkpoint)[0]


def _teacher(model_file: configs.ModelFileConfig, checkpoint: pathlib.Path | None):
    """(the teacher as a BoundModel, a SHA-256 of its parameters' values)."""
    import jax
    import numpy as np

    from specdec_core.models.bound import bind

    params = train.load_model_params(model_file, checkpoint)
    digest = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_leaves_with_path(params):
        value = np.asarray(leaf)
        digest.update(f"{jax.tree_util.keystr(path)}:{value.dtype}:{value.shape}".encode())
        digest.update(value.tobytes())
    return bind(model_file.name, model_file.family, model_file.model, params), digest.hexdigest()


def decode_all(
    model,
    encoded: Sequence[Sequence[int]],
    *,
    temperature: float,
    seed: int,
    batch_size: int,
    max_new_tokens: int,
    first_id: int = 0,
) -> list[list[int]]:
    """The teacher's continuation of every input (EOS dropped), in input order. Inputs
    are decoded in length-sorted batches so padding stays small. Input ``i`` is request
    ``first_id + i``, whose id seeds its samples at T > 0 (so a sample does not depend on
    the batch it was decoded in)."""
    from specdec_core.sampling import SamplingConfig
    from workers.batching import DecodeSettings, Request, pack
    from workers.engine import decode_baseline

    settings = DecodeSettings(
        sampling=SamplingConfig(temperature=temperature),
        seed=seed,
        eos_id=EOS_ID,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    outputs: list[list[int]] = [[] for _ in encoded]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        requests = [
            Request(id=str(first_id + i), prompt_tokens=(0,), encoder_tokens=tuple(encoded[i]))
            for i in chunk
        ]
        batch = pack(requests, settings)
        result = decode_baseline(model, batch, settings)
        for row, i in enumerate(chunk):
            ids = result.row_tokens(row)
            outputs[i] = ids[:-1] if ids and ids[-1] == EOS_ID else ids
    return outputs


def _part_path(parts: pathlib.Path, settings: dict, chunk: Sequence[Sequence[int]]):
    """Where a part's decodes live: named by a hash of everything they depend on."""
    key = json.dumps([settings, [[int(t) for t in x] for x in chunk]], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return parts / f"T{settings['temperature']:g}_{settings['first_id']:08d}_{digest}.json"


def _read_part(path: pathlib.Path, inputs: int) -> list[list[int]] | None:
    """A finished part's decodes, or None where there is none (or it does not read as
    ``inputs`` lists of token ids: it is then decoded again)."""
    try:
        outputs = json.loads(path.read_text())["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = isinstance(outputs, list) and len(outputs) == inputs
    if not ok or not all(isinstance(o, list) and all(type(t) is int for t in o) for o in outputs):
        return None
    return outputs


def _write_part(path: pathlib.Path, outputs: list[list[int]]) -> None:
    """Written whole or not at all (:func:`part_files.write_atomic`)."""
    from pipelines import part_files

    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"outputs": [[int(t) for t in o] for o in outputs]})
    part_files.write_atomic(str(path), text)


def parse_temperatures(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--temperatures must be comma-separated numbers, got {text!r}") from None
    if not values or any(t < 0 for t in values):
        raise ValueError(f"--temperatures must be >= 0 and not empty, got {text!r}")
    return values


def build(
    *,
    teacher_config: str | pathlib.Path,
    output: str | pathlib.Path,
    teacher_checkpoint: str | pathlib.Path | None = None,
    inputs: str = "sentences",
    limit: int = 0,
    temperatures: Sequence[float] = (0.0, 1.0),
    seed: int = 0,
    batch_size: int = 32,
    max_new_tokens: int = 64,
    processes: int = 1,
    shard: tuple[int, int] | None = None,
    log=print,
) -> dict:
    """Writes the distillation data folder; returns what kd.json records.

    ``processes`` > 1: the parts are decoded by that many processes first (module
    docstring). ``shard=(i, n)``: only decode the parts whose index is i mod n, and write
    nothing else (one of those processes)."""
    import sentencepiece as spm

    if processes > 1:
        settings = dict(
            teacher_config=teacher_config, output=output, teacher_checkpoint=teacher_checkpoint,
            inputs=inputs, limit=limit, temperatures=temperatures, seed=seed,
            batch_size=batch_size, max_new_tokens=max_new_tokens,
        )  # fmt: skip
        _decode_in_processes(settings, processes, log=log)
        return build(**settings, log=log)

    model_file = configs.load_model_config(configs.resolve(teacher_config))
    if not families.get(model_file.family).is_encoder_decoder:
        raise ValueError(f"{model_file.path}: kd_data needs an encoder-decoder (t5) teacher")
    data_dir = configs.resolve(model_file.data.data_dir)
    output = configs.resolve(output)
    checkpoint = configs.resolve(teacher_checkpoint) if teacher_checkpoint else None
    english = select_inputs(model_file.data, inputs=inputs, limit=limit)
    processor = spm.SentencePieceProcessor(
        model_file=str(configs.resolve(model_file.data.vocab_path))
    )
    max_in = model_file.data.max_input_length
    encoded = [train.trim(x, max_in) for x in processor.encode([PREFIX + e for e in english])]
    model, params_sha256 = _teacher(model_file, checkpoint)
    teacher = {"params_sha256": params_sha256, "step": _teacher_step(model_file, checkpoint)}
    parts = output / "parts"
    started = time.perf_counter()
    lines, truncated, empty, reused = [], 0, 0, 0
    for temperature in temperatures:
        tick, decoded = time.perf_counter(), 0
        outputs: list[list[int]] = []
        for first in range(0, len(encoded), PART_INPUTS):
            if shard is not None and (first // PART_INPUTS) % shard[1] != shard[0]:
                continue
            chunk = encoded[first : first + PART_INPUTS]
            settings = {
                "teacher": teacher,
                "temperature": temperature,
                "seed": seed,
                "max_new_tokens": max_new_tokens,
                "first_id": first,
            }
            path = _part_path(parts, settings, chunk)
            if (done := _read_part(path, len(chunk))) is not None:
                outputs += done
                reused += len(chunk)
                continue
            done = decode_all(
                model,
                chunk,
                temperature=temperature,
                seed=seed,
                batch_size=batch_size,
                max_new_tokens=max_new_tokens,
                first_id=first,
            )
            _write_part(path, done)
            outputs += done
            decoded += len(chunk)
            rate = decoded / max(time.perf_counter() - tick, 1e-9)
            log(
                f"T={temperature:g}: {first + len(chunk)}/{len(encoded)} inputs "
                f"({rate:.1f}/s; {len(outputs) - decoded} from earlier parts)"
            )
        if shard is not None:
            continue
        for en, ids in zip(english, outputs, strict=True):
            truncated += len(ids) >= max_new_tokens
            empty += not ids
            german = processor.decode(ids).replace("\t", " ").replace("\n", " ").strip()
            lines.append((en, german))
    if shard is not None:
        return {"shard": list(shard), "decoded_parts_in": str(parts)}
    output.mkdir(parents=True, exist_ok=True)
    ding.write_split(output / "train.tsv", lines)
    for split in ("validation", "test"):  # real references, as a Ding-style folder
        if model_file.data.source == "debian":
            ding.write_split(output / f"{split}.tsv", train.read_pairs(model_file.data, split))
        else:
            shutil.copyfile(ding.split_path(data_dir, split), output / f"{split}.tsv")
    info = {
        "teacher_config": str(teacher_config),
        "teacher_checkpoint": str(checkpoint or "latest"),
        "teacher_step": teacher["step"],
        "source": str(data_dir),
        "inputs": inputs,
        "limit": limit,
        "temperatures": list(temperatures),
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "pairs": len(lines),
        "distinct_inputs": len(english),
        "truncated": truncated,
        "empty": empty,
        "reused_from_parts": reused,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    (output / "kd.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"wrote {len(lines)} pairs to {output / 'train.tsv'} ({truncated} hit the length cap)")
    return info


def _decode_in_processes(settings: dict, processes: int, *, log) -> None:
    """The parts of :func:`build` with ``settings``, decoded by ``processes`` processes:
    shards 1.. in child processes, shard 0 in this one; raises if a child fails."""
    import subprocess

    flags = []
    for name, value in settings.items():
        if value is None:
            continue
        value = ",".join(f"{t:g}" for t in value) if name == "temperatures" else value
        flags += [f"--{name.replace('_', '-')}", str(value)]
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "pipelines.kd_data", *flags, "--shard", f"{i}/{processes}"],
            cwd=configs.REPO_ROOT,
        )
        for i in range(1, processes)
    ]
    try:
        build(**settings, shard=(0, processes), log=log)
    finally:
        codes = [child.wait() for child in children]
    if any(codes):
        raise RuntimeError(f"kd_data: a decoding process failed (exit codes {codes})")


def _teacher_step(model_file: configs.ModelFileConfig, checkpoint: pathlib.Path | None):
    complete = train.complete_checkpoints(model_file.train_dir)
    if checkpoint is None and complete:
        return complete[-1][0]
    folder = checkpoint or model_file.export_dir
    if folder.name.startswith("checkpoint_") and folder.name[11:].isdigit():
        return int(folder.name[11:])
    info = folder / "training.json"
    if info.is_file():
        return json.loads(info.read_text()).get("step")
    steps = [int(p.name.split("_")[1]) for p in folder.glob("checkpoint_*")]
    return max(steps) if steps else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``specdec kd-data`` / ``python -m pipelines.kd_data``."""
    parser.add_argument("--teacher-config", required=True, help="the target's model YAML")
    parser.add_argument("--output", required=True, help="data folder to write")
    parser.add_argument("--teacher-checkpoint", help="default: the config's latest checkpoint")
    parser.add_argument(
        "--inputs", choices=("sentences", "all"), default="sentences", help="default sentences"
    )
    parser.add_argument("--limit", type=int, default=0, help="first N distinct inputs (0 = all)")
    parser.add_argument("--temperatures", default="0,1", help="one pass per temperature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument(
        "--processes", type=int, default=1, help="decode the parts in N processes (default 1)"
    )
    parser.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # I/N: one process's


# build()'s keywords that the flags of the same name give as they are (not --temperatures)
_PASSED_FLAGS = (
    "teacher_config",
    "output",
    "teacher_checkpoint",
    "inputs",
    "limit",
    "seed",
    "batch_size",
    "max_new_tokens",
)


def build_from_args(args: argparse.Namespace) -> dict:
    """:func:`build` with the command line's settings, checked first (ValueError naming the
    flag); returns what kd.json records."""
    temperatures = parse_temperatures(args.temperatures)
    if args.limit < 0 or args.batch_size < 1 or args.max_new_tokens < 1:
        raise ValueError("--limit must be >= 0, --batch-size and --max-new-tokens >= 1")
    if args.processes < 1:
        raise ValueError(f"--processes must be >= 1, got {args.processes}")
    passed = {name: getattr(args, name) for name in _PASSED_FLAGS}
    return build(
        **passed,
        temperatures=temperatures,
        processes=args.processes,
        shard=_shard(args.shard),
    )


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    index, _, count = text.partition("/")
    if not (index.isdigit() and count.isdigit() and int(index) < int(count)):
        raise ValueError(f"--shard must be I/N with 0 <= I < N, got {text!r}")
    return int(index), int(count)


def run(args: argparse.Namespace) -> int:
    """``specdec kd-data``: :func:`build_from_args`; returns the exit status."""
    build_from_args(args)
    return 0


def main(argv: Sequence[str] | None = None) -> dict:
    """``python -m pipelines.kd_data ARGS``; exits with a message on bad settings."""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.kd_data", description=__doc__.split("\n\n")[0]
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return build_from_args(args)
    except (ValueError, FileNotFoundError) as error:  # configs.ConfigError is a ValueError
        sys.exit(f"kd_data: {error}")


if __name__ == "__main__":
    main()
