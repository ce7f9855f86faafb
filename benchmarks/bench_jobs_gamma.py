"""The jobs as users run them: ``--gamma auto`` against fixed γ, each job's speedup over
the target alone measured inside the job.

Every job is a ``specdec translate`` / ``specdec summarize`` process on a shipped
sample with ``--compare-baseline``: each batch is decoded speculatively and then by the
target alone, one after the other in the same process, so the job's ``speedup``
(speculative tokens/s over the target's) is a ratio measured in one run. The jobs run
one at a time, in rounds (every job once per round, in the same order), so load that
drifts over minutes touches all of them. The table gives each job's median speedup over
the rounds and its range, α, the batches at each γ (auto) and whether every output was
the target's own (T=0).

Jobs (``--jobs`` picks some):

- ``translate``: the Debian pair (``ende_target_debian`` + ``--draft``, by default
  make run's ``ende_draft_debian_seq2``) on ``assets/samples/en_de_debian_sample.tsv`` =
  ``make run``, through Ray and in-process, γ auto and γ = 1, 2, 3 (the sweep the auto
  choice is compared with; γ = 1 through Ray too, for Ray against in-process), and
  through Ray with the draft in the target's actor (``--draft-placement target``, make
  run's), auto and γ = 1;
- ``summarize``: the summarizer pair (``summ_target`` + ``summ_draft``) on
  ``assets/data/summaries/test_sample.jsonl``, and with the copy draft, γ auto.

Usage (BENCHMARKS.md "Automatic γ" gives the command run)::

    .venv/bin/python benchmarks/bench_jobs_gamma.py [--rounds 2] [--jobs translate,summarize]
        [--json runs/bench/jobs_gamma.json] [--draft NAME[,NAME...]] [--batch-size N]
        [--names "translate inprocess γ=2,..."]

With several drafts, every translate job runs once per draft, one after the other in
each round, so the drafts are compared in one run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
INPROCESS = ("--workers", "inprocess")
RAY = ("--workers", "ray")
IN_TARGET = ("--draft-placement", "target")  # make run's: the loop compiled in the target's actor
DEFAULT_DRAFT = "ende_draft_debian_seq2"  # make run's draft


def translate_args(draft: str) -> tuple[str, ...]:
    return (
        "translate",
        "--input", "assets/samples/en_de_debian_sample.tsv",
        "--target", "ende_target_debian", "--draft", draft,
    )  # fmt: skip


SUMMARIZE = (
    "summarize",
    "--input", "assets/data/summaries/test_sample.jsonl",
    "--target", "summ_target",
)  # fmt: skip


def jobs(translate_draft: str = DEFAULT_DRAFT) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Job name -> (group, arguments)."""
    translate = translate_args(translate_draft)
    return {
        "translate ray auto": ("translate", (*translate, *RAY)),
        "translate inprocess auto": ("translate", (*translate, *INPROCESS)),
        "translate ray γ=1": ("translate", (*translate, *RAY, "--gamma", "1")),
        "translate ray-in-target auto": ("translate", (*translate, *RAY, *IN_TARGET)),
        "translate ray-in-target γ=1": (
            "translate", (*translate, *RAY, *IN_TARGET, "--gamma", "1")
        ),
        "translate inprocess γ=1": ("translate", (*translate, *INPROCESS, "--gamma", "1")),
        "translate inprocess γ=2": ("translate", (*translate, *INPROCESS, "--gamma", "2")),
        "translate inprocess γ=3": ("translate", (*translate, *INPROCESS, "--gamma", "3")),
        "summarize ray auto": ("summarize", (*SUMMARIZE, "--draft", "summ_draft", *RAY)),
        "summarize ray auto, copy": ("summarize", (*SUMMARIZE, "--draft", "copy", *RAY)),
    }  # fmt: skip


def run_job(name: str, args: tuple[str, ...], folder: pathlib.Path) -> dict:
    """One job as a process; its summary JSON."""
    stem = folder / name.replace(" ", "_").replace(",", "").replace("=", "")
    command = [
        str(REPO / ".venv" / "bin" / "specdec"), *args,
        "--output", f"{stem}.jsonl", "--summary-json", f"{stem}.summary.json",
        "--compare-baseline", "--quiet", "--tracking-uri", f"sqlite:///{folder}/mlflow.db",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    summary = json.loads(pathlib.Path(f"{stem}.summary.json").read_text())
    summary["process_s"] = time.perf_counter() - start
    pathlib.Path(f"{stem}.jsonl").unlink()
    return summary


def _median_cell(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs if r.get(key) is not None]
    return f"{statistics.median(values):.3f} | " if values else "— | "


def table(results: dict[str, list[dict]]) -> str:
    lines = [
        "| job | speedup (median) | range | predicted (costs) | measured / predicted | α (ML) "
        "| c (est.) | c in the loop | batches at γ | identical | job s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        speedups = [r["speedup"] for r in runs]
        histogram = runs[-1].get("gamma_histogram") or {}
        lines.append(
            f"| {name} | {statistics.median(speedups):.3f} | "
            f"{min(speedups):.3f}–{max(speedups):.3f} | "
            + _median_cell(runs, "predicted_speedup")
            + _median_cell(runs, "efficiency")
            + _median_cell(runs, "alpha")  # none where auto never left γ = 0
            + (f"{c:.3f} | " if (c := runs[-1].get("c_estimate")) is not None else "— | ")
            + _median_cell(runs, "draft_c_loop")
            + (", ".join(f"γ={g}: {n}" for g, n in histogram.items()) or "—")
            + f" | {all(r['identical_to_baseline'] for r in runs)} | "
            f"{statistics.median(r['process_s'] for r in runs):.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", default="translate,summarize", help="groups to run")
    parser.add_argument("--json", default=None, help="write every run's summary here")
    parser.add_argument(
        "--draft", default=DEFAULT_DRAFT, help="the translate jobs' draft (A,B: each job with each)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="every job's --batch-size")
    parser.add_argument(
        "--names", default="", help="only these jobs (comma-separated names, as in the table)"
    )
    args = parser.parse_args(argv)
    groups = set(args.jobs.split(","))
    drafts = [d for d in args.draft.split(",") if d]
    known = jobs(drafts[0])
    unknown = groups - {group for group, _ in known.values()}
    if unknown:
        parser.error(f"unknown job group(s): {', '.join(sorted(unknown))}")
    names = [n.strip() for n in args.names.split(",") if n.strip()]
    if missing := [n for n in names if n not in known]:
        parser.error(f"unknown job name(s): {', '.join(missing)}")
    batch = ("--batch-size", str(args.batch_size))
    chosen = {}
    for name, (group, job) in known.items():
        if group not in groups or (names and name not in names):
            continue
        if group != "translate" or len(drafts) == 1:
            chosen[name] = (*job, *batch)
            continue
        for draft in drafts:  # each job once per draft, side by side in every round
            chosen[f"{name} [{draft}]"] = (*jobs(draft)[name][1], *batch)
    results: dict[str, list[dict]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as folder:
        for round_ in range(1, args.rounds + 1):
            for name, job in chosen.items():
                summary = run_job(name, job, pathlib.Path(folder))
                results[name].append(summary)
                print(
                    f"round {round_}: {name}: {summary['speedup']:.3f}x "
                    f"({summary['process_s']:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    if args.json:
        pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    print(table(results))


if __name__ == "__main__":
    main()
