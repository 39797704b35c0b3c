"""Graceful shutdown on SIGTERM: refuse new sessions, deliver the finals of closed segments, then exit.

On the first SIGTERM, `GracefulServer` (uvicorn's server) does not stop at once: `Drain.run` marks the app
draining (`POST /webrtc/offer` answers 503), waits until every live session's closed segments have their
final (or error) delivered, at most `--shutdown-timeout` seconds, tells each session's consumers why it ends
(a `closed` event, reason `shutdown`) and closes it; then uvicorn stops as usual (open event streams are cut
after `GRACEFUL_HTTP_S`). A second SIGTERM, or SIGINT, stops at once as before.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from types import FrameType
from typing import Any

import uvicorn

from ..live.events import ClosedEvent
from ..live.service import TranscriptionService

log = logging.getLogger(__name__)

GRACEFUL_HTTP_S = 2
"""Seconds uvicorn waits for open HTTP connections (event streams) once the drain is over."""
EVENT_GRACE_S = 0.5
"""Lets the closed events reach the event streams before the server stops."""
MESSAGE = "The server is shutting down; this session has ended. Its transcript so far was delivered."


class Drain:
    """The app's shutdown state, shared by its offer route and the server."""

    def __init__(self, service: TranscriptionService, timeout_s: float) -> None:
        self.service, self.timeout_s = service, timeout_s
        self.draining = False

    async def run(self) -> None:
        self.draining = True
        deadline = time.monotonic() + self.timeout_s
        sessions = self.service.sessions
        log.info("SIGTERM: draining %d sessions (at most %.0fs)", len(sessions), self.timeout_s)
        while any(s.pending_finals for s in sessions.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = sum(s.pending_finals for s in sessions.values())
        for sid, session in list(sessions.items()):
            session.on_event(ClosedEvent("shutdown", MESSAGE))
            self.service.close_session(sid)
        if left:
            log.warning("drain deadline reached: %d finals not delivered", left)
        await asyncio.sleep(EVENT_GRACE_S)
        log.info("drained: %d finals left undelivered", left)


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.drain.draining or self._loop is None:
            super().handle_exit(sig, frame)
            return
        self.drain.draining = True
        self._loop.call_soon_threadsafe(self._start_drain, sig, frame)

    def _start_drain(self, sig: int, frame: FrameType | None) -> None:
        async def drain_then_exit() -> None:
            try:
                await self.drain.run()
            except Exception:
                log.exception("drain failed")
            super(GracefulServer, self).handle_exit(sig, frame)

        self._task = asyncio.get_running_loop().create_task(drain_then_exit())
