"""The bytes that cross between the coordinator and the model workers.

One call's arguments (or result) are encoded together, in band, into one ``bytes``
value. Ray serializes a tuple of numpy arrays with one out-of-band buffer per array;
for the dozen small arrays of an iteration (the loop state, draft tokens, their q,
the target's sparse distribution) that per-buffer cost dominates the call. A single
blob keeps the per-iteration call as cheap as an empty one and makes the traffic
exactly ``len(blob)`` bytes.

The format is this module's own, not pickle: a blob can arrive from a socket
(:mod:`workers.channel`), and decoding it must never run code or build an object that
was not asked for. A blob is a version byte and one tagged value:

==========  ============================================================================
tag         value
==========  ============================================================================
``N``       ``None``
``T F``     ``True``, ``False``
``i``       int, 8 bytes signed; ``I``: a larger int, u32 length + signed bytes
``f``       float, 8 bytes
``s b``     str (UTF-8) and bytes: u32 length + the bytes
``t l``     tuple, list: u32 count + the items
``d``       dict with str keys: u32 count + (key, value) pairs
``a``       numpy array: dtype code, ndim, ndim × u64 shape, the raw little-endian data
``g``       numpy scalar: dtype code + its bytes
``c``       a registered dataclass: its name, then (field name, value) per field; it is
            rebuilt by calling the class (so its own validation runs)
==========  ============================================================================

dtypes come from a fixed table of plain numeric and boolean types (never ``object``);
classes from an explicit registry (:func:`register`). Anything else is a
:class:`WireError` naming the type. Decoding checks every length and count against
the bytes that remain, so a truncated or lying blob is a :class:`WireDecodeError`,
never a crash or a large allocation. jax arrays are sent as numpy arrays.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import jax
import ml_dtypes
import numpy as np

from specdec_core.decoding import DecodeState
from specdec_core.sampling import SamplingConfig
from workers.batching import DecodeSettings

VERSION = 1
MAX_DEPTH = 32  # nesting of containers and classes
MAX_NDIM = 32
MAX_INT_BYTES = 1024  # ints wider than this are no loop value


class WireError(ValueError):
    """A value that this format does not carry (the message names its type)."""


class WireDecodeError(WireError):
    """A blob that is not a valid encoding: truncated, corrupted or forged."""


# The dtypes an array or numpy scalar may have, by code. Fixed: codes never change.
_DTYPES = (
    np.dtype(np.bool_),
    np.dtype("<i1"),
    np.dtype("<i2"),
    np.dtype("<i4"),
    np.dtype("<i8"),
    np.dtype("<u1"),
    np.dtype("<u2"),
    np.dtype("<u4"),
    np.dtype("<u8"),
    np.dtype("<f2"),
    np.dtype("<f4"),
    np.dtype("<f8"),
    np.dtype(ml_dtypes.bfloat16),
)
_DTYPE_CODE = {dtype: code for code, dtype in enumerate(_DTYPES)}

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_ARRAY_HEAD = struct.Struct("<BB")  # dtype code, ndim
_SHAPES = [struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1)]


@dataclasses.dataclass(frozen=True)
class _Entry:
    cls: type
    name: str
    fields: tuple[str, ...]
    encoded_fields: tuple[bytes, ...]  # each field's name as encoded before its value
    header: bytes  # the encoded class name and field count


_BY_CLASS: dict[type, _Entry] = {}
_BY_NAME: dict[str, _Entry] = {}


def _str(text: str) -> bytes:
    raw = text.encode()
    return _U32.pack(len(raw)) + raw


def register(cls: type) -> type:
    """Lets instances of the dataclass ``cls`` cross: fields by name, rebuilt by ``cls(**fields)``.

    Only the classes registered here (in this module, below) can be decoded.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"only dataclasses can be registered, not {cls!r}")
    fields = tuple(f.name for f in dataclasses.fields(cls))
    if any(not f.init for f in dataclasses.fields(cls)):
        raise TypeError(f"{cls.__qualname__} has fields outside __init__")
    name = f"{cls.__module__}.{cls.__qualname__}"
    raw = name.encode()
    header = _U32.pack(len(raw)) + raw + _U32.pack(len(fields))
    entry = _Entry(cls, name, fields, tuple(_str(f) for f in fields), header)
    _BY_CLASS[cls] = _BY_NAME[name] = entry
    return cls


# What the coordinator and the workers send each other (besides tuples and arrays).
for _cls in (DecodeState, DecodeSettings, SamplingConfig):
    register(_cls)


def _encode_array(array: np.ndarray, out: list) -> None:
    code = _DTYPE_CODE.get(array.dtype)
    if code is None:
        if array.dtype.byteorder == ">" and array.dtype.newbyteorder("<") in _DTYPE_CODE:
            array = array.astype(array.dtype.newbyteorder("<"))
            code = _DTYPE_CODE[array.dtype]
        else:
            raise WireError(f"numpy arrays of dtype {array.dtype} do not cross the wire")
    if array.ndim > MAX_NDIM:
        raise WireError(f"arrays of {array.ndim} dimensions do not cross the wire")
    out.append(b"a")
    out.append(_ARRAY_HEAD.pack(code, array.ndim))
    out.append(_SHAPES[array.ndim].pack(*array.shape))
    out.append(array.tobytes())


