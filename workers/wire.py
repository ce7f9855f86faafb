"""The bytes that cross between the coordinator and the model workers.

One call's arguments (or result) are pickled together, in band, into one ``bytes``
value. Ray serializes a tuple of numpy arrays with one out-of-band buffer per array;
for the dozen small arrays of an iteration (the loop state, draft tokens, their q,
the target's sparse distribution) that per-buffer cost dominates the call. A single
blob keeps the per-iteration call as cheap as an empty one and makes the traffic
exactly ``len(blob)`` bytes.

Only the coordinator and the workers of one job read these blobs: pickle is safe
here because both ends are this package's own processes.
"""

from __future__ import annotations

import pickle
from typing import Any

import jax
import numpy as np


def _host(value: Any) -> Any:
    """jax arrays -> numpy (pickling a jax array would copy it through the device API)."""
    return np.asarray(value) if isinstance(value, jax.Array) else value


def dumps(value: Any) -> bytes:
    """``value`` (tuples, flax structs, numpy/jax arrays, dataclasses) as one blob."""
    return pickle.dumps(jax.tree.map(_host, value), protocol=pickle.HIGHEST_PROTOCOL)


def loads(payload: bytes) -> Any:
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"a wire payload is bytes, got {type(payload).__name__}")
    return pickle.loads(payload)
