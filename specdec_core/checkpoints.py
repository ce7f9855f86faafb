"""Reading and writing T5X checkpoints; importing HuggingFace T5 weights.

T5X layouts read by ``load_t5x`` (all return the ``target`` params tree with T5X names):

- **inline msgpack**: ``checkpoint`` is a flax msgpack of ``{'version', 'optimizer':
  {'target': params, 'state': ...}}`` with every array inline;
- **tensorstore** (classic ``t5x.checkpoints.Checkpointer``): the same msgpack whose
  leaves are tensorstore spec dicts; a ``file`` kvstore path is relative to the
  checkpoint folder and names a zarr folder beside the ``checkpoint`` file;
- **Orbax** (T5X's default today): ``state/`` with ``_METADATA``; params live under the
  ``target`` key, stored as zarr arrays in an OCDBT store (or one folder per array).

``save_t5x`` writes the classic tensorstore layout. ``import_hf_t5`` maps a
``T5ForConditionalGeneration`` state dict (torch tensors, numpy arrays or a safetensors
file/folder) into the same tree and ``export_hf_t5`` / ``hf_t5_config`` / ``hf_t5_model``
go back (one name table for both directions; torch and transformers are imported only
inside those functions); ``import_hf_gpt2`` maps ``GPT2LMHeadModel`` into the
gpt tree of ``specdec_core.models.decoder``. Nothing here unpickles anything: msgpack, zarr and
safetensors only. Every failure raises ``CheckpointError`` naming the path and, where
there is one, the parameter.
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import re
import shutil
import time
from collections.abc import Iterable, Mapping
from typing import Any

import flax.serialization
import jax
import numpy as np
import tensorstore as ts

T5X_CHECKPOINT_VERSION = 3  # t5x.checkpoints.VERSION
_CHUNK_BYTES = 64 * 1024 * 1024  # T5X's target chunk size for zarr arrays


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, truncated or does not match the expected params."""

    def __init__(self, path, message: str, *, param: str | None = None):
        self.path = str(path)
        self.param = param
        where = f"{self.path}" + (f" [parameter {param}]" if param else "")
        super().__init__(f"{where}: {message}")


# ------------------------------------------------------------------------ tree helpers


