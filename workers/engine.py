"""Engines: what a job calls to decode a batch of requests.

Two implementations of one interface (``generate`` speculative, ``generate_baseline``
target alone, ``close``):

- :class:`InProcessEngine` runs both models in the calling process with
  :func:`specdec_core.decoding.speculative_generate`, by default as one compiled loop
  (``compiled=False``: the host loop, which also splits the time into draft / target /
  overhead);
- :class:`workers.coordinator.RayEngine` hosts the draft and the target in separate
  Ray actors driven by a speculative coordinator.

Given the same settings and requests both produce the same tokens: every random draw
derives from (job seed, request key, tokens generated).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from specdec_core import decoding
from specdec_core.models.bound import BoundModel
from workers.batching import DecodeSettings, Generation, PackedBatch, Request, pack, unpack


def decode_speculative(
    target: BoundModel,
    draft: BoundModel,
    batch: PackedBatch,
    settings: DecodeSettings,
    *,
    compiled: bool = False,
) -> decoding.DecodeResult:
    """One packed batch through the in-process speculative loop (encoders included)."""
    rows = batch.prompt_tokens.shape[0]
    return decoding.speculative_generate(
        target=target.forward,
        target_cache=target.new_cache(batch.encoder_tokens, rows, batch.max_len),
        draft=draft.forward,
        draft_cache=draft.new_cache(batch.encoder_tokens, rows, batch.max_len),
        prompt_tokens=batch.prompt_tokens,
        prompt_lengths=batch.prompt_lengths,
        request_ids=batch.request_keys,
        max_new_tokens=batch.max_new_tokens,
        gamma=settings.gamma,
        sampling_config=settings.sampling,
        seed=settings.seed,
        eos_id=settings.eos_id,
        compiled=compiled,
    )


def decode_baseline(
    target: BoundModel, batch: PackedBatch, settings: DecodeSettings
) -> decoding.DecodeResult:
    """One packed batch decoded by the target alone (encoder included)."""
    rows = batch.prompt_tokens.shape[0]
    return decoding.autoregressive_generate(
        target=target.forward,
        target_cache=target.new_cache(batch.encoder_tokens, rows, batch.max_len),
        prompt_tokens=batch.prompt_tokens,
        prompt_lengths=batch.prompt_lengths,
        request_ids=batch.request_keys,
        max_new_tokens=batch.max_new_tokens,
        sampling_config=settings.sampling,
        seed=settings.seed,
        eos_id=settings.eos_id,
    )


class InProcessEngine:
    """Draft and target in this process; ``compiled``: the whole speculative loop as one
    compiled call (the same tokens as the host loop, without a host round trip per
    iteration). ``gamma_policy`` (:class:`workers.gamma.AdaptiveGamma`): γ chosen per
    batch (0: the target alone), ``settings.gamma`` being the largest."""

    def __init__(
        self,
        target: BoundModel,
        draft: BoundModel,
        settings: DecodeSettings,
        *,
        compiled: bool = True,
        gamma_policy=None,
    ):
        if target.vocab_size != draft.vocab_size:
            raise ValueError(
                f"draft {draft.name!r} has vocab_size {draft.vocab_size} but target "
                f"{target.name!r} has {target.vocab_size}: they must share a vocabulary"
            )
        self.target, self.draft, self.settings = target, draft, settings
        self.compiled, self.gamma_policy = compiled, gamma_policy

    def generate(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        if self.gamma_policy is not None:
            result, _, seconds = self.gamma_policy.decode(
                batch,
                lambda gamma: decode_speculative(
                    self.target,
                    self.draft,
                    batch,
                    dataclasses.replace(self.settings, gamma=gamma),
                    compiled=self.compiled,
                ),
                lambda: decode_baseline(self.target, batch, self.settings),
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = decode_speculative(
            self.target, self.draft, batch, self.settings, compiled=self.compiled
        )
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def generate_baseline(self, requests: Sequence[Request]) -> list[Generation]:
        batch = pack(requests, self.settings)
        if self.gamma_policy is not None:  # its time per step is the γ = 0 cost
            result, seconds = self.gamma_policy.decode_baseline(
                batch, lambda: decode_baseline(self.target, batch, self.settings)
            )
            return unpack(batch, result, wall_ms=1e3 * seconds)
        start = time.perf_counter()
        result = decode_baseline(self.target, batch, self.settings)
        return unpack(batch, result, wall_ms=1e3 * (time.perf_counter() - start))

    def close(self) -> None:
        pass
