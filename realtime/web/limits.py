"""Limits for a public demo: per-session time limit, idle and abandoned sessions reclaimed, with a message.

fastrtc refuses a connection over `--concurrency-limit` itself (the page shows "Too many concurrent
connections"). `SessionLimits` sweeps the live sessions every `TICK_S` and ends:
- a session older than `--session-time-limit`;
- a session with no speech for `--idle-timeout` seconds;
- a session whose audio stopped arriving (a client gone, or stuck, without hanging up) for `--idle-timeout`
  seconds, or `STALE_AUDIO_S` without an idle timeout;
- a WebRTC connection whose audio arrives faster than real time (more than `AHEAD_S` of audio beyond the
  time it has been sending): a live stream cannot run ahead of the clock, and a client that floods the
  server would lose audio to full socket buffers without anyone knowing. Files go to the HTTP API. (Realtime
  API WebSocket sessions may send audio as fast as they like, as OpenAI's do: the rule skips them.)

Ending one keeps what was said: the session stops taking audio, its open segment is closed and every closed
segment's final (or error) is delivered (at most `FINISH_S`), then the session is closed (its transcript stays
downloadable) and the visitor is told why: a last `closed` event (shown in the page's status line and sent to
`/transcript/{id}/events` clients), then a warning on the data channel and fastrtc's `update_connection`
"closed" message, which makes the page stop its stream; the server hangs up shortly after in any case.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import Settings
from ..live.events import ClosedEvent
from ..live.service import TranscriptionService
from ..live.session import TranscriptionSession

log = logging.getLogger(__name__)

TICK_S = 0.25
STALE_AUDIO_S = 30.0
AHEAD_S = 5.0
"""Audio a WebRTC client may have sent beyond real time (a start-up burst, jitter) before it is refused."""
FINISH_S = 15.0
"""Longest wait for an ending session's finals."""
EVENT_GRACE_S = 1.0  # lets the closed event reach the page before the page is told to stop
HANGUP_GRACE_S = 2.0  # then the server closes the peer connection if the client has not


@dataclass
class _Watch:
    samples: int
    audio_at: float
    voice_at: float


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 120 and seconds % 60 == 0 else f"{seconds:g} s"


class SessionLimits:
    def __init__(self, settings: Settings, service: TranscriptionService, webrtc: Any) -> None:
        self.settings = settings
        self.service = service
        self.webrtc = webrtc
        self.reclaimed: Counter[str] = Counter()
        self._watch: dict[str, _Watch] = {}
        self._closing: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._hangups: set[asyncio.Task[None]] = set()

    def describe(self) -> dict[str, Any]:
        s = self.settings
        return {
            "concurrency_limit": s.concurrency_limit,
            "session_time_limit_s": s.session_time_limit or None,
            "idle_timeout_s": s.idle_timeout or None,
            "connections": len(self.webrtc.pcs),
            "reclaimed": dict(self.reclaimed),
        }

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.sweep(time.monotonic())
            except Exception:  # the sweeper must outlive any one bad session
                log.exception("session sweep failed")

    def sweep(self, now: float) -> None:
        s = self.settings
        for sid, session in list(self.service.sessions.items()):
            segmenter = session.segmenter
            w = self._watch.get(sid)
            if w is None:
                w = self._watch[sid] = _Watch(segmenter.samples, now, now)
            if segmenter.samples != w.samples:
                w.samples, w.audio_at = segmenter.samples, now
            if segmenter.announced:
                w.voice_at = now
            if sid in self._closing:
                continue
            # measured from the session's start, which no real-time audio can precede: a server that stalled and
            # then reads a backlog of frames at once does not look ahead of the clock
            sending = now - session.started_at
            ahead = session.stream_time - sending
            stale = min(STALE_AUDIO_S, s.idle_timeout) if s.idle_timeout else STALE_AUDIO_S
            if ahead > AHEAD_S and sid in self.webrtc.pcs:
                self._end(sid, "too_fast", f"Audio arrived faster than real time ({session.stream_time:.0f} s of "
                                           f"audio in {sending:.0f} s), so the session was closed: this "
                                           "stream is for live audio. Send recordings to /v1/audio/transcriptions.")
            elif now - w.audio_at >= stale:
                self._end(sid, "no_audio", f"No audio arrived for {_minutes(stale)}; the session was closed.")
            elif s.session_time_limit and now - session.started_at >= s.session_time_limit:
                self._end(sid, "time_limit", f"This demo allows {_minutes(s.session_time_limit)} per session, "
                                             "so this one has ended. Press the microphone to start a new one.")
            elif s.idle_timeout and now - w.voice_at >= s.idle_timeout:
                self._end(sid, "idle", f"Session closed after {_minutes(s.idle_timeout)} without speech, to free "
                                       "its place for others. Press the microphone to start again.")
        for sid in set(self._watch) - set(self.service.sessions):
            del self._watch[sid]
            self._closing.discard(sid)

    def _end(self, sid: str, reason: str, message: str) -> None:
        self._closing.add(sid)
        self.reclaimed[reason] += 1
        log.info("session %s ended (%s): %s", sid, reason, message)
        task = asyncio.create_task(self._hang_up(sid, reason, message))
        self._hangups.add(task)
        task.add_done_callback(self._hangups.discard)

    async def _hang_up(self, sid: str, reason: str, message: str) -> None:
        session = self.service.sessions.get(sid)
        if session is not None:
            await self._finish(session)
            if self.service.sessions.get(sid) is session:  # not closed meanwhile (the client hung up)
                session.on_event(ClosedEvent(reason, message))
                self.service.close_session(sid)  # the transcript stops here (and stays downloadable)
        await asyncio.sleep(EVENT_GRACE_S)
        channel = self.webrtc.data_channels.get(sid)
        if channel is not None and getattr(channel, "readyState", "open") == "open":
            from fastrtc.utils import create_message  # fastrtc (and gradio) load with the server, not with this module

            channel.send(create_message("warning", message))
            channel.send(create_message("update_connection", "closed"))
        await asyncio.sleep(HANGUP_GRACE_S)
        pc = self.webrtc.pcs.get(sid)
        if pc is not None:
            await pc.close()

    @staticmethod
    async def _finish(session: TranscriptionSession) -> None:
        """No more audio for the session; its open segment closes, and the finals of all its closed segments are
        delivered (at most FINISH_S): what was said before the session ends stays in its transcript."""
        session.feed = _no_more_audio  # type: ignore[method-assign]
        session.flush()
        deadline = time.monotonic() + FINISH_S
        while session.pending_finals and not session.closed and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if session.pending_finals:
            log.warning("session %s ends with %d finals not delivered", session.id, session.pending_finals)


def _no_more_audio(audio: np.ndarray) -> None:
    """The feed of a session that is ending: the audio that still arrives is not transcribed."""
