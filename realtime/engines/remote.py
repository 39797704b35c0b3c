"""The remote engine: segments go over HTTP to OpenAI-compatible or Hugging Face Whisper endpoints.

This module owns the client side of the transcription protocol that realtime/web/api.py serves: `vllm serve`,
Hugging Face Inference Endpoints, OpenAI, or another instance of this app.

- One `httpx.AsyncClient` with pooled, kept-alive connections; each segment is sent as a 16 kHz mono WAV
  made in memory (multipart `file`).
- URL styles: a path ending in `/api/v1/audio/transcriptions` (or a bare `*.endpoints.huggingface.cloud`
  address) is a Hugging Face endpoint and gets the bare `file`; any other address is OpenAI-style
  (`/v1/audio/transcriptions` is appended to a base URL) and gets `model` (from `--remote-model` or the
  server's `/v1/models`), `response_format`, `language`, `prompt`, `temperature`.
- vLLM's server (its `/v1/models` says `owned_by: vllm`) gets no `prompt`: it puts `<|prev|>`, which is no
  Whisper token, before the prompt instead of `<|startofprev|>` (vllm#53206, open in 0.33), and Whisper then
  loops on a word until the token limit. The prompt is dropped with a warning; the transcript stays right.
- Connect and read timeouts (the read timeout grows by the clip's duration: `read_timeout`); retries with
  exponential backoff and jitter on connection errors, timeouts, dropped connections, malformed replies, 429 and
  5xx; `Retry-After` is honoured (the endpoint is not used again before then); a bound on requests in flight.
- Back-pressure is not failure: a 429, or a 503 with Retry-After (this app's answer when its `--api-max-requests`
  are running), rests the endpoint until then and the request waits and tries again, for up to `busy_wait`
  seconds without using up its retries; such answers never open the circuit.
- A circuit breaker per endpoint: after `failure_threshold` consecutive failures it is skipped, and a
  background prober re-probes it (`/health`, else `/v1/models`) after a cooldown that doubles while it
  stays down. With several URLs each request goes to the healthy endpoint with the fewest requests in
  flight. When no endpoint is usable, requests fail at once with `EndpointUnavailable` (it carries a
  retry delay), or go to the fallback engine when one is configured (`--remote-fallback`); `describe()`
  says which one is in use, and the page shows it.
- Timestamps: a request with `timestamps` (timed formats, and every packed window of a file, whose answer the file
  path checks for coverage: realtime/live/coverage.py) asks `verbose_json` and reads its timed `segments`. An endpoint
  that refuses `verbose_json` (400/422) is asked `json` from then on; its answers carry no times, and a window's
  segments are then asked one by one.
- Streaming: with `stream=True` OpenAI-style endpoints are asked for Server-Sent Events; both vLLM's chunks
  (`choices[].delta.content`, then `[DONE]`) and OpenAI's `transcript.text.delta` / `transcript.text.done`
  events are read. `_decode_stream` hands the deltas on as they arrive (the HTTP API forwards them).
- A live session's final carries `X-Transcription-Lane: final` (`LANE_HEADER`): an endpoint that is this app (with
  an API key) or its pool decodes it ahead of queued file work and partials, as the local worker does.
- Realtime (`realtime=True`, `--remote-realtime`): for an endpoint that is another instance of this app, each
  request that only asks for text (`task` transcribe, no timestamps, at most `REALTIME_MAX_S` of audio: every
  live partial and final) goes over the endpoint's `/v1/realtime?intent=transcription` WebSocket instead: one
  connection per request, a `session.update` with manual commits (`turn_detection: null`), the language and
  prompt, the clip resampled to 24 kHz PCM16 (soxr, as the app's own input path) in `input_audio_buffer.append`
  events, one `commit`, then the item's `...input_audio_transcription.delta` events are passed on until its
  `.completed`. A refused handshake with 401/403 or 404, a `.failed` item or an `error` event is an
  `EngineError`; connection errors, timeouts, 429/5xx handshakes and server-side closes are retried like HTTP
  failures, so retries, the circuit breaker and the fallback work the same. Timed and translation requests
  (files, the API's verbose formats) still go over HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from ..audio import SAMPLE_RATE, wav_bytes
from . import policy
from .base import Engine, EngineBase, EngineError, TimedText, TranscribeOptions, Transcription
from .endpoints import (
    OPENAI,
    RETRYABLE_STATUS,
    Endpoint,
    EndpointUnavailable,
    _error_message,
    _Retryable,
    is_busy,
    parse_answer,
    parse_endpoint,
    read_sse,
    retry_after_s,
)
from .types import APP_OWNER, CLIP_HEADER, LANE_HEADER

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)

REALTIME_RATE = 24000
"""The sample rate of the Realtime API's `audio/pcm` input."""
REALTIME_MAX_S = 30.0
"""Most audio one realtime request carries (the server's manual-commit buffer); longer clips go over HTTP."""
REALTIME_CHUNK_S = 5.0
"""Seconds of audio per `input_audio_buffer.append` event."""
REALTIME_MAX_PROMPT = 4000
REALTIME_PAD_S = 0.05


