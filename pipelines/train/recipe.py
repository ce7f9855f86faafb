"""Training recipes: several ``specdec train`` stages in one call, packed to bring back.

``specdec train-recipe run configs/recipes/debian_pair.yaml`` trains every stage of a
recipe (a YAML list of model configs, each with a time budget or a step count, ``--set``
overrides and
the stages it comes ``after``). A stage starts as soon as the stages it comes after
have finished, so independent chains share the machine (a lent accelerator runs the
target and the summarizer draft side by side). A stage whose prerequisite failed is
skipped, named, and the exit status says so. Then the exports of the finished stages
(smallest first) and the stage logs go into one tar, split into parts of at most
``part_bytes`` (a machine that returns files of at most 16 MiB), with a manifest of
SHA-256 sums. ``--return-dir DIR --return-parts N`` copies the manifest and the first
N parts there; the rest wait in the recipe's folder for the next call.

``specdec train-recipe unpack DIR [DIR ...]`` finds the manifest and the parts in the
folders, checks every sum, joins them and extracts the exports at their repository
paths (only plain files and folders below ``--root``).

Recipe schema::

    part_bytes: 16700000            # optional
    stages:
      - config: configs/models/NAME.yaml
        budget_s: 300               # --time-budget (loading and compiling included)
        # or steps: 2000            # --max-steps instead (one of budget_s and steps)
        after: [OTHER_NAME]         # optional: stage names (their configs' ``name``)
        set: [train.tokens_per_batch=65536, ...]   # optional --set overrides
        resume: true                # optional: continue a train dir / export if present
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time
import typing
from collections.abc import Sequence

import yaml

from pipelines import configs
from pipelines.arguments import add_overrides, add_ranged

DESCRIPTION = "Train a recipe's stages (configs/recipes/*.yaml) and pack their exports."
DEFAULT_PART_BYTES = 16_700_000  # under the 16 MiB a lent machine returns per file
MIN_BUDGET_S = 30.0  # a stage the deadline leaves less than this is skipped
MANIFEST = "manifest.json"
STAGE_KEYS = ("config", "budget_s", "steps", "after", "set", "resume")


class RecipeError(ValueError):
    """A recipe file is malformed, or its parts do not join: says what and where."""


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str  # the model config's name
    config: str
    budget_s: float | None  # a time budget, or None where the stage trains ``steps``
    export_dir: pathlib.Path  # where the config (with the overrides) exports
    after: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    resume: bool = True
    steps: int | None = None


@dataclasses.dataclass(frozen=True)
class Recipe:
    path: str
    stages: tuple[Stage, ...]
    part_bytes: int = DEFAULT_PART_BYTES


def load_recipe(path: str | pathlib.Path, extra_overrides: Sequence[str] = ()) -> Recipe:
    """Parses and checks a recipe: known keys, configs that load, known ``after`` names."""
    path = configs.resolve(path)
    if not path.is_file():
        raise RecipeError(f"recipe not found: {path}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(raw, dict) or not isinstance(raw.get("stages"), list) or not raw["stages"]:
        raise RecipeError(f"{path}: needs a non-empty list `stages`")
    unknown = sorted(set(raw) - {"stages", "part_bytes"})
    if unknown:
        raise RecipeError(f"{path}: unknown key {unknown[0]} (known: part_bytes, stages)")
    stages: list[Stage] = []
    for number, entry in enumerate(raw["stages"], 1):
        where = f"{path}: stage {number}"
        if not isinstance(entry, dict) or "config" not in entry:
            raise RecipeError(f"{where}: needs `config` and one of `budget_s` and `steps`")
        if ("budget_s" in entry) == ("steps" in entry):
            raise RecipeError(f"{where}: needs one of `budget_s` and `steps`, not both")
        bad = sorted(set(entry) - set(STAGE_KEYS))
        if bad:
            raise RecipeError(f"{where}: unknown key {bad[0]} (known: {', '.join(STAGE_KEYS)})")
        overrides = (*[str(x) for x in entry.get("set") or ()], *extra_overrides)
        try:
            model_file = configs.load_model_config(entry["config"], overrides)
        except configs.ConfigError as error:
            raise RecipeError(f"{where}: {error}") from None
        budget, steps = entry.get("budget_s"), entry.get("steps")
        if budget is not None and (
            not isinstance(budget, int | float) or isinstance(budget, bool) or budget <= 0
        ):
            raise RecipeError(f"{where}: budget_s must be a positive number, got {budget!r}")
        if "steps" in entry and (
            not isinstance(steps, int) or isinstance(steps, bool) or steps < 1
        ):
            raise RecipeError(f"{where}: steps must be a positive integer, got {steps!r}")
        after = tuple(str(x) for x in entry.get("after") or ())
        known = {s.name for s in stages}
        missing = [name for name in after if name not in known]
        if missing:
            raise RecipeError(f"{where}: after {missing[0]!r} names no earlier stage")
        if model_file.name in known:
            raise RecipeError(f"{where}: a second stage trains {model_file.name!r}")
        stages.append(
            Stage(
                name=model_file.name,
                config=entry["config"],
                budget_s=None if budget is None else float(budget),
                steps=steps,
                export_dir=model_file.export_dir,
                after=after,
                overrides=overrides,
                resume=bool(entry.get("resume", True)),
            )
        )
    part_bytes = raw.get("part_bytes", DEFAULT_PART_BYTES)
    if not isinstance(part_bytes, int) or part_bytes < 1024:
        raise RecipeError(f"{path}: part_bytes must be an integer >= 1024, got {part_bytes!r}")
    return Recipe(path=str(path), stages=tuple(stages), part_bytes=part_bytes)


def stage_command(
    stage: Stage, *, python: str, budget_s: float | None, tracking_uri: str | None = None
) -> list[str]:
    """The ``specdec train`` command line of one stage, training for ``budget_s`` seconds
    (:func:`run_stages` scales and cuts the stage's own budget), or for the stage's
    ``steps`` where ``budget_s`` is None."""
    command = [python, "-m", "pipelines.train", "--config", stage.config]
    if tracking_uri:
        command += ["--tracking-uri", tracking_uri]
    if budget_s is None:
        command += ["--max-steps", str(stage.steps)]
    else:
        command += ["--time-budget", f"{max(budget_s, 1.0):g}"]
    if stage.resume:
        command.append("--resume")
    for override in stage.overrides:
        command += ["--set", override]
    return command


@dataclasses.dataclass
class StageRun:
    stage: Stage
    status: str = "waiting"  # waiting | running | done | failed | skipped
    process: subprocess.Popen | None = None
    started: float = 0.0
    seconds: float = 0.0
    reason: str = ""
    log: typing.IO | None = None  # the stage's log file while it runs


def run_stages(
    recipe: Recipe,
    *,
    out_dir: pathlib.Path,
    scale: float,
    python: str,
    tracking_uri: str | None = None,
    poll_s: float = 1.0,
    deadline_s: float | None = None,
    reserve_s: float = 45.0,
) -> list[StageRun]:
    """Runs the stages (each when its ``after`` stages are done); returns their outcomes.

    ``deadline_s`` (seconds from now): a stage's budget is cut so that it ends
    ``reserve_s`` before the deadline (its last evaluation and export come after its
    budget); a stage left with less than ``MIN_BUDGET_S`` is skipped, named; a stage
    still running ``reserve_s`` after the deadline is stopped (SIGTERM: it saves and
    exports what it has). So the parts are packed before a lent machine's call ends.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {s.name: StageRun(s) for s in recipe.stages}
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    start = time.time()
    try:
        while any(r.status in ("waiting", "running") for r in runs.values()):
            for run in runs.values():
                if run.status == "running" and run.process.poll() is not None:
                    run.seconds = time.time() - run.started
                    code = run.process.returncode
                    run.status = "done" if code == 0 else "failed"
                    run.reason = "" if code == 0 else f"exit status {code}"
                    run.log.close()
                    print(
                        f"[{time.time() - start:6.0f}s] {run.stage.name}: {run.status} "
                        f"after {run.seconds:.0f}s {run.reason}".rstrip(),
                        flush=True,
                    )
                if run.status != "waiting":
                    continue
                before = [runs[name] for name in run.stage.after]
                blocked = [b.stage.name for b in before if b.status in ("failed", "skipped")]
                if blocked:
                    run.status, run.reason = "skipped", f"{blocked[0]} did not finish"
                    print(f"{run.stage.name}: skipped ({run.reason})", flush=True)
                elif all(b.status == "done" for b in before):
                    budget = None if run.stage.budget_s is None else run.stage.budget_s * scale
                    if deadline_s is not None:
                        left = deadline_s - (time.time() - start) - reserve_s
                        if left < min(budget or MIN_BUDGET_S, MIN_BUDGET_S):
                            run.status = "skipped"
                            run.reason = f"the deadline leaves {max(left, 0):.0f}s"
                            print(f"{run.stage.name}: skipped ({run.reason})", flush=True)
                            continue
                        if budget is not None:  # a steps stage is stopped at the deadline
                            budget = min(budget, float(int(left)))
                    command = stage_command(
                        run.stage, python=python, budget_s=budget, tracking_uri=tracking_uri
                    )
                    run.log = open(out_dir / f"{run.stage.name}.log", "w")
                    print(f"[{time.time() - start:6.0f}s] {run.stage.name}: {' '.join(command)}")
                    run.process = subprocess.Popen(
                        command,
                        cwd=configs.REPO_ROOT,
                        env=env,
                        stdout=run.log,
                        stderr=subprocess.STDOUT,
                    )
                    run.status, run.started = "running", time.time()
            late = deadline_s is not None and time.time() - start > deadline_s + reserve_s
            for run in runs.values():
                if late and run.status == "running" and not run.reason:
                    run.reason = "stopped at the deadline"
                    print(f"{run.stage.name}: {run.reason}", flush=True)
                    run.process.terminate()
            sys.stdout.flush()
            time.sleep(poll_s)
    finally:
        for run in runs.values():
            if run.status == "running":
                run.process.terminate()
                run.process.wait()
                run.log.close()
    return list(runs.values())


def _arcname(path: pathlib.Path) -> str:
    """The path inside the tar: repository-relative where it is under the repository."""
    path = path.resolve()
    root = configs.REPO_ROOT.resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path).lstrip("/")