def flatten(tree: Mapping, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Nested dict -> {key path: leaf}; tensorstore spec dicts count as leaves."""
    flat = {}
    for key, value in tree.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping) and not _is_ts_spec(value):
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


def unflatten(flat: Mapping[tuple[str, ...], Any]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return tree


def _name(path: Iterable[str]) -> str:
    return "/".join(path)


def _is_ts_spec(value: Any) -> bool:
    return isinstance(value, Mapping) and "driver" in value and "kvstore" in value


# ----------------------------------------------------------------------------- load


def load_t5x(path, *, like=None) -> dict:
    """Reads the ``target`` params of a T5X checkpoint in any of the three layouts.

    ``path``: a ``checkpoint_<step>`` folder, its ``checkpoint`` file, its Orbax
    ``state`` folder, or a model folder holding ``checkpoint_<step>`` folders (the
    highest step is read). ``like``: optional params tree (arrays or
    ``jax.ShapeDtypeStruct``); when given, missing/extra parameters and shape
    mismatches raise ``CheckpointError``. Returns a nested dict of numpy arrays.
    """
    path = pathlib.Path(path).resolve()  # tensorstore rejects ".." in kvstore paths
    if not path.exists():
        raise CheckpointError(path, "no such file or folder")
    path = _latest_step_dir(path)
    if path.is_file():
        params = _load_msgpack_checkpoint(path)
    elif (path / "checkpoint").is_file():
        params = _load_msgpack_checkpoint(path / "checkpoint")
    elif (path / "state" / "_METADATA").is_file():
        params = _load_orbax(path / "state")
    elif (path / "_METADATA").is_file():
        params = _load_orbax(path)
    else:
        raise CheckpointError(
            path, "not a T5X checkpoint (no 'checkpoint' file and no Orbax 'state/_METADATA')"
        )
    if like is not None:
        check_params(params, like, path=path)
    return params


def _latest_step_dir(path: pathlib.Path) -> pathlib.Path:
    """A model folder with ``checkpoint_<step>`` subfolders -> the highest step's folder."""
    if not path.is_dir() or (path / "checkpoint").exists() or (path / "state").exists():
        return path
    steps = [
        (int(m.group(1)), child)
        for child in path.iterdir()
        if (m := re.fullmatch(r"checkpoint_(\d+)", child.name)) and child.is_dir()
    ]
    return max(steps)[1] if steps else path


def _load_msgpack_checkpoint(file: pathlib.Path) -> dict:
    """Inline or tensorstore-leaf msgpack checkpoint -> target params (numpy)."""
    try:
        state = flax.serialization.msgpack_restore(file.read_bytes())
    except Exception as err:  # msgpack raises several unrelated types on bad bytes
        raise CheckpointError(file, f"cannot decode msgpack ({type(err).__name__}: {err})") from err
    if not isinstance(state, Mapping):
        raise CheckpointError(file, "msgpack does not hold a T5X state dict")
    target = _target_of(state, file)
    flat = flatten(target)
    out = {}
    for key_path, leaf in flat.items():
        name = _name(key_path)
        if _is_ts_spec(leaf):
            out[key_path] = _read_ts_leaf(leaf, base_dir=file.parent, name=name, file=file)
        elif isinstance(leaf, np.ndarray | np.generic | int | float):
            out[key_path] = np.asarray(leaf)
        else:
            raise CheckpointError(
                file, f"unexpected leaf of type {type(leaf).__name__}", param=name
            )
    return unflatten(out)


def _target_of(state: Mapping, file) -> Mapping:
    if isinstance(state.get("optimizer"), Mapping) and "target" in state["optimizer"]:
        return state["optimizer"]["target"]
    if isinstance(state.get("target"), Mapping):
        return state["target"]
    raise CheckpointError(file, f"no 'optimizer/target' params; top-level keys {sorted(state)}")


def _read_ts_leaf(spec: Mapping, *, base_dir: pathlib.Path, name: str, file) -> np.ndarray:
    """Opens a T5X tensorstore spec whose ``file`` kvstore path is relative to base_dir."""
    spec = json.loads(json.dumps(spec, default=_json_default))  # deep copy, plain types
    kvstore = spec["kvstore"]
    if kvstore.get("driver") == "file" and not os.path.isabs(kvstore["path"]):
        kvstore["path"] = str(base_dir / kvstore["path"])
    location = kvstore.get("path", "")
    try:
        return ts.open(spec, open=True, read=True).result().read().result()
    except Exception as err:
        raise CheckpointError(location or file, f"cannot read array: {err}", param=name) from err


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, bytes):
        return value.decode()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _load_orbax(state_dir: pathlib.Path) -> dict:
    """Orbax PyTree checkpoint (zarr arrays, OCDBT or per-array folders) -> target params."""
    try:
        metadata = json.loads((state_dir / "_METADATA").read_text())
        tree_metadata = metadata["tree_metadata"]
    except (OSError, ValueError, KeyError) as err:
        raise CheckpointError(
            state_dir / "_METADATA", f"cannot read Orbax metadata: {err}"
        ) from err
    driver = "zarr3" if metadata.get("use_zarr3") else "zarr"
    out = {}
    for entry in tree_metadata.values():
        keys = tuple(str(k["key"]) for k in entry["key_metadata"])
        if keys[0] != "target":
            continue
        name = _name(keys[1:])
        array_key = ".".join(keys)
        if metadata.get("use_ocdbt", True):
            kvstore = {"driver": "ocdbt", "base": f"file://{state_dir}/", "path": f"{array_key}/"}
        else:
            kvstore = {"driver": "file", "path": str(state_dir / array_key)}
        try:
            array = ts.open({"driver": driver, "kvstore": kvstore}, open=True).result()
            out[keys[1:]] = array.read().result()
        except Exception as err:
            raise CheckpointError(state_dir, f"cannot read array: {err}", param=name) from err
    if not out:
        raise CheckpointError(state_dir, "Orbax checkpoint has no 'target' params")
    return unflatten(out)


def check_params(params: Mapping, like: Mapping, *, path="<params>") -> None:
    """Raises ``CheckpointError`` unless ``params`` has exactly ``like``'s names and shapes."""
    got, want = flatten(params), flatten(like)
    missing = sorted(set(want) - set(got))
    if missing:
        raise CheckpointError(path, "missing from the checkpoint", param=_name(missing[0]))
    extra = sorted(set(got) - set(want))
    if extra:
        raise CheckpointError(path, "not expected by the model", param=_name(extra[0]))
    for key_path, expected in want.items():
        if tuple(np.shape(got[key_path])) != tuple(expected.shape):
            raise CheckpointError(
                path,
                f"shape {tuple(np.shape(got[key_path]))} != expected {tuple(expected.shape)}",
                param=_name(key_path),
            )


