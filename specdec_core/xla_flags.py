"""The XLA flags behind a row's same bits at any batch size, set before JAX starts its
CPU backend.

XLA hands a reduction and the elementwise work around it (a softmax's max and exp) to
YNNPACK, whose fused kernels give some elements another last bit depending on the
array's shape: a row's attention weights in the encoder then changed with the number
of rows beside it, and so did its translation (BENCHMARKS.md, "Same bits for every
call"). Without YNNPACK's reduce fusions XLA's own loops compute every element the
same way whatever the shape. Its matmul fusions stay (``layers.Bfloat16Weight`` pads
their rows for the same reason).

XLA reads ``XLA_FLAGS`` once, when a process first runs a computation, so
:func:`ensure` runs when :mod:`specdec_core` is imported; processes that the job starts
(Ray's workers, Beam's) inherit the environment and import it too.
"""

from __future__ import annotations

import os

ROW_INVARIANT_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=-reduce",)


def with_flags(current: str, flags=ROW_INVARIANT_FLAGS) -> str:
    """``current`` (an ``XLA_FLAGS`` value) with each of ``flags`` whose name it does
    not set already appended: a user's own setting of a flag wins."""
    named = {item.split("=", 1)[0] for item in current.split()}
    missing = [flag for flag in flags if flag.split("=", 1)[0] not in named]
    return " ".join([*current.split(), *missing])


def ensure() -> None:
    """Puts :data:`ROW_INVARIANT_FLAGS` into ``XLA_FLAGS`` (see :func:`with_flags`)."""
    os.environ["XLA_FLAGS"] = with_flags(os.environ.get("XLA_FLAGS", ""))
