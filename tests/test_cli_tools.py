"""One CLI style: every ``specdec`` subcommand but the jobs (translate, summarize) is a
module's ``add_arguments`` + ``run``. The tools ``specdec train``, ``specdec vocab`` and
``specdec kd-data`` answer ``--help`` and reject bad flags with exit status 2 and a line
that names the flag, before doing any work; the ``python -m`` forms take the same
flags. The Makefile calls the ``specdec`` forms."""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

import pytest

from pipelines import cli, kd_data, vocab
from pipelines.train import cli as train_cli
from pipelines.train import recipe

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOLS = {"train": train_cli, "vocab": vocab, "kd-data": kd_data, "train-recipe": recipe}


@pytest.mark.parametrize(
    "name,flags",
    [
        ("train", ["--config", "--resume", "--max-steps", "--evaluate", "--sentences"]),
        ("vocab", ["--corpus", "--vocab-size", "--sample-sentences", "--measure"]),
        ("kd-data", ["--teacher-config", "--output", "--temperatures", "--batch-size"]),
    ],
)
def test_help_lists_the_tool_flags(name, flags, capsys):
    assert cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: specdec {name} ")
    for flag in flags:
        assert flag in out


def test_every_subcommand_is_a_modules_add_arguments_plus_run():
    from pipelines import demo, log_run, prepare, study, ui

    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    modules = {**TOOLS, "log-run": log_run, "ui": ui, "prepare": prepare, "demo": demo}
    assert set(subcommands.choices) == {*modules, "study", "translate", "summarize"}
    for name, module in {**modules, "study": study}.items():
        sub = subcommands.choices[name]
        assert sub.get_default("func") is (study.command if name == "study" else module.run)
        own = argparse.ArgumentParser(prog=f"specdec {name}")
        module.add_arguments(own)
        assert {a.dest for a in own._actions} == {a.dest for a in sub._actions}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train"], "the following arguments are required: --config"),
        (["train", "--config", "x.yaml", "--max-steps", "many"], "--max-steps must be int"),
        (["train", "--config", "x.yaml", "--max-steps", "0"], "--max-steps must be >= 1, got 0"),
        (["train", "--config", "x.yaml", "--epochs", "3"], "unrecognized arguments: --epochs"),
        (["vocab", "--corpus", "wiki"], "argument --corpus: invalid choice: 'wiki'"),
        (["vocab", "--vocab-size", "-8"], "--vocab-size must be >= 1, got -8"),
        (["kd-data", "--output", "o"], "the following arguments are required: --teacher-config"),
        (["kd-data", "--teacher-config", "t.yaml", "--output", "o", "--inputs", "x"], "--inputs"),
        (["demo", "--gamma", "0"], "--gamma must be >= 1, got 0"),
        (["demo", "--top-p", "0"], "--top-p must be > 0.0, got 0"),
        (["ui", "--port", "70000"], "--port must be <= 65535, got 70000"),
        (["log-run"], "the following arguments are required: --summary-json"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(argv, message, capsys):
    assert cli.main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    # the subcommand's parser reports its own flags; the top parser unknown ones
    assert last.startswith(("specdec: error:", f"specdec {argv[0]}: error:")) and message in last


def test_flags_that_do_not_go_together_exit_2_before_any_work(tmp_path, capsys):
    config = REPO_ROOT / "configs" / "models" / "ende_target_debian.yaml"
    assert cli.main(["train", "--config", str(config), "--sentences", "3"]) == 2
    assert (
        "specdec: error: --sentences only applies with --evaluate SPLIT" in capsys.readouterr().err
    )
    assert cli.main(["train", "--config", str(tmp_path / "none.yaml")]) == 2
    assert f"config file not found: {tmp_path / 'none.yaml'}" in capsys.readouterr().err
    assert cli.main(["vocab", "--measure", "8000", "--output", str(tmp_path / "v.model")]) == 2
    assert "--measure and --compare only apply with --corpus debian" in capsys.readouterr().err
    output = tmp_path / "kd"
    argv = ["kd-data", "--teacher-config", str(config), "--output", str(output)]
    assert cli.main([*argv, "--temperatures", "zero"]) == 2
    assert "--temperatures must be comma-separated numbers" in capsys.readouterr().err
    assert cli.main([*argv, "--batch-size", "0"]) == 2
    assert "--batch-size and --max-new-tokens >= 1" in capsys.readouterr().err
    assert not output.exists() and not (tmp_path / "v.model").exists()


def test_the_recorded_command_is_the_one_that_was_run():
    for prog in ("specdec train", "python -m pipelines.train"):
        parser = argparse.ArgumentParser(prog=prog)
        train_cli.add_arguments(parser)
        args = parser.parse_args(["--resume", "--config", "c.yaml", "--max-steps", "7"])
        assert train_cli.command_line(args) == f"{prog} --config c.yaml --resume --max-steps 7"


def test_python_m_forms_take_the_same_flags():
    for module, flag in (("pipelines.train", "--evaluate"), ("pipelines.vocab", "--corpus")):
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"usage: python -m {module} ") and flag in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.train", "--config", "c.yaml", "--max-steps", "x"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "--max-steps must be int, got 'x'" in done.stderr


def test_the_makefile_calls_the_specdec_forms():
    makefile = (REPO_ROOT / "Makefile").read_text()
    for tool in ("pipelines.train", "pipelines.vocab", "pipelines.kd_data"):
        assert f"-m {tool}" not in makefile
    train = "$(BIN)/specdec train --config configs/models/ende_target_debian.yaml --resume"
    assert train in makefile
    assert "$(BIN)/specdec vocab --corpus debian" in makefile
    assert "RECIPE ?= $(BIN)/specdec train-recipe" in makefile
    assert "$(BIN)/specdec train-recipe unpack" in makefile


@pytest.mark.slow  # compiles both decoding loops
def test_demo_runs_both_ways_and_greedy_output_is_the_targets(tmp_path, capsys):
    summary_path = tmp_path / "demo.json"
    argv = ["demo", "--gamma", "3", "--batch-size", "2", "--max-new-tokens", "12"]
    assert cli.main([*argv, "--target-layers", "1", "--summary-json", str(summary_path)]) == 0
    summary = json.loads(summary_path.read_text())
    assert summary["identical_to_baseline"] is True  # greedy: token for token the target's
    assert 0.0 <= summary["alpha"] <= 1.0
    assert 1.0 <= summary["mean_accepted_length"] <= 3 + 1
    assert summary["tokens_per_s"] > 0 and summary["baseline_tokens_per_s"] > 0
    assert "identical_to_baseline" in capsys.readouterr().out