# ----------------------------------------------------------------------------- save


def save_t5x(params: Mapping, directory, *, step: int) -> pathlib.Path:
    """Writes ``params`` as a classic T5X tensorstore checkpoint; returns its folder.

    Layout: ``directory/checkpoint_<step>/checkpoint`` (msgpack ``{'version': 3,
    'optimizer': {'target': <tensorstore specs>, 'state': {'step': step}}}``) plus one
    gzip zarr v2 folder per parameter named ``target.<dotted.path>``. There is no
    optimizer state: T5X restores it from scratch (``fallback_to_scratch``) or reads
    the params alone (``t5x.checkpoints.load_t5x_checkpoint``). The folder appears
    atomically (written under a temporary name, then renamed).
    """
    final_dir = pathlib.Path(directory) / f"checkpoint_{step}"
    tmp_dir = final_dir.with_name(f"{final_dir.name}.tmp-{int(time.time() * 1e6)}")
    tmp_dir.mkdir(parents=True)
    specs = {}
    for key_path, value in flatten(params).items():
        array = np.asarray(jax.device_get(value))
        specs[key_path] = _write_zarr(array, tmp_dir, "target." + ".".join(key_path))
    state = {
        "version": T5X_CHECKPOINT_VERSION,
        "optimizer": {"target": unflatten(specs), "state": {"step": np.int32(step)}},
    }
    (tmp_dir / "checkpoint").write_bytes(flax.serialization.msgpack_serialize(state))
    if final_dir.exists():
        shutil.rmtree(final_dir)
    tmp_dir.rename(final_dir)
    return final_dir


def _write_zarr(array: np.ndarray, directory: pathlib.Path, folder: str) -> dict:
    """Writes one gzip zarr v2 array; returns T5X's spec dict with a relative path."""
    metadata = {
        "chunks": list(_chunk_shape(array.shape, array.dtype.itemsize)),
        "compressor": {"id": "gzip", "level": 1},
        "shape": list(array.shape),
    }
    dtype = "bfloat16" if array.dtype.name == "bfloat16" else array.dtype.name
    spec = {
        "driver": "zarr",
        "dtype": dtype,
        "kvstore": {"driver": "file", "path": f"{folder}/"},
        "metadata": metadata,
    }
    write_spec = json.loads(json.dumps(spec))
    write_spec["kvstore"]["path"] = str(directory / folder)
    store = ts.open(write_spec, create=True, open=True).result()
    store.write(array).result()
    return spec


