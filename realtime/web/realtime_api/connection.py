"""One Realtime connection: its events in and out, turned into a live `TranscriptionSession` of the shared service
(server VAD items and their deltas, or manual commits of buffered audio).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...audio import SAMPLE_RATE
from ...engines import Transcription
from ...engines import logprobs as lp
from ...engines.types import TokenLogprob
from ...live.denoise import Denoiser
from ...live.events import ClosedEvent, ErrorEvent, Event, FinalEvent, PartialEvent, SpeechStarted, SpeechStopped
from ...live.service import TranscriptionService
from ...live.session import TranscriptionSession
from ...live.worker import Job
from .protocol import (
    LOGPROBS,
    MANUAL_MAX_S,
    MAX_EVENT_BYTES,
    MIN_COMMIT_S,
    UNSUPPORTED_EVENTS,
    AudioInput,
    Config,
    EventError,
    _id,
    _words,
    apply_update,
    as_beta,
    beta_param,
    from_beta,
    remainder,
)


@dataclass
class _Item:
    id: str
    sent: list[str] = field(default_factory=list)
    discarded: bool = False
    said: list[dict[str, Any]] = field(default_factory=list)
    """The logprobs sent with its deltas, when the session asks for them: together they spell its transcript."""


class RealtimeConnection:
    """One client (a WebSocket, or a WebRTC call's data channel): client events in, the session's events out as
    OpenAI's server events through `send_text`."""

    def __init__(self, service: TranscriptionService, config: Config, expires_at: int,
                 send_text: Callable[[str], Awaitable[None]]) -> None:
        self.send_text = send_text
        self.service = service
        self.id = _id("sess")
        self.config = config
        self.expires_at = expires_at
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.session: TranscriptionSession | None = None
        self.audio = AudioInput(config.format)
        self.audio_started = False
        self.items: dict[int, _Item] = {}
        self.last_item: str | None = None
        self.manual: list[np.ndarray] = []
        self.manual_samples = 0
        self.manual_index = 0
        self.closed_reason: ClosedEvent | None = None
        self._full_said = False
        self.denoiser: Denoiser | None = None
        self._held = np.zeros(0, dtype=np.float32)  # audio whose denoised copy the denoiser still holds

    # -- output
    def send(self, event: dict[str, Any]) -> None:
        self.outbox.put_nowait({"event_id": _id("event"), **event})

    def error(self, message: str, code: str, param: str | None = None, event_id: str | None = None,
              kind: str = "invalid_request_error") -> None:
        self.send({"type": "error", "error": {"type": kind, "code": code, "message": message, "param": param,
                                              "event_id": event_id}})

    async def sender(self) -> None:
        while True:
            event = await self.outbox.get()
            if event is None:
                return
            await self.send_text(json.dumps(event, ensure_ascii=False))

    # -- the pipeline session
    def open(self) -> None:
        s = self.service.settings
        self.session = self.service.open_session(self.id, self.on_event, vad_config=self.config.vad_config(
            s.vad_config()), speakers=False, source="realtime",  # OpenAI's Realtime events have no speaker
            turn=self.config.turn_config())
        self._apply_options()

    def _apply_options(self) -> None:
        assert self.session is not None
        language = self.config.language or self.service.settings.language
        vocabulary = self.config.vocabulary
        if vocabulary is None:
            vocabulary = self.service.settings.vocabulary_terms
        self.session.options = dataclasses.replace(self.session.options, language=language, prompt=self.config.prompt,
                                                   logprobs=LOGPROBS in self.config.include, vocabulary=vocabulary)
        wanted = (self.config.noise_reduction or {}).get("type")
        if (self.denoiser.field if self.denoiser else None) != wanted:
            if self.denoiser is not None:  # what the old one still holds goes on as it was heard
                self._denoised(self.denoiser.flush())
                self.denoiser.close()
            self.denoiser = Denoiser(wanted) if wanted else None

    def close(self) -> None:
        if self.session is not None:
            if self.denoiser is not None:  # the end of the stream it still holds
                self._denoised(self.denoiser.flush())
            self.service.close_session(self.id)
            self.session = None
        if self.denoiser is not None:
            self.denoiser.close()
            self.denoiser = None

    # -- session events to server events
    def on_event(self, event: Event) -> None:
        if isinstance(event, ClosedEvent):
            self.closed_reason = event
            self.error(event.message, event.reason, kind="server_error")
            self.outbox.put_nowait(None)
            return
        if not self.config.vad:
            return  # manual mode: the segmenter only keeps the limits informed; commits make the items
        if isinstance(event, SpeechStarted):
            item = self.items[event.segment] = _Item(_id("item"))
            start_ms = max(0, round(event.start * 1000) - self.config.prefix_padding_ms)
            self.send({"type": "input_audio_buffer.speech_started", "audio_start_ms": start_ms, "item_id": item.id})
            return
        item = self.items.get(event.segment)
        if item is None or item.discarded:
            if isinstance(event, FinalEvent | ErrorEvent):
                self.items.pop(event.segment, None)
            return
        if isinstance(event, PartialEvent):
            self._delta(item, _words(event.committed), event.logprobs)
        elif isinstance(event, SpeechStopped):
            self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": round(event.audio_end * 1000),
                       "item_id": item.id})
            self._committed(item.id)
        elif isinstance(event, FinalEvent):
            del self.items[event.segment]
            self._complete(item, event.text, self._seconds(event.audio_end - event.start), event.logprobs)
        elif isinstance(event, ErrorEvent):
            del self.items[event.segment]
            self._failed(item.id, event.message)

    def _seconds(self, speech: float) -> float:
        cfg = self.config.vad_config(self.service.settings.vad_config())
        return round(speech + (cfg.pad_before_ms + cfg.pad_after_ms) / 1000, 3)

    def _committed(self, item_id: str) -> None:
        self.send({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": self.last_item})
        self.last_item = item_id

    def _delta(self, item: _Item, words: list[str],
               by_word: Sequence[tuple[TokenLogprob, ...]] | None = None) -> None:
        """Committed words past those already sent (never taking any back); with the session's `include`, their
        tokens (`by_word`: the tokens of each of `words`, by position) with their log probabilities."""
        n = len(item.sent)
        if len(words) <= n or words[:n] != item.sent:
            return
        new = words[n:]
        scored: dict[str, Any] = {}
        if LOGPROBS in self.config.include:
            if by_word is None or len(by_word) < len(words):
                return  # a hypothesis without its tokens: its words go with the next one's, or with the final's
            scored["logprobs"] = lp.as_json(t for w in by_word[n:len(words)] for t in w)
            item.said += scored["logprobs"]
        self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item.id,
                   "content_index": 0, "delta": (" " if n else "") + " ".join(new), **scored})
        item.sent.extend(new)

    def _complete(self, item: _Item, text: str, seconds: float,
                  logprobs: tuple[TokenLogprob, ...] | None = None) -> None:
        rest = remainder(item.sent, text)
        if rest:  # the rest's tokens, placed as `_delta` reads them: by position among the words sent and the rest
            words = _words(text)
            by_word = None if logprobs is None else \
                [()] * len(item.sent) + lp.by_words(words, lp.within(text, logprobs))[len(words) - len(rest):]
            self._delta(item, item.sent + rest, by_word)
        self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id,
                   "content_index": 0, "transcript": " ".join(item.sent),
                   **({"logprobs": item.said} if LOGPROBS in self.config.include else {}),
                   "usage": {"type": "duration", "seconds": seconds}})

    def _failed(self, item_id: str, message: str) -> None:
        self.send({"type": "conversation.item.input_audio_transcription.failed", "item_id": item_id,
                   "content_index": 0, "error": {"type": "server_error", "code": "transcription_failed",
                                                 "message": message, "param": None}})

    # -- client events
    def receive(self, text: str | None) -> None:
        """One client message: handled, or answered with an `error` (with the client's event_id if it gave one)."""
        client_id = None
        try:
            if text is None:
                raise EventError("send events as JSON text frames, not binary", "invalid_event")
            if len(text) <= MAX_EVENT_BYTES:
                try:
                    doc = json.loads(text)
                    client_id = doc.get("event_id") if isinstance(doc, dict) else None
                except ValueError:
                    pass
            self.handle(text)
        except EventError as exc:
            self.error(exc.message, exc.code, exc.param, client_id if isinstance(client_id, str) else None)

    def handle(self, text: str) -> None:
        if len(text) > MAX_EVENT_BYTES:
            raise EventError(f"the event ({len(text) / 2**20:.1f} MiB) is larger than the limit of "
                             f"{MAX_EVENT_BYTES / 2**20:.0f} MiB", "event_too_large")
        try:
            event = json.loads(text)
        except ValueError as exc:
            raise EventError(f"the event is not valid JSON ({exc})", "invalid_json") from None
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise EventError("an event must be a JSON object with a string 'type'", "invalid_event", "type")
        kind = event["type"]
        if kind == "session.update":
            self.update(event.get("session"))
        elif kind == "transcription_session.update":  # the beta API's form, still sent by older clients
            self.update(from_beta(event.get("session")), beta=True)
        elif kind == "input_audio_buffer.append":
            self.append(event.get("audio"))
        elif kind == "input_audio_buffer.commit":
            self.commit()
        elif kind == "input_audio_buffer.clear":
            self.clear()
        elif kind in UNSUPPORTED_EVENTS:
            raise EventError(f"{kind} is not supported in a transcription session", "unsupported_event", "type")
        else:
            raise EventError(f"unknown event type {kind!r}; a transcription session takes session.update and "
                             "input_audio_buffer.append, .commit and .clear", "invalid_value", "type")

    def update(self, session: Any, beta: bool = False) -> None:
        try:
            new = apply_update(self.config, session, self.audio_started, self.service.engine)
        except EventError as exc:
            if beta:
                exc.param = beta_param(exc.param)
            raise
        old, self.config = self.config, new
        if new.format != old.format:
            self.audio = AudioInput(new.format)
        if new.turn_detection != old.turn_detection:
            self.close()  # no audio yet: the session starts again with the new VAD settings
            self.open()
        else:
            self._apply_options()
        shown = self.config.as_session(self.id, self.expires_at)
        if beta:
            self.send({"type": "transcription_session.updated", "session": as_beta(shown)})
        else:
            self.send({"type": "session.updated", "session": shown})

    def append(self, audio: Any) -> None:
        if not isinstance(audio, str):
            raise EventError("audio must be a base64 string", "invalid_type", "audio")
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError("audio is not valid base64", "invalid_value", "audio") from None
        if self.session is not None:
            self.feed(self.audio(raw))

    def feed(self, samples: np.ndarray) -> None:
        """16 kHz mono float32 into the session (server VAD) or the manual buffer, through the denoiser when the
        session asks for noise reduction."""
        if self.session is None or not samples.size:
            return
        self.audio_started = True
        if self.denoiser is None:
            self._take(samples)
            return
        self._held = np.concatenate([self._held, samples]) if self._held.size else samples
        self._denoised(self.denoiser.process(samples))

    def _denoised(self, heard: np.ndarray) -> None:
        """The denoiser's next output goes to the VAD's ears beside the audio it stands for, which the engine gets:
        Whisper reads noisy speech better than a denoiser's output of it (docs/realtime-api.md)."""
        samples, self._held = self._held[:heard.size], self._held[heard.size:]
        self.service.denoised_seconds += heard.size / SAMPLE_RATE
        self._take(samples, heard)

    def _take(self, samples: np.ndarray, heard: np.ndarray | None = None) -> None:
        if self.session is None or not samples.size:
            return
        if self.config.vad:
            self.session.feed(samples, heard)
            return
        if (self.manual_samples + samples.size) / SAMPLE_RATE > MANUAL_MAX_S:
            if self._full_said:
                return
            self._full_said = True  # once until the next commit or clear (a media track sends 50 frames a second)
            raise EventError(f"the input audio buffer holds at most {MANUAL_MAX_S:g} s without turn detection; "
                             "commit or clear it first (this audio was dropped)", "input_audio_buffer_full", "audio")
        self.manual.append(samples)
        self.manual_samples += samples.size
        self.session.segmenter.feed(samples, heard)  # only for the limits (idle, stale audio): no items from it

    def commit(self) -> None:
        session = self.session
        if session is None:
            return
        if self.denoiser is not None:  # the last few milliseconds it holds belong to this commit
            self._denoised(self.denoiser.flush())
        if self.config.vad:
            if not session.segmenter.announced:
                raise EventError("buffer too small: there is no speech in the input audio buffer to commit",
                                 "input_audio_buffer_commit_empty")
            session.flush()  # the open segment closes now: speech_stopped, committed, then its final
            return
        if self.manual_samples < MIN_COMMIT_S * SAMPLE_RATE:
            raise EventError(f"buffer too small: a commit needs at least {MIN_COMMIT_S * 1000:.0f} ms of audio, the "
                             f"buffer has {self.manual_samples / SAMPLE_RATE * 1000:.0f} ms",
                             "input_audio_buffer_commit_empty")
        audio = np.concatenate(self.manual)
        self.manual, self.manual_samples, self._full_said = [], 0, False
        item = _Item(_id("item"))
        self._committed(item.id)
        self.manual_index += 1
        future = session.worker.submit(Job(self.id, -self.manual_index, audio, "final", session.options))
        seconds = round(audio.size / SAMPLE_RATE, 3)
        future.add_done_callback(lambda f: self._manual_done(item, seconds, f))

    def _manual_done(self, item: _Item, seconds: float, future: asyncio.Future[Transcription]) -> None:
        if future.cancelled() or self.session is None:
            return
        exc = future.exception()
        if exc is not None:
            self._failed(item.id, str(exc))
        else:
            self._complete(item, future.result().text, seconds, future.result().logprobs)

    def clear(self) -> None:
        if self.denoiser is not None:  # cleared with the rest
            self.denoiser.flush()
            self._held = np.zeros(0, dtype=np.float32)
        session = self.session
        if session is not None and self.config.vad and session.segmenter.announced:
            open_item = self.items.get(session.segmenter.segment)
            if open_item is not None:
                open_item.discarded = True
            session.flush()
        self.manual, self.manual_samples, self._full_said = [], 0, False
        self.send({"type": "input_audio_buffer.cleared"})
