"""Requests, their results, and packing a list of requests into padded arrays.

A ``Request`` carries token ids only (tokenisation happens in ``pipelines``). Its
``request_key`` seeds every random draw of the request (with the job seed), so the
output of a request does not depend on which batch or worker served it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

from specdec_core.decoding import measured_compile_s, measured_loop_s
from specdec_core.models import api
from specdec_core.models.t5 import EOS_ID
from specdec_core.sampling import GREEDY, SamplingConfig

LENGTH_BUCKET = 16  # prompt and encoder widths pad to multiples of this (few compiled shapes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecodeSettings:
    """How a job decodes. Hashable, so compiled steps can be cached by it."""

    gamma: int = 4  # drafted tokens per iteration (the drafted bonus position not counted)
    sampling: SamplingConfig = GREEDY
    seed: int = 0  # job seed; with the request key it fixes every random draw
    eos_id: int | None = EOS_ID  # stop a row at this token; None: never
    max_new_tokens: int = 64
    batch_size: int = 1  # batches are padded to this many rows (one compilation)
    # the compiled loop's draft slots, of which γ are drafted: every γ up to it shares
    # one program (decoding.speculative_generate's ``slots``); None: a program per γ
    slots: int | None = None

    def __post_init__(self):
        if self.gamma < 1 - self.sampling.drafts_bonus:
            raise ValueError(
                f"gamma must be >= 1, got {self.gamma} (0 only where the draft proposes the "
                "bonus position: the paper's rule at a temperature above 0)"
            )
        if self.slots is not None and self.slots < self.gamma:
            raise ValueError(f"slots must be >= gamma ({self.gamma}), got {self.slots}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @property
    def sampling_kwargs(self) -> dict:
        """The decoding loops' keywords for how tokens are drawn and where rows stop."""
        return {"sampling_config": self.sampling, "seed": self.seed, "eos_id": self.eos_id}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    id: str  # the record's id (line number or the input's own id)
    prompt_tokens: tuple[int, ...]  # decoder prompt; T5: (0,), the decoder start token
    encoder_tokens: tuple[int, ...] | None = None  # encoder input (EOS included) for T5
    max_new_tokens: int | None = None  # None: the job's setting

    @property
    def request_key(self) -> int:
        """A stable 32-bit key from the id: the same record draws the same numbers."""
        return int.from_bytes(hashlib.blake2s(self.id.encode(), digest_size=4).digest(), "little")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    id: str
    tokens: list[int]  # generated ids, EOS included when reached
    iterations: int  # target calls
    drafted: int  # drafted tokens proposed (0 for target-only decoding)
    accepted: int  # drafted tokens accepted
    accepted_by_position: list[int]  # accepted count at each of the γ draft positions
    batch_wall_ms: float  # wall time of the batch this request was decoded in
    # of which the decode loop alone (DecodeResult.loop_s); None where not measured
    batch_loop_ms: float | None = None
    # of which compiling its programs (DecodeResult.compile_s); None where not measured
    batch_compile_ms: float | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackedBatch:
    ids: list[str]  # real requests first; padding rows have no id
    encoder_tokens: np.ndarray | None  # [B, S] int32, 0-padded
    prompt_tokens: np.ndarray  # [B, P] int32
    prompt_lengths: np.ndarray  # [B] int32
    request_keys: np.ndarray  # [B] uint32
    max_new_tokens: np.ndarray  # [B] int32 (0 for padding rows)
    max_len: int  # decoder cache slots needed

    @property
    def size(self) -> int:
        return len(self.ids)

    def shape(self) -> tuple:
        """Every padded width: rows and encoder width (None without an encoder), prompt
        width, cache slots. The encoders compile once per shape."""
        encoder = None if self.encoder_tokens is None else self.encoder_tokens.shape
        return (encoder, self.prompt_tokens.shape, self.max_len)

    def program_shape(self) -> tuple:
        """What the decode loops compile for: :meth:`shape` with the encoder width
        replaced by the width the caches pad their source to (``api.source_width``).
        Batches of one program shape share every compiled loop."""
        encoder, prompt, max_len = self.shape()
        source = None if encoder is None else (encoder[0], api.source_width(encoder[1]))
        return (source, prompt, max_len)


def padded_length(n: int, multiple: int = LENGTH_BUCKET) -> int:
    """``n`` rounded up to a multiple of ``multiple`` (at least one multiple)."""
    return max(multiple, -(-n // multiple) * multiple)


def pack(requests: Sequence[Request], settings: DecodeSettings) -> PackedBatch:
    """Pads requests to ``settings.batch_size`` rows and bucketed lengths.

    Lengths are rounded up to multiples of :data:`LENGTH_BUCKET` so a job compiles a
    handful of shapes.
    """
    if not requests:
        raise ValueError("cannot pack an empty batch")
    if len(requests) > settings.batch_size:
        raise ValueError(f"{len(requests)} requests exceed batch_size {settings.batch_size}")
    rows = settings.batch_size
    encoder = [r.encoder_tokens for r in requests]
    if any(e is None for e in encoder) and not all(e is None for e in encoder):
        raise ValueError("a batch mixes requests with and without encoder tokens")
    prompt_width = padded_length(max(len(r.prompt_tokens) for r in requests))
    prompt_tokens = np.zeros((rows, prompt_width), np.int32)
    prompt_lengths = np.ones((rows,), np.int32)
    max_new = np.zeros((rows,), np.int32)
    for i, r in enumerate(requests):
        if not r.prompt_tokens:
            raise ValueError(f"request {r.id!r} has an empty prompt")
        prompt_tokens[i, : len(r.prompt_tokens)] = r.prompt_tokens
        prompt_lengths[i] = len(r.prompt_tokens)
        max_new[i] = settings.max_new_tokens if r.max_new_tokens is None else r.max_new_tokens
    encoder_tokens = None
    if encoder[0] is not None:
        width = padded_length(max(len(e) for e in encoder))
        encoder_tokens = np.zeros((rows, width), np.int32)
        encoder_tokens[:, 0] = EOS_ID  # padding rows encode a lone EOS (all-pad is NaN-prone)
        for i, e in enumerate(encoder):
            encoder_tokens[i, : len(e)] = e
    keys = np.array([r.request_key for r in requests] + [0] * (rows - len(requests)), np.uint32)
    max_len = padded_length(prompt_width + int(max_new.max()) + settings.gamma + 2, 32)
    return PackedBatch(
        ids=[r.id for r in requests],
        encoder_tokens=encoder_tokens,
        prompt_tokens=prompt_tokens,
        prompt_lengths=prompt_lengths,
        request_keys=keys,
        max_new_tokens=max_new,
        max_len=max_len,
    )


def unpack(batch: PackedBatch, result, *, wall_ms: float) -> list[Generation]:
    """One ``Generation`` per real request from a ``decoding.DecodeResult``."""
    loop_s = measured_loop_s(result)
    loop_ms = None if loop_s is None else 1e3 * loop_s
    compile_s = measured_compile_s(result)
    compile_ms = None if compile_s is None else 1e3 * compile_s
    return [
        Generation(
            id=request_id,
            tokens=result.row_tokens(i),
            iterations=int(result.iterations[i]),
            drafted=int(result.drafted[i]),
            accepted=int(result.accepted[i]),
            accepted_by_position=[int(x) for x in result.accepted_by_position[i]],
            batch_wall_ms=wall_ms,
            batch_loop_ms=loop_ms,
            batch_compile_ms=compile_ms,
        )
        for i, request_id in enumerate(batch.ids)
    ]
