"""OpenAI's Realtime API for transcription sessions: `GET /v1/realtime` upgraded to a WebSocket.

This module owns the WebSocket route and the translation between OpenAI's realtime events (the shapes of the
openai SDK's `openai.types.realtime`) and the app's live pipeline. Each connection is one
`TranscriptionSession` of the shared `TranscriptionService` (the page's sessions, same engine, worker and
batching); nothing here transcribes by itself.

Client events: `session.update` (a session of `type` `transcription`, or the beta API's
`transcription_session.update`, answered with `transcription_session.updated`: `audio.input.format` `audio/pcm` at
24 kHz, `audio/pcmu` or `audio/pcma` at 8 kHz; `audio.input.transcription` `model`, `language`, `prompt`;
`audio.input.turn_detection` `server_vad` with `threshold`, `prefix_padding_ms`, `silence_duration_ms`, or
`null` for manual commits; `noise_reduction` and `include` are accepted, echoed and ignored),
`input_audio_buffer.append` (base64 audio), `.commit`, `.clear`.

Server events: `session.created` (first), `session.updated`, `input_audio_buffer.speech_started`,
`.speech_stopped`, `.committed`, `.cleared`, `conversation.item.input_audio_transcription.delta` (append-only:
the words LocalAgreement has committed, as they settle, then the rest of the final text; their concatenation
is the `.completed` transcript), `.completed` (with `usage` in seconds of audio), `.failed` (the engine failed on
that item), and `error` for a bad, unknown, oversized or malformed event (the session goes on).

With server VAD the session's own VAD cuts items and deltas flow while the person speaks. With
`turn_detection: null` the audio is buffered here (at most `MANUAL_MAX_S`) and `commit` sends it to the
shared worker as one final; the session's segmenter still hears it, so the demo limits (idle, stale audio)
judge the session as they judge the page's.

Authentication (`--api-key`): `Authorization: Bearer <key>`, the subprotocol form the SDKs use in browsers
(`openai-insecure-api-key.<key>`), or an ephemeral secret from `POST /v1/realtime/client_secrets`; anything
else is refused with 401 before the WebSocket is accepted. Sessions count against `--concurrency-limit`
(refused with 503 when the live sessions, the page's included, reach it).

Per client address (realtime/signalling.py's `ClientLimiter`, the page's rules: `--max-connections-per-client`,
`--max-new-connections-per-minute`, `--client-ip-header`), the WebSocket and `POST /v1/realtime/calls` share a cap
on open sessions and on new ones per minute, counted apart from the page's WebRTC connections; a session's slot is
freed when it closes (a call's on hangup or when its peer connection ends). Minting client secrets has the
per-minute cap of its own. Over a cap is a 429 with Retry-After and OpenAI's error shape (`rate_limit_error`),
for the WebSocket before it is accepted, and before the key is checked (a refused attempt spends no secret).

A `language` the engine's model does not know (any but `en` on an English-only model) is an `error` with code
`unsupported_language` (400 on the HTTP routes) and the session keeps its language.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import difflib
import json
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect, WebSocketState

from .access import bearer, is_key
from .audio import SAMPLE_RATE, FrameConverter
from .engines import Engine, Transcription
from .engines.base import unsupported_language
from .events import ClosedEvent, ErrorEvent, Event, FinalEvent, PartialEvent, SpeechStarted, SpeechStopped
from .service import TranscriptionService
from .session import TranscriptionSession
from .signalling import ClientLimiter, OfferError
from .vad import VADConfig
from .worker import Job

log = logging.getLogger(__name__)

MAX_EVENT_BYTES = 15 * 1024 * 1024
"""Largest client event accepted (OpenAI's limit for one append); bigger ones get an `error`. (uvicorn itself
closes the connection on frames over 16 MiB.)"""
MANUAL_MAX_S = 30.0
"""Most audio one manual commit may hold (Whisper's window); appends beyond it get an `error`."""
MIN_COMMIT_S = 0.1
"""A commit needs at least this much audio (OpenAI's rule)."""
SUBPROTOCOL_KEY = "openai-insecure-api-key."
SECRET_TTL_S = 600
SECRET_TTL_RANGE = (10, 7200)
_LANGUAGE = re.compile(r"^[a-z]{2,3}$")
MAX_PROMPT_CHARS = 4000
FORMAT_RATES = {"audio/pcm": 24000, "audio/pcmu": 8000, "audio/pcma": 8000}
UNSUPPORTED_EVENTS = {"response.create", "response.cancel", "conversation.item.create", "conversation.item.delete",
                      "conversation.item.retrieve", "conversation.item.truncate", "output_audio_buffer.clear"}
"""Client events of conversation sessions: answered with an `error`, since these sessions only transcribe."""


def _id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


# -- G.711 (ITU-T G.711 decoding, as tables of the 256 code words)
def _ulaw_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 7, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return (np.where(u & 0x80, -magnitude, magnitude) / 32768.0).astype(np.float32)


def _alaw_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent, mantissa = (a >> 4) & 7, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    return (np.where(a & 0x80, magnitude, -magnitude) / 32768.0).astype(np.float32)


ULAW = _ulaw_table()
ALAW = _alaw_table()


class AudioInput:
    """Base64 chunks of one input format to 16 kHz mono float32 (a PCM16 byte split across appends is kept)."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        self.rate = FORMAT_RATES[fmt]
        self._convert = FrameConverter()
        self._carry = b""

    def __call__(self, raw: bytes) -> np.ndarray:
        if self.format == "audio/pcm":
            raw, self._carry = self._carry + raw, b""
            if len(raw) % 2:
                raw, self._carry = raw[:-1], raw[-1:]
            samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
        else:
            table = ULAW if self.format == "audio/pcmu" else ALAW
            samples = table[np.frombuffer(raw, dtype=np.uint8)]
        if not samples.size:
            return samples
        return self._convert(self.rate, samples)


class EventError(Exception):
    """A client event that is answered with an `error` event."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.param = message, code, param


@dataclass
class Config:
    """The effective session configuration, as `session.created` / `session.updated` show it."""

    format: str = "audio/pcm"
    model: str = "whisper-1"
    language: str | None = None
    prompt: str | None = None
    vad: bool = True
    threshold: float = 0.5
    prefix_padding_ms: int = 200
    silence_duration_ms: int = 400
    noise_reduction: dict[str, Any] | None = None
    include: list[str] = field(default_factory=list)

    def vad_config(self, base: VADConfig) -> VADConfig:
        return dataclasses.replace(
            base, threshold=self.threshold, neg_threshold=min(base.neg_threshold, self.threshold),
            pad_before_ms=self.prefix_padding_ms, min_silence_ms=self.silence_duration_ms,
            pad_after_ms=min(base.pad_after_ms, self.silence_duration_ms))

    def as_session(self, session_id: str, expires_at: int) -> dict[str, Any]:
        fmt: dict[str, Any] = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = 24000
        turn = ({"type": "server_vad", "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                 "silence_duration_ms": self.silence_duration_ms} if self.vad else None)
        return {
            "type": "transcription", "id": session_id, "object": "realtime.transcription_session",
            "expires_at": expires_at, "include": list(self.include),
            "audio": {"input": {
                "format": fmt, "noise_reduction": self.noise_reduction, "turn_detection": turn,
                "transcription": {"model": self.model, "language": self.language, "prompt": self.prompt},
            }},
        }


def _dict(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EventError(f"{param} must be an object", "invalid_type", param)
    return value


def apply_update(config: Config, session: Any, audio_started: bool, engine: Engine | None = None) -> Config:
    """The configuration after a `session.update`'s `session` object (only the fields present change); with the
    `engine`, a language its model does not know is refused."""
    s = _dict(session, "session")
    kind = s.get("type", "transcription")
    if kind != "transcription":
        raise EventError(f"this server only transcribes: the session type must be 'transcription' (got {kind!r})",
                         "unsupported_session_type", "session.type")
    new = dataclasses.replace(config, include=list(config.include))
    if "include" in s:
        inc = s["include"]
        if inc is not None and (not isinstance(inc, list) or not all(isinstance(x, str) for x in inc)):
            raise EventError("session.include must be a list of strings", "invalid_type", "session.include")
        new.include = list(inc or [])
    audio = s.get("audio")
    inp = _dict(_dict(audio, "session.audio").get("input") or {}, "session.audio.input") if audio is not None else {}
    if "format" in inp and inp["format"] is not None:
        f = _dict(inp["format"], "session.audio.input.format")
        kind = f.get("type", "audio/pcm")
        if kind not in FORMAT_RATES:
            raise EventError(f"audio format must be audio/pcm, audio/pcmu or audio/pcma (got {kind!r})",
                             "invalid_value", "session.audio.input.format.type")
        rate = f.get("rate")
        if rate is not None and rate != FORMAT_RATES[kind]:
            raise EventError(f"{kind} is taken at {FORMAT_RATES[kind]} Hz (got rate {rate!r})", "invalid_value",
                             "session.audio.input.format.rate")
        new.format = kind
    if "transcription" in inp and inp["transcription"] is not None:
        t = _dict(inp["transcription"], "session.audio.input.transcription")
        if t.get("model") is not None:
            if not isinstance(t["model"], str):
                raise EventError("transcription.model must be a string", "invalid_type",
                                 "session.audio.input.transcription.model")
            new.model = t["model"]
        if "language" in t:
            lang = t["language"]
            if lang is not None and (not isinstance(lang, str) or not _LANGUAGE.match(lang.strip().lower())):
                raise EventError(f"language must be an ISO-639-1 code such as 'en' (got {lang!r})", "invalid_value",
                                 "session.audio.input.transcription.language")
            new.language = lang.strip().lower() if lang else None
            why = unsupported_language(new.language, engine) if new.language and engine is not None else None
            if why is not None:
                raise EventError(why, "unsupported_language", "session.audio.input.transcription.language")
        if "prompt" in t:
            prompt = t["prompt"]
            if prompt is not None and (not isinstance(prompt, str) or len(prompt) > MAX_PROMPT_CHARS):
                raise EventError(f"prompt must be a string of at most {MAX_PROMPT_CHARS} characters",
                                 "invalid_value", "session.audio.input.transcription.prompt")
            new.prompt = prompt or None
    if "turn_detection" in inp:
        td = inp["turn_detection"]
        if td is None:
            new.vad = False
        else:
            td = _dict(td, "session.audio.input.turn_detection")
            kind = td.get("type", "server_vad")
            if kind not in ("server_vad", "semantic_vad"):
                raise EventError(f"turn_detection.type must be server_vad (got {kind!r})", "invalid_value",
                                 "session.audio.input.turn_detection.type")
            if kind == "semantic_vad":
                log.info("semantic_vad is served as server_vad")
            new.vad = True
            p = "session.audio.input.turn_detection."
            if td.get("threshold") is not None:
                th = td["threshold"]
                if not isinstance(th, int | float) or isinstance(th, bool) or not 0.0 < th < 1.0:
                    raise EventError(f"threshold must be a number between 0 and 1 (got {th!r})", "invalid_value",
                                     p + "threshold")
                new.threshold = float(th)
            for name, lo, hi in (("prefix_padding_ms", 0, 5000), ("silence_duration_ms", 30, 10000)):
                v = td.get(name)
                if v is None:
                    continue
                if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                    raise EventError(f"{name} must be an integer from {lo} to {hi} (got {v!r})", "invalid_value",
                                     p + name)
                setattr(new, name, v)
    if "noise_reduction" in inp:
        nr = inp["noise_reduction"]
        new.noise_reduction = _dict(nr, "session.audio.input.noise_reduction") if nr is not None else None
        if nr is not None:
            log.info("noise_reduction %s accepted and ignored (the audio is transcribed as it arrives)", nr)
    changed_audio = (new.format, new.vad, new.threshold, new.prefix_padding_ms, new.silence_duration_ms) != (
        config.format, config.vad, config.threshold, config.prefix_padding_ms, config.silence_duration_ms)
    if changed_audio and audio_started:
        raise EventError("the audio format and turn detection cannot change once audio has been appended; open a "
                         "new session for other settings", "session_update_after_audio", "session.audio.input")
    return new


BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}
BETA_PARAMS = (("session.audio.input.transcription", "session.input_audio_transcription"),
               ("session.audio.input.turn_detection", "session.turn_detection"),
               ("session.audio.input.noise_reduction", "session.input_audio_noise_reduction"))
"""The GA paths of `param` in errors and their beta names, for answers to `transcription_session.update`."""


def from_beta(session: Any) -> dict[str, Any]:
    """A beta `transcription_session.update`'s session (`input_audio_format`, `input_audio_transcription`,
    `turn_detection`, `input_audio_noise_reduction`) in the GA shape."""
    s = _dict(session, "session")
    inp: dict[str, Any] = {}
    if s.get("input_audio_format") is not None:
        fmt = s["input_audio_format"]
        if fmt not in BETA_FORMATS:
            raise EventError(f"input_audio_format must be pcm16, g711_ulaw or g711_alaw (got {fmt!r})",
                             "invalid_value", "session.input_audio_format")
        inp["format"] = {"type": BETA_FORMATS[fmt]}
    for beta, ga in (("input_audio_transcription", "transcription"), ("turn_detection", "turn_detection"),
                     ("input_audio_noise_reduction", "noise_reduction")):
        if beta in s:
            inp[ga] = s[beta]
    out: dict[str, Any] = {"type": "transcription", "audio": {"input": inp}}
    if "include" in s:
        out["include"] = s["include"]
    return out


def as_beta(session: dict[str, Any]) -> dict[str, Any]:
    """The effective configuration as the beta `transcription_session.updated` shows it."""
    inp = session["audio"]["input"]
    return {"id": session["id"], "object": session["object"], "expires_at": session["expires_at"],
            "include": session["include"],
            "input_audio_format": {v: k for k, v in BETA_FORMATS.items()}[inp["format"]["type"]],
            "input_audio_transcription": inp["transcription"], "turn_detection": inp["turn_detection"],
            "input_audio_noise_reduction": inp["noise_reduction"]}


def beta_param(param: str | None) -> str | None:
    """An error's GA `param` as the beta session names it."""
    for ga, beta in BETA_PARAMS:
        if param is not None and (param == ga or param.startswith(ga + ".")):
            return beta + param[len(ga):]
    return param


def _words(text: str) -> list[str]:
    return text.split()


def _norm(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


def remainder(sent: list[str], final: str) -> list[str]:
    """The final text's words after those already sent as deltas (aligned loosely: case and punctuation aside)."""
    words = _words(final)
    if not sent:
        return words
    a, b = [_norm(w) for w in sent], [_norm(w) for w in words]
    if b[: len(a)] == a:
        return words[len(a):]
    end = len(a)  # no word in common: the sent words stand for as many of the final's
    for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        if block.size:  # past the last sent word the final matches, and as many words as sent ones after it
            end = block.b + block.size + len(a) - (block.a + block.size)
    return words[end:]


@dataclass
class _Item:
    id: str
    sent: list[str] = field(default_factory=list)
    discarded: bool = False


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
            s.vad_config()))
        self._apply_options()

    def _apply_options(self) -> None:
        assert self.session is not None
        language = self.config.language or self.service.settings.language
        self.session.options = dataclasses.replace(self.session.options, language=language, prompt=self.config.prompt)

    def close(self) -> None:
        if self.session is not None:
            self.service.close_session(self.id)
            self.session = None

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
            self._delta(item, _words(event.committed))
        elif isinstance(event, SpeechStopped):
            self.send({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": round(event.audio_end * 1000),
                       "item_id": item.id})
            self._committed(item.id)
        elif isinstance(event, FinalEvent):
            del self.items[event.segment]
            self._complete(item, event.text, self._seconds(event.audio_end - event.start))
        elif isinstance(event, ErrorEvent):
            del self.items[event.segment]
            self._failed(item.id, event.message)

    def _seconds(self, speech: float) -> float:
        cfg = self.config.vad_config(self.service.settings.vad_config())
        return round(speech + (cfg.pad_before_ms + cfg.pad_after_ms) / 1000, 3)

    def _committed(self, item_id: str) -> None:
        self.send({"type": "input_audio_buffer.committed", "item_id": item_id, "previous_item_id": self.last_item})
        self.last_item = item_id

    def _delta(self, item: _Item, words: list[str]) -> None:
        """Committed words past those already sent (never taking any back)."""
        n = len(item.sent)
        if len(words) <= n or words[:n] != item.sent:
            return
        new = words[n:]
        self.send({"type": "conversation.item.input_audio_transcription.delta", "item_id": item.id,
                   "content_index": 0, "delta": (" " if n else "") + " ".join(new)})
        item.sent.extend(new)

    def _complete(self, item: _Item, text: str, seconds: float) -> None:
        rest = remainder(item.sent, text)
        if rest:
            self._delta(item, item.sent + rest)
        self.send({"type": "conversation.item.input_audio_transcription.completed", "item_id": item.id,
                   "content_index": 0, "transcript": " ".join(item.sent),
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
        if (new.vad, new.threshold, new.prefix_padding_ms, new.silence_duration_ms) != (
                old.vad, old.threshold, old.prefix_padding_ms, old.silence_duration_ms):
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
        """16 kHz mono float32 into the session (server VAD) or the manual buffer."""
        if self.session is None or not samples.size:
            return
        self.audio_started = True
        if self.config.vad:
            self.session.feed(samples)
            return
        if (self.manual_samples + samples.size) / SAMPLE_RATE > MANUAL_MAX_S:
            if self._full_said:
                return
            self._full_said = True  # once until the next commit or clear (a media track sends 50 frames a second)
            raise EventError(f"the input audio buffer holds at most {MANUAL_MAX_S:g} s without turn detection; "
                             "commit or clear it first (this audio was dropped)", "input_audio_buffer_full", "audio")
        self.manual.append(samples)
        self.manual_samples += samples.size
        self.session.segmenter.feed(samples)  # only for the limits (idle, stale audio): no items from it

    def commit(self) -> None:
        session = self.session
        if session is None:
            return
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
            self._complete(item, future.result().text, seconds)

    def clear(self) -> None:
        session = self.session
        if session is not None and self.config.vad and session.segmenter.announced:
            open_item = self.items.get(session.segmenter.segment)
            if open_item is not None:
                open_item.discarded = True
            session.flush()
        self.manual, self.manual_samples, self._full_said = [], 0, False
        self.send({"type": "input_audio_buffer.cleared"})


@dataclass
class _Secret:
    expires_at: float
    config: Config


class _Call:
    """One WebRTC call: the offer's audio track into a `RealtimeConnection`, its events on the `oai-events` data
    channel (aiortc as the server's peer; no ICE servers: host candidates, 127.0.0.1 only with --ice-loopback)."""

    def __init__(self, service: TranscriptionService, config: Config, expires_at: int) -> None:
        from aiortc import RTCConfiguration, RTCPeerConnection

        self.id = _id("rtc")
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel: Any = None
        self.channel_open = asyncio.Event()
        self.conn = RealtimeConnection(service, config, expires_at, self._send)
        self.tasks: set[asyncio.Task[None]] = set()
        self.ended = False
        self.on_end: Callable[[], object] | None = None

    async def _send(self, text: str) -> None:
        await self.channel_open.wait()
        if self.channel is not None and self.channel.readyState == "open":
            self.channel.send(text)

    def _task(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def answer(self, offer: str) -> str:
        from aiortc import RTCSessionDescription

        pc = self.pc

        @pc.on("datachannel")
        def on_datachannel(channel: Any) -> None:
            if self.channel is not None:
                return
            self.channel = channel

            @channel.on("message")
            def on_message(message: str | bytes) -> None:
                self.conn.receive(message if isinstance(message, str) else None)

            if channel.readyState == "open":
                self.channel_open.set()
            channel.on("open", self.channel_open.set)

        @pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind == "audio":
                self._task(self._read(track))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.hang_up()

        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        self.conn.open()
        self.conn.send({"type": "session.created", "session": self.conn.config.as_session(self.conn.id,
                                                                                          self.conn.expires_at)})
        self._task(self._run_sender())
        return pc.localDescription.sdp

    async def _run_sender(self) -> None:
        try:
            await self.conn.sender()
        finally:
            if self.conn.closed_reason is not None:  # the server ended the session: the error went out first
                await asyncio.sleep(0.5)
                await self.hang_up()

    async def _read(self, track: Any) -> None:
        import av
        from aiortc.mediastreams import MediaStreamError

        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        while not self.ended:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            for out in resampler.resample(frame):
                try:
                    self.conn.feed(out.to_ndarray().reshape(-1).astype(np.float32, copy=False))
                except EventError as exc:
                    self.conn.error(exc.message, exc.code, exc.param)

    async def hang_up(self) -> None:
        if self.ended:
            return
        self.ended = True
        self.conn.close()
        self.conn.outbox.put_nowait(None)
        self.channel_open.set()
        for task in list(self.tasks):
            if task is not asyncio.current_task():
                task.cancel()
        await self.pc.close()
        if self.on_end is not None:
            self.on_end()
        log.info("realtime call %s ended", self.id)


def create_realtime_router(service: TranscriptionService) -> APIRouter:
    settings = service.settings
    router = APIRouter()
    secrets_: dict[str, _Secret] = {}
    base = settings.vad_config()
    clients = ClientLimiter(settings.max_connections_per_client, settings.max_new_connections_per_minute,
                            settings.client_ip_header)
    minting = ClientLimiter(0, settings.max_new_connections_per_minute, settings.client_ip_header)
    live: set[str] = set()  # the slots of open sessions (WebSockets and calls) in `clients`

    def admit(connection: HTTPConnection, limiter: ClientLimiter = clients) -> str:
        """A new slot for the connection's client (in `live` until the session ends), or `OfferError` (429)."""
        slot = _id("slot")
        client = limiter.client(connection)
        try:
            limiter.admit(client, slot, live)
        except OfferError as exc:
            log.info("realtime connection of %s refused: %s", client, exc.message)
            raise
        if limiter is clients:
            live.add(slot)
        return slot

    def default_config() -> Config:
        return Config(language=settings.language, threshold=base.threshold, prefix_padding_ms=base.pad_before_ms,
                      silence_duration_ms=base.min_silence_ms)

    def expires_at() -> int:
        return int(time.time()) + int(settings.session_time_limit or 3600)

    def offered(headers: Any) -> list[str]:
        raw = headers.get("sec-websocket-protocol", "")
        return [p.strip() for p in raw.split(",") if p.strip()]

    def authorize(headers: Any) -> tuple[bool, Config | None]:
        """(allowed, the configuration an ephemeral secret carries): the Bearer header or the key subprotocol."""
        tokens = [t for t in (bearer(headers.get("authorization", "")),) if t]
        tokens += [p[len(SUBPROTOCOL_KEY):] for p in offered(headers) if p.startswith(SUBPROTOCOL_KEY)]
        now = time.time()
        for expired in [k for k, v in secrets_.items() if v.expires_at <= now]:
            del secrets_[expired]
        for token in tokens:
            secret = secrets_.pop(token, None)  # one session per secret
            if secret is not None:
                return True, secret.config
        if not settings.api_key:
            return True, None
        return any(is_key(t, settings.api_key) for t in tokens), None

    async def refuse(ws: WebSocket, status: int, message: str, code: str, kind: str | None = None,
                     retry_after: int | None = None) -> None:
        """An HTTP answer in place of the WebSocket (ASGI's denial response, which uvicorn serves), else a close
        before accepting: 1013 (try again later) for what may pass later, 1008 (policy) for the rest."""
        body = {"error": {"message": message, "type": kind or ("invalid_request_error" if status < 500 else
                                                                "server_error"), "code": code, "param": None}}
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            headers = {"Retry-After": str(retry_after)} if retry_after else None
            await ws.send_denial_response(JSONResponse(body, status_code=status, headers=headers))
        else:
            await ws.close(code=1013 if status in (429, 503) else 1008, reason=message[:120])

    @router.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        try:
            slot = admit(ws)
        except OfferError as exc:
            await refuse(ws, exc.status, exc.message, exc.code, exc.kind, exc.retry_after)
            return
        try:
            await serve(ws)
        finally:
            live.discard(slot)

    async def serve(ws: WebSocket) -> None:
        allowed, secret_config = authorize(ws.headers)
        if not allowed:
            log.info("realtime connection refused: missing or wrong API key")
            await refuse(ws, 401, "missing or wrong API key: send 'Authorization: Bearer <key>' or the subprotocol "
                                  f"'{SUBPROTOCOL_KEY}<key>'", "invalid_api_key")
            return
        busy = unavailable()
        if busy is not None:
            await refuse(ws, *busy)
            return
        # a browser fails the handshake unless one of the subprotocols it offered is chosen (never the key's)
        choices = [p for p in offered(ws.headers) if not p.startswith(SUBPROTOCOL_KEY)]
        await ws.accept(subprotocol="realtime" if "realtime" in choices else (choices[0] if choices else None))
        config = secret_config or default_config()
        conn = RealtimeConnection(service, config, expires_at(), ws.send_text)
        conn.open()
        log.info("realtime session %s opened (intent=%s, model=%s)", conn.id, ws.query_params.get("intent"),
                 ws.query_params.get("model"))
        conn.send({"type": "session.created", "session": conn.config.as_session(conn.id, conn.expires_at)})
        sender = asyncio.create_task(conn.sender())
        try:
            while not sender.done():
                receive = asyncio.ensure_future(ws.receive())
                await asyncio.wait({receive, sender}, return_when=asyncio.FIRST_COMPLETED)
                if not receive.done():
                    receive.cancel()
                    break
                message = receive.result()
                if message["type"] == "websocket.disconnect":
                    break
                conn.receive(message.get("text"))
        except WebSocketDisconnect:
            pass
        except Exception:
            log.exception("realtime session %s failed", conn.id)
        finally:
            conn.close()
            if not sender.done():
                conn.outbox.put_nowait(None)
                try:
                    await asyncio.wait_for(sender, 2.0)
                except (TimeoutError, Exception):
                    sender.cancel()
            if ws.client_state == WebSocketState.CONNECTED:
                try:
                    await ws.close(code=1000 if conn.closed_reason is None else 1008,
                                   reason=conn.closed_reason.reason if conn.closed_reason else "")
                except Exception:  # already gone
                    pass
            log.info("realtime session %s closed", conn.id)

    def unavailable() -> tuple[int, str, str] | None:
        if not service.ready or not service.engine.ready:
            return 503, "the transcription engine is not ready", "engine_not_ready"
        if len(service.sessions) >= settings.concurrency_limit:
            return (503, f"the server is at its limit of {settings.concurrency_limit} sessions; retry later",
                    "session_limit_reached")
        return None

    def fail(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error" if status < 500 else
                                       "server_error", "code": code, "param": param}}, status_code=status)

    def refused_update(exc: EventError) -> JSONResponse:
        """A session configuration refused on an HTTP route: 400 for a language the model lacks (as the HTTP API
        answers it), else 422."""
        return fail(400 if exc.code == "unsupported_language" else 422, exc.message, exc.code, exc.param)

    calls: dict[str, _Call] = {}

    @router.post("/v1/realtime/calls", include_in_schema=False)
    async def create_call(request: Request) -> Response:
        try:
            slot = admit(request)
        except OfferError as exc:
            return exc.response()
        kept = False
        try:
            response = await open_call(request, slot)
            kept = response.status_code == 201
            return response
        finally:
            if not kept:
                live.discard(slot)

    async def open_call(request: Request, slot: str) -> Response:
        allowed, secret_config = authorize(request.headers)
        if not allowed:
            return fail(401, "missing or wrong API key: send 'Authorization: Bearer <key>' (or an ephemeral secret)",
                        "invalid_api_key")
        busy = unavailable()
        if busy is not None:
            return fail(*busy)
        config = secret_config or default_config()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "multipart/form-data":  # OpenAI's other form: the offer and a session configuration
            form = await request.form()
            sdp = form.get("sdp")
            raw_session = form.get("session")
            if raw_session is not None:
                try:
                    config = apply_update(config, json.loads(str(raw_session)), False, service.engine)
                except ValueError:
                    return fail(400, "the session field must be JSON", "invalid_json")
                except EventError as exc:
                    return refused_update(exc)
        else:
            sdp = (await request.body()).decode("utf-8", "replace")
        if not isinstance(sdp, str) or not sdp.lstrip().startswith("v="):
            return fail(400, "the body must be an SDP offer (Content-Type: application/sdp)", "invalid_offer")
        call = _Call(service, config, expires_at())
        try:
            answer = await call.answer(sdp)
        except Exception as exc:
            await call.hang_up()
            log.info("realtime call refused: %s", exc)
            return fail(400, f"the SDP offer was not accepted ({type(exc).__name__}: {exc})", "invalid_offer")
        calls[call.id] = call

        def ended() -> None:
            calls.pop(call.id, None)
            live.discard(slot)

        call.on_end = ended
        log.info("realtime call %s opened (session %s)", call.id, call.conn.id)
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/v1/realtime/calls/{call.id}"})

    @router.post("/v1/realtime/calls/{call_id}/hangup", include_in_schema=False)
    async def hangup(call_id: str, request: Request) -> Response:
        if settings.api_key and not authorize(request.headers)[0]:
            return fail(401, "missing or wrong API key", "invalid_api_key")
        call = calls.get(call_id)
        if call is None:
            return fail(404, f"no call {call_id}", "unknown_call")
        await call.hang_up()
        return Response(status_code=200)

    @router.post("/v1/realtime/client_secrets", include_in_schema=False)
    async def client_secrets(request: Request) -> Response:
        try:
            admit(request, minting)  # a secret holds no session: only the per-minute cap
        except OfferError as exc:
            return exc.response()
        if settings.api_key and not is_key(bearer(request.headers.get("authorization", "")), settings.api_key):
            return fail(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "invalid_api_key")
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return fail(400, "the body must be JSON", "invalid_json")
        if not isinstance(body, dict):
            return fail(400, "the body must be a JSON object", "invalid_json")
        ttl = SECRET_TTL_S
        after = body.get("expires_after")
        if after is not None:
            seconds = after.get("seconds") if isinstance(after, dict) else None
            if not isinstance(seconds, int) or isinstance(seconds, bool) or not (
                    SECRET_TTL_RANGE[0] <= seconds <= SECRET_TTL_RANGE[1]):
                return fail(422, f"expires_after.seconds must be an integer from {SECRET_TTL_RANGE[0]} to "
                                 f"{SECRET_TTL_RANGE[1]}", "invalid_value")
            ttl = seconds
        config = default_config()
        if body.get("session") is not None:
            try:
                config = apply_update(config, body["session"], False, service.engine)
            except EventError as exc:
                return refused_update(exc)
        now = time.time()
        value = "ek_" + secrets.token_urlsafe(24)
        secrets_[value] = _Secret(now + ttl, config)
        return JSONResponse({"value": value, "expires_at": int(now + ttl),
                             "session": config.as_session(_id("sess"), int(now + ttl))})

    return router


__all__ = ["AudioInput", "Config", "apply_update", "create_realtime_router", "remainder"]
