"""The engine contract: 16 kHz mono float32 audio and options in, text and metadata out.

`Engine` declares everything the worker, the file path and the API may ask of an engine, capabilities
included. `EngineBase` holds what every engine does the same way: the digital-silence answer, the
quiet-voice gain of the model's copy, cutting audio over 30 s at quiet points (for engines that do not
take long audio themselves), the one-clip, batch and stream adapters. An engine subclasses it and
writes only its own decoding (`_decode`, and `_decode_batch` / `_decode_stream` where it batches or
streams). Engines are shared by all sessions of a process; every method is safe to await from the
event loop (blocking work goes to a thread or another process).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from ..audio import SAMPLE_RATE, split_at_quiet
from . import policy
from .types import EngineError, EngineUnavailable, TimedText, TranscribeOptions, Transcription

WHISPER_LANGUAGES: tuple[str, ...] = (
    "af", "am", "ar", "as", "az", "ba", "be", "bg", "bn", "bo", "br", "bs", "ca", "cs", "cy", "da", "de", "el", "en",
    "es", "et", "eu", "fa", "fi", "fo", "fr", "gl", "gu", "ha", "haw", "he", "hi", "hr", "ht", "hu", "hy", "id", "is",
    "it", "ja", "jw", "ka", "kk", "km", "kn", "ko", "la", "lb", "ln", "lo", "lt", "lv", "mg", "mi", "mk", "ml", "mn",
    "mr", "ms", "mt", "my", "ne", "nl", "nn", "no", "oc", "pa", "pl", "ps", "pt", "ro", "ru", "sa", "sd", "si", "sk",
    "sl", "sn", "so", "sq", "sr", "su", "sv", "sw", "ta", "te", "tg", "th", "tk", "tl", "tr", "tt", "uk", "ur", "uz",
    "vi", "yi", "yo", "zh", "yue",
)
"""The language codes of multilingual Whisper models, as their tokenizers name them."""

MAX_CLIP_S = 30.0
"""Whisper's window: engines without long-form decoding get audio cut to at most this."""


