"""The ``specdec`` command line.

Subcommands:
  translate  the En→De Beam job: input file or seqio split -> output JSONL + dead letters,
             MLflow run, summary table (``--compare-baseline`` measures the speedup)
  summarize  the same job for ``article -> summary`` (ROUGE when references exist)
  ui         the MLflow UI on 127.0.0.1 over the jobs' tracking store
  prepare    writes the Ding En-De splits (``python -m pipelines.data.ding``), or with
             ``--corpus debian`` the Debian En-De corpus (``pipelines.data.debian.build``),
             or with ``--corpus summaries`` the Debian description → synopsis corpus
             (``pipelines.data.summaries``)
  train      trains a model config, resumably (``pipelines.train``)
  train-recipe  trains a recipe's stages and packs their exports (``pipelines.train.recipe``)
  vocab      trains the SentencePiece vocabulary (``pipelines.vocab``)
  kd-data    the teacher's own translations as distillation data (``pipelines.kd_data``)
  demo       speculative vs target-only decoding on stub models, in one run
  study      acceptance-rate study over a grid file (``pipelines.study``, the paper's Table 3)
  log-run    logs the MLflow run of a job that ran while MLflow was unavailable

Arguments after a lone ``--`` go to Beam as pipeline options
(``specdec translate ... -- --runner=DirectRunner``). A command prints its own lines
only: the log lines and warnings of the libraries it uses go to ``runs/<command>.log``,
and ``specdec --verbose`` shows them instead (:mod:`pipelines.log_setup`). User errors
(missing file, unknown model, bad config key, bad value) print one ``specdec: error:``
line and exit with status 2; ``SPECDEC_DEBUG=1`` shows the traceback instead. The job
commands' exit statuses are :data:`pipelines.exit_codes.EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import pathlib
import sys
from typing import TYPE_CHECKING

from pipelines.arguments import ranged as _ranged
from pipelines.compile_cache import DEFAULT_COMPILE_CACHE as DEFAULT_COMPILE_CACHE
from pipelines.compile_cache import compile_cache_environment as compile_cache_environment
from pipelines.compile_cache import compile_cache_settings as compile_cache_settings
from pipelines.compile_cache import enable_compile_cache
from pipelines.exit_codes import EXIT_CANNOT_START as EXIT_CANNOT_START
from pipelines.exit_codes import EXIT_CODES as EXIT_CODES
from pipelines.exit_codes import EXIT_DEAD_LETTERS as EXIT_DEAD_LETTERS
from pipelines.exit_codes import EXIT_FAILED as EXIT_FAILED
from pipelines.exit_codes import EXIT_OK as EXIT_OK
from pipelines.log_setup import (
    LOG_DIR_ENV,
    VERBOSE_ENV,
    VERBOSE_FLAG,
    configure_from_argv,
    own_lines_to_stderr,
    split_verbose,
)
from pipelines.model_resolver import DEFAULT_GAMMA
from pipelines.record_io import JobFailed, PartitionError
from workers.spec import (
    DEFAULT_DRAFT_PLACEMENT,
    DEFAULT_TRANSPORT,
    DRAFT_PLACEMENTS,
    ENGINE_KINDS,
    TRANSPORTS,
)

if TYPE_CHECKING:
    from pipelines.job_summary import JobSummary

log = logging.getLogger(__name__)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
# --sampling: specdec_core.sampling.RULES, named here so that parsing the flags imports
# no JAX (tests/test_invariant_sampling.py checks that the two agree)
SAMPLING_RULES = ("paper", "invariant")


def _int_or_auto(flag: str, low: int):
    """An argparse type for ``flag``: ``auto`` or an integer >= ``low``."""

    def parse(text: str) -> int | str:
        if text == "auto":
            return text
        try:
            int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be auto or int, got {text!r}") from None
        return _ranged(int, flag, low=low)(text)

    return parse


def _add_job_arguments(parser: argparse.ArgumentParser, kind) -> None:
    """The flags of translate/summarize: the job CLI's contract."""
    add = parser.add_argument
    add(
        "--input", required=True, help="text, TSV (source<TAB>reference), JSONL or seqio:TASK:SPLIT"
    )
    add("--output", required=True, help="output JSONL")
    add(
        "--target",
        default=None,
        help=f"model config name or YAML path (default {kind.default_target})",
    )
    add(
        "--draft",
        default=None,
        help=f"model config name or spec (default {kind.default_draft}); none: no draft "
        "model, the target alone (--gamma 0)",
    )
    add(
        "--gamma",
        type=_int_or_auto("--gamma", low=0),  # 0: the target alone
        default=None,
        help="drafted tokens per iteration, or auto: chosen per batch in 0..--gamma-max "
        "(0 = the target alone) from what the job measures, acceptance by position and "
        f"the calls' times (default auto, or 0 with --draft none; the best fixed γ measured "
        f"is {DEFAULT_GAMMA}); 0: the same job without speculation, through the same "
        "engine and workers",
    )
    add(
        "--gamma-max",
        type=_ranged(int, "--gamma-max", low=1),
        default=None,
        help="the largest γ that --gamma auto tries (default 4)",
    )
    add("--temperature", type=_ranged(float, "--temperature", low=0.0), default=0.0)
    add("--top-k", type=_ranged(int, "--top-k", low=0), default=0, help="0 = off")
    add("--top-p", type=_ranged(float, "--top-p", low=0.0, high=1.0, low_open=True), default=1.0)
    add(
        "--sampling",
        choices=SAMPLING_RULES,
        default="invariant",
        help="invariant (default): every token is the target's own seeded sample at its "
        "position, so a seed fixes the outputs and they equal the target alone's at any "
        "temperature, whatever the draft, γ, --gamma auto's choices, batch, placement or "
        "restarts; paper: the paper's accept/reject rule (a few more drafts accepted; a "
        "seed fixes the outputs too, but they are not the target alone's samples, and at "
        "T > 0 the draft also proposes the position after its γ tokens). At T = 0 both "
        "are greedy",
    )
    add("--seed", type=int, default=0, help="job seed (with the record id it fixes every draw)")
    add(
        "--batch-size",
        type=_int_or_auto("--batch-size", low=1),
        default=1,
        help="records per batch, or auto: the job times the target at batch 1, 4, 16 and "
        "64 and takes the size that decodes its records soonest (for offline jobs)",
    )
    add("--workers", choices=ENGINE_KINDS, default="ray")
    add("--compare-baseline", action="store_true", help="also decode with the target alone")
    add("--summary-json", default=None, help="write the summary here")
    add(
        "--tracking-uri",
        default=None,
        help="MLflow store (default sqlite:///<repo>/runs/mlflow.db)",
    )
    add("--ray-address", default=None, help="join this Ray cluster (default: a local instance)")
    add(
        "--draft-placement",
        choices=DRAFT_PLACEMENTS,
        default=DEFAULT_DRAFT_PLACEMENT,
        help="ray: host the draft in the coordinator's actor (one call per iteration), "
        "in its own actor (two calls) or in the target's actor (the batch's whole loop "
        "compiled there: one call per batch; for one host)",
    )
    add(
        "--transport",
        choices=TRANSPORTS,
        default=DEFAULT_TRANSPORT,
        help="ray: the loop's per-iteration calls over a direct socket to each worker, "
        "or as Ray actor calls",
    )
    add(
        "--pipelined",
        action="store_true",
        help="ray, --draft-placement coordinator or worker: the draft proposes the next "
        "block while the target verifies this one (the same tokens; slower on a 2-core "
        "machine: BENCHMARKS.md, Pipelined speculation)",
    )
    add(
        "--max-new-tokens",
        type=_ranged(int, "--max-new-tokens", low=1),
        default=None,
        help=f"generated tokens per record at most (default {kind.max_new_tokens})",
    )
    add(
        "--max-input-tokens",
        type=_ranged(int, "--max-input-tokens", low=1),
        default=None,
        help=f"longer inputs are dead letters (default {kind.max_input_tokens})",
    )
    add("--dead-letter", default=None, help="dead-letter JSONL (default <output>.dead.jsonl)")
    add("--limit", type=_ranged(int, "--limit", low=1), default=None, help="read at most N records")
    add("--vocab", default=None, help="SentencePiece model (default: the target config's)")
    add(
        "--allow-random-init",
        action="store_true",
        help="run models without checkpoints on random weights (tests only)",
    )
    add("--quiet", action="store_true", help="no progress lines")
    add(
        "--no-warmup",
        action="store_true",
        help="compile each program when a batch first needs it, on that batch's path "
        "(default: the programs of the job's batch shapes compile ahead, in the background)",
    )
    parser.set_defaults(func=functools.partial(_job, kind.name))