class _Deltas:
    """Passes a request's text deltas on without repeating text after a retry (deltas only grow)."""

    def __init__(self, sink: Callable[[str], None] | None) -> None:
        self.sink = sink
        self.emitted = ""

    def attempt(self) -> Callable[[str], None]:
        text = ""

        def add(delta: str) -> None:
            nonlocal text
            text += delta
            self.offer(text)

        return add

    def offer(self, text: str) -> None:
        if self.sink is not None and text.startswith(self.emitted) and len(text) > len(self.emitted):
            self.sink(text[len(self.emitted):])
            self.emitted = text


class RemoteEngine(EngineBase):
    name = "remote"
    timestamps = True
    word_timestamps = False
    """Endpoints differ in whether they return words (vLLM's and Hugging Face's do not); none are asked for."""
    long_form = True

    def __init__(
        self,
        urls: Sequence[str] | str,
        token: str | None = None,
        model: str | None = None,
        *,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        retries: int = 3,
        max_in_flight: int = 8,
        stream: bool = False,
        realtime: bool = False,
        language: str | None = None,
        fallback: Engine | None = None,
        failure_threshold: int = 3,
        cooldown: float = 2.0,
        max_cooldown: float = 30.0,
        backoff_base: float = 0.2,
        backoff_max: float = 5.0,
        max_retry_wait: float = 10.0,
        busy_wait: float = 120.0,
        probe_interval: float = 0.25,
    ) -> None:
        raw = urls.split(",") if isinstance(urls, str) else list(urls)
        raw = [u for u in (u.strip() for u in raw) if u]
        if not raw:
            raise EngineError("the remote engine needs --remote-url (one or more endpoint URLs, comma-separated)")
        try:
            self.endpoints = [parse_endpoint(u) for u in raw]
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        self.token = token or None
        self.model = model or None
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retries = max(0, retries)
        self.max_in_flight = max(1, max_in_flight) * len(self.endpoints)
        self.max_batch_size = self.max_in_flight
        self.stream = stream
        self.realtime = realtime
        self.streaming = stream or realtime
        self.realtime_requests = 0
        self.language = language
        self.fallback = fallback
        self.failure_threshold = max(1, failure_threshold)
        self.cooldown = cooldown
        self.max_cooldown = max_cooldown
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.max_retry_wait = max_retry_wait
        self.busy_wait = busy_wait
        self.probe_interval = probe_interval
        self.fallback_requests = 0
        self._slots = asyncio.Semaphore(self.max_in_flight)
        self._client: httpx.AsyncClient | None = None
        self._prober: asyncio.Task[None] | None = None
        self._started = False
        for ep in self.endpoints:
            ep.cooldown = cooldown

    @classmethod
    def from_settings(cls, settings: Settings, fallback: Engine | None = None) -> RemoteEngine:
        """The engine the settings describe; `fallback` (the registry makes it with `--remote-fallback`) serves
        while no endpoint does."""
        return cls(
            settings.remote_url,
            token=settings.remote_token or settings.hf_token or None,
            model=settings.remote_model,
            timeout=settings.remote_timeout,
            connect_timeout=settings.remote_connect_timeout,
            retries=settings.remote_retries,
            max_in_flight=settings.remote_max_in_flight,
            stream=settings.remote_stream,
            realtime=settings.remote_realtime,
            language=settings.language,
            fallback=fallback,
        )

    # -- lifecycle
    async def start(self) -> None:
        if self._started:
            return
        headers = {"User-Agent": "realtime-transcription"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
            limits=httpx.Limits(max_connections=self.max_in_flight + 2 * len(self.endpoints),
                                max_keepalive_connections=self.max_in_flight + len(self.endpoints),
                                keepalive_expiry=60.0),
        )
        if self.fallback is not None:
            await self.fallback.start()
        await asyncio.gather(*(self._probe(ep, initial=True) for ep in self.endpoints))
        self._started = True
        self._prober = asyncio.get_running_loop().create_task(self._probe_loop(), name="remote-prober")
        log.info("remote engine: %s", ", ".join(f"{e.url} ({e.state})" for e in self.endpoints))

    async def close(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self.fallback is not None:
            await self.fallback.close()
        self._started = False

    # -- health
    def _open(self, ep: Endpoint, reason: str, at_least: float = 0.0, quiet: bool = False) -> None:
        now = time.monotonic()
        if ep.state != "open":
            log.log(logging.INFO if quiet else logging.WARNING, "remote endpoint %s unhealthy (%s); circuit open "
                    "for %.1fs", ep.url, reason, max(ep.cooldown, at_least))
        ep.state = "open"
        ep.retry_at = now + max(ep.cooldown, at_least)

    def _close_circuit(self, ep: Endpoint) -> None:
        if ep.state != "closed":
            log.info("remote endpoint %s healthy again", ep.url)
        ep.state = "closed"
        ep.failures = 0
        ep.cooldown = self.cooldown

    async def _probe(self, ep: Endpoint, initial: bool = False) -> bool:
        """GET /health (else /v1/models); learns the model name of OpenAI-style endpoints."""
        assert self._client is not None
        timeout = httpx.Timeout(max(self.connect_timeout, 2.0))
        healthy = False
        try:
            r = await self._client.get(ep.health_url, timeout=timeout)
            healthy = r.is_success
            if r.status_code in (404, 405) or (ep.style == OPENAI and healthy and ep.owner is None):
                m = await self._models(ep, timeout)
                if r.status_code in (404, 405):
                    healthy = m.status_code < 500 and m.status_code != 429
            reason = f"health check answered {r.status_code}"
        except httpx.HTTPError as exc:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if healthy:
            self._close_circuit(ep)
        else:
            ep.last_error = reason
            if not initial and ep.state == "open":
                ep.cooldown = min(self.max_cooldown, ep.cooldown * 2)
            self._open(ep, reason, quiet=initial)
        return healthy

    async def _models(self, ep: Endpoint, timeout: httpx.Timeout) -> httpx.Response:
        """GET /v1/models: learns the model name to send (unless --remote-model) and who serves it."""
        assert self._client is not None
        m = await self._client.get(ep.models_url, timeout=timeout)
        if m.is_success:
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError, AttributeError):
                entry = m.json()["data"][0]
                if not self.model:
                    ep.model = str(entry["id"])
                ep.owner = str(entry.get("owned_by") or "")
        elif m.status_code in (404, 405):
            ep.owner = ""  # no model list there: do not ask again
        return m

    async def _probe_loop(self) -> None:
        while True:
            await asyncio.sleep(self.probe_interval)
            now = time.monotonic()
            due = [ep for ep in self.endpoints if ep.state == "open" and now >= ep.retry_at]
            if due:
                await asyncio.gather(*(self._probe(ep) for ep in due), return_exceptions=True)

    def _failure(self, ep: Endpoint, exc: _Retryable) -> None:
        now = time.monotonic()
        if exc.retry_after:
            ep.blocked_until = max(ep.blocked_until, now + exc.retry_after)
        if exc.busy:  # at capacity, not down: rested until its Retry-After, the circuit left alone
            ep.busy += 1
            return
        ep.failures += 1
        ep.errors += 1
        ep.last_error = str(exc)
        if ep.failures >= self.failure_threshold:
            self._open(ep, str(exc), at_least=ep.blocked_until - now)

    def _wait_hint(self) -> float:
        now = time.monotonic()
        hints = [max(ep.retry_at if ep.state == "open" else now, ep.blocked_until) - now for ep in self.endpoints]
        return max(1.0, min(hints, default=1.0))

    async def _choose(self, avoid: Endpoint | None, wait: bool = True) -> Endpoint:
        """The usable endpoint with the fewest requests in flight (waits out a short Retry-After if `wait`)."""
        while True:
            now = time.monotonic()
            usable = [ep for ep in self.endpoints if ep.usable(now)]
            if len(usable) > 1 and avoid in usable:
                usable.remove(avoid)
            if usable:
                ep = min(usable, key=lambda e: (e.in_flight, e.picked))
                ep.picked += 1
                return ep
            waiting = [ep.blocked_until - now for ep in self.endpoints if ep.state == "closed"]
            if wait and waiting and min(waiting) <= self.max_retry_wait:
                await asyncio.sleep(min(waiting))
                continue
            errors = "; ".join(f"{ep.url}: {ep.last_error or 'down'}" for ep in self.endpoints)
            hint = self._wait_hint()
            raise EndpointUnavailable(f"remote endpoint unavailable ({errors}); retry in {hint:.0f} s", hint)

    # -- requests
    def read_timeout(self, audio: np.ndarray) -> float:
        """`timeout` plus the clip's own duration: an endpoint that decodes on a busy CPU may need real time for a
        file's long window, and is not failing while it does."""
        return self.timeout + audio.size / SAMPLE_RATE

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter: half the step for sure, the other half at random."""
        step = min(self.backoff_max, self.backoff_base * 2**attempt)
        return step / 2 + random.uniform(0.0, step / 2)

    async def _request(self, audio: np.ndarray, options: TranscribeOptions, deltas: _Deltas) -> Transcription:
        if self._client is None:
            await self.start()
        realtime = self._uses_realtime(audio, options)
        attempts = 1 if options.partial else 1 + self.retries  # a partial is stale by the time a retry lands
        last: _Retryable | None = None
        ep: Endpoint | None = None
        attempt = sent = 0
        busy_until = time.monotonic() + self.busy_wait
        while attempt < attempts:
            if sent:
                await asyncio.sleep(self._backoff(max(attempt, 1) - 1))
            sent += 1
            async with self._slots:  # the bound on requests in flight; then the least busy endpoint
                ep = await self._choose(avoid=ep, wait=not options.partial)
                t0 = time.perf_counter()
                ep.in_flight += 1
                ep.requests += 1
                read = self.read_timeout(audio)
                whole = read * 2 + self.connect_timeout
                try:
                    send = (self._send_realtime(ep, audio, options, deltas.attempt(), read) if realtime
                            else self._send(ep, audio, options, deltas.attempt(), read))
                    result = await asyncio.wait_for(send, whole)
                except TimeoutError:
                    last = _Retryable(f"no complete reply within {whole:.0f} s")
                    self._failure(ep, last)
                    attempt += 1
                    continue
                except _Retryable as exc:
                    last = exc
                    self._failure(ep, exc)
                    # a busy endpoint is waited for (within busy_wait) without using up the retries
                    if not (exc.busy and attempts > 1 and time.monotonic() < busy_until):
                        attempt += 1
                    log.info("remote %s attempt %d/%d failed: %s", ep.url, attempt, attempts, exc)
                    continue
                finally:
                    ep.in_flight -= 1
            ep.failures = 0
            deltas.offer(result.text)
            duration = audio.size / SAMPLE_RATE
            return Transcription(
                text=result.text, language=result.language or options.language or self.language,
                duration=duration, segments=result.segments or ((TimedText(0.0, duration, result.text),)
                                                                 if result.text else ()),
                engine_seconds=time.perf_counter() - t0,
                extra={"endpoint": ep.realtime_url if realtime else ep.url, "attempts": sent},
            )
        assert last is not None
        raise EndpointUnavailable(f"remote endpoint failed after {sent} attempt(s): {last}", self._wait_hint())

    async def _send(self, ep: Endpoint, audio: np.ndarray, options: TranscribeOptions,
                    on_delta: Callable[[str], None], read: float) -> Transcription:
        assert self._client is not None
        url = ep.translate_url if options.task == "translate" else ep.url
        data: dict[str, str] = {}
        stream = False
        if ep.style == OPENAI:
            if ep.owner is None:  # /v1/models has not answered yet (say the server was still starting): ask first
                with contextlib.suppress(httpx.HTTPError):
                    await self._models(ep, httpx.Timeout(max(self.connect_timeout, 2.0)))
            data["model"] = self.model or ep.model or "whisper-1"
            data["response_format"] = "verbose_json" if options.timestamps and ep.timed else "json"
            language = options.language or self.language
            if language and options.task != "translate":
                data["language"] = language
            if options.whisper_prompt and ep.owner == "vllm":
                if not ep.prompt_warned:
                    ep.prompt_warned = True
                    log.warning("%s is vLLM's server, which mangles Whisper prompts (<|prev|>, vllm#53206): "
                                "prompts are not sent to it", ep.url)
            elif options.whisper_prompt:
                data["prompt"] = options.whisper_prompt
            if options.temperature is not None:
                data["temperature"] = str(options.temperature)
            if self.stream and not options.timestamps:
                stream = True
                data["stream"] = "true"
        # another instance of this app gets the samples exactly: its decode of a window then reads as this one's
        # would (16-bit rounding alone turned a faint voice's reading into other words)
        files = {"file": ("segment.wav", wav_bytes(audio, exact=ep.owner == APP_OWNER), "audio/wav")}
        headers: dict[str, str] = {}
        if options.live and not options.partial:
            headers[LANE_HEADER] = "final"
        if options.coverage and options.timestamps and ep.owner == APP_OWNER and data.get("response_format"):
            headers[CLIP_HEADER] = "checked"  # decoded whole, as that instance's file path decodes a window
        try:
            async with self._client.stream("POST", url, data=data, files=files, headers=headers,
                                           timeout=httpx.Timeout(read, connect=self.connect_timeout)) as r:
                if r.status_code != 200:
                    await r.aread()
                    message = f"{r.status_code} {_error_message(r)}"
                    if r.status_code in (400, 422) and data.get("response_format") == "verbose_json":
                        ep.timed = False  # an endpoint without timestamps: ask for text, as before
                        log.warning("%s refused verbose_json (%s): asking it for json from now on", ep.url, message)
                        raise _Retryable(message)
                    if r.status_code in RETRYABLE_STATUS or r.status_code >= 500:
                        wait = retry_after_s(r.headers.get("retry-after"))
                        raise _Retryable(message, wait, busy=is_busy(r.status_code, wait))
                    if r.status_code in (401, 403):
                        raise EngineError(f"the endpoint {ep.url} refused the token ({message})")
                    raise EngineError(f"the endpoint {ep.url} rejected the segment ({message})")
                if stream and r.headers.get("content-type", "").startswith("text/event-stream"):
                    return await read_sse(r, on_delta)
                body = await r.aread()
                return parse_answer(r, body)
        except httpx.TimeoutException as exc:
            raise _Retryable(f"timed out ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:  # connection refused or dropped, protocol errors
            raise _Retryable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc

    def _uses_realtime(self, audio: np.ndarray, options: TranscribeOptions) -> bool:
        return (self.realtime and options.task == "transcribe" and not options.timestamps
                and audio.size <= REALTIME_MAX_S * SAMPLE_RATE)

    async def _send_realtime(self, ep: Endpoint, audio: np.ndarray, options: TranscribeOptions,
                             on_delta: Callable[[str], None], read: float) -> Transcription:
        """One clip over the endpoint's Realtime API WebSocket: manual commit, deltas until `.completed`."""
        import soxr
        import websockets
        from websockets.exceptions import InvalidStatus, WebSocketException

        headers = {"User-Agent": "realtime-transcription"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        language = options.language or self.language
        prompt = options.whisper_prompt[-REALTIME_MAX_PROMPT:] if options.whisper_prompt else None
        transcription: dict[str, Any] = {"model": self.model or ep.model or "whisper-1"}
        if language:
            transcription["language"] = language
        if prompt:
            transcription["prompt"] = prompt
        update = {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
            "format": {"type": "audio/pcm", "rate": REALTIME_RATE}, "turn_detection": None,
            "transcription": transcription}}}}
        pcm = soxr.resample(np.asarray(audio, dtype=np.float32), SAMPLE_RATE, REALTIME_RATE)
        # silence after the clip: the server's streaming resampler holds back its last ~20 ms, and a commit
        # needs at least 100 ms
        pcm = np.concatenate([pcm, np.zeros(max(int(REALTIME_PAD_S * REALTIME_RATE),
                                                int(0.15 * REALTIME_RATE) - pcm.size), np.float32)])
        pcm16 = (np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
        chunk = int(REALTIME_CHUNK_S * REALTIME_RATE) * 2
        self.realtime_requests += 1
        try:
            async with websockets.connect(ep.realtime_url, additional_headers=headers, user_agent_header=None,
                                          open_timeout=self.connect_timeout, ping_interval=None, proxy=None,
                                          max_size=16 * 2**20, close_timeout=1.0) as ws:

                async def event() -> dict[str, Any]:
                    raw = await asyncio.wait_for(ws.recv(), read)
                    try:
                        doc = json.loads(raw)
                    except ValueError:
                        raise _Retryable(f"malformed realtime event ({str(raw)[:60]!r})") from None
                    if not isinstance(doc, dict):
                        raise _Retryable(f"malformed realtime event ({str(raw)[:60]!r})")
                    if doc.get("type") == "error":
                        err = doc.get("error") if isinstance(doc.get("error"), dict) else {}
                        message = f"the endpoint's realtime session: {err.get('message') or err}"
                        if err.get("type") == "server_error":  # the server ended the session (limits)
                            raise _Retryable(message)
                        raise EngineError(message)
                    return doc

                await ws.send(json.dumps(update))
                while (await event()).get("type") not in ("session.updated", "transcription_session.updated"):
                    pass  # session.created comes first
                for start in range(0, len(pcm16), chunk):
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(pcm16[start:start + chunk]).decode()}))
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                item: str | None = None
                while True:
                    doc = await event()
                    kind = doc.get("type")
                    if kind == "input_audio_buffer.committed" and item is None:
                        item = doc.get("item_id")
                    if item is None or doc.get("item_id") != item:
                        continue
                    if kind == "conversation.item.input_audio_transcription.delta":
                        if doc.get("delta"):
                            on_delta(str(doc["delta"]))
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        return Transcription(text=str(doc.get("transcript") or "").strip(), language=language)
                    elif kind == "conversation.item.input_audio_transcription.failed":
                        err = doc.get("error") if isinstance(doc.get("error"), dict) else {}
                        raise EngineError(f"the endpoint {ep.realtime_url} failed on the segment "
                                          f"({err.get('message') or err})")
        except InvalidStatus as exc:
            status = exc.response.status_code
            body = (exc.response.body or b"").decode("utf-8", "replace")
            try:
                err = json.loads(body).get("error") or {}
                detail = str(err.get("message") if isinstance(err, dict) else err)[:200]
            except (ValueError, AttributeError):
                detail = body.strip()[:200]
            message = f"{status} {detail}".strip()
            if status in RETRYABLE_STATUS or status >= 500:
                retry_after = retry_after_s(exc.response.headers.get("retry-after"))
                raise _Retryable(f"realtime handshake {message}", retry_after,
                                 busy=is_busy(status, retry_after)) from exc
            if status in (401, 403):
                raise EngineError(f"the endpoint {ep.realtime_url} refused the token ({message})") from exc
            raise EngineError(f"the endpoint {ep.realtime_url} has no Realtime API ({message}); --remote-realtime "
                              "needs another instance of this app") from exc
        except TimeoutError as exc:
            raise _Retryable("realtime: timed out") from exc
        except (OSError, WebSocketException) as exc:  # refused, dropped, closed mid-request, bad handshake
            raise _Retryable(f"realtime: {type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from exc
        raise _Retryable("realtime: the connection ended before the transcript was completed")

    # -- the Engine interface
    def _fallback_active(self) -> bool:
        return self.fallback is not None and self._started and not any(
            ep.state == "closed" for ep in self.endpoints)

    async def _transcribe(self, audio: np.ndarray, options: TranscribeOptions,
                          on_delta: Callable[[str], None] | None = None) -> Transcription:
        deltas = _Deltas(on_delta)
        if not self._fallback_active():
            try:
                return await policy.with_fallback(lambda o: self._request(audio, o, deltas), options)
            except EndpointUnavailable as exc:
                # a partial that failed once is simply dropped; a final is never lost while a fallback exists
                if self.fallback is None or (options.partial and not self._fallback_active()):
                    raise
                log.warning("using the fallback engine: %s", exc)
        assert self.fallback is not None
        self.fallback_requests += 1
        result = await self.fallback.transcribe(audio, options)
        deltas.offer(result.text)
        return result

    async def _decode(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        return await self._transcribe(audio, options)

    async def _decode_stream(self, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
        """Text deltas as the endpoint produces them (one delta when it does not stream)."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        task = asyncio.ensure_future(self._transcribe(audio, options, on_delta=queue.put_nowait))
        try:
            while not (task.done() and queue.empty()):
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            task.result()  # raises the engine's error
        finally:
            task.cancel()

    @property
    def ready(self) -> bool:
        return self._started and (any(ep.state == "closed" for ep in self.endpoints) or self.fallback is not None)

    @property
    def multilingual(self) -> bool:
        return True

    @property
    def translates(self) -> bool:
        return True

    def describe(self) -> dict[str, Any]:
        now = time.monotonic()
        models = sorted({m for m in (self.model, *(ep.model for ep in self.endpoints)) if m})
        hosts = ", ".join(httpx.URL(ep.url).netloc.decode() for ep in self.endpoints)
        fallback = self.fallback.describe() if self.fallback is not None else None
        in_use = "fallback" if self._fallback_active() else "remote"
        model = f"{'/'.join(models) or 'remote model'} @ {hosts}"
        if in_use == "fallback" and fallback is not None:
            model = f"{fallback.get('model')} (fallback: endpoint down)"
        return {
            "engine": self.name,
            "model": model,
            "in_use": in_use,
            "ready": self.ready,
            "endpoints": [ep.public(now) for ep in self.endpoints],
            "fallback": fallback.get("model") if fallback else None,
            "fallback_requests": self.fallback_requests,
            "stream": self.stream,
            "realtime": self.realtime,
            "realtime_requests": self.realtime_requests,
            "max_in_flight": self.max_in_flight,
            "timeout_s": self.timeout,
            "retries": self.retries,
        }
