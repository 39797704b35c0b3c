"""A WebRTC client (aiortc) that plays an audio file to a running app in real time.

It posts an SDP offer to `/webrtc/offer`, sends the file as a live audio track paced at real time
(then a little silence so the last segment closes), reads the session's events from
`/transcript/{id}/events` and reports latencies. `python -m realtime stream URL FILE` runs it.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from ..web.ice import use_loopback_only

FRAME = 320  # 20 ms at 16 kHz


class StreamError(RuntimeError):
    """The server refused the connection or the stream broke."""


def _make_track(audio: np.ndarray, tail_seconds: float) -> Any:
    from aiortc import MediaStreamTrack
    from aiortc.mediastreams import MediaStreamError
    from av import AudioFrame

    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    pcm = np.concatenate([pcm, np.zeros(int(tail_seconds * SAMPLE_RATE), dtype=np.int16)])
    audio_frames = (audio.size + FRAME - 1) // FRAME

    class FileTrack(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.t0: float | None = None
            self.index = 0
            self.file_done = asyncio.Event()
            self.all_done = asyncio.Event()

        async def recv(self) -> AudioFrame:
            if self.readyState != "live":
                raise MediaStreamError
            now = time.monotonic()
            if self.t0 is None:
                self.t0 = now
            target = self.t0 + self.index * FRAME / SAMPLE_RATE
            if target > now:
                await asyncio.sleep(target - now)
            start = self.index * FRAME
            chunk = pcm[start : start + FRAME]
            if chunk.size < FRAME:
                chunk = np.pad(chunk, (0, FRAME - chunk.size))
                self.all_done.set()
            if self.index + 1 >= audio_frames:
                self.file_done.set()
            frame = AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.pts = start
            frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
            self.index += 1
            return frame

    return FileTrack()


@dataclass
class StreamResult:
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    webrtc_id: str = ""
    token: str | None = None
    """The session's transcript token, when the server requires one (realtime/web/access.py)."""


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 3)


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    finals = [e for e in events if e["type"] in ("final", "error")]
    segments = {e["segment"] for e in events if "segment" in e}
    final_lat = [e["t"] - e["audio_end"] for e in finals if e["type"] == "final"]
    first_partial: dict[int, float] = {}
    for e in events:
        if e["type"] == "partial" and e["segment"] not in first_partial:
            first_partial[e["segment"]] = e["t"] - e["start"]
    return {
        "segments": len(segments),
        "finals": sum(1 for e in finals if e["type"] == "final"),
        "errors": sum(1 for e in finals if e["type"] == "error"),
        "final_latency_p50": _percentile(final_lat, 0.5),
        "final_latency_p95": _percentile(final_lat, 0.95),
        "final_latency_max": round(max(final_lat), 3) if final_lat else None,
        "first_partial_latency_p50": _percentile(list(first_partial.values()), 0.5),
        "partials": sum(1 for e in events if e["type"] == "partial"),
        "text": " ".join(e["text"] for e in finals if e["type"] == "final" and e["text"]),
    }


