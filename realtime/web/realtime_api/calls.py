"""WebRTC calls (`POST /v1/realtime/calls`): the peer connection, its data channel carrying the same events as the
WebSocket, the microphone track fed to a `RealtimeConnection`, and the ephemeral client secrets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...audio import SAMPLE_RATE
from ...live.service import TranscriptionService
from .connection import RealtimeConnection
from .protocol import Config, EventError, _id

log = logging.getLogger(__name__)


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