def _encode(value: Any, out: list, depth: int) -> None:
    kind = type(value)
    if kind is np.ndarray:
        _encode_array(value, out)
    elif kind is tuple or kind is list:
        if depth >= MAX_DEPTH:
            raise WireError(f"values nest deeper than {MAX_DEPTH} levels")
        out.append((b"t" if kind is tuple else b"l") + _U32.pack(len(value)))
        for item in value:
            _encode(item, out, depth + 1)
    elif value is None:
        out.append(b"N")
    elif kind is bool:
        out.append(b"T" if value else b"F")
    elif kind is int:
        if -(1 << 63) <= value < (1 << 63):
            out.append(b"i" + _I64.pack(value))
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            if len(raw) > MAX_INT_BYTES:
                raise WireError(f"an int of {len(raw)} bytes does not cross the wire")
            out.append(b"I" + _U32.pack(len(raw)) + raw)
    elif kind is float:
        out.append(b"f" + _F64.pack(value))
    elif kind is str:
        out.append(b"s" + _str(value))
    elif kind is bytes or kind is bytearray or kind is memoryview:
        raw = bytes(value)
        out.append(b"b" + _U32.pack(len(raw)))
        out.append(raw)
    elif kind in _BY_CLASS:
        if depth >= MAX_DEPTH:
            raise WireError(f"values nest deeper than {MAX_DEPTH} levels")
        entry = _BY_CLASS[kind]
        out.append(b"c" + entry.header)
        for name, encoded in zip(entry.fields, entry.encoded_fields, strict=True):
            out.append(encoded)
            _encode(getattr(value, name), out, depth + 1)
    elif kind is dict:
        if depth >= MAX_DEPTH:
            raise WireError(f"values nest deeper than {MAX_DEPTH} levels")
        out.append(b"d" + _U32.pack(len(value)))
        for key, item in value.items():
            if type(key) is not str:
                raise WireError(f"dict keys must be str, got {type(key).__name__}")
            out.append(_str(key))
            _encode(item, out, depth + 1)
    elif isinstance(value, np.generic):
        code = _DTYPE_CODE.get(value.dtype)
        if code is None:
            raise WireError(f"numpy scalars of dtype {value.dtype} do not cross the wire")
        out.append(b"g" + _U8.pack(code) + value.tobytes())
    elif isinstance(value, jax.Array):
        _encode_array(np.asarray(value), out)
    else:
        raise WireError(
            f"a {kind.__module__}.{kind.__qualname__} does not cross the wire "
            "(not a plain value, a numpy array or a registered dataclass)"
        )


def dumps(value: Any) -> bytes:
    """``value`` (tuples, lists, dicts, registered dataclasses, numpy/jax arrays) as one blob."""
    out = [_U8.pack(VERSION)]
    _encode(value, out, 0)
    return b"".join(out)


def _truncated(what: str, need: int, at: int, left: int) -> WireDecodeError:
    return WireDecodeError(
        f"truncated blob: {what} needs {need} bytes at offset {at}, {left} remain"
    )


