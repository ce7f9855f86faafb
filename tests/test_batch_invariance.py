"""A record's translation does not depend on its batch: the shipped target's logits for
a sentence are the same bits alone and beside the other sentences a job batches with it
(one length bucket, sources of different lengths, padding rows), fed one token per call
or many, in caches of other lengths (``tests/shipped_rows.py``: every bucket of the
sample, and sixteen test-split sentences of one bucket whose first got other encoder
bits beside the others until ``specdec_core.xla_flags`` took YNNPACK's reduce fusions
off). Greedy output, and a seeded sample under ``--sampling invariant``, are then the
same at any batch size.

It runs in a fresh process compiled as a job compiles: XLA picks its CPU kernels per
program, and the rest of the suite compiles with optimisation off (``tests/conftest.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipelines.cli import REPO_ROOT
from tests.conftest import TEST_XLA_FLAGS


@pytest.mark.slow
def test_a_rows_logits_are_its_own_beside_any_rows_of_its_bucket(tmp_path):
    flags = os.environ.get("XLA_FLAGS", "").replace(TEST_XLA_FLAGS, "").strip()
    env = {**os.environ, "XLA_FLAGS": flags, "SPECDEC_COMPILE_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "tests.shipped_rows"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("row of")]
    assert len(lines) >= 9, done.stdout + done.stderr[-3000:]
    assert done.returncode == 0 and all(line.endswith(": same") for line in lines), done.stdout


def test_importing_the_core_puts_the_row_invariant_flags_in_xla_flags():
    import specdec_core  # noqa: F401  (the import is what sets them)
    from specdec_core import xla_flags

    current = os.environ["XLA_FLAGS"].split()
    assert all(flag in current for flag in xla_flags.ROW_INVARIANT_FLAGS)
    # appended to a user's flags, never in place of their own setting of the same flag
    name = xla_flags.ROW_INVARIANT_FLAGS[0].split("=")[0]
    assert xla_flags.with_flags("--a=1").split() == ["--a=1", *xla_flags.ROW_INVARIANT_FLAGS]
    assert xla_flags.with_flags(f"--a=1 {name}=+dot") == f"--a=1 {name}=+dot"
    assert xla_flags.with_flags(xla_flags.with_flags("")) == xla_flags.with_flags("")
