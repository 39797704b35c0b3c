"""Live sessions into the history as they go: a final is in the database before anyone is told it is final.

The recorder sits between a session and its consumers (the page, a WebRTC client, a Realtime API connection). Each
final, error or speaker revision writes its segment's entries on the recorder's thread, and the session's events
wait behind that write in their order. A write that fails (a full disk, a database gone away) is kept and retried
until it succeeds: the events go on meanwhile, `/health` and the page say that the history is behind, and nothing
is dropped. A write that takes longer than `wait_s` lets the events go on too; it is still made.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa

from ..live.events import ErrorEvent, Event, FinalEvent, SpeakerEvent
from ..live.transcript import Entry
from .audio import AudioKeeper
from .database import SessionInfo, Store

log = logging.getLogger(__name__)

Write = Callable[[], None]


class Recorder:
    """The service's `History` on a `Store`: sessions of `engine` running `model` (in `language`, where fixed)."""

    def __init__(self, store: Store, engine: str = "", model: str = "", language: str | None = None,
                 retry_s: float = 2.0, wait_s: float = 2.0, audio: AudioKeeper | None = None) -> None:
        self.store = store
        self.audio = audio
        """Where sessions' audio is kept (`--keep-audio`), if it is."""
        self.engine, self.model, self.language = engine, model, language
        self.retry_s = retry_s
        self.wait_s = wait_s
        self.error: str | None = None
        """Why the last write failed, while writes wait to be retried."""
        self.written = 0
        self._backlog: OrderedDict[tuple[Any, ...], Write] = OrderedDict()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="history")
        self._retry: threading.Timer | None = None
        self._closed = False

    @property
    def behind(self) -> int:
        """Writes that failed and wait to be retried."""
        return len(self._backlog)

    # -- the writer thread
    def _write(self, key: tuple[Any, ...], write: Write) -> bool:
        """Make `write` (after those still waiting); True when it is in the database."""
        self._backlog.pop(key, None)  # a newer write of the same thing replaces it, in its new place
        self._backlog[key] = write
        return self._flush()

    def _flush(self) -> bool:
        while self._backlog:
            key, write = next(iter(self._backlog.items()))
            try:
                write()
            except sa.exc.IntegrityError as exc:  # its session was deleted meanwhile (by its user): nothing to keep
                log.warning("a history write of a deleted session dropped: %s", exc)
            except Exception as exc:  # the database's errors, a full disk: kept, retried, reported
                if self.error is None:
                    log.error("the history cannot be written (%d waiting): %s", len(self._backlog), exc)
                self.error = f"{type(exc).__name__}: {exc}"
                self._schedule_retry()
                return False
            self._backlog.pop(key, None)
            self.written += 1
        if self.error is not None:
            try:  # a database server that restarted has forgotten this instance's lock
                self.store.liveness.renew()
            except Exception as exc:  # without it another instance takes this one's sessions for interrupted
                log.warning("this instance's lock in the history could not be taken again: %s", exc)
                self.error = f"{type(exc).__name__}: {exc}"
                self._schedule_retry()
                return True
            log.info("the history is written again")
            self.error = None
        return True

    def _schedule_retry(self) -> None:
        if self._closed or (self._retry is not None and self._retry.is_alive()):
            return
        self._retry = threading.Timer(self.retry_s, lambda: self._submit_flush())
        self._retry.daemon = True
        self._retry.start()

    def _submit_flush(self) -> None:
        if not self._closed:
            self._pool.submit(self._flush)

    def submit(self, key: tuple[Any, ...], write: Write) -> Future[bool]:
        return self._pool.submit(self._write, key, write)

    # -- sessions
    def track(self, session_id: str, source: str, forward: Callable[[Event], None],
              entries_of: Callable[[int], list[Entry]]) -> Callable[[Event], None]:
        """Record a session that opens: the callback to give the session in place of `forward`, which gets the
        session's events once what they announce is written."""
        info = SessionInfo(session_id, source, self.engine, self.model, self.language)
        self.submit(("begin", session_id), lambda: self.store.begin(info))
        return _Outbox(self, session_id, forward, entries_of).deliver

    def listen(self, session_id: str) -> Callable[[np.ndarray], None] | None:
        return self.audio.listen(session_id) if self.audio is not None else None

    def end(self, session_id: str) -> None:
        self.submit(("end", session_id), lambda: self.store.end(session_id))
        if self.audio is not None:
            self.audio.end(session_id)

    def audio_file(self, session_id: str) -> Path | None:
        """A kept session's audio file, where there is one."""
        path = self.audio.path(session_id) if self.audio is not None else None
        return path if path is not None and path.exists() else None

    def forget(self, session_ids: list[str]) -> None:
        """The audio of deleted sessions, deleted."""
        if self.audio is not None:
            for session_id in session_ids:
                self.audio.forget(session_id)

    def clear(self, session_id: str) -> None:
        self.submit(("clear", session_id), lambda: self.store.clear(session_id))

    def entries(self, session_id: str) -> tuple[Entry, ...] | None:
        found = self.store.session(session_id)
        return None if found is None else found[1]

    def rename_speaker(self, session_id: str, speaker: str, name: str) -> bool:
        return self.store.rename_speaker(session_id, speaker, name)

    def recover(self) -> int:
        return self.store.recover()

    def save(self, source: str, entries: list[Entry], duration: float, language: str | None = None,
             title: str | None = None, audio: Path | None = None) -> str:
        session_id = f"{source}_{uuid.uuid4().hex[:16]}"
        info = SessionInfo(session_id, source, self.engine, self.model, language or self.language)
        self.store.save(info, entries, duration, title)
        if audio is not None and self.audio is not None:
            self.audio.keep_file(session_id, audio)
        return session_id

    def close(self, timeout: float = 10.0) -> None:
        """Make what is queued (one more try for what failed), then stop, and close the store."""
        self._closed = True
        if self.audio is not None:
            self.audio.close()
        if self._retry is not None:
            self._retry.cancel()
        done = self._pool.submit(self._flush)
        try:
            done.result(timeout)
        except Exception:
            pass
        if self._backlog:
            log.error("%d history writes were not made: %s", len(self._backlog), self.error)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.store.close()

    def describe(self) -> dict[str, Any]:
        return {"database": self.store.dialect, "in_memory": self.store.in_memory, "error": self.error,
                "behind": self.behind, "written": self.written}