def _folder_bytes(folder: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def pack(runs: Sequence[StageRun], *, out_dir: pathlib.Path, part_bytes: int) -> dict:
    """Tars the finished stages' exports (smallest first) and the logs; splits the tar into
    parts; writes and returns the manifest."""
    parts_dir = out_dir / "parts"
    shutil.rmtree(parts_dir, ignore_errors=True)
    parts_dir.mkdir(parents=True)
    stages = []
    exports = []
    for run in runs:
        export = run.stage.export_dir
        info_path = export / "training.json"
        info = json.loads(info_path.read_text()) if info_path.is_file() else {}
        stages.append(
            {
                "name": run.stage.name,
                "status": run.status,
                "reason": run.reason,
                "seconds": round(run.seconds, 1),
                "step": info.get("step"),
                "validation": info.get("validation"),
                "export": _arcname(export),
            }
        )
        if run.status == "done" and info:
            exports.append(export)
    tar_path = out_dir / "models.tar"
    with tarfile.open(tar_path, "w") as tar:
        for export in sorted(exports, key=_folder_bytes):
            tar.add(export, arcname=_arcname(export))
        for run in runs:
            log = out_dir / f"{run.stage.name}.log"
            if log.is_file():
                tar.add(log, arcname=_arcname(log))
    parts = []
    whole = hashlib.sha256()  # the tar's sum, from the same reads as the parts'
    with open(tar_path, "rb") as handle:
        while chunk := handle.read(part_bytes):
            part = parts_dir / f"models.tar.part{len(parts):02d}"
            part.write_bytes(chunk)
            whole.update(chunk)
            sha256 = hashlib.sha256(chunk).hexdigest()
            parts.append({"name": part.name, "bytes": len(chunk), "sha256": sha256})
    manifest = {
        "tar_sha256": whole.hexdigest(),
        "tar_bytes": tar_path.stat().st_size,
        "parts": parts,
        "stages": stages,
    }
    (parts_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    tar_path.unlink()
    return manifest


def unpack(folders: Sequence[pathlib.Path], *, root: pathlib.Path) -> list[str]:
    """Joins the parts found in ``folders`` (sums checked), extracts below ``root``;
    returns the extracted member names. RecipeError names a missing or corrupt part."""
    manifests = [f / MANIFEST for f in folders if (f / MANIFEST).is_file()]
    if not manifests:
        raise RecipeError(f"no {MANIFEST} in {', '.join(map(str, folders))}")
    manifest = json.loads(manifests[0].read_text())
    root.mkdir(parents=True, exist_ok=True)
    joined = root / ".models.tar.partial"
    whole = hashlib.sha256()
    try:
        with open(joined, "wb") as out:
            for part in manifest["parts"]:
                found = [f / part["name"] for f in folders if (f / part["name"]).is_file()]
                if not found:
                    raise RecipeError(f"part {part['name']} is in none of the folders given")
                data = found[0].read_bytes()
                if hashlib.sha256(data).hexdigest() != part["sha256"]:
                    raise RecipeError(f"{found[0]}: SHA-256 differs from the manifest's")
                out.write(data)
                whole.update(data)
        if whole.hexdigest() != manifest["tar_sha256"]:
            raise RecipeError("the joined tar's SHA-256 differs from the manifest's")
        with tarfile.open(joined) as tar:
            names = tar.getnames()
            tar.extractall(root, filter="data")
    finally:
        joined.unlink(missing_ok=True)
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="recipe_command", required=True)
    run = sub.add_parser("run", help="train a recipe's stages and pack their exports")
    run.add_argument("recipe", help="configs/recipes/<name>.yaml")
    run.add_argument("--out", default=None, help="folder for logs and parts (runs/recipe/NAME)")
    scale_help = "multiply every stage's time budget (e.g. a CPU smoke run; steps stay)"
    add_ranged(run, "--scale", float, low=0.0, low_open=True, default=1.0, help=scale_help)
    add_overrides(run, "an override for every stage, after the recipe's own")
    run.add_argument("--return-dir", default=None, help="copy the manifest and parts here")
    parts_help = "with --return-dir: only the first N parts (the rest wait in OUT/parts)"
    add_ranged(run, "--return-parts", int, low=0, help=parts_help)
    deadline_help = (
        "seconds from now by which every stage has ended (budgets are cut to fit; "
        "a lent machine's call limit minus the packing)"
    )
    add_ranged(run, "--deadline", float, low=0.0, low_open=True, help=deadline_help)
    run.add_argument("--python", default=sys.executable, help="the interpreter of the stages")
    run.add_argument("--tracking-uri", default=None, help="MLflow URI of the stages' train runs")
    unpack_parser = sub.add_parser("unpack", help="join and extract returned parts")
    unpack_parser.add_argument("folders", nargs="+", help="folders holding the manifest and parts")
    unpack_parser.add_argument(
        "--root", default=str(configs.REPO_ROOT), help="extract below this folder"
    )


def run(args: argparse.Namespace) -> int:
    """Runs ``specdec train-recipe run|unpack``; returns the exit status."""
    if args.recipe_command == "unpack":
        names = unpack([pathlib.Path(f) for f in args.folders], root=pathlib.Path(args.root))
        folders = sorted({"/".join(n.split("/")[:3]) for n in names})
        print(f"extracted {len(names)} files below {args.root}: {', '.join(folders)}")
        return 0
    recipe = load_recipe(args.recipe, args.overrides)
    out_dir = pathlib.Path(args.out or f"runs/recipe/{pathlib.Path(recipe.path).stem}")
    out_dir = out_dir if out_dir.is_absolute() else configs.REPO_ROOT / out_dir
    runs = run_stages(
        recipe,
        out_dir=out_dir,
        scale=args.scale,
        python=args.python,
        tracking_uri=args.tracking_uri,
        deadline_s=args.deadline,
    )
    for stage_run in runs:  # the end of each log: final eval, checkpoint, errors
        log = out_dir / f"{stage_run.stage.name}.log"
        if log.is_file():
            tail = log.read_text(errors="replace").splitlines()[-12:]
            print(f"--- {stage_run.stage.name} ({stage_run.status}) ---", *tail, sep="\n")
    manifest = pack(runs, out_dir=out_dir, part_bytes=recipe.part_bytes)
    print(json.dumps({"stages": manifest["stages"], "parts": len(manifest["parts"])}, indent=1))
    if args.return_dir:
        target = pathlib.Path(args.return_dir)
        target.mkdir(parents=True, exist_ok=True)
        parts = manifest["parts"][: args.return_parts]
        for name in [MANIFEST, *(p["name"] for p in parts)]:
            shutil.copy2(out_dir / "parts" / name, target / name)
        rest = [p["name"] for p in manifest["parts"][len(parts) :]]
        if rest:
            print(f"not returned yet ({len(rest)} parts): {out_dir / 'parts'}: {' '.join(rest)}")
    failed = [r.stage.name for r in runs if r.status != "done"]
    if failed:
        print(f"stages not finished: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pipelines.train.recipe ARGS`` (no ``specdec`` entry point needed)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.train.recipe", description=DESCRIPTION
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (RecipeError, configs.ConfigError) as error:
        raise SystemExit(f"{parser.prog}: error: {error}") from None


if __name__ == "__main__":
    sys.exit(main())