def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Halves the largest dimension until a chunk holds at most 64 MiB."""
    chunk = list(shape) or []
    while chunk and math.prod(chunk) * itemsize > _CHUNK_BYTES:
        largest = int(np.argmax(chunk))
        chunk[largest] = (chunk[largest] + 1) // 2
    return tuple(chunk)


# ------------------------------------------------------------------------ HF import


def _load_state_dict(state_dict_or_path) -> tuple[dict[str, np.ndarray], str]:
    """A state dict (torch tensors / arrays) or safetensors file/folder -> numpy, source."""
    if isinstance(state_dict_or_path, Mapping):
        return {k: _to_numpy(v) for k, v in state_dict_or_path.items()}, "<state dict>"
    path = pathlib.Path(state_dict_or_path)
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(path, "no .safetensors file found")
    from safetensors import safe_open  # the 'hf' extra

    tensors = {}
    for file in files:
        try:
            with safe_open(str(file), framework="flax") as reader:
                for key in reader.keys():
                    tensors[key] = np.asarray(reader.get_tensor(key), dtype=np.float32)
        except Exception as err:
            raise CheckpointError(file, f"cannot read safetensors: {err}") from err
    return tensors, str(path)


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor; no torch import needed
        return value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)


def _taker(tensors: Mapping[str, np.ndarray], source: str):
    """``take(name, transpose=True)`` reading ``tensors`` and recording names in ``used``."""
    used: set[str] = set()

    def take(name: str, *, transpose: bool = True) -> np.ndarray:
        if name not in tensors:
            raise CheckpointError(source, "missing from the HF state dict", param=name)
        used.add(name)
        return tensors[name].T if transpose else tensors[name]

    return take, used


def _check_all_used(tensors: Mapping, used: set[str], source: str, ignorable: Iterable[str]):
    unused = sorted(set(tensors) - used - set(ignorable))
    if unused:
        raise CheckpointError(source, "HF tensor not mapped to any parameter", param=unused[0])


def import_hf_t5(state_dict_or_path) -> dict:
    """HuggingFace ``T5ForConditionalGeneration`` (T5 1.1, gated-gelu) -> T5X params tree.

    Linear weights [out, in] become kernels [in, out]; relative attention biases
    [num_buckets, H] become ``rel_embedding`` [H, num_buckets]; ``lm_head`` becomes
    ``decoder/logits_dense`` (absent when the checkpoint ties it to ``shared``: then use
    ``logits_via_embedding=True``). Layer counts and MLP names come from the names
    present. The names are :func:`_hf_t5_layout`'s, shared with :func:`export_hf_t5`.
    """
    tensors, source = _load_state_dict(state_dict_or_path)
    take, used = _taker(tensors, source)
    mlp = "encoder.block.0.layer.1.DenseReluDense"
    layout = _hf_t5_layout(
        encoder_layers=_hf_block_count(tensors, "encoder", source=source),
        decoder_layers=_hf_block_count(tensors, "decoder", source=source),
        mlp=[name for name in _HF_MLP if f"{mlp}.{name}.weight" in tensors],
        tied="lm_head.weight" not in tensors,
    )
    params = unflatten({path: take(hf, transpose=t) for path, hf, t in layout})
    _check_all_used(tensors, used, source, _HF_T5_TIED_INPUTS)
    return params


def export_hf_t5(params: Mapping, config) -> dict[str, np.ndarray]:
    """T5X params tree of ``config`` (a ``t5.T5Config``) -> a HuggingFace
    ``T5ForConditionalGeneration`` state dict of float32 numpy arrays.

    The exact inverse of :func:`import_hf_t5` (the same name table): kernels [in, out]
    become Linear weights [out, in], ``rel_embedding`` [H, buckets] becomes
    ``relative_attention_bias.weight`` [buckets, H], ``decoder/logits_dense`` becomes
    ``lm_head.weight``. Tied logits (``logits_via_embedding``) write ``shared.weight``
    only, as HF's ``save_pretrained`` does; the inputs' ``embed_tokens`` are never
    written (HF ties them to ``shared``). Build the model with :func:`hf_t5_model`.
    Raises ValueError when HF T5 cannot express ``config`` (:func:`hf_t5_config`) and
    ``CheckpointError`` (a ValueError) when ``params`` does not fit ``config``.
    """
    from specdec_core.models import layers, t5

    _hf_feed_forward(config.mlp_activations)  # fails before anything is copied
    like = jax.eval_shape(functools.partial(t5.init_params, config), jax.random.key(0))
    check_params(params, like)
    flat = flatten(params)
    layout = _hf_t5_layout(
        encoder_layers=config.num_encoder_layers,
        decoder_layers=config.num_decoder_layers,
        mlp=[*layers.mlp_input_names(config.mlp_activations), "wo"],
        tied=config.logits_via_embedding,
    )
    return {hf: _hf_array(flat[path], transpose=t) for path, hf, t in layout}


def _hf_array(value, *, transpose: bool) -> np.ndarray:
    array = np.asarray(jax.device_get(value), dtype=np.float32)
    return np.array(array.T if transpose else array, order="C")  # a writable copy


# HF T5 sublayers per block: (T5X block name, HF module name, T5X pre-norm name)
_HF_T5_SUBLAYERS = {
    "encoder": (
        ("attention", "SelfAttention", "pre_attention_layer_norm"),
        ("mlp", "DenseReluDense", "pre_mlp_layer_norm"),
    ),
    "decoder": (
        ("self_attention", "SelfAttention", "pre_self_attention_layer_norm"),
        ("encoder_decoder_attention", "EncDecAttention", "pre_cross_attention_layer_norm"),
        ("mlp", "DenseReluDense", "pre_mlp_layer_norm"),
    ),
}
_HF_ATTENTION = (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
_HF_MLP = ("wi_0", "wi_1", "wi", "wo")
_HF_T5_FINAL_NORMS = {"encoder": "encoder_norm", "decoder": "decoder_norm"}
_HF_T5_TIED_INPUTS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")

# (T5X key path, HF name, transposed): one entry per parameter, both directions
HfT5Entry = tuple[tuple[str, ...], str, bool]


def _hf_t5_layout(
    *, encoder_layers: int, decoder_layers: int, mlp: Iterable[str], tied: bool
) -> list[HfT5Entry]:
    """Every parameter of a T5 as (T5X key path, HF name, transposed).

    ``mlp``: the MLP's T5X names (``wi_0``, ``wi_1``, ``wo`` for gated-GELU), the same
    in HF; ``tied``: no ``lm_head`` (logits via the shared embedding)."""
    mlp = tuple(mlp)
    entries = [(("token_embedder", "embedding"), "shared.weight", False)]
    entries += _hf_t5_stack_layout("encoder", encoder_layers, mlp=mlp)
    entries += _hf_t5_stack_layout("decoder", decoder_layers, mlp=mlp)
    if not tied:
        entries.append((("decoder", "logits_dense", "kernel"), "lm_head.weight", True))
    return entries


def _hf_t5_stack_layout(stack: str, num_layers: int, *, mlp: tuple[str, ...]) -> list[HfT5Entry]:
    """One stack (``encoder`` or ``decoder``): its position bias, blocks and final norm."""
    rel = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    entries = [((stack, "relpos_bias", "rel_embedding"), rel, True)]  # [H, 32] <-> [32, H]
    for i in range(num_layers):
        ours = (stack, f"layers_{i}")
        for sub, (t5x_name, hf_name, norm_name) in enumerate(_HF_T5_SUBLAYERS[stack]):
            prefix = f"{stack}.block.{i}.layer.{sub}"
            entries.append(((*ours, norm_name, "scale"), f"{prefix}.layer_norm.weight", False))
            names = [(n, n) for n in mlp] if hf_name == "DenseReluDense" else _HF_ATTENTION
            entries += [
                ((*ours, t5x_name, name, "kernel"), f"{prefix}.{hf_name}.{theirs}.weight", True)
                for name, theirs in names  # kernel [in, out] <-> weight [out, in]
            ]
    final = f"{stack}.final_layer_norm.weight"
    entries.append(((stack, _HF_T5_FINAL_NORMS[stack], "scale"), final, False))
    return entries


def _hf_block_count(tensors: Mapping, stack: str, *, source: str) -> int:
    blocks = {m.group(1) for k in tensors if (m := re.match(rf"{stack}\.block\.(\d+)\.", k))}
    if not blocks:
        raise CheckpointError(source, f"no {stack} blocks", param=f"{stack}.block.0")
    return len(blocks)


# HF T5Config.feed_forward_proj -> T5X mlp_activations (HF's plain "gelu" is exact GELU)
_HF_FEED_FORWARD = {
    "gated-gelu": ("gelu", "linear"),
    "gated-silu": ("silu", "linear"),
    "relu": ("relu",),
    "gelu": ("gelu_exact",),
}
_ACTIVATION_SYNONYMS = {"gelu_new": "gelu", "swish": "silu"}  # layers.activation_fn's

# T5Config field -> HF T5Config key, both ways (t5_config_from_hf, hf_t5_config); not
# num_decoder_layers, which HF may leave unset (then it is num_layers)
_HF_T5_FIELDS = {
    "vocab_size": "vocab_size",
    "emb_dim": "d_model",
    "num_heads": "num_heads",
    "head_dim": "d_kv",
    "mlp_dim": "d_ff",
    "num_encoder_layers": "num_layers",
}


def _hf_feed_forward(activations: Iterable[str]) -> str:
    """T5X ``mlp_activations`` -> HF ``feed_forward_proj`` (the inverse of the table)."""
    wanted = tuple(_ACTIVATION_SYNONYMS.get(name, name) for name in activations)
    for proj, ours in _HF_FEED_FORWARD.items():
        if ours == wanted:
            return proj
    raise ValueError(
        f"HF T5 cannot express mlp_activations {tuple(activations)}: its feed_forward_proj "
        f"covers {', '.join(f'{ours} ({proj})' for proj, ours in _HF_FEED_FORWARD.items())}"
    )


def t5_config_from_hf(hf_config, *, logits_via_embedding: bool = False) -> Any:
    """A ``transformers.T5Config`` (or its dict) -> ``specdec_core.models.t5.T5Config``.

    ``logits_via_embedding``: True when the checkpoint has no separate ``lm_head``
    (transformers 5.x configs always say ``tie_word_embeddings``, so it cannot be read
    from the config). HF's non-gated ``gelu`` is the exact GELU; gated-gelu uses tanh.
    """
    from specdec_core.models.t5 import MAX_DISTANCE, NUM_BUCKETS, T5Config

    get = _config_getter(hf_config)
    buckets = (
        get("relative_attention_num_buckets", 32),
        get("relative_attention_max_distance", 128),
    )
    if buckets != (NUM_BUCKETS, MAX_DISTANCE):
        raise CheckpointError("<hf config>", f"relative attention buckets {buckets} unsupported")
    proj = get("feed_forward_proj", "relu")
    activations = _HF_FEED_FORWARD.get(proj)
    if activations is None:
        raise CheckpointError("<hf config>", f"feed_forward_proj {proj!r} unsupported")
    fields = {ours: get(theirs) for ours, theirs in _HF_T5_FIELDS.items()}
    return T5Config(
        **fields,
        num_decoder_layers=get("num_decoder_layers") or fields["num_encoder_layers"],
        mlp_activations=activations,
        logits_via_embedding=logits_via_embedding,
    )


def hf_t5_config(config) -> Any:
    """A ``t5.T5Config`` -> ``transformers.T5Config`` (the inverse of
    :func:`t5_config_from_hf`; imports transformers, the ``hf`` extra).

    Relative attention buckets are ours (``t5.NUM_BUCKETS``, ``t5.MAX_DISTANCE``),
    token ids T5's (decoder start = pad = 0, EOS = 1). ``tie_word_embeddings`` is
    ``logits_via_embedding``: transformers then scales the decoder output by
    ``d_model ** -0.5`` before the tied ``lm_head``, as our ``_logits`` does, and does
    not when it is False (T5 1.1). ``dtype`` (our activation dtype) is not carried:
    HF runs in its weights' dtype (float32 from :func:`export_hf_t5`). Raises
    ValueError for ``mlp_activations`` with no HF ``feed_forward_proj``.
    """
    import transformers

    from specdec_core.models import t5

    return transformers.T5Config(
        **{theirs: getattr(config, ours) for ours, theirs in _HF_T5_FIELDS.items()},
        num_decoder_layers=config.num_decoder_layers,
        feed_forward_proj=_hf_feed_forward(config.mlp_activations),
        relative_attention_num_buckets=t5.NUM_BUCKETS,
        relative_attention_max_distance=t5.MAX_DISTANCE,
        dropout_rate=config.dropout_rate,  # training only; eval mode drops nothing
        layer_norm_epsilon=1e-6,  # layers.rms_norm's
        tie_word_embeddings=config.logits_via_embedding,
        decoder_start_token_id=t5.DECODER_START_ID,
        pad_token_id=t5.PAD_ID,
        eos_token_id=t5.EOS_ID,
    )


def hf_t5_model(params: Mapping, config) -> Any:
    """``params`` of ``config`` as a float32 ``transformers.T5ForConditionalGeneration``
    in eval mode (imports torch and transformers).

    transformers 5.x ties ``lm_head`` to ``shared`` in every T5 whatever the config
    says, so untied logits get an ``lm_head`` of their own here before loading. Its
    ``generate`` (5.24) sizes the decoder's cache by ``num_layers``, the encoder's
    count: with more decoder than encoder layers pass it an unsized one,
    ``cache=EncoderDecoderCache(DynamicCache(), DynamicCache())``."""
    import torch
    import transformers

    state = export_hf_t5(params, config)
    model = transformers.T5ForConditionalGeneration(hf_t5_config(config))
    if "lm_head.weight" in state and model.lm_head.weight is model.shared.weight:
        model.lm_head = torch.nn.Linear(config.emb_dim, config.vocab_size, bias=False)
    missing, unexpected = model.load_state_dict(
        {name: torch.from_numpy(array) for name, array in state.items()}, strict=False
    )
    untied = [name for name in missing if model.get_parameter(name) is not model.shared.weight]
    if unexpected or untied:
        raise CheckpointError(
            "<hf model>", f"state dict does not fit: missing {untied}, unexpected {unexpected}"
        )
    return model.eval()


# ------------------------------------------------------------------------- GPT-2


def import_hf_gpt2(state_dict_or_path) -> dict:
    """HuggingFace ``GPT2LMHeadModel`` (or ``GPT2Model``) -> the decoder-only gpt tree.

    The tree is ``specdec_core.models.decoder``'s (``variant="gpt"``). HF's Conv1D
    weights are already [in, out]; ``c_attn`` [E, 3E] is split into query/key/value.
    ``lm_head`` is tied to ``wte`` and not read; attention mask buffers are ignored.
    """
    tensors, source = _load_state_dict(state_dict_or_path)
    if any(k.startswith("transformer.") for k in tensors):
        tensors = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    take, used = _taker(tensors, source)
    blocks = {m.group(1) for k in tensors if (m := re.match(r"h\.(\d+)\.", k))}
    if not blocks:
        raise CheckpointError(source, "no GPT-2 blocks", param="h.0")
    tree = {
        "token_embedder": {"embedding": take("wte.weight", transpose=False)},
        "position_embedder": {"embedding": take("wpe.weight", transpose=False)},
    }
    for i in range(len(blocks)):
        tree[f"layers_{i}"] = _hf_gpt2_block(take, f"h.{i}")
    tree["decoder_norm"] = _hf_layer_norm(take, "ln_f")
    buffers = [k for k in tensors if re.fullmatch(r"h\.\d+\.attn\.(masked_)?bias", k)]
    _check_all_used(tensors, used, source, [*buffers, "lm_head.weight"])
    return {"decoder": tree}


def _hf_layer_norm(take, prefix: str) -> dict:
    return {
        "scale": take(f"{prefix}.weight", transpose=False),
        "bias": take(f"{prefix}.bias", transpose=False),
    }


def _hf_conv1d(take, prefix: str) -> dict:
    """HF Conv1D: weight [in, out] (no transpose), bias [out]."""
    return {
        "kernel": take(f"{prefix}.weight", transpose=False),
        "bias": take(f"{prefix}.bias", transpose=False),
    }


def _hf_gpt2_block(take, prefix: str) -> dict:
    qkv = _hf_conv1d(take, f"{prefix}.attn.c_attn")
    kernels = np.split(qkv["kernel"], 3, axis=-1)  # 3 x [E, H*D]
    biases = np.split(qkv["bias"], 3, axis=-1)
    attention = {
        name: {"kernel": kernel, "bias": bias}
        for name, kernel, bias in zip(("query", "key", "value"), kernels, biases, strict=True)
    }
    attention["out"] = _hf_conv1d(take, f"{prefix}.attn.c_proj")
    return {
        "pre_self_attention_layer_norm": _hf_layer_norm(take, f"{prefix}.ln_1"),
        "self_attention": attention,
        "pre_mlp_layer_norm": _hf_layer_norm(take, f"{prefix}.ln_2"),
        "mlp": {
            "wi": _hf_conv1d(take, f"{prefix}.mlp.c_fc"),
            "wo": _hf_conv1d(take, f"{prefix}.mlp.c_proj"),
        },
    }


def gpt2_config_from_hf(hf_config) -> Any:
    """A ``transformers.GPT2Config`` -> ``specdec_core.models.decoder.DecoderConfig``."""
    from specdec_core.models.decoder import DecoderConfig

    get = _config_getter(hf_config)
    activation = get("activation_function", "gelu_new")
    if activation not in ("gelu_new", "gelu_pytorch_tanh"):
        raise CheckpointError("<hf config>", f"activation_function {activation!r} unsupported")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if get(flag, False):
            raise CheckpointError("<hf config>", f"{flag}=True unsupported")
    if not get("scale_attn_weights", True):
        raise CheckpointError("<hf config>", "scale_attn_weights=False unsupported")
    emb_dim, num_heads = get("n_embd"), get("n_head")
    return DecoderConfig(
        variant="gpt",
        vocab_size=get("vocab_size"),
        emb_dim=emb_dim,
        num_heads=num_heads,
        num_layers=get("n_layer"),
        head_dim=emb_dim // num_heads,
        mlp_dim=get("n_inner") or 4 * emb_dim,
        max_len=get("n_positions"),
    )


def _config_getter(hf_config):
    if isinstance(hf_config, Mapping):
        return hf_config.get
    return lambda key, default=None: getattr(hf_config, key, default)