class _Outbox:
    """One session's events, in order, each held until the write it waits on is made (or `wait_s` has passed)."""

    def __init__(self, recorder: Recorder, session_id: str, forward: Callable[[Event], None],
                 entries_of: Callable[[int], list[Entry]]) -> None:
        self.recorder = recorder
        self.session_id = session_id
        self.forward = forward
        self.entries_of = entries_of
        self.queue: deque[tuple[Event, Future[bool] | None, float]] = deque()
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    def deliver(self, event: Event) -> None:
        written: Future[bool] | None = None
        if isinstance(event, FinalEvent | ErrorEvent | SpeakerEvent):
            segment, sid, store = event.segment, self.session_id, self.recorder.store
            entries = tuple(self.entries_of(segment))
            written = self.recorder.submit(("put", sid, segment), lambda: store.put(sid, segment, entries))
            if self.loop is None:
                written.result()
            else:
                written.add_done_callback(lambda _: self.loop.call_soon_threadsafe(self.drain))  # type: ignore[union-attr]
                self.loop.call_later(self.recorder.wait_s, self.drain)
        self.queue.append((event, written, time.monotonic() + self.recorder.wait_s))
        self.drain()

    def drain(self) -> None:
        now = time.monotonic()
        while self.queue:
            event, written, deadline = self.queue[0]
            if written is not None and not written.done() and now < deadline:
                return
            self.queue.popleft()
            try:
                self.forward(event)
            except Exception:  # a broken consumer must not stop the others' events
                log.exception("event consumer failed")
