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
  vocab      trains the SentencePiece vocabulary (``pipelines.vocab``)
  kd-data    the teacher's own translations as distillation data (``pipelines.kd_data``)
  demo       speculative vs target-only decoding on stub models, in one run
  study      acceptance-rate study over a grid file (``pipelines.study``, the paper's Table 3)
  log-run    logs the MLflow run of a job that ran while MLflow was unavailable

Arguments after a lone ``--`` go to Beam as pipeline options
(``specdec translate ... -- --runner=DirectRunner``). User errors (missing file,
unknown model, bad config key, bad value) print one ``specdec: error:`` line and exit
with status 2; ``SPECDEC_DEBUG=1`` shows the traceback instead. The job commands'
exit statuses are :data:`EXIT_CODES`.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import pathlib
import sys

import numpy as np

from pipelines.model_resolver import DEFAULT_DRAFT, DEFAULT_GAMMA, DEFAULT_TARGET
from pipelines.record_io import JobFailed, PartitionError
from workers.spec import DEFAULT_DRAFT_PLACEMENT, DEFAULT_TRANSPORT, DRAFT_PLACEMENTS, TRANSPORTS

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

# Exit statuses of the job commands (translate, summarize).
EXIT_OK = 0  # every record came out
EXIT_FAILED = 1  # the job started but did not finish, or lost a record (a bug)
EXIT_CANNOT_START = 2  # bad flags or config, missing checkpoint, unreadable input
EXIT_DEAD_LETTERS = 3  # the job finished, but some records went to the dead letters
EXIT_CODES = {
    EXIT_OK: "every record came out",
    EXIT_FAILED: "the job failed after it started (finished records are kept: rerun to "
    "continue), or a record was lost",
    EXIT_CANNOT_START: "the job could not start: bad flags or config, missing checkpoint, "
    "unreadable input",
    EXIT_DEAD_LETTERS: "the job finished, but some records went to the dead letters (the "
    "summary counts them per reason)",
}
DEFAULT_COMPILE_CACHE = REPO_ROOT / "runs" / "jax_cache"


def enable_compile_cache(directory: str | os.PathLike | None = None) -> pathlib.Path | None:
    """Turns on JAX's persistent compilation cache for the job commands.

    Compiled programs are written to ``directory`` (default ``$SPECDEC_COMPILE_CACHE``,
    else ``runs/jax_cache`` under the repository; ``SPECDEC_COMPILE_CACHE=off``
    disables it), so a second job with the same models and shapes loads them instead
    of compiling. Every program is cached, however small or quick to compile (the
    loop's are both). Set through the environment, so that the processes the job
    starts (Ray workers) read it when they import JAX, and through ``jax.config`` when
    this process has already imported JAX. Returns the folder, or None when disabled.
    """
    chosen = directory or os.environ.get("SPECDEC_COMPILE_CACHE") or DEFAULT_COMPILE_CACHE
    if str(chosen).lower() == "off":
        return None
    path = pathlib.Path(chosen).resolve()
    path.mkdir(parents=True, exist_ok=True)
    settings = {
        "jax_compilation_cache_dir": str(path),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    os.environ.update({name.upper(): str(value) for name, value in settings.items()})
    if "jax" in sys.modules:
        import jax

        for name, value in settings.items():
            jax.config.update(name, value)
    return path


def _demo(args: argparse.Namespace) -> int:
    import jax

    from specdec_core import decoding, theory
    from specdec_core.models import table
    from specdec_core.sampling import SamplingConfig

    config = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    vocab, prompt_len, batch = 64, 8, args.batch_size
    target_params = table.init_params(
        jax.random.key(args.seed),
        vocab_size=vocab,
        scale=4.0,
        work_dim=1024,
        work_layers=args.target_layers,
    )
    noise = table.init_params(jax.random.key(args.seed + 1), vocab_size=vocab, scale=4.0)
    draft_params = table.from_table(0.85 * target_params.table + 0.15 * noise.table)
    target = functools.partial(table.forward, target_params)
    draft = functools.partial(table.forward, draft_params)
    max_len = prompt_len + args.max_new_tokens + args.gamma + 2
    prompts = np.random.default_rng(args.seed).integers(0, vocab, (batch, prompt_len))
    common = dict(
        prompt_tokens=prompts,
        prompt_lengths=np.full(batch, prompt_len),
        request_ids=np.arange(batch),
        max_new_tokens=args.max_new_tokens,
        sampling_config=config,
        seed=args.seed,
    )

    def run_both():
        base = decoding.autoregressive_generate(
            target=target, target_cache=table.init_cache(batch, max_len), **common
        )
        spec = decoding.speculative_generate(
            target=target,
            target_cache=table.init_cache(batch, max_len),
            draft=draft,
            draft_cache=table.init_cache(batch, max_len),
            gamma=args.gamma,
            **common,
        )
        return base, spec

    print("compiling ...", file=sys.stderr, flush=True)
    run_both()
    base, spec = run_both()
    alpha = theory.empirical_alpha(
        int(spec.accepted.sum()),
        int(spec.iterations.sum()),
        int(spec.accepted_by_position[:, -1].sum()),
    )
    summary = {
        "speedup": base.total_s / spec.total_s,
        "alpha": alpha,
        "mean_accepted_length": float(
            (spec.accepted.sum() + spec.iterations.sum()) / spec.iterations.sum()
        ),
        "predicted_tokens_per_iteration": theory.expected_tokens(min(alpha, 1.0), args.gamma)
        if alpha is not None
        else None,
        "tokens_per_s": float(spec.lengths.sum() / spec.total_s),
        "baseline_tokens_per_s": float(base.lengths.sum() / base.total_s),
        "identical_to_baseline": bool((spec.tokens == base.tokens).all())
        if config.greedy
        else None,
        "draft_s": spec.draft_s,
        "target_s": spec.target_s,
        "overhead_s": spec.overhead_s,
    }
    print("speculative decoding demo (stub table models, target with dense work layers)")
    for key, value in summary.items():
        print(f"  {key:32s} {value:.4f}" if isinstance(value, float) else f"  {key:32s} {value}")
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


def _ranged(kind, name: str, *, low=None, high=None, low_open=False):
    """An argparse type that checks ``low <= x <= high`` (``low < x`` when low_open)."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            message = f"{name} must be {kind.__name__}, got {text!r}"
            raise argparse.ArgumentTypeError(message) from None
        if low is not None and (value <= low if low_open else value < low):
            raise argparse.ArgumentTypeError(
                f"{name} must be {'>' if low_open else '>='} {low}, got {text}"
            )
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{name} must be <= {high}, got {text}")
        return value

    return parse


def _gamma(text: str) -> int | str:
    """``--gamma``: ``auto`` or an integer >= 1."""
    if text == "auto":
        return text
    try:
        int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gamma must be auto or int, got {text!r}") from None
    return _ranged(int, "--gamma", low=1)(text)


def _add_job_arguments(parser: argparse.ArgumentParser, kind) -> None:
    """The flags of translate/summarize (the CLI contract of issue 5)."""
    add = parser.add_argument
    add(
        "--input", required=True, help="text, TSV (source<TAB>reference), JSONL or seqio:TASK:SPLIT"
    )
    add("--output", required=True, help="output JSONL")
    add("--target", default=None, help=f"model config name or YAML path (default {DEFAULT_TARGET})")
    add("--draft", default=None, help=f"model config name or YAML path (default {DEFAULT_DRAFT})")
    add(
        "--gamma",
        type=_gamma,
        default="auto",
        help="drafted tokens per iteration, or auto: chosen per batch in 0..--gamma-max "
        "(0 = the target alone) from what the job measures, acceptance by position and "
        f"the calls' times (default auto; the best fixed γ measured is {DEFAULT_GAMMA})",
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
    add("--seed", type=int, default=0, help="job seed (with the record id it fixes every draw)")
    add("--batch-size", type=_ranged(int, "--batch-size", low=1), default=1)
    add("--workers", choices=("ray", "inprocess"), default="ray")
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
        help="ray: host the draft in the coordinator's actor (one call per iteration) "
        "or in its own actor (two calls)",
    )
    add(
        "--transport",
        choices=TRANSPORTS,
        default=DEFAULT_TRANSPORT,
        help="ray: the loop's per-iteration calls over a direct socket to each worker, "
        "or as Ray actor calls",
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
    add("--no-warmup", action="store_true", help="time the first batch of each shape too")
    add("--quiet", action="store_true", help="no progress lines")
    parser.set_defaults(func=functools.partial(_job, kind.name))


def _job(kind_name: str, args: argparse.Namespace) -> int:
    enable_compile_cache()  # before JAX is imported here or in the job's Ray workers
    from pipelines import job_report, translate

    job = translate.make_job(
        translate.KINDS[kind_name],
        input=args.input,
        output=args.output,
        target=args.target,
        draft=args.draft,
        gamma=args.gamma,
        gamma_max=args.gamma_max,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        max_input_tokens=args.max_input_tokens,
        workers=args.workers,
        compare_baseline=args.compare_baseline,
        dead_letter=args.dead_letter,
        vocab=args.vocab,
        allow_random_init=args.allow_random_init,
        limit=args.limit,
        ray_address=args.ray_address,
        draft_placement=args.draft_placement,
        transport=args.transport,
        tracking_uri=args.tracking_uri,
        summary_json=args.summary_json,
        beam_args=tuple(args.beam_args),
        warmup=not args.no_warmup,
        progress=not args.quiet,
    )
    print(f"specdec {kind_name}: {job.input} -> {job.output}", file=sys.stderr, flush=True)
    summary = translate.run_job(job)
    print(job_report.format_summary(job, summary))
    return job_exit_code(summary)


def job_exit_code(summary: dict) -> int:
    """EXIT_OK when every record came out, else EXIT_DEAD_LETTERS (with a stderr line)."""
    failed = summary["records_failed"]
    if not failed and summary["records_out"] == summary["records_in"]:
        return EXIT_OK
    reasons = ", ".join(f"{n} {reason}" for reason, n in summary["failed_by_reason"].items())
    total = summary["records_in"]
    what = f"all {total}" if summary["records_out"] == 0 else f"{failed} of {total}"
    print(
        f"specdec: error: {what} records went to the dead letters ({reasons}); "
        f"see {summary['dead_letter']}",
        file=sys.stderr,
    )
    return EXIT_DEAD_LETTERS


def _log_run(args: argparse.Namespace) -> int:
    """``specdec log-run``: the MLflow run of a job that ran without one."""
    from pipelines import job_report, tracking

    job_report.read_saved_run(args.summary_json)  # a bad summary: EXIT_CANNOT_START in main
    try:
        run_id = job_report.log_saved_run(args.summary_json, tracking_uri=args.tracking_uri)
    except Exception as error:  # MLflow still unavailable
        print(f"specdec: error: {tracking.describe_error(error)}", file=sys.stderr)
        return EXIT_FAILED
    print(run_id)
    print(f"logged MLflow run {run_id}; {args.summary_json} updated", file=sys.stderr)
    return EXIT_OK


def _exit_codes_epilog() -> str:
    return "Exit status: " + "; ".join(f"{code} {text}" for code, text in EXIT_CODES.items())


def ui_command(tracking_uri: str, port: int) -> list[str]:
    """``mlflow ui`` on 127.0.0.1 over ``tracking_uri`` (the venv's mlflow when present).

    One server process: with mlflow's default of 4, uvicorn's supervisor kills the
    workers that miss its health check on a loaded small machine, and nothing answers.
    """
    local = pathlib.Path(sys.executable).parent / "mlflow"
    executable = str(local) if local.exists() else "mlflow"
    return [executable, "ui", "--backend-store-uri", tracking_uri, "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1"]  # fmt: skip


def _ui(args: argparse.Namespace) -> int:
    """Prints the URL, then becomes ``mlflow ui`` (it starts in ~10 s; Ctrl-C stops it)."""
    from pipelines import tracking

    uri = args.tracking_uri or tracking.default_tracking_uri()
    command = ui_command(uri, args.port)
    print(f"MLflow UI for {uri}: http://127.0.0.1:{args.port}  (Ctrl-C stops it)", flush=True)
    if args.dry_run:
        print(" ".join(command))
        return 0
    os.execvp(command[0], command)  # the server replaces this process: signals reach it


PREPARE_CORPORA = ("ding", "debian", "summaries")
PREPARE_USAGE = """usage: specdec prepare [--corpus {ding,debian,summaries}] ARGS...

  --corpus ding    (default) the Ding dictionary splits: python -m pipelines.data.ding ARGS
  --corpus debian  the Debian En-De corpus (DDTP descriptions, gettext catalogs,
                   LibreOffice help, Firefox/Thunderbird language packs, plus the Ding
                   splits): python -m pipelines.data.debian.build ARGS; fetches the named
                   packages with apt-get download into runs/debian_cache (no install)
                   and writes assets/data/debian/<source>/{train,validation,test}.tsv.xz,
                   counts.json and LICENSE.md
  --corpus summaries  Debian package long description -> synopsis (Translation-en
                   and the Packages file, cached in runs/debian_cache/ddtp):
                   python -m pipelines.data.summaries ARGS; writes
                   assets/data/summaries/{train,validation,test}.tsv.xz, counts.json
                   and LICENSE.md

`specdec prepare --corpus debian --help` (or summaries) shows that corpus's ARGS.
"""


def _prepare(args: argparse.Namespace) -> int:
    """``specdec prepare [--corpus ding|debian|summaries] ARGS``: the chosen corpus's builder."""
    chooser = argparse.ArgumentParser(prog="specdec prepare", add_help=False)
    chooser.add_argument("--corpus", choices=PREPARE_CORPORA, default=None)
    try:
        known, rest = chooser.parse_known_args(args.passthrough_args)
    except SystemExit as exit_:  # a bad --corpus value: argparse has printed why
        return int(exit_.code or 0)
    if known.corpus is None and rest[:1] in (["-h"], ["--help"]):
        print(PREPARE_USAGE)
    try:
        if known.corpus == "debian":
            from pipelines.data.debian import build

            build.main(rest)
        elif known.corpus == "summaries":
            from pipelines.data import summaries

            summaries.main(rest)
        else:
            from pipelines.data import ding

            ding.main(rest)
    except SystemExit as exit_:  # its own argparse (--help, bad flags)
        return int(exit_.code or 0)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from pipelines import kd_data, study, translate, vocab
    from pipelines.train import cli as train_cli

    # Tools with add_arguments(parser) + run(args) (each also runs as python -m MODULE).
    tools = (
        ("train", train_cli, "train a model config, resumably (pipelines.train)"),
        ("vocab", vocab, "train the SentencePiece vocabulary (pipelines.vocab)"),
        ("kd-data", kd_data, "the teacher's translations as distillation data (pipelines.kd_data)"),
    )

    parser = argparse.ArgumentParser(prog="specdec", description="Speculative decoding jobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for kind in (translate.TRANSLATE, translate.SUMMARIZE):
        job = sub.add_parser(
            kind.name,
            help=f"the {kind.name} Beam job (speculative decoding)",
            epilog="Beam pipeline options go after a lone --, e.g. -- --runner=DataflowRunner "
            "(default: the in-process FnApiRunner). Models: a configs/models name, a model "
            "YAML path, or (with --allow-random-init) a registry preset[:key=value,...]. "
            "A killed job resumes when rerun with the same flags (finished records are kept "
            "in <output>.parts/). " + _exit_codes_epilog() + ".",
        )
        _add_job_arguments(job, kind)
    log_run = sub.add_parser(
        "log-run",
        help="log the MLflow run of a job that ran while MLflow was unavailable",
        description="Logs params, metrics and artifacts from a job's summary JSON (written "
        "with mlflow_run_id null and mlflow_pending when MLflow was unavailable) and its "
        "output, prints the new run id and writes it into the summary.",
    )
    log_run.add_argument("--summary-json", required=True, help="the job's summary JSON")
    log_run.add_argument(
        "--tracking-uri", default=None, help="MLflow store (default: the one the job tried)"
    )
    log_run.set_defaults(func=_log_run)
    ui = sub.add_parser("ui", help="MLflow UI on 127.0.0.1 over the jobs' store")
    ui.add_argument("--tracking-uri", default=None, help="default: the jobs' default store")
    ui.add_argument("--port", type=_ranged(int, "--port", low=1, high=65535), default=5000)
    ui.add_argument("--dry-run", action="store_true", help="print the command, do not start it")
    ui.set_defaults(func=_ui)
    prepare = sub.add_parser(
        "prepare",
        help="write the Ding En-De splits, or with --corpus debian|summaries a Debian corpus",
    )
    prepare.add_argument(
        "passthrough_args",
        nargs=argparse.REMAINDER,
        help="[--corpus ding|debian|summaries] and that builder's arguments",
    )
    prepare.set_defaults(func=_prepare)
    for name, module, help_text in tools:
        tool = sub.add_parser(name, help=help_text, description=module.__doc__.split("\n\n")[0])
        module.add_arguments(tool)
        tool.set_defaults(func=module.run)
    demo = sub.add_parser("demo", help="speculative vs target-only decoding on stub models")
    demo.add_argument("--gamma", type=int, default=4)
    demo.add_argument("--temperature", type=float, default=0.0)
    demo.add_argument("--top-k", type=int, default=0)
    demo.add_argument("--top-p", type=float, default=1.0)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--batch-size", type=int, default=1)
    demo.add_argument("--max-new-tokens", type=int, default=64)
    demo.add_argument("--target-layers", type=int, default=12)
    demo.add_argument("--summary-json", default=None)
    demo.set_defaults(func=_demo)
    study_parser = sub.add_parser("study", help="acceptance-rate study over a grid (Table 3)")
    study.add_arguments(study_parser)
    study_parser.set_defaults(func=study.command)
    return parser


def _split_beam_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[..., "--", beam options...]`` -> (specdec args, Beam pipeline options)."""
    if "--" in argv:
        at = argv.index("--")
        return argv[:at], argv[at + 1 :]
    return argv, []


def main(argv: list[str] | None = None) -> int:
    """Runs one subcommand; returns the exit status (2 for usage and input errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
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
        print(f"specdec: error: {err}", file=sys.stderr)
        return EXIT_CANNOT_START
    except (PartitionError, JobFailed) as err:  # loud, and not a usage error
        if os.environ.get("SPECDEC_DEBUG"):
            raise
        print(f"specdec: error: {err}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
