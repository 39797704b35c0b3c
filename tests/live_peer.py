"""A page's WebRTC client (aiortc) for the tests of live protocols, faults and limits, whose audio track can be told
when to send.

`Peer` posts an offer to `/webrtc/offer`, sends a recording on its audio track and reads the session's events from
`/transcript/{id}/events` (with the session's token where the app has a key). By default the track plays in real
time, as a microphone does; it can also:

- send faster than real time (`speed`), or stop for good at a point without hanging up (`stall_at`);
- wait at a point of the recording until something has happened (`Gate`): until the server has sent an event
  (say a partial of the segment being spoken), or until the test says so (say once an endpoint's fault has been
  answered). A gate makes a moment that depends on the server's speed happen on purpose instead of by luck: the
  stream waits for it, without a deadline that a busy machine could miss. While it waits, the track either sends
  nothing or keeps the speech going slowly (`drip_s`: one 20 ms frame each so many seconds), so that a session
  that needs more audio to act on (a partial is scheduled on incoming audio) gets it.
"""

from __future__ import annotations

import asyncio
import fractions
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from realtime.audio import SAMPLE_RATE
from realtime.bench.client import FRAME
from realtime.web.ice import use_loopback_only

Events = list[dict[str, Any]]

SETTLE_S = 300.0
"""The longest wait for the server's answers: reached only when something is wrong."""


@dataclass
class Gate:
    """At `at` seconds of the recording the track waits until `ready(events)` holds (checked every 50 ms); while it
    waits it sends nothing, or one frame of the recording every `drip_s` seconds."""

    at: float
    ready: Callable[[Events], bool]
    drip_s: float | None = None


def partial_of(segment: int) -> Callable[[Events], bool]:
    """Whether a partial with text of `segment` has reached the client."""
    return lambda events: any(e["type"] == "partial" and e["segment"] == segment and e.get("text")
                              for e in events)


def outcomes(events: Events) -> dict[int, list[str]]:
    """Each segment the server opened, with the final and error events it got."""
    seen: dict[int, list[str]] = {e["segment"]: [] for e in events if e["type"] == "speech_started"}
    for e in events:
        if e["type"] in ("final", "error"):
            seen.setdefault(e["segment"], []).append(e["type"])
    return seen


def settled(n: int, reaching: float = 0.0) -> Callable[[Events], bool]:
    """Whether n segments have opened and each has its outcome, one of them ending at `reaching` seconds of the
    recording or later (say the start of its last sentence): the server may still be reading the audio after the
    client has sent its last packet, and a segment it has not opened yet has no outcome to wait for."""
    def check(events: Events) -> bool:
        seen = outcomes(events)
        ends = [e["audio_end"] for e in events if e["type"] in ("final", "error")]
        return len(seen) >= n and all(seen.values()) and max(ends, default=-1.0) >= reaching
    return check