def _job_gamma(args: argparse.Namespace) -> int | str:
    """``--gamma`` as given, else ``auto``, or 0 (the target alone) with ``--draft none``."""
    if args.gamma is not None:
        return args.gamma
    from pipelines.job_config import NO_DRAFT

    return 0 if args.draft == NO_DRAFT else "auto"


def _job(kind_name: str, args: argparse.Namespace) -> int:
    enable_compile_cache()  # before JAX is imported here or in the job's Ray workers
    from pipelines import job_config, job_table, translate
    from workers.engine import EngineConfig

    engine = EngineConfig(
        kind=args.workers,
        draft_placement=args.draft_placement,
        transport=args.transport,
        pipelined=args.pipelined,
        ray_address=args.ray_address,
        gamma=_job_gamma(args),
        gamma_max=args.gamma_max,
    )
    job = job_config.make_job(
        job_config.KINDS[kind_name],
        input=args.input,
        output=args.output,
        target=args.target,
        draft=args.draft,
        engine=engine,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        sampling_rule=args.sampling,
        seed=args.seed,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        max_input_tokens=args.max_input_tokens,
        compare_baseline=args.compare_baseline,
        dead_letter=args.dead_letter,
        vocab=args.vocab,
        allow_random_init=args.allow_random_init,
        limit=args.limit,
        tracking_uri=args.tracking_uri,
        summary_json=args.summary_json,
        beam_args=tuple(args.beam_args),
        progress=not args.quiet,
        warmup=not args.no_warmup,
    )
    log.info("specdec %s: %s -> %s", kind_name, job.input, job.output)
    summary = translate.run_job(job)
    print(job_table.format_summary(job, summary))
    return job_exit_code(summary)


