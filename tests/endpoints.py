"""Real HTTP servers on 127.0.0.1 for the remote-engine and API tests: a Whisper endpoint that misbehaves on command.

`FakeEndpoint` answers `POST .../audio/transcriptions` (OpenAI or Hugging Face style), `GET /health` and
`GET /v1/models` over a real socket (HTTP/1.1, keep-alive). Each transcription request takes the next
behaviour from `script` (else `default`; clips shorter than `script_min_seconds` skip the script):

    ok            {"text": "segment N"}; N is read from the WAV's first sample (see `segment_audio`)
    500, 503      an error reply (OpenAI error shape)
    429:S         429 with Retry-After: S
    busy:S        503 with Retry-After: S, as this app answers when its API transcriptions are all running
    slow:S        the ok reply, S seconds late
    drop          the connection is closed without a reply
    drop-mid      200 with its headers and part of the body, then the connection is closed (a reply cut short)
    trickle:S     the ok reply a byte every S seconds (each read is quick, the whole reply is late)
    badjson       200 with a body that is not JSON
    garbage       200 `application/json` with a body of random bytes
    html          200 with an HTML page (a proxy's or a captive portal's), not the transcription
    wrongjson     200 with JSON in another shape (no `text`)
    sse-vllm      vLLM's streamed chunks (choices[].delta.content, then [DONE])
    sse-openai    OpenAI's transcript.text.delta / transcript.text.done events
    sse-drop      two vLLM chunks, then the connection is closed
    hold          wait until `release()`, then ok
    hold-mid      with `upstream`: forward the request's headers and the first half of its body, wait until
                  `release()`, then the rest (the request is at the upstream meanwhile, its upload unfinished)

With `upstream` set, `ok` (and GET, while healthy) forwards the request to that server instead: a
fault-injecting proxy. Its forwarding can be gated (`gate()`: requests wait here, before the upstream sees them,
until `open_gate()`; `wait_forwarding(n)`: until at most n are at the upstream), so that a test knows which
requests the upstream holds. `HeldUpload` is a client whose upload stops half-way until it is released.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np

SSE_WORDS = ["Hello", " there,", " general", " Kenobi."]


def segment_audio(n: int, seconds: float = 0.5) -> np.ndarray:
    """A clip that identifies itself: constant amplitude (n + 10) / 100, read back by the endpoint (loud enough
    that the decoding policy sends it as it is: quiet audio is raised before an engine hears it)."""
    return np.full(int(16000 * seconds), (n + 10) / 100, dtype=np.float32)


def _samples(wav: bytes) -> tuple[np.ndarray, int]:
    """A mono WAV's samples in [-1, 1] and its rate: 16-bit PCM, or 32-bit float (what the remote engine sends to
    another instance of this app)."""
    chunks: dict[bytes, bytes] = {}
    at = 12
    while at + 8 <= len(wav):
        name, size = wav[at:at + 4], struct.unpack("<I", wav[at + 4:at + 8])[0]
        chunks[name] = wav[at + 8:at + 8 + size]
        at += 8 + size + size % 2
    tag, _, rate = struct.unpack("<HHI", chunks[b"fmt "][:8])
    if tag == 3:
        return np.frombuffer(chunks[b"data"], dtype="<f4"), rate
    return np.frombuffer(chunks[b"data"], dtype="<i2") / 32767.0, rate


def _seconds(wav: bytes) -> float:
    samples, rate = _samples(wav)
    return samples.size / rate


def _segment_id(wav: bytes) -> int:
    first = _samples(wav)[0][:1]
    return round(float(first[0]) * 100) - 10 if first.size else -1


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, str], bytes | None]:
    msg = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + body)
    fields: dict[str, str] = {}
    audio = None
    for part in msg.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file":
            audio = payload
        elif name:
            fields[str(name)] = payload.decode()
    return fields, audio


class FakeEndpoint:
    def __init__(self, upstream: str | None = None, model: str = "fake-whisper", owner: str = "fake") -> None:
        self.script: deque[str] = deque()
        self.script_min_seconds = 0.0
        """Shorter clips (a live session's early partials) get `default` and leave the script alone."""
        self.default = "ok"
        self.health_status = 200
        self.model = model
        self.owner = owner
        """`owned_by` in /v1/models ("vllm" makes it look like vLLM's server)."""
        self.upstream = upstream.rstrip("/") if upstream else None
        self.script_lane: str | None = None
        """When set, only requests with this lane header (`final`: a live session's finals) take the script."""
        self.log: list[dict[str, Any]] = []
        self.health_checks = 0
        self.holding = threading.Event()
        """Set once a `hold` or `hold-mid` request is held (for `hold-mid`: its first half is at the upstream)."""
        self.forwarding = 0
        """Requests past the gate and not yet answered by the upstream."""
        self._held = threading.Event()
        self._lock = threading.Lock()
        self._gate = threading.Condition()
        self._gated = False
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    with endpoint._lock:
                        endpoint.health_checks += 1
                if endpoint.upstream is not None and endpoint.health_status == 200:
                    with httpx.Client(timeout=30) as client:
                        r = client.get(endpoint.upstream + self.path,
                                       headers={k: v for k, v in self.headers.items() if k.lower() == "authorization"})
                    self._json(r.status_code, r.json())
                elif self.path == "/health":
                    self._json(endpoint.health_status, {"ok": endpoint.health_status == 200})
                elif self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": endpoint.model, "object": "model",
                                                             "owned_by": endpoint.owner}]})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                fields, wav = _multipart(self.headers.get("content-type", ""), body)
                seconds = _seconds(wav) if wav else 0.0
                lane = self.headers.get("x-transcription-lane")
                with endpoint._lock:
                    scripted = endpoint.script and seconds >= endpoint.script_min_seconds and \
                        endpoint.script_lane in (None, lane)
                    behaviour = endpoint.script.popleft() if scripted else endpoint.default
                    entry = {"t": time.monotonic(), "path": self.path, "behaviour": behaviour, "fields": fields,
                             "segment": _segment_id(wav) if wav else None, "port": self.client_address[1],
                             "digest": hashlib.sha1(wav or b"").hexdigest()[:12], "seconds": seconds,
                             "auth": self.headers.get("authorization"),
                             "lane": lane,
                             "clip": self.headers.get("x-transcription-clip"),
                             "float": bool(wav) and struct.unpack("<H", wav[20:22])[0] == 3}
                    endpoint.log.append(entry)
                endpoint.on_request(self, behaviour, entry, body)

            def _json(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up on a slow reply: expected here

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    # -- behaviours
    def on_request(self, h: Any, behaviour: str, entry: dict[str, Any], body: bytes) -> None:
        name, _, arg = behaviour.partition(":")
        if name == "hold-mid" and self.upstream is not None:
            self._forward(h, entry, body, hold=True)
            return
        if name == "hold":
            self.holding.set()
            self._held.wait(30)
            name = "ok"
        if name == "slow":
            time.sleep(float(arg))
            name = "ok"
        if name == "ok":
            if self.upstream is not None:
                self._forward(h, entry, body)
            else:
                h._json(200, {"text": f"segment {entry['segment']}"})
        elif name in ("500", "503"):
            h._json(int(name), {"error": {"message": f"injected {name}", "type": "server_error", "code": None}})
        elif name == "busy":
            h._json(503, {"error": {"message": "the server is busy (8 transcriptions running); retry shortly",
                                    "type": "server_error", "code": "overloaded"}}, {"Retry-After": arg})
        elif name == "429":
            h._json(429, {"error": {"message": "slow down", "type": "rate_limit", "code": None}},
                    {"Retry-After": arg})
        elif name == "drop":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
        elif name == "drop-mid":
            data = json.dumps({"text": f"segment {entry['segment']}"}).encode()
            h.close_connection = True
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
        elif name == "trickle":
            data = json.dumps({"text": f"segment {entry['segment']}"}).encode()
            h.close_connection = True
            h.send_response(200)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.flush()
            try:
                for i in range(len(data)):
                    h.wfile.write(data[i : i + 1])
                    h.wfile.flush()
                    time.sleep(float(arg))
            except OSError:
                pass  # the client gave up
        elif name in ("badjson", "garbage", "html", "wrongjson"):
            data, ctype = {
                "badjson": (b'{"text": "segment', "application/json"),
                "garbage": (hashlib.sha256(body).digest() * 8, "application/json"),
                "html": (b"<html><body><h1>Sign in to continue</h1></body></html>", "text/html"),
                "wrongjson": (json.dumps({"result": {"text": 5}}).encode(), "application/json"),
            }[name]
            h.send_response(200)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        elif name.startswith("sse-"):
            h.close_connection = True
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Connection", "close")
            h.end_headers()
            words = SSE_WORDS[:2] if name == "sse-drop" else SSE_WORDS
            for w in words:
                if name == "sse-openai":
                    event = {"type": "transcript.text.delta", "delta": w}
                else:
                    event = {"id": "trsc-1", "object": "transcription.chunk", "choices": [{"delta": {"content": w}}]}
                h.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                h.wfile.flush()
                time.sleep(0.05)
            if name == "sse-drop":
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            if name == "sse-openai":
                h.wfile.write(f"data: {json.dumps({'type': 'transcript.text.done', 'text': ''.join(SSE_WORDS)})}\n\n"
                              .encode())
            else:
                h.wfile.write(b"data: [DONE]\n\n")
            h.wfile.flush()
        else:
            raise ValueError(f"unknown behaviour {behaviour}")

    def _forward(self, h: Any, entry: dict[str, Any], body: bytes, hold: bool = False) -> None:
        """The request sent on to the upstream and its answer back; an upstream that fails to answer is a 502."""
        headers = {k: v for k, v in h.headers.items()
                   if k.lower() in ("content-type", "authorization") or k.lower().startswith("x-transcription-")}
        headers["Content-Length"] = str(len(body))

        def content() -> Iterator[bytes]:
            half = len(body) // 2
            yield body[:half]
            self.holding.set()
            self._held.wait(60)
            yield body[half:]

        with self._gate:
            while self._gated:
                self._gate.wait()
            self.forwarding += 1
        try:
            with httpx.Client(timeout=60) as client:
                r = client.post(self.upstream + h.path, content=content() if hold else body, headers=headers)
            status, ctype, data = r.status_code, r.headers.get("content-type", "application/json"), r.content
        except httpx.HTTPError as exc:
            status, ctype = 502, "application/json"
            error = {"message": f"upstream: {type(exc).__name__}", "type": "server_error"}
            data = json.dumps({"error": error}).encode()
        finally:
            with self._gate:
                self.forwarding -= 1
                self._gate.notify_all()
        entry["forwarded"] = status
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    # -- control
    def hold_next(self) -> None:
        """The next scripted request waits until `release()`."""
        self._held.clear()
        self.script.append("hold")

    def release(self) -> None:
        self._held.set()

    def gate(self) -> None:
        """Requests not yet forwarded wait here until `open_gate()`."""
        with self._gate:
            self._gated = True

    def open_gate(self) -> None:
        with self._gate:
            self._gated = False
            self._gate.notify_all()

    def wait_forwarding(self, at_most: int, timeout: float = 120) -> None:
        """Until at most `at_most` requests are at the upstream (the others answered, or waiting at the gate)."""
        deadline = time.monotonic() + timeout
        with self._gate:
            while self.forwarding > at_most:
                left = deadline - time.monotonic()
                assert left > 0, f"{self.forwarding} requests still at the upstream"
                self._gate.wait(left)

    def down(self) -> None:
        """Health checks fail and every request gets a 500."""
        self.health_status, self.default = 503, "500"

    def up(self) -> None:
        self.health_status, self.default = 200, "ok"

    def requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.log)

    def close(self) -> None:
        self._held.set()
        self.open_gate()
        self.server.shutdown()
        self.server.server_close()