async def stream_file(
    url: str,
    path: str | Path | None = None,
    *,
    audio: np.ndarray | None = None,
    ice_loopback: bool = False,
    tail_seconds: float = 2.0,
    settle_timeout: float = 30.0,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    ice_servers: list[dict[str, Any]] | None = None,
    relay_only: bool = False,
) -> StreamResult:
    """Play a file (or 16 kHz float32 `audio`) to the app at `url`; return every event and a summary.

    `ice_servers` (browser-style dicts, e.g. from `fetch_rtc_configuration`) and `relay_only` (ICE transport
    policy "relay": only TURN candidates) configure the client's peer; by default it uses no ICE servers.
    """
    from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
    from aiortc.rtcconfiguration import RTCIceTransportPolicy

    if ice_loopback:
        use_loopback_only()
    if audio is None:
        if path is None:
            raise ValueError("give a file or audio")
        audio = decode_file(path)
    url = url.rstrip("/")
    result = StreamResult(webrtc_id=uuid.uuid4().hex[:12])
    servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
               for s in ice_servers or []]
    policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
    pc = RTCPeerConnection(RTCConfiguration(iceServers=servers, iceTransportPolicy=policy))
    pc.createDataChannel("text")
    track = _make_track(audio, tail_seconds)
    pc.addTrack(track)
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    try:
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as http:
            r = await http.post(f"{url}/webrtc/offer", json={
                "sdp": pc.localDescription.sdp, "type": pc.localDescription.type, "webrtc_id": result.webrtc_id})
            answer = r.json()
            if r.status_code != 200 or answer.get("status") == "failed" or "sdp" not in answer:
                meta = answer.get("meta") or {}
                reason = ": ".join(str(m) for m in (meta.get("error"), meta.get("message")) if m)
                reason = reason or answer.get("error") or r.text
                raise StreamError(f"server refused the stream: {reason}")
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
            result.token = answer.get("transcript_token")  # the server's key guards transcripts (web/access.py)
            query = f"?token={result.token}" if result.token else ""

            async def read_events() -> None:
                try:
                    async with http.stream("GET", f"{url}/transcript/{result.webrtc_id}/events{query}") as resp:
                        async for line in resp.aiter_lines():
                            if line.startswith("data: "):
                                event = json.loads(line[6:])
                                t0 = track.t0 if track.t0 is not None else time.monotonic()
                                event["t"] = round(time.monotonic() - t0, 3)
                                await queue.put(event)
                finally:
                    await queue.put(None)

            reader = asyncio.create_task(read_events())
            deadline: float | None = None
            open_segments: set[int] = set()
            try:
                while True:
                    if deadline is None and track.all_done.is_set():
                        deadline = time.monotonic() + settle_timeout
                    if deadline is not None and not open_segments:
                        break
                    if deadline is not None and time.monotonic() > deadline:
                        break
                    try:
                        event = await asyncio.wait_for(queue.get(), 0.2)
                    except TimeoutError:
                        continue
                    if event is None:
                        break
                    if event["type"] in ("speech_started", "partial"):
                        open_segments.add(event["segment"])
                    elif event["type"] in ("final", "error"):
                        open_segments.discard(event["segment"])
                    result.events.append(event)
                    if on_event is not None:
                        on_event(event)
            finally:
                reader.cancel()
    finally:
        await pc.close()
    result.summary = summarize(result.events)
    result.summary["unfinished_segments"] = sorted(
        {e["segment"] for e in result.events if e["type"] in ("speech_started", "partial")}
        - {e["segment"] for e in result.events if e["type"] in ("final", "error")}
    )
    return result


async def fetch_rtc_configuration(url: str) -> dict[str, Any]:
    """The ICE servers (with fresh TURN credentials) the app at `url` hands its clients."""
    async with httpx.AsyncClient(timeout=30.0) as http:
        r = await http.get(f"{url.rstrip('/')}/webrtc/rtc-configuration")
    body = r.json()
    if r.status_code != 200:
        raise StreamError(f"no ICE servers from the app: {(body.get('error') or {}).get('message', r.text)}")
    return body


def event_line(event: dict[str, Any]) -> str:
    """An event as `python -m realtime stream` prints it: whole, as one JSON line (a speaker event with its speaker
    and turns, an error with its message)."""
    return json.dumps(event, ensure_ascii=False)


def run_stream(url: str, path: str, ice_loopback: bool, tail: float) -> int:
    def show(event: dict[str, Any]) -> None:
        print(event_line(event), flush=True)

    try:
        res = asyncio.run(stream_file(url, path, ice_loopback=ice_loopback, tail_seconds=tail, on_event=show))
    except (StreamError, httpx.HTTPError, OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
    summary = {k: res.summary[k] for k in ("segments", "finals", "final_latency_p50", "final_latency_p95",
                                           "first_partial_latency_p50")}
    print(json.dumps({"summary": summary}), flush=True)
    return 0 if not res.summary["unfinished_segments"] else 1


__all__ = ["StreamError", "StreamResult", "fetch_rtc_configuration", "stream_file", "summarize"]
