"""Which of XLA's CPU kernels change a row's result with the shape around it, on this
machine: the facts behind ``layers.MIN_MATMUL_ROWS`` and ``layers.ordered_sum``
(BENCHMARKS.md, "Same bits for every call"). Each check compares a row computed in a
small call with the same row in a larger one and lists the sizes where the bits differ.

- a bfloat16 matmul (float32 sums) on M rows against 2,048 rows, M = 1..69 and larger;
- a plain float32 ``sum`` over a softmax-sized row (8 heads, 128 slots) at Q queries,
  against 2 queries, and ``layers.ordered_sum`` the same way;
- the attention ``q·k`` product of an 18-token row zero-padded to other widths.

Usage::

    .venv/bin/python benchmarks/probe_kernel_orders.py
"""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from specdec_core.models import layers


def matmul_rows() -> list[int]:
    """Row counts M whose rows differ from a 2,048-row call's (K = N = 512)."""
    rng = np.random.default_rng(0)
    dot = jax.jit(
        lambda a, b: jax.lax.dot_general(
            a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
        )
    )
    weight = jnp.asarray(rng.standard_normal((512, 512)), jnp.bfloat16)
    rows = jnp.asarray(rng.standard_normal((2048, 512)), jnp.bfloat16)
    reference = np.asarray(dot(rows, weight))
    sizes = [*range(1, 70), 100, 128, 256, 512, 1000]
    return [
        m for m in sizes if not np.array_equal(np.asarray(dot(rows[:m], weight)), reference[:m])
    ]


def reduce_queries(total) -> list[int]:
    """Query counts Q at which rows 0-1 of ``total`` over [1, 8, Q, 128] differ from Q = 2."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, 8, 32, 128)) * 5, jnp.float32)
    f = jax.jit(total)
    two = np.asarray(f(x[:, :, :2]))
    return [
        q for q in range(2, 33) if not np.array_equal(np.asarray(f(x[:, :, :q]))[:, :, :2], two)
    ]


def qk_widths() -> list[int]:
    """Padded widths at which an 18-token row's q·k logits differ from width 18's."""
    rng = np.random.default_rng(0)
    qk = jax.jit(lambda q, k: jnp.einsum("bhqd,bhsd->bhqs", q, k))
    q = rng.standard_normal((1, 8, 18, 64)).astype(np.float32)
    k = rng.standard_normal((1, 8, 18, 64)).astype(np.float32)
    reference = np.asarray(qk(q, k))
    differ = []
    for width in (20, 24, 30, 32, 48, 64, 100, 128):
        qp, kp = (np.zeros((1, 8, width, 64), np.float32) for _ in range(2))
        qp[:, :, :18], kp[:, :, :18] = q, k
        if not np.array_equal(np.asarray(qk(qp, kp))[:, :, :18, :18], reference):
            differ.append(width)
    return differ


def main() -> int:
    print("bfloat16 matmul, rows that differ from a 2,048-row call:", matmul_rows())
    print("float32 sum over 128 slots, queries that differ from 2:", reduce_queries(
        lambda x: x.sum(-1)))  # fmt: skip
    print("layers.ordered_sum, queries that differ from 2:", reduce_queries(layers.ordered_sum))
    print("q·k of an 18-token row, padded widths that differ from 18:", qk_widths())
    return 0


if __name__ == "__main__":
    sys.exit(main())