class HeldUpload:
    """A client's upload to `url` that stops half-way through its body until `release()`: the server holds the
    request meanwhile (this app counts it among its `--api-max-requests` and a pool replica among its ongoing
    requests), at no cost in decoding. Released with `finish`, the rest is sent and the answer awaited; without, the
    client hangs up (the server sees a client that disconnected during its upload)."""

    def __init__(self, url: str, audio: bytes, headers: dict[str, str] | None = None) -> None:
        request = httpx.Request("POST", url, files={"file": ("held.flac", audio)}, headers=headers or {})
        self.body = request.read()
        self.headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        self.url = url
        self.sent = threading.Event()
        """The first half is on its way (the server has the request once its headers arrive)."""
        self.response: httpx.Response | None = None
        self.error: Exception | None = None
        self._release = threading.Event()
        self._finish = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _content(self) -> Iterator[bytes]:
        half = len(self.body) // 2
        yield self.body[:half]
        self.sent.set()
        self._release.wait(300)
        if not self._finish:
            raise ConnectionAbortedError("the client hung up")
        yield self.body[half:]

    def _run(self) -> None:
        try:
            with httpx.Client(timeout=300) as client:
                self.response = client.post(self.url, content=self._content(), headers=self.headers)
        except Exception as exc:  # the hang-up, or what the server did about it
            self.error = exc
        finally:
            self.sent.set()

    def release(self, finish: bool = False, timeout: float = 120) -> httpx.Response | None:
        """Sends the rest (`finish`) or hangs up; the answer, once the request is over."""
        self._finish = finish
        self._release.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the held upload did not end"
        return self.response
