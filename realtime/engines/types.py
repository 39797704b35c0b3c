"""What engines take and give: request options, transcriptions, and the errors a user may see."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

LANE_HEADER = "X-Transcription-Lane"
"""The request header by which the remote engine marks a live final (`final`) for an endpoint that is this app or
its pool, which puts such requests ahead of file work (realtime/web/api.py)."""
CLIP_HEADER = "X-Transcription-Clip"
"""The request header (`checked`) by which the remote engine asks an endpoint that is this app or its pool to decode
the upload whole, as its own file path decodes a packed window to check it for coverage (no second VAD cut),
and to answer `verbose_json` with the times it has: words where its engine aligns them (realtime/web/api.py)."""
APP_OWNER = "realtime-transcription"
"""`owned_by` of this app's /v1/models entry: how the remote engine knows an endpoint is this app or its pool."""


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    """ISO code; None lets a multilingual model detect it (English-only models always use English)."""
    task: Literal["transcribe", "translate"] = "transcribe"
    prompt: str | None = None
    vocabulary: tuple[str, ...] = ()
    """Terms (names, jargon) the speech may hold: Whisper reads them before the audio, ahead of `prompt`, as
    faster-whisper's `hotwords` (`whisper_prompt`)."""
    temperature: float | None = None
    """None: greedy with the engine's temperature fallback; a number: that temperature only."""
    partial: bool = False
    """A partial hypothesis of a still-open segment: cheapest decoding, no fallback."""
    timestamps: bool = False
    """Ask for timed sub-segments (used by verbose formats)."""
    word_timestamps: bool = False
    """Ask for each word's times (`TimedText.words`), on engines that declare `word_timestamps`."""
    live: bool = False
    """A live session's final (the worker sets it): someone is waiting for it as they speak. Engines that queue
    requests elsewhere pass it on (the remote engine asks its endpoint for the finals lane); others ignore it."""
    fallback: bool = True
    """False: a decode the policy rejects is not tried again at a higher temperature; it is returned as it is, marked
    rejected (`policy.rejected`), for a caller with a better fallback (a packed window's segments decoded alone).
    Engines that cannot mark a result fall back as usual."""
    logprobs: bool = False
    """Ask for each text token's log probability (`Transcription.logprobs`), on engines that declare `logprobs`."""
    coverage: bool = False
    """Times are asked only to check that the text covers the clip's speech (realtime/live/coverage.py): an engine may
    answer with word times instead of timed pieces (the remote engine asks an endpoint that is this app to decode
    the clip as its own file path would)."""

    @property
    def terms(self) -> str | None:
        """The vocabulary as the text Whisper reads, or None: a sentence of its own, so that Whisper does not take
        the speech for its continuation (with "Linnell" before it, "Linnell's pictures..." lost its first word)."""
        if not self.vocabulary:
            return None
        text = ", ".join(self.vocabulary)
        return text if text[-1] in ".!?" else text + "."

    @property
    def whisper_prompt(self) -> str | None:
        """What an engine puts before the audio as Whisper's previous text: the vocabulary's terms, then the prompt
        (the order faster-whisper gives `hotwords` and `initial_prompt`). Every engine that takes a prompt takes
        this."""
        parts = [p for p in (self.terms, (self.prompt or "").strip()) if p]
        return " ".join(parts) if parts else None


@dataclass(frozen=True)
class TokenLogprob:
    """One text token of a decode and its log probability as the model gave it, in OpenAI's shape: the token's
    text, and its UTF-8 bytes (a token may hold part of a character)."""

    token: str
    logprob: float
    bytes: tuple[int, ...]


@dataclass(frozen=True)
class Word:
    """One spoken word and when it was said, in seconds from the start of the clip; `word` keeps Whisper's
    leading space (joined, a piece's words are its text)."""

    start: float
    end: float
    word: str
    probability: float | None = None
    logprobs: tuple[TokenLogprob, ...] = ()
    """The word's tokens with their log probabilities, when they were asked for."""


@dataclass(frozen=True)
class TimedText:
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()
    """The piece's words with their times, when they were asked for and the engine gives them."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """The piece's tokens with their log probabilities, when they were asked for."""


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
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Every token of `text` with its log probability, in order, when they were asked for (`TranscribeOptions.
    logprobs`); None when they were not."""

    @property
    def words(self) -> tuple[Word, ...]:
        """Every timed word of the clip, in order (empty unless word timestamps were asked for)."""
        return tuple(w for s in self.segments for w in s.words)


class EngineError(RuntimeError):
    """An engine failed on a request; the message is safe to show to a user."""


class EngineUnavailable(EngineError):
    """The engine cannot take requests now (endpoints down, still loading); try again in `retry_after` s."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after
