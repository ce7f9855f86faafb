"""Checkpoint I/O of the training job: resumable train checkpoints, exports, params.

- ``<train_dir>/checkpoint_<step>/``: float32 params in T5X layout
  (:func:`specdec_core.checkpoints.save_t5x`) plus ``train_state.msgpack`` (flax
  msgpack: step, optimizer state, metadata; no pickle). The latest ``checkpoint.keep``
  are kept; ``--resume`` takes the newest complete one (:func:`complete_checkpoints`).
- ``<export_dir>/checkpoint_<step>/``: params only, cast to ``export_dtype``, in T5X
  layout (what gets committed), plus ``<export_dir>/training.json`` (step, wall time,
  last evaluation, vocabulary hash, the command). Only the latest export is kept.

:func:`load_model_params` reads a model config's latest params (train dir, else
export) for evaluation, distillation teachers and ``pipelines.kd_data``.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import shutil

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

from pipelines import configs
from specdec_core import checkpoints
from specdec_core.models import families

TRAIN_STATE_FILE = "train_state.msgpack"


def init_params(model_config, seed: int) -> dict:
    """Fresh float32 params of the config's family (one that loads from checkpoints), with
    what it shares with another model (its target's encoder) loaded, not drawn."""
    family = families.of_config(model_config)
    params = family.init_params(model_config, jax.random.key(seed))
    return {**params, **_float32(family.load_shared(model_config))}


def _float32(tree):
    """Float32 copies (a train step donates its params; the shared ones are cached)."""
    return jax.tree.map(lambda x: jnp.array(x, jnp.float32), tree)


def complete_checkpoints(train_dir: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """(step, folder) of checkpoints that have their train-state sidecar, oldest first."""
    if not train_dir.is_dir():
        return []
    found = []
    for child in train_dir.iterdir():
        match = re.fullmatch(r"checkpoint_(\d+)", child.name)
        if match and (child / TRAIN_STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def save_train_checkpoint(
    train_dir: pathlib.Path, *, step: int, params, opt_state, meta: dict, keep: int
) -> pathlib.Path:
    """float32 params (T5X layout) + msgpack sidecar (step, optimizer state, meta)."""
    folder = checkpoints.save_t5x(params, train_dir, step=step)
    state = {
        "step": np.int64(step),
        "opt_state": flax.serialization.to_state_dict(jax.device_get(opt_state)),
        "meta": json.dumps(meta),
    }
    tmp = folder / f"{TRAIN_STATE_FILE}.tmp"
    tmp.write_bytes(flax.serialization.msgpack_serialize(state))
    tmp.rename(folder / TRAIN_STATE_FILE)
    for _, old in complete_checkpoints(train_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def restore_train_checkpoint(folder: pathlib.Path, *, params_like, opt_state_like):
    """(params, opt_state, step, meta) from :func:`save_train_checkpoint`'s folder."""
    params = checkpoints.load_t5x(folder, like=params_like)
    params = jax.tree.map(lambda x, like: jnp.asarray(x, like.dtype), params, params_like)
    state = flax.serialization.msgpack_restore((folder / TRAIN_STATE_FILE).read_bytes())
    opt_state = flax.serialization.from_state_dict(opt_state_like, state["opt_state"])
    opt_state = jax.tree.map(jnp.asarray, opt_state)
    return params, opt_state, int(state["step"]), json.loads(state["meta"])


def at_schedule_step(opt_state, step: int):
    """Fresh optimizer state whose learning-rate schedule continues at ``step``.

    Only the schedule's counter moves: the moments' own counters (Adam's bias
    correction, Adafactor's decay) stay at 0 because their moments are fresh.
    """

    def advance(node):
        if isinstance(node, optax.ScaleByScheduleState):
            return node._replace(count=jnp.full_like(node.count, step))
        return node

    return jax.tree.map(
        advance, opt_state, is_leaf=lambda n: isinstance(n, optax.ScaleByScheduleState)
    )


def export_params(
    export_dir: pathlib.Path, *, step: int, params, dtype: str, info: dict, model_config
):
    """Params cast to ``dtype`` as the only T5X checkpoint in export_dir + training.json;
    what the model shares with another (its target's encoder) is left out."""
    params = families.own_params(model_config, params)
    cast = jax.tree.map(lambda x: np.asarray(jax.device_get(x)).astype(jnp.dtype(dtype)), params)
    folder = checkpoints.save_t5x(cast, export_dir, step=step)
    for child in export_dir.iterdir():
        if re.fullmatch(r"checkpoint_\d+", child.name) and child != folder:
            shutil.rmtree(child, ignore_errors=True)
    (export_dir / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    return folder


def repo_relative(path) -> str:
    """``path`` relative to the repository root when it is under it (for provenance)."""
    path = pathlib.Path(path)
    return (
        str(path.relative_to(configs.REPO_ROOT))
        if path.is_relative_to(configs.REPO_ROOT)
        else str(path)
    )


def load_model_params(model_file: configs.ModelFileConfig, path: pathlib.Path | None = None):
    """Latest params of a model config: its train dir, else its export dir (as float32).
    A train checkpoint holds every param; an export lacks what the model shares with
    another (its target's encoder), which is loaded from there."""
    config = model_file.model
    family = families.of_config(config)
    like = jax.eval_shape(lambda: family.init_params(config, jax.random.key(0)))
    if path is None:
        complete = complete_checkpoints(model_file.train_dir)
        path = complete[-1][1] if complete else model_file.export_dir
    try:
        params = checkpoints.load_t5x(path, like=like)
    except checkpoints.CheckpointError:
        if not family.shared_keys(config):
            raise
        params = checkpoints.load_t5x(path, like=families.own_params(config, like))
        params = {**params, **family.load_shared(config)}
    return _float32(params)


def load_teacher(model_file: configs.ModelFileConfig):
    """(teacher model config, teacher params) from ``teacher`` (YAML or checkpoint folder)."""
    teacher = pathlib.Path(model_file.teacher)
    if teacher.suffix in (".yaml", ".yml"):
        teacher_file = configs.load_model_config(teacher)
        return teacher_file.model, load_model_params(teacher_file)
    if not model_file.teacher_config:
        raise configs.ConfigError(
            f"{model_file.path}: teacher {teacher} is a checkpoint; set teacher_config to the "
            "teacher's model YAML"
        )
    teacher_file = configs.load_model_config(model_file.teacher_config)
    return teacher_file.model, load_model_params(teacher_file, teacher)


def file_sha256(path: pathlib.Path) -> str:
    """Hex SHA-256 of a file's bytes (the vocabulary a checkpoint was trained with)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_matching(path: pathlib.Path, params) -> tuple[dict, list[str]]:
    """``params`` with every leaf that the checkpoint at ``path`` holds at the same path
    and shape replaced by the checkpoint's (as float32); and the names of the leaves
    that stayed as they were."""
    stored = checkpoints.flatten(checkpoints.load_t5x(path))
    taken, fresh = {}, []
    for key, leaf in checkpoints.flatten(params).items():
        found = stored.get(key)
        if found is not None and tuple(np.shape(found)) == tuple(leaf.shape):
            taken[key] = jnp.asarray(found, jnp.float32)
        else:
            taken[key] = leaf
            fresh.append("/".join(key))
    return checkpoints.unflatten(taken), fresh