@runtime_checkable
class Engine(Protocol):
    name: str
    """Short engine kind, e.g. "embedded"."""
    timestamps: bool
    """Whether a request with `TranscribeOptions.timestamps` gets Whisper's timed pieces of the clip (else the
    file path sends timed formats segment by segment, each segment one piece)."""
    max_batch_size: int
    """How many requests the worker hands over at once."""
    abortable: bool
    """Whether cancelling a request's task stops its decoding (the worker then runs one task per job, so that
    a stale partial can be withdrawn while the others go on)."""
    streaming: bool
    """Whether `transcribe_stream` gives text while decoding (else it gives the whole text at the end)."""
    multilingual: bool
    """Whether the model knows Whisper's languages (else English only)."""
    translates: bool
    """Whether `task="translate"` is honoured: a multilingual model trained to translate (see `translating`)."""
    word_timestamps: bool
    """Whether a request with `TranscribeOptions.word_timestamps` gets each word's times (`TimedText.words`)."""
    logprobs: bool
    """Whether a request with `TranscribeOptions.logprobs` gets each text token's log probability
    (`Transcription.logprobs`, and `Word.logprobs` where words are timed); a request for them to an engine that
    cannot give them fails with `unsupported_logprobs`'s reason."""
    languages: tuple[str, ...]
    """The language codes a request may name (`("en",)` for an English-only model); the model detects the
    language of a request that names none."""
    ready: bool
    """Whether requests are served now (weights loaded, an endpoint or a fallback reachable)."""

    async def start(self) -> None:
        """Load weights / connect; called once before the first request."""

    async def transcribe(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription: ...

    async def transcribe_batch(
        self, audios: Sequence[np.ndarray], options: Sequence[TranscribeOptions]
    ) -> list[Transcription | BaseException]:
        """Several clips at once (engines that batch do it in one pass); errors are returned per clip."""
        ...

    def transcribe_stream(self, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
        """Text deltas of one clip; joined, they are its text. Closing the iterator early abandons the request."""
        ...

    async def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """Engine, model and effective settings, shown on the page and in health information."""
        ...


def english_only(model_name: str) -> bool:
    """Whether a model name is one of Whisper's English-only models (tiny.en, base.en, ...)."""
    return re.search(r"\.en\b", model_name) is not None


def translating(model_name: str) -> bool:
    """Whether a model name is one trained to translate: not English-only, and not large-v3-turbo, whose
    fine-tuning on transcription alone took translation away (OpenAI's model card says so)."""
    return not english_only(model_name) and re.search(r"turbo", model_name, re.IGNORECASE) is None


def unsupported_translation(engine: Engine) -> str | None:
    """Why the engine's model cannot translate, said plainly, or None when it can."""
    if engine.translates:
        return None
    model = engine.describe().get("model")
    if not engine.multilingual:
        return (f"the model {model} is English-only and cannot translate; use /v1/audio/transcriptions or a "
                "multilingual model")
    return (f"the model {model} was not trained to translate (it transcribes its languages); use "
            "/v1/audio/transcriptions, or a model that translates (large-v3, medium, base)")


def unsupported_language(language: str, engine: Engine) -> str | None:
    """Why the engine's model cannot transcribe `language`, said plainly, or None when it can (the HTTP and the
    Realtime API refuse such a request with this message)."""
    languages = engine.languages
    if language in languages:
        return None
    model = engine.describe().get("model")
    if tuple(languages) == ("en",):
        return (f"the model {model} is English-only and cannot transcribe language {language!r}; leave language "
                "out, or run a multilingual model (--model base)")
    return f"the model {model} does not know language {language!r} (it knows {', '.join(languages)})"


def unsupported_logprobs(engine: Engine) -> str | None:
    """Why the engine cannot give token log-probabilities, said plainly, or None when it can (the HTTP and the
    Realtime API refuse a request for them with this message; an engine asked anyway fails the request)."""
    if engine.logprobs:
        return None
    described = engine.describe()
    if described.get("beam_size", 1) > 1:
        return (f"log-probabilities come from greedy decoding; this {engine.name} engine decodes with beam size "
                f"{described['beam_size']} (start it with --beam-size 1)")
    return f"the {engine.name} engine does not give token log-probabilities"


def as_clip(audio: np.ndarray) -> np.ndarray:
    """The samples as a 1-D float32 array; anything but mono audio is an error."""
    clip = np.asarray(audio, dtype=np.float32)
    if clip.ndim > 2 or (clip.ndim == 2 and 1 not in clip.shape):
        raise EngineError(f"audio must be mono samples (got an array of shape {clip.shape})")
    return clip.reshape(-1)


class EngineBase:
    """The shared part of every engine; see the module docstring."""

    name: ClassVar[str] = "engine"
    timestamps: bool = False
    max_batch_size: int = 1
    abortable: bool = False
    streaming: bool = False
    long_form: ClassVar[bool] = False
    """Whether `_decode` takes audio over `MAX_CLIP_S` itself (else the base cuts it at quiet points)."""
    language: str | None = None
    """The default language, reported for answers that need no decoding."""
    word_timestamps: bool = False

    @property
    def logprobs(self) -> bool:
        return False

    @property
    def multilingual(self) -> bool:
        return False

    @property
    def translates(self) -> bool:
        return False

    @property
    def languages(self) -> tuple[str, ...]:
        """Whisper's languages on a multilingual model, else English only."""
        return WHISPER_LANGUAGES if self.multilingual else ("en",)

    @property
    def ready(self) -> bool:
        return True

    # -- what an engine writes
    async def _decode(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        """One clip that is not digital silence (at most `MAX_CLIP_S` unless `long_form`), quiet voices raised."""
        raise NotImplementedError

    async def _decode_batch(
        self, audios: list[np.ndarray], options: list[TranscribeOptions]
    ) -> list[Transcription | BaseException]:
        """Several such clips; by default one `_decode` each, all at once."""
        return list(await asyncio.gather(*(self._decode(a, o) for a, o in zip(audios, options, strict=True)),
                                         return_exceptions=True))

    async def _decode_stream(self, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
        """Text deltas of one such clip; by default its whole text once."""
        yield (await self._decode(audio, options)).text

    # -- the contract
    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name}

    def silent(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription | None:
        """The answer for digital silence (no decoding: Whisper invents text for it), else None."""
        if not policy.is_silent(audio):
            return None
        return Transcription(text="", language=options.language or self.language, duration=audio.size / SAMPLE_RATE,
                             logprobs=() if options.logprobs else None)

    async def transcribe(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        result = (await self.transcribe_batch([audio], [options]))[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def transcribe_batch(
        self, audios: Sequence[np.ndarray], options: Sequence[TranscribeOptions]
    ) -> list[Transcription | BaseException]:
        opts = list(options)
        clips: list[np.ndarray] = []
        results: list[Transcription | BaseException | None] = []
        for audio, o in zip(audios, opts, strict=True):
            try:
                if o.logprobs and (why := unsupported_logprobs(self)):  # type: ignore[arg-type]
                    raise EngineError(why)
                clips.append(as_clip(audio))
                results.append(self.silent(clips[-1], o))
            except EngineError as exc:
                clips.append(np.zeros(0, dtype=np.float32))
                results.append(exc)
        todo = [i for i, r in enumerate(results) if r is None]
        whole = [i for i in todo if self.long_form or clips[i].size <= MAX_CLIP_S * SAMPLE_RATE]
        if whole:
            decoded = await self._decode_batch([policy.normalise(clips[i]) for i in whole], [opts[i] for i in whole])
            for i, result in zip(whole, decoded, strict=True):
                results[i] = result
        for i in set(todo) - set(whole):
            try:
                results[i] = await self._pieces(clips[i], opts[i])
            except Exception as exc:
                results[i] = exc
        return [r for r in results if r is not None]

    async def _pieces(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        """Audio over `MAX_CLIP_S`, cut at quiet points, decoded piece by piece; one timed segment per piece."""
        pieces = split_at_quiet(audio, MAX_CLIP_S)
        results = await self.transcribe_batch(pieces, [options] * len(pieces))
        for r in results:
            if isinstance(r, BaseException):
                raise r
        done = [r for r in results if isinstance(r, Transcription)]
        offset, segments = 0.0, []
        for piece, result in zip(pieces, done, strict=True):
            if result.text:
                segments.append(TimedText(offset, offset + piece.size / SAMPLE_RATE, result.text,
                                          logprobs=result.logprobs))
            offset += piece.size / SAMPLE_RATE
        scored = all(r.logprobs is not None for r in done) and options.logprobs
        return Transcription(
            text=" ".join(s.text for s in segments), language=done[0].language, duration=audio.size / SAMPLE_RATE,
            segments=tuple(segments), engine_seconds=max(r.engine_seconds for r in done),
            extra={"pieces": len(pieces)},
            logprobs=tuple(t for r in done for t in r.logprobs or ()) if scored else None,
        )

    async def transcribe_stream(self, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
        audio = as_clip(audio)
        pieces = [audio] if self.long_form else split_at_quiet(audio, MAX_CLIP_S)
        spoken = False
        for piece in pieces:
            if self.silent(piece, options) is not None:
                continue
            first = True
            async for delta in self._decode_stream(policy.normalise(piece), options):
                if delta:
                    yield (" " if spoken and first else "") + delta
                    first = False
            spoken = spoken or not first


__all__ = ["MAX_CLIP_S", "WHISPER_LANGUAGES", "Engine", "EngineBase", "EngineError", "EngineUnavailable", "TimedText",
           "TranscribeOptions", "Transcription", "as_clip", "english_only", "unsupported_language",
           "unsupported_logprobs"]
