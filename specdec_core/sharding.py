"""Logical axis names for params and caches, and rules that map them onto a device mesh.

As in T5X, every array dimension gets a *logical* name and a rule table maps names to
the axes of a ``jax.sharding.Mesh`` with axes ``('data', 'model')``:

==============  =====================================  =========
logical name    what it indexes                        mesh axis
==============  =====================================  =========
``batch``       rows of a batch                        data
``vocab``       vocabulary (embeddings, logits)        model
``mlp``         MLP hidden units                       model
``heads``       attention heads                        model
``joined_kv``   heads × head_dim of flat projections   model
``embed``       model width                            (replicated)
``kv``          head_dim                               (replicated)
``length``      positions (cache slots, encoder)       (replicated)
==============  =====================================  =========

This is T5X's 1-D parameter partitioning (Megatron-style model parallelism over
``model``, data parallelism over ``data``). Names come from the T5X param names of
``specdec_core.models`` (T5 and the decoder-only families) and the cache field names;
unknown leaves are replicated. A dimension not divisible by its mesh axis is
replicated too, so any mesh is valid for any model (only slower).

Typical use::

    mesh = make_mesh(data=2, model=4)
    params = shard_params(params, mesh)
    cache = shard_cache(t5.init_cache(config, params, enc, max_decode_len=L), mesh)
    step = jax.jit(partial(t5.forward, config),
                   out_shardings=(None, cache_shardings(cache, mesh)))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Axes = tuple[str | None, ...]

MESH_AXES = ("data", "model")
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("batch", "data"),
    ("vocab", "model"),
    ("mlp", "model"),
    ("heads", "model"),
    ("joined_kv", "model"),
    ("embed", None),
    ("kv", None),
    ("length", None),
)

_CACHE_AXES: dict[str, Axes] = {
    "self_keys": ("batch", "heads", "length", "kv"),  # T5Cache (heads-major)
    "self_values": ("batch", "heads", "length", "kv"),
    "cross_keys": ("batch", "heads", "length", "kv"),
    "cross_values": ("batch", "heads", "length", "kv"),
    "keys": ("batch", "heads", "length", "kv"),  # DecoderCache (heads-major)
    "values": ("batch", "heads", "length", "kv"),
    "encoded": ("batch", "length", "embed"),
    "encoder_mask": ("batch", "length"),
    "history": ("batch", "length"),  # TableCache
    "lengths": ("batch",),
}


def make_mesh(*, data: int, model: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ``data × model`` mesh over the first data*model devices (default: jax.devices())."""
    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < data * model:
        hint = ""
        if devices and devices[0].platform == "cpu":
            hint = (
                f"; on CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={data * model} "
                "in the process's environment before JAX starts (a model YAML's worker.env)"
            )
        raise ValueError(
            f"mesh {data}x{model} needs {data * model} devices, have {len(devices)}{hint}"
        )
    return Mesh(np.asarray(devices[: data * model]).reshape(data, model), MESH_AXES)


# ------------------------------------------------------------------ logical axes


def param_axes(path: Sequence[str], ndim: int) -> Axes:
    """Logical axes of a param leaf from its T5X path, e.g. (..., 'query', 'kernel')."""
    leaf = path[-1] if path else ""
    parent = path[-2] if len(path) > 1 else ""
    if leaf == "embedding":
        axes = ("vocab", "embed") if parent == "token_embedder" else (None, "embed")
    elif leaf == "rel_embedding":
        axes = ("heads", None)
    elif "norm" in parent:
        axes = ("embed",)
    elif parent in ("query", "key", "value"):
        axes = ("embed", "joined_kv") if leaf == "kernel" else ("joined_kv",)
    elif parent == "out":
        axes = ("joined_kv", "embed") if leaf == "kernel" else ("embed",)
    elif parent.startswith("wi"):
        axes = ("embed", "mlp") if leaf == "kernel" else ("mlp",)
    elif parent == "wo":
        axes = ("mlp", "embed") if leaf == "kernel" else ("embed",)
    elif parent == "logits_dense":
        axes = ("embed", "vocab") if leaf == "kernel" else ("vocab",)
    else:
        axes = ()
    return axes if len(axes) == ndim else (None,) * ndim


def cache_axes(field: str, ndim: int) -> Axes:
    """Logical axes of a cache leaf from its field name; unknown fields: batch-major."""
    axes = _CACHE_AXES.get(field, ("batch",) + (None,) * (ndim - 1))
    return axes if len(axes) == ndim else ("batch",) + (None,) * (ndim - 1)


def _path_names(path) -> list[str]:
    names = []
    for entry in path:
        for attr in ("key", "name"):  # DictKey.key, GetAttrKey.name
            if hasattr(entry, attr):
                names.append(str(getattr(entry, attr)))
                break
    return names


# -------------------------------------------------------------------- shardings


def logical_to_spec(
    axes: Axes, shape: Sequence[int], mesh: Mesh, *, rules=LOGICAL_AXIS_RULES
) -> PartitionSpec:
    """Logical axes -> PartitionSpec; a mesh axis is used once and only where it divides."""
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, size in zip(axes, shape, strict=True):
        mesh_axis = table.get(name) if name is not None else None
        if mesh_axis is None or mesh_axis in used or size % mesh.shape[mesh_axis]:
            spec.append(None)
        else:
            used.add(mesh_axis)
            spec.append(mesh_axis)
    return PartitionSpec(*spec)


def param_shardings(params: Any, mesh: Mesh, *, rules=LOGICAL_AXIS_RULES) -> Any:
    """A tree of ``NamedSharding`` matching ``params``."""

    def one(path, leaf):
        axes = param_axes(_path_names(path), np.ndim(leaf))
        return NamedSharding(mesh, logical_to_spec(axes, np.shape(leaf), mesh, rules=rules))

    return jax.tree_util.tree_map_with_path(one, params)


def cache_shardings(cache: Any, mesh: Mesh, *, rules=LOGICAL_AXIS_RULES) -> Any:
    """A tree of ``NamedSharding`` matching a cache dataclass (by field name)."""

    def one(path, leaf):
        names = _path_names(path)
        axes = cache_axes(names[0] if names else "", np.ndim(leaf))
        return NamedSharding(mesh, logical_to_spec(axes, np.shape(leaf), mesh, rules=rules))

    return jax.tree_util.tree_map_with_path(one, cache)


def shard_params(params: Any, mesh: Mesh, *, rules=LOGICAL_AXIS_RULES) -> Any:
    """Places every param leaf on ``mesh`` per the rules."""
    return jax.device_put(params, param_shardings(params, mesh, rules=rules))


def shard_cache(cache: Any, mesh: Mesh, *, rules=LOGICAL_AXIS_RULES) -> Any:
    """Places every cache leaf on ``mesh`` (K/V: batch over data, heads over model)."""
    return jax.device_put(cache, cache_shardings(cache, mesh, rules=rules))