class Peer:
    """An aiortc client of the page's WebRTC route; an async context manager (the offer, then the hang-up)."""

    def __init__(self, url: str, audio: np.ndarray, *, speed: float = 1.0, stall_at: float | None = None,
                 tail: float = 2.0, gates: list[Gate] | None = None, read_events: bool = True,
                 webrtc_id: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.webrtc_id = webrtc_id or uuid.uuid4().hex[:12]
        self.events: Events = []
        self.token: str | None = None
        self.offers = 0
        self.track = _track(self, audio, speed, stall_at, tail, sorted(gates or [], key=lambda g: g.at))
        self.read_events = read_events
        self.pc: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Peer:
        from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

        use_loopback_only()
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.createDataChannel("text")
        self.pc.addTrack(self.track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{self.url}/webrtc/offer", json={
                "sdp": self.pc.localDescription.sdp, "type": "offer", "webrtc_id": self.webrtc_id})
        answer = r.json()
        if r.status_code != 200 or "sdp" not in answer:
            await self.pc.close()
            raise AssertionError(f"offer refused ({r.status_code}): {r.text}")
        self.token = answer.get("transcript_token")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        if self.read_events:
            self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()

    async def _read(self) -> None:
        params = {"token": self.token} if self.token else None
        async with httpx.AsyncClient(timeout=httpx.Timeout(30, read=None)) as http:
            async with http.stream("GET", f"{self.url}/transcript/{self.webrtc_id}/events", params=params) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        now = time.monotonic()
                        t0 = self.track.t0 if self.track.t0 is not None else now
                        self.events.append(json.loads(line[6:]) | {"at": now, "t": round(now - t0, 3)})

    async def connected(self, timeout: float = SETTLE_S) -> None:
        """Until the connection is up. One closed before then stays open on the server until its ICE checks give up
        (about 30 s); one closed after is gone there at once."""
        deadline = time.monotonic() + timeout
        while self.pc.connectionState != "connected":
            assert time.monotonic() < deadline, f"not connected: {self.pc.connectionState}"
            await asyncio.sleep(0.02)

    async def until(self, done: Callable[[Events], bool], timeout: float = SETTLE_S) -> None:
        """Until `done(events)`; `timeout` is a deadline that only a fault reaches."""
        deadline = time.monotonic() + timeout
        while not done(self.events):
            assert time.monotonic() < deadline, f"timed out; events: {self.summary()}"
            await asyncio.sleep(0.05)

    async def finished(self, n: int, reaching: float = 0.0, timeout: float = SETTLE_S) -> None:
        """Until the whole recording has been sent and n segments have their outcomes, one ending at `reaching` or
        later (`settled`)."""
        done = settled(n, reaching)
        await self.until(lambda ev: self.track.done.is_set() and done(ev), timeout)

    def summary(self) -> list[tuple[Any, ...]]:
        return [(e["type"], e.get("segment"), e.get("text") or e.get("message") or e.get("reason"))
                for e in self.events if e["type"] != "partial"]


def _track(peer: Peer, audio: np.ndarray, speed: float, stall_at: float | None, tail: float,
           gates: list[Gate]) -> Any:
    from aiortc import MediaStreamTrack
    from aiortc.mediastreams import MediaStreamError
    from av import AudioFrame

    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    speech_samples = pcm.size
    pcm = np.concatenate([pcm, np.zeros(int(tail * SAMPLE_RATE), np.int16)])
    pending = list(gates)

    class Track(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.index = 0
            self.t0: float | None = None
            self.shift = 0.0
            """Seconds the recording's schedule has moved on by (the time spent at gates)."""
            self.tail_t0: float | None = None
            self.stalled = asyncio.Event()
            self.done = asyncio.Event()
            self.gated = 0
            """Gates passed."""

        async def _gate(self, start: int) -> None:
            """Wait at the gate due at `start` until it opens, or (dripping) for one frame's turn."""
            while pending and start >= pending[0].at * SAMPLE_RATE:
                gate = pending[0]
                if gate.ready(peer.events):
                    pending.pop(0)
                    self.gated += 1
                elif gate.drip_s is not None and start < speech_samples:
                    await asyncio.sleep(gate.drip_s)  # this frame goes out; the gate is asked again at the next
                    return
                else:
                    await asyncio.sleep(0.05)

        async def recv(self) -> AudioFrame:
            if self.readyState != "live":
                raise MediaStreamError
            start = self.index * FRAME
            if stall_at is not None and start >= stall_at * SAMPLE_RATE:
                self.stalled.set()
                await asyncio.Event().wait()  # never another frame, and no hang-up
            self.t0 = self.t0 or time.monotonic()
            held = time.monotonic()
            await self._gate(start)
            now = time.monotonic()
            self.shift += now - held
            if start < speech_samples:  # the recording at `speed`, then the tail in real time
                target = self.t0 + self.shift + start / SAMPLE_RATE / speed
            else:
                self.tail_t0 = self.tail_t0 or now
                target = self.tail_t0 + (start - speech_samples) / SAMPLE_RATE
            await asyncio.sleep(max(0.0, target - now))
            chunk = pcm[start : start + FRAME]
            if chunk.size < FRAME:
                chunk = np.pad(chunk, (0, FRAME - chunk.size))
                self.done.set()
            frame = AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = SAMPLE_RATE
            frame.pts = start
            frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
            self.index += 1
            return frame

    return Track()
