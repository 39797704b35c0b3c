"""Live transcript events: what a session tells its consumers, typed, with one wire form.

A `TranscriptionSession` reports every event through its callback as one of these dataclasses. The page,
the `/transcript/{id}/events` stream, the `stream` client and the Realtime API read them; `as_dict` is the
one place that turns them into JSON-ready dicts (the wire form those consumers share).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..engines.types import TokenLogprob, Word


def _span(segment: int, start: float, audio_end: float) -> dict[str, Any]:
    """Where a segment's event lies, as every segment event's dict carries it."""
    return {"segment": segment, "start": round(start, 3), "audio_end": round(audio_end, 3)}


@dataclass(frozen=True)
class SpeechStarted:
    """The VAD opened a segment (speech began at `start`, seconds of stream time)."""

    type: ClassVar[str] = "speech_started"
    segment: int
    start: float

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "segment": self.segment, "start": round(self.start, 3)}


@dataclass(frozen=True)
class SpeechStopped:
    """The segment closed (speech ended at `audio_end`); its final or error follows."""

    type: ClassVar[str] = "speech_stopped"
    segment: int
    start: float
    audio_end: float

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, **_span(self.segment, self.start, self.audio_end)}


@dataclass(frozen=True)
class PartialEvent:
    """The open segment's text so far: `committed` words no longer change, `tentative` ones may."""

    type: ClassVar[str] = "partial"
    segment: int
    start: float
    audio_end: float
    committed: str
    tentative: str
    streaming: bool = False
    """Tentative words from a streaming engine's decode in progress (not yet a whole hypothesis)."""
    logprobs: tuple[tuple[TokenLogprob, ...], ...] | None = None
    """The tokens of each word of the hypothesis (by position: the committed words, then the tentative ones) with
    their log probabilities, when the session asked for them."""

    @property
    def text(self) -> str:
        return f"{self.committed} {self.tentative}".strip()

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "text": self.text, "committed": self.committed, "tentative": self.tentative,
                **_span(self.segment, self.start, self.audio_end), **({"streaming": True} if self.streaming else {})}


@dataclass(frozen=True)
class FinalEvent:
    """A closed segment's final text; `latency` is from the end of its speech to this event."""

    type: ClassVar[str] = "final"
    segment: int
    start: float
    audio_end: float
    text: str
    latency: float
    language: str | None = None
    """The language the engine heard (detected, or the one the session asked for), when it says."""
    words: tuple[Word, ...] = ()
    """The text's words with their times in stream seconds, when the session asked for word timestamps."""
    speaker: str | None = None
    """Who spoke it, when speaker labels are on and the speaker model was done first (else a `speaker` event
    follows)."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """The text's tokens with their log probabilities, when the session asked for them."""

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "text": self.text, "latency": round(self.latency, 3),
                **_span(self.segment, self.start, self.audio_end),
                **({"language": self.language} if self.language else {}),
                **({"speaker": self.speaker} if self.speaker else {}),
                **({"words": [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                              for w in self.words]} if self.words else {})}


@dataclass(frozen=True)
class SpeakerEvent:
    """Who spoke a closed segment, once the speaker model has heard it (it may follow the segment's final by a
    moment); `turns` (start, end, speaker) where the speaker changes inside the segment. `revised`: a later label
    for a segment already labelled, as when two voices first taken for two speakers turn out to be one."""

    type: ClassVar[str] = "speaker"
    segment: int
    speaker: str
    turns: tuple[tuple[float, float, str], ...] = ()
    revised: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "segment": self.segment, "speaker": self.speaker,
                **({"turns": [{"start": round(a, 3), "end": round(b, 3), "speaker": w} for a, b, w in self.turns]}
                   if len(self.turns) > 1 else {}),
                **({"revised": True} if self.revised else {})}


@dataclass(frozen=True)
class ErrorEvent:
    """A closed segment that has no text because the engine failed on it; `message` says why."""

    type: ClassVar[str] = "error"
    segment: int
    start: float
    audio_end: float
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, **_span(self.segment, self.start, self.audio_end)}


@dataclass(frozen=True)
class ClosedEvent:
    """The server ended the session (`reason`: idle, time limit, shutdown); `message` is for the user."""

    type: ClassVar[str] = "closed"
    reason: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "reason": self.reason, "message": self.message}


Event = SpeechStarted | SpeechStopped | PartialEvent | FinalEvent | SpeakerEvent | ErrorEvent | ClosedEvent
PAGE_EVENTS = (SpeechStarted, SpeechStopped, PartialEvent, FinalEvent, SpeakerEvent, ErrorEvent, ClosedEvent)
"""The events the page and the `/events` stream carry: all of them, so that a client learns of a segment when it
opens, before any partial (under load a segment may get none) and not only when its final arrives."""
