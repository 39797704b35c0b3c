"""A deterministic engine for the fast tier: the real `EngineBase` around a decoder that names what it heard.

`ScriptedEngine` answers each clip with `"clip <seconds> <peak>"` (its length in tenths of a second and its
peak in hundredths), so a test can tell which audio reached the model and at what level. A test can hold
every decode at a gate (`hold()` / `release()`), make chosen clips fail, and turn on the streaming and
abortable capabilities; it records every decode it started, finished and had cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np

from realtime.audio import SAMPLE_RATE
from realtime.engines import EngineBase, EngineError, TranscribeOptions, Transcription


def describe_clip(audio: np.ndarray) -> str:
    return f"clip {round(audio.size / SAMPLE_RATE * 10)} {round(float(np.max(np.abs(audio))) * 100)}"


class ScriptedEngine(EngineBase):
    name = "scripted"

    def __init__(self, *, long_form: bool = False, streaming: bool = False, abortable: bool = False,
                 max_batch_size: int = 4, fail_longer_than_s: float | None = None) -> None:
        self.long_form = long_form  # type: ignore[misc]
        self.streaming = streaming
        self.abortable = abortable
        self.max_batch_size = max_batch_size
        self.fail_longer_than_s = fail_longer_than_s
        self.started: list[tuple[str, bool]] = []
        """(what was heard, partial) for every decode begun."""
        self.finished: list[str] = []
        self.cancelled: list[str] = []
        self.batches: list[int] = []
        self._gate = asyncio.Event()
        self._gate.set()

    def hold(self) -> None:
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def _answer(self, audio: np.ndarray, options: TranscribeOptions) -> str:
        heard = describe_clip(audio)
        self.started.append((heard, options.partial))
        if self.fail_longer_than_s is not None and audio.size > self.fail_longer_than_s * SAMPLE_RATE:
            raise EngineError(f"scripted failure on {heard}")
        return heard

    async def _decode(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        heard = self._answer(audio, options)
        try:
            await self._gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(heard)
            raise
        self.finished.append(heard)
        return Transcription(text=heard, duration=audio.size / SAMPLE_RATE)

    async def _decode_batch(self, audios: list[np.ndarray], options: list[TranscribeOptions]
                            ) -> list[Transcription | BaseException]:
        self.batches.append(len(audios))
        return await super()._decode_batch(audios, options)

    async def _decode_stream(self, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
        if not self.streaming:
            async for delta in super()._decode_stream(audio, options):
                yield delta
            return
        heard = self._answer(audio, options)
        for word in heard.split():
            await self._gate.wait()
            yield word + " "
        self.finished.append(heard)
