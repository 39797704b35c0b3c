"""The transcription service of one process: the engine, the worker and the live sessions.

Sessions are keyed by their WebRTC connection id. Closed sessions keep their transcript (not their
audio) for a while so that a page can still download it; with a `History` (realtime/store), every session is
kept in it as it goes and read back from it once out of memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from ..config import Settings, TurnConfig
from ..engines import Engine, create_engine
from ..speakers import Diarizer, LiveSpeakers
from .end_of_turn import TurnModel
from .events import Event
from .memory import IdleTrim
from .session import TranscriptionSession
from .transcript import Entry, TranscriptSnapshot
from .vad import SileroVAD, VADConfig
from .worker import Worker

log = logging.getLogger(__name__)

KEEP_CLOSED = 64


SPEAKERS_NICE = 10
"""The speaker model's thread runs at this niceness: a final's decode, due at the same moment, goes first."""


def _yield_cpu() -> None:
    try:  # on Linux a thread has its own nice value
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SPEAKERS_NICE)
    except (AttributeError, OSError):
        pass


class History(Protocol):
    """What the service needs of a history that keeps sessions beyond the process (realtime/store's `Recorder`)."""

    def track(self, session_id: str, source: str, forward: Callable[[Event], None],
              entries_of: Callable[[int], list[Entry]]) -> Callable[[Event], None]:
        """Keep a session that opens; the callback to give it in place of `forward`."""

    def listen(self, session_id: str) -> Callable[[np.ndarray], None] | None:
        """What takes a session's audio as it arrives, where its audio is kept."""

    def end(self, session_id: str) -> None: ...

    def clear(self, session_id: str) -> None: ...

    def entries(self, session_id: str) -> tuple[Entry, ...] | None:
        """A kept session's transcript, or None."""

    def rename_speaker(self, session_id: str, speaker: str, name: str) -> bool: ...

    def recover(self) -> int:
        """Mark the sessions of processes that ended without closing them as interrupted; how many."""

    def save(self, source: str, entries: list[Entry], duration: float, language: str | None = None,
             title: str | None = None, audio: Path | None = None) -> str:
        """Keep a finished transcription (a file, an API request) as an ended session, with its `audio` file where
        sessions' audio is kept; its id."""

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


class TranscriptionService:
    def __init__(self, settings: Settings, engine: Engine | None = None) -> None:
        self.settings = settings
        self.engine = engine or create_engine(settings)
        self.vad_model = SileroVAD.shared()
        self.worker: Worker | None = None
        self.sessions: dict[str, TranscriptionSession] = {}
        self.denoised_seconds = 0.0  # audio that Realtime sessions asking for noise reduction had cleaned
        self.closed: OrderedDict[str, TranscriptSnapshot] = OrderedDict()
        self.ready = False
        self.error: str | None = None
        self.started_at = time.time()
        self.idle_trim = IdleTrim()
        self._diarizer: Diarizer | None = None
        self._diarizer_lock = threading.Lock()
        self._speaker_pool: ThreadPoolExecutor | None = None
        self.history: History | None = None
        """Where sessions are kept beyond the process, when they are."""

    def diarizer(self) -> Diarizer:
        """The speaker model, loaded on first use (from any thread); raises SpeakersUnavailable when its
        packages are missing."""
        with self._diarizer_lock:
            if self._diarizer is None:
                self._diarizer = Diarizer()
            return self._diarizer

    @property
    def speakers_ready(self) -> bool:
        """Live sessions can have speaker labels: the model was loaded at start (`--diarize`)."""
        return self._speaker_pool is not None

    async def start(self) -> None:
        try:
            await self.engine.start()
            if self.settings.diarize:
                await asyncio.to_thread(self.diarizer)
                self._speaker_pool = ThreadPoolExecutor(1, thread_name_prefix="speakers", initializer=_yield_cpu)
            if self.settings.turn_config() is not None:
                await asyncio.to_thread(TurnModel.shared)
        except Exception as exc:
            self.error = str(exc)
            raise
        self._ensure_worker()
        if self.history is not None:
            interrupted = await asyncio.to_thread(self.history.recover)
            if interrupted:
                log.warning("%d sessions of a process that ended without closing them are marked interrupted",
                            interrupted)
        self.ready = True

    async def stop(self) -> None:
        for sid in list(self.sessions):
            self.close_session(sid)
        if self.worker is not None:
            await self.worker.stop()
        self.idle_trim.cancel()
        await self.engine.close()
        if self._speaker_pool is not None:
            self._speaker_pool.shutdown(wait=False, cancel_futures=True)
        if self.history is not None:
            await asyncio.to_thread(self.history.close)

    def _ensure_worker(self) -> Worker:
        if self.worker is None:  # first session on a loop where start() was not awaited
            self.worker = Worker(self.engine, batch_size=self.engine.max_batch_size,
                                 max_pending_audio_s=self.settings.max_pending_audio_s)
            self.worker.on_idle = self.idle_trim
            self.worker.start()
        return self.worker

    def file_worker(self) -> Worker:
        """The worker that file jobs (API uploads) join, behind live finals."""
        return self._ensure_worker()

    def open_session(self, session_id: str, on_event: Callable[[Event], None],
                     vad_config: VADConfig | None = None, speakers: bool = True,
                     source: str = "webrtc", turn: TurnConfig | None | Literal["app"] = "app") -> TranscriptionSession:
        """A live session; `vad_config` replaces the app's VAD settings for it and `turn` its end of turn (the
        Realtime API's turn detection);
        it labels speakers where the app has the speaker model loaded, unless `speakers` is False. With a history,
        its events reach `on_event` once what they announce is written (`source` says where it came from)."""
        existing = self.sessions.get(session_id)
        if existing is not None:
            return existing
        s = self.settings
        labelled = speakers and self.speakers_ready
        if self.history is not None:
            on_event = self.history.track(session_id, source, on_event,
                                          lambda segment: session.transcript.entries_of(segment))
        session = TranscriptionSession(
            session_id,
            self._ensure_worker(),
            on_event,
            vad_config=vad_config or s.vad_config(),
            vad_model=self.vad_model,
            partial_interval=s.partial_interval,
            partial_interval_max=s.partial_interval_max,
            language=s.language,
            # a final's words say where the speaker changes inside it (`TranscriptionSession._labelled`)
            word_timestamps=(s.word_times or labelled) and self.engine.word_timestamps,
            speakers=LiveSpeakers(self.diarizer().embedder) if labelled else None,
            speaker_pool=self._speaker_pool,
            on_audio=self.history.listen(session_id) if self.history is not None else None,
            turn=s.turn_config() if turn == "app" else turn,
        )
        session.options = dataclasses.replace(session.options, vocabulary=s.vocabulary_terms)
        self.sessions[session_id] = session
        log.info("session %s opened (%d live)", session_id, len(self.sessions))
        return session

    def close_session(self, session_id: str) -> None:
        session = self.sessions.pop(session_id, None)
        if session is None:
            return
        session.close()
        if self.history is not None:
            self.history.end(session_id)
        self.closed[session_id] = session.transcript.snapshot()
        while len(self.closed) > KEEP_CLOSED:
            self.closed.popitem(last=False)
        log.info("session %s closed (%d live)", session_id, len(self.sessions))

    def snapshot(self, session_id: str) -> TranscriptSnapshot | None:
        session = self.sessions.get(session_id)
        if session is not None:
            return session.transcript.snapshot()
        closed = self.closed.get(session_id)
        if closed is None and self.history is not None:
            stored = self.history.entries(session_id)
            if stored is not None:
                return TranscriptSnapshot(stored, None)
        return closed

    def rename_speaker(self, session_id: str, speaker: str, name: str) -> bool:
        """Call a speaker of a session (live or closed) `name` in its transcript from now on."""
        session = self.sessions.get(session_id)
        if session is not None:
            return session.rename(speaker, name)
        snapshot = self.closed.get(session_id)
        name = " ".join(name.split())[:64]
        if not name:
            return False
        stored = self.history is not None and self.history.rename_speaker(session_id, speaker, name)
        if snapshot is None or not any(e.speaker == speaker for e in snapshot.entries):
            return stored
        entries = tuple(dataclasses.replace(e, speaker=name) if e.speaker == speaker else e for e in snapshot.entries)
        self.closed[session_id] = dataclasses.replace(snapshot, entries=entries)
        return True

    def clear(self, session_id: str) -> None:
        session = self.sessions.get(session_id)
        if session is not None:
            session.clear()
        self.closed.pop(session_id, None)
        if self.history is not None:
            self.history.clear(session_id)

    def health(self) -> dict[str, Any]:
        worker = self.worker
        return {
            "ready": self.ready,
            "error": self.error,
            **self.engine.describe(),
            "sessions": len(self.sessions),
            "queue": {
                "pending_finals": worker.pending_finals if worker else 0,
                "pending_files": worker.pending_files if worker else 0,
                "engine_latency_s": round(worker.stats.engine_latency, 3) if worker else None,
                "finals": worker.stats.finals if worker else 0,
                "partials": worker.stats.partials if worker else 0,
                "files": worker.stats.files if worker else 0,
                "partials_shed": worker.stats.partials_shed if worker else 0,
                "errors": worker.stats.errors if worker else 0,
            },
            "history": self.history.describe() if self.history is not None else None,
        }
