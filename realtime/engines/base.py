"""The engine interface: 16 kHz mono float32 audio and options in, text and metadata out.

Every engine (embedded faster-whisper, vLLM, remote endpoint) implements `Engine`. Engines are
shared by all sessions of a process; `transcribe` must be safe to await from the event loop (blocking
work goes to a thread or another process).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    """ISO code; None lets a multilingual model detect it (English-only models always use English)."""
    task: Literal["transcribe", "translate"] = "transcribe"
    prompt: str | None = None
    temperature: float | None = None
    """None: greedy with the engine's temperature fallback; a number: that temperature only."""
    partial: bool = False
    """A partial hypothesis of a still-open segment: cheapest decoding, no fallback."""
    timestamps: bool = False
    """Ask for timed sub-segments (used by verbose formats)."""


@dataclass(frozen=True)
class TimedText:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Transcription:
    text: str
    language: str | None = None
    duration: float = 0.0
    segments: tuple[TimedText, ...] = ()
    no_speech_prob: float | None = None
    avg_logprob: float | None = None
    engine_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class EngineError(RuntimeError):
    """An engine failed on a request; the message is safe to show to a user."""


@runtime_checkable
class Engine(Protocol):
    name: str
    """Short engine kind, e.g. "embedded"."""
    timestamps: bool
    """Whether a request with `TranscribeOptions.timestamps` gets Whisper's timed pieces of the clip (else the
    file path sends timed formats segment by segment, each segment one piece)."""

    async def start(self) -> None:
        """Load weights / connect; called once before the first request."""

    async def transcribe(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription: ...

    async def transcribe_batch(
        self, audios: Sequence[np.ndarray], options: Sequence[TranscribeOptions]
    ) -> list[Transcription | BaseException]:
        """Several clips at once (engines that batch do it in one pass); errors are returned per clip."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """Engine, model and effective settings, shown on the page and in health information."""
        ...