def job_exit_code(summary: JobSummary) -> int:
    """EXIT_OK when every record came out, else EXIT_DEAD_LETTERS (with a stderr line)."""
    failed, total = summary.records_failed, summary.records_in
    if not failed and summary.records_out == total:
        return EXIT_OK
    reasons = ", ".join(f"{n} {reason}" for reason, n in summary.failed_by_reason.items())
    what = f"all {total}" if summary.records_out == 0 else f"{failed} of {total}"
    log.error(
        "specdec: error: %s records went to the dead letters (%s); see %s",
        what,
        reasons,
        summary.dead_letter,
    )
    return EXIT_DEAD_LETTERS


def _exit_codes_epilog() -> str:
    return "Exit status: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items())


def build_parser() -> argparse.ArgumentParser:
    from pipelines import demo, job_config, kd_data, log_run, prepare, study, ui, vocab
    from pipelines.train import cli as train_cli
    from pipelines.train import recipe

    # Every other subcommand: (name, help, its module with add_arguments(parser), run(args)).
    subcommands = (
        ("log-run", "log the MLflow run of a job that ran while MLflow was unavailable",
         log_run, log_run.run),
        ("ui", "MLflow UI on 127.0.0.1 over the jobs' store", ui, ui.run),
        ("prepare", "write the Ding En-De splits, or a Debian corpus (--corpus)",
         prepare, prepare.run),
        ("train", "train a model config, resumably", train_cli, train_cli.run),
        ("train-recipe", "train a recipe's stages and pack their exports", recipe, recipe.run),
        ("vocab", "train the SentencePiece vocabulary", vocab, vocab.run),
        ("kd-data", "the teacher's translations as distillation data", kd_data, kd_data.run),
        ("demo", "speculative vs target-only decoding on stub models", demo, demo.run),
        ("study", "acceptance-rate study over a grid (Table 3)",
         study, study.command),  # study.run is the study job itself
    )  # fmt: skip

    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Speculative decoding jobs. Each command prints its own lines only: the "
        "log lines and warnings of the libraries it uses (Beam, Ray, MLflow, JAX, absl, "
        "TensorFlow) go to runs/<command>.log, rewritten by each run (another folder: "
        f"{LOG_DIR_ENV}=DIR), and their native and Ray workers' logging is turned down.",
    )
    parser.add_argument(
        VERBOSE_FLAG,
        action="store_true",
        help="show the libraries' log lines and warnings on stderr, and Ray's workers' "
        f"output, instead of writing them to runs/<command>.log (also {VERBOSE_ENV}=1; "
        "accepted among a command's flags too)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for kind in (job_config.TRANSLATE, job_config.SUMMARIZE):
        job = sub.add_parser(
            kind.name,
            help=f"the {kind.name} Beam job (speculative decoding)",
            epilog="Beam pipeline options go after a lone --, e.g. -- --runner=DataflowRunner "
            "(default: the in-process FnApiRunner). Models: a configs/models name, a model "
            "YAML path, or (with --allow-random-init) a registry preset[:key=value,...]. "
            "A killed job resumes when rerun with the same flags (finished records are kept "
            "in <output>.parts/). The libraries' log lines go to runs/<command>.log "
            "(--verbose: to stderr). " + _exit_codes_epilog() + ".",
        )
        _add_job_arguments(job, kind)
    for name, help_text, module, run in subcommands:
        description = module.__doc__.split("\n\n")[0].replace("``", "")
        subparser = sub.add_parser(name, help=help_text, description=description)
        module.add_arguments(subparser)
        subparser.set_defaults(func=run)
    return parser


def _split_beam_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[..., "--", beam options...]`` -> (specdec args, Beam pipeline options)."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns the exit status (2 for usage and input errors).
    Its messages go through ``logging``, its loggers on stderr (the job's table on stdout)."""
    own_lines_to_stderr()
    argv, _ = split_verbose(list(sys.argv[1:] if argv is None else argv))  # see entry()
    own, beam_args = (
        _split_beam_args(argv) if argv[:1] in (["translate"], ["summarize"]) else (argv, [])
    )
    # Everything after prepare belongs to the chosen corpus's builder.
    passthrough = own[:1] == ["prepare"]
    try:
        args = build_parser().parse_args(own[:1] if passthrough else own)
    except SystemExit as exit_:  # argparse has printed its message
        return int(exit_.code or 0)
    args.beam_args = beam_args
    if passthrough:
        args.passthrough_args = own[1:]
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as err:
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        log.error("specdec: error: %s", err)
        return EXIT_CANNOT_START
    except (PartitionError, JobFailed) as err:  # loud, and not a usage error
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        log.error("specdec: error: %s", err)
        return EXIT_FAILED


JOB_COMMANDS = ("translate", "summarize")


def entry() -> None:
    """The ``specdec`` console script: :func:`main`, then the process's exit.

    After a job command the process skips the interpreter's teardown: once the job has
    written its outputs, summary and MLflow run, the exit handlers run (Ray's shutdown of
    its local instance, MLflow's, logging's), stdout and stderr are flushed, and the
    process ends with ``os._exit``. The teardown it skips (freeing JAX's and Ray's
    objects one by one) costs seconds at the end of every job (BENCHMARKS.md
    "Start-up"). The exit status is :func:`main`'s either way.
    """
    argv = configure_from_argv(sys.argv[1:])  # done already when it came through launch
    code = main(argv)
    if argv[:1] and argv[0] in JOB_COMMANDS:
        import atexit

        atexit._run_exitfuncs()  # Ray, MLflow and logging handlers, as a normal exit runs them
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe (``| head``): nothing more to say
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
