"""The training job's command line: ``specdec train`` (or ``python -m pipelines.train``).

``--config configs/models/<name>.yaml`` with ``--resume`` (continue from the latest
checkpoint in the config's train dir, else warm-start from its export), ``--max-steps
N`` (override ``train.max_steps``) or ``--time-budget SECONDS`` (train until a deadline,
the learning rate annealed by time), ``--set SECTION.KEY=VALUE`` (override a config
value, checked as the file is), ``--tracking-uri URI`` (MLflow; default
``sqlite:///<repo>/runs/mlflow.db``), or ``--evaluate SPLIT [--sentences N]`` to score
the latest checkpoint only. :func:`add_arguments` and :func:`run` are the ``specdec``
subcommand; :func:`main` is ``python -m pipelines.train`` as a function.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from pipelines import configs
from pipelines.arguments import add_overrides, add_ranged
from pipelines.train.evaluate import evaluate_checkpoint
from pipelines.train.loop import Trainer, enable_compilation_cache

DESCRIPTION = "Train a model config (configs/models/<name>.yaml), resumably."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The training job's flags; the parser's program name prefixes the recorded command."""
    parser.add_argument("--config", required=True, help="configs/models/<name>.yaml")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    add_ranged(parser, "--max-steps", int, low=1, help="override train.max_steps")
    add_ranged(
        parser,
        "--time-budget",
        float,
        low=1.0,
        metavar="SECONDS",
        help="train until this many seconds have passed (loading and compiling included), "
        "the learning rate decayed to 0 over the last 20%% of them; not with --max-steps",
    )
    add_overrides(parser, "override a config value (YAML), e.g. --set train.tokens_per_batch=65536")
    parser.add_argument("--tracking-uri", default=None, help="MLflow URI (default runs/mlflow.db)")
    parser.add_argument(
        "--evaluate",
        metavar="SPLIT",
        default=None,
        help="only evaluate the latest checkpoint on SPLIT (loss, accuracy, BLEU of all pairs)",
    )
    parser.add_argument(
        "--sentences",
        type=int,
        default=None,
        metavar="N",
        help="with --evaluate: only the first N full-sentence pairs of SPLIT",
    )
    parser.set_defaults(train_prog=parser.prog)


def check_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the flag when the flags do not go together."""
    if args.sentences is not None and not args.evaluate:
        raise ValueError("--sentences only applies with --evaluate SPLIT")
    if args.time_budget is not None and args.max_steps is not None:
        raise ValueError("--time-budget and --max-steps do not go together: choose one")


def command_line(args: argparse.Namespace) -> str:
    """The command that trains as ``args`` do (recorded in the export's training.json)."""
    parts = [getattr(args, "train_prog", "specdec train"), "--config", args.config]
    if args.resume:
        parts.append("--resume")
    if args.max_steps is not None:
        parts += ["--max-steps", str(args.max_steps)]
    if args.time_budget is not None:
        parts += ["--time-budget", f"{args.time_budget:g}"]
    for override in args.overrides:
        parts += ["--set", override]
    if args.tracking_uri is not None:
        parts += ["--tracking-uri", args.tracking_uri]
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    """Trains (or with ``--evaluate`` scores) the config; returns the exit status."""
    check_arguments(args)
    model_file = configs.load_model_config(args.config, args.overrides)
    enable_compilation_cache()
    if args.evaluate:
        result = evaluate_checkpoint(model_file, split=args.evaluate, sentences=args.sentences)
        print(json.dumps(result), flush=True)
        return 0
    trainer = Trainer(model_file, max_steps=args.max_steps, time_budget_s=args.time_budget)
    run_state = trainer.fit(
        resume=args.resume, tracking_uri=args.tracking_uri, command=command_line(args)
    )
    print(
        f"done: step {run_state.step}, {run_state.wall_s / 60:.1f} min, "
        f"last eval {run_state.last_eval}",
        flush=True,
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.train ARGS``; returns an exit status (argparse exits 2 on bad
    flags; flags that do not go together exit with a message naming them)."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.train", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
    except ValueError as error:
        raise SystemExit(f"{parser.prog}: error: {error}") from None
    return run(args)
