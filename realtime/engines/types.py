"""What engines take and give: request options, transcriptions, and the errors a user may see."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


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


class EngineUnavailable(EngineError):
    """The engine cannot take requests now (endpoints down, still loading); try again in `retry_after` s."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
