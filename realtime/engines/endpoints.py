"""An OpenAI-compatible transcription endpoint as the remote engine sees it: its address and circuit state
(`Endpoint`, `parse_endpoint`), the errors a request may meet (`EndpointUnavailable`, retryable ones), and how its
answers read: text, JSON, verbose_json with segments and words (`parse_answer`), and SSE streams (`read_sse`).
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from .base import EngineUnavailable, TimedText, Transcription
from .types import Word

OPENAI, HF = "openai", "hf"
"""Endpoint styles: OpenAI's routes (`/v1/...`: vLLM, another instance of this app) or Hugging Face's
(`/api/v1/...`)."""
RETRYABLE_STATUS = {408, 425, 429, 500, 502, 503, 504}


class EndpointUnavailable(EngineUnavailable):
    """No endpoint can take the request now (all circuits open or rate limited)."""


class _Retryable(Exception):
    """A failure worth another attempt: connection, timeout, 429/5xx, malformed reply.

    `busy` marks back-pressure rather than a fault: the endpoint said it is at capacity (429, or 503 with a
    Retry-After), so it is rested until then but its circuit stays closed."""

    def __init__(self, message: str, retry_after: float | None = None, *, busy: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.busy = busy


def is_busy(status: int, retry_after: float | None) -> bool:
    """Whether a refusal is the endpoint's back-pressure (429, or 503 naming when to come back)."""
    return status == 429 or (status == 503 and retry_after is not None)


@dataclass
class Endpoint:
    url: str
    style: str
    translate_url: str
    health_url: str
    models_url: str
    realtime_url: str = ""
    """The endpoint's `/v1/realtime?intent=transcription` WebSocket (ws:// or wss://)."""
    model: str | None = None
    """The model name the server lists first in /v1/models (used when --remote-model is not given)."""
    owner: str | None = None
    """`owned_by` of that /v1/models entry ("vllm" for vLLM's server); None until /v1/models answered."""
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    """Consecutive failures; the circuit opens at the threshold."""
    errors: int = 0
    busy: int = 0
    """Requests the endpoint refused as busy (not failures: they never open the circuit)."""
    state: str = "closed"
    """closed: in use; open: skipped until re-probed."""
    retry_at: float = 0.0
    """When an open circuit is probed next (monotonic)."""
    cooldown: float = 0.0
    blocked_until: float = 0.0
    """Retry-After of a 429/503: not used before this (monotonic)."""
    last_error: str | None = None
    picked: int = field(default=0, repr=False)
    prompt_warned: bool = field(default=False, repr=False)
    timed: bool = True
    """Whether the endpoint answers `verbose_json` (False once it refused it: such requests then ask `json`)."""

    def usable(self, now: float) -> bool:
        return self.state == "closed" and now >= self.blocked_until

    def public(self, now: float) -> dict[str, Any]:
        return {
            "url": self.url, "style": self.style, "model": self.model, "healthy": self.state == "closed",
            "in_flight": self.in_flight, "requests": self.requests, "errors": self.errors,
            "busy": self.busy,
            "retry_in_s": round(max(self.retry_at, self.blocked_until) - now, 1)
            if self.state == "open" or self.blocked_until > now else None,
            "last_error": self.last_error,
        }