class _Reader:
    """Decodes one blob, checking every length against what remains.

    Error messages are built only on failure: this runs once per call of the loop.
    """

    __slots__ = ("buffer", "end", "pos", "view")

    def __init__(self, payload):
        # One writable copy: arrays are views into it (as pickle's would be copies).
        self.buffer = bytearray(payload)
        self.view = memoryview(self.buffer)
        self.pos = 0
        self.end = len(self.buffer)

    def take(self, size: int, what: str) -> int:
        """Advances past ``size`` bytes; returns where they start."""
        start = self.pos
        if size > self.end - start:
            raise _truncated(what, size, start, self.end - start)
        self.pos = start + size
        return start

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        start = self.pos
        if fmt.size > self.end - start:
            raise _truncated(what, fmt.size, start, self.end - start)
        self.pos = start + fmt.size
        return fmt.unpack_from(self.buffer, start)

    def count(self, what: str) -> int:
        """A u32 count of items, each at least one byte: no more than the bytes left."""
        (n,) = self.unpack(_U32, what)
        if n > self.end - self.pos:
            raise WireDecodeError(
                f"{what} claims {n} items but only {self.end - self.pos} bytes remain"
            )
        return n

    def raw(self, what: str) -> bytes:
        """A u32 length and that many bytes."""
        (size,) = self.unpack(_U32, what)
        start = self.take(size, what)
        return bytes(self.view[start : start + size])

    def text(self, what: str) -> str:
        try:
            return self.raw(what).decode()
        except UnicodeDecodeError as error:
            raise WireDecodeError(f"{what} is not UTF-8: {error}") from None

    def array(self) -> np.ndarray:
        code, ndim = self.unpack(_ARRAY_HEAD, "an array header")
        if code >= len(_DTYPES):
            raise WireDecodeError(f"unknown dtype code {code}")
        if ndim > MAX_NDIM:
            raise WireDecodeError(f"an array of {ndim} dimensions")
        dtype = _DTYPES[code]
        shape = self.unpack(_SHAPES[ndim], "an array shape")
        size = 1
        for dim in shape:
            size *= dim
        start = self.pos
        nbytes = size * dtype.itemsize
        if nbytes > self.end - start:
            raise _truncated(f"a {dtype} array of shape {shape}", nbytes, start, self.end - start)
        self.pos = start + nbytes
        if size == 0:
            try:
                return np.zeros(shape, dtype)
            except ValueError as error:  # e.g. (0, 2**62): numpy refuses the shape
                raise WireDecodeError(f"an empty array of shape {shape}: {error}") from None
        array = np.frombuffer(self.view, dtype, size, start).reshape(shape)
        if code == 0 and array.view(np.uint8).max() > 1:
            raise WireDecodeError("a bool array holds bytes other than 0 and 1")
        return array

    def instance(self, depth: int) -> Any:
        name = self.text("a class name")
        entry = _BY_NAME.get(name)
        if entry is None:
            raise WireDecodeError(f"class {name!r} is not registered to cross the wire")
        (n,) = self.unpack(_U32, "a field count")
        if n != len(entry.fields):
            raise WireDecodeError(f"{name} has {len(entry.fields)} fields, the blob {n}")
        fields = {}
        buffer = self.buffer
        for field, encoded in zip(entry.fields, entry.encoded_fields, strict=True):
            start = self.pos
            if buffer[start : start + len(encoded)] != encoded:
                raise WireDecodeError(
                    f"{name}: expected field {field!r} at offset {start} (fields go in order)"
                )
            self.pos = start + len(encoded)
            fields[field] = self.value(depth + 1)
        try:
            return entry.cls(**fields)
        except Exception as error:  # its own validation: a forged value
            raise WireDecodeError(f"{name} rejected its fields: {error}") from None

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise WireDecodeError(f"values nest deeper than {MAX_DEPTH} levels")
        pos = self.pos
        if pos >= self.end:
            raise _truncated("a tag", 1, pos, 0)
        tag = self.buffer[pos]
        self.pos = pos + 1
        if tag == 0x61:  # a
            return self.array()
        if tag == 0x74 or tag == 0x6C:  # t, l
            items = [self.value(depth + 1) for _ in range(self.count("a sequence"))]
            return tuple(items) if tag == 0x74 else items
        if tag == 0x63:  # c
            return self.instance(depth)
        if tag == 0x4E:  # N
            return None
        if tag == 0x54:  # T
            return True
        if tag == 0x46:  # F
            return False
        if tag == 0x69:  # i
            return self.unpack(_I64, "an int")[0]
        if tag == 0x49:  # I
            (size,) = self.unpack(_U32, "an int's length")
            if size > MAX_INT_BYTES:
                raise WireDecodeError(f"an int of {size} bytes")
            start = self.take(size, "an int")
            return int.from_bytes(self.buffer[start : start + size], "little", signed=True)
        if tag == 0x66:  # f
            return self.unpack(_F64, "a float")[0]
        if tag == 0x73:  # s
            return self.text("a str")
        if tag == 0x62:  # b
            return self.raw("bytes")
        if tag == 0x64:  # d
            result = {}
            for _ in range(self.count("a dict")):
                key = self.text("a dict key")
                result[key] = self.value(depth + 1)
            return result
        if tag == 0x67:  # g
            (code,) = self.unpack(_U8, "a scalar's dtype")
            if code >= len(_DTYPES):
                raise WireDecodeError(f"unknown dtype code {code}")
            dtype = _DTYPES[code]
            start = self.take(dtype.itemsize, "a numpy scalar")
            if code == 0 and self.buffer[start] > 1:
                raise WireDecodeError("a bool scalar holds a byte other than 0 and 1")
            return np.frombuffer(self.view, dtype, 1, start)[0]
        raise WireDecodeError(f"unknown tag {tag:#04x} at offset {pos}")


def loads(payload: bytes) -> Any:
    """The value of a blob from :func:`dumps`; :class:`WireDecodeError` if it is not one."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"a wire payload is bytes, got {type(payload).__name__}")
    reader = _Reader(payload)
    (version,) = reader.unpack(_U8, "the version")
    if version != VERSION:
        raise WireDecodeError(f"wire format version {version}, expected {VERSION}")
    value = reader.value(0)
    if reader.pos != reader.end:
        raise WireDecodeError(f"{reader.end - reader.pos} stray bytes after the value")
    return value