def parse_endpoint(raw: str) -> Endpoint:
    """An Endpoint for a URL as users give it (full route, base URL, or a Hugging Face endpoint address)."""
    url = httpx.URL(raw.strip())
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"remote URL {raw!r} must be http:// or https:// with a host")
    path = url.path.rstrip("/")
    for tail in ("/audio/transcriptions", "/audio/translations"):
        if path.endswith(tail):
            prefix = path[: -len(tail)]
            break
    else:
        if url.host.endswith(".endpoints.huggingface.cloud") and not path:
            prefix = "/api/v1"
        else:
            prefix = path if path.endswith("/v1") else path + "/v1"
    style = HF if prefix.endswith("/api/v1") else OPENAI
    root_path = prefix[: -len("/api/v1")] if style == HF else prefix[: -len("/v1")]
    root = str(url.copy_with(path=root_path or "/", query=None, fragment=None)).rstrip("/")
    ws_root = str(url.copy_with(scheme="wss" if url.scheme == "https" else "ws", path=root_path or "/", query=None,
                                fragment=None)).rstrip("/")
    return Endpoint(
        url=f"{root}{prefix}/audio/transcriptions",
        style=style,
        translate_url=f"{root}{prefix}/audio/translations",
        health_url=f"{root}/health",
        models_url=f"{root}/v1/models",
        realtime_url=f"{ws_root}/v1/realtime?intent=transcription",
    )


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header's wait in seconds (a number of seconds or an HTTP date); None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_message(response: httpx.Response) -> str:
    try:
        doc = response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase
    if isinstance(doc, dict):
        err = doc.get("error", doc.get("detail", doc.get("message")))
        if isinstance(err, dict):
            err = err.get("message")
        if err:
            return str(err)[:200]
    return str(doc)[:200]


def parse_answer(r: httpx.Response, body: bytes) -> Transcription:
    """A complete answer: text/plain, or JSON with `text` (and verbose_json's segments, words and temperatures)."""
    ctype = r.headers.get("content-type", "")
    if ctype.startswith("text/plain"):
        return Transcription(text=body.decode("utf-8", "replace").strip())
    try:
        doc = json.loads(body)
    except ValueError:
        raise _Retryable(f"malformed JSON reply ({body[:60]!r})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("text"), str):
        raise _Retryable(f"reply without text ({body[:60]!r})")
    segments: list[TimedText] = []
    for seg in doc.get("segments") or []:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            segments.append(TimedText(float(seg["start"]), float(seg["end"]), str(seg["text"]).strip()))
    words: list[Word] = []
    for w in doc.get("words") or []:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            words.append(Word(float(w["start"]), float(w["end"]), str(w["word"])))
    if words:  # each word to the timed piece nearest its middle
        pieces = segments or [TimedText(words[0].start, words[-1].end, doc["text"].strip())]
        mine: list[list[Word]] = [[] for _ in pieces]
        for w in words:
            t = (w.start + w.end) / 2
            mine[min(range(len(pieces)), key=lambda k: max(pieces[k].start - t, 0.0, t - pieces[k].end))].append(w)
        segments = [replace(p, words=tuple(ws)) for p, ws in zip(pieces, mine, strict=True)]
    temperatures = [float(seg.get("temperature") or 0.0) for seg in doc.get("segments") or []
                     if isinstance(seg, dict) and isinstance(seg.get("temperature"), int | float)]
    language = doc.get("language")
    return Transcription(text=doc["text"].strip(), language=language if isinstance(language, str) else None,
                         segments=tuple(segments), extra={"temperature": max(temperatures, default=0.0)})


async def read_sse(r: httpx.Response, on_delta: Callable[[str], None]) -> Transcription:
    """vLLM's chat-completion-like chunks or OpenAI's transcript.text.* events."""
    parts: list[str] = []
    done_text: str | None = None
    finished = False
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            finished = True
            break
        try:
            event = json.loads(payload)
        except ValueError:
            raise _Retryable(f"malformed event in the stream ({payload[:60]!r})") from None
        if not isinstance(event, dict):
            continue
        if event.get("error"):
            err = event["error"]
            raise _Retryable(f"stream error: {err.get('message') if isinstance(err, dict) else err}")
        kind = event.get("type")
        delta = ""
        if kind == "transcript.text.delta":
            delta = str(event.get("delta") or "")
        elif kind == "transcript.text.done":
            done_text = str(event.get("text") or "")
            finished = True
            break
        else:
            for choice in event.get("choices") or []:
                if isinstance(choice, dict):
                    delta += str((choice.get("delta") or {}).get("content") or "")
        if delta:
            parts.append(delta)
            on_delta(delta)
    if not finished:
        raise _Retryable("the stream ended before it was done")
    text = done_text if done_text is not None else "".join(parts)
    return Transcription(text=text.strip())
