"""The transcription queue: the only way into the engine, shared by every live session and every file.

Three lanes. Live finals are never dropped and run first, in submission order (so each session's order
is kept). A live session has at most one pending partial: a newer one replaces it (coalescing), and
partials wait while finals are queued, so under load partials thin out first. File jobs (uploads, the
HTTP API, the command line) wait while live finals are queued and take turns with partials, oldest
first. Engines that batch get up to `batch_size` jobs of one lane at once (never mixed, so a final's
latency is its own decode, not that of a batch of partials or of a file's windows). Memory is bounded by
`max_pending_audio_s`: a live final over that bound is answered at once with an explicit overload error
(a file's reader waits for its results instead, so its queue holds at most `READ_AHEAD_BATCHES` batches of
realtime/live/transcribe.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from ..audio import SAMPLE_RATE
from ..engines import Engine, EngineError, TranscribeOptions, Transcription

log = logging.getLogger(__name__)


class Overloaded(EngineError):
    """The queue is full; the segment is reported as an error instead of waiting without bound."""


@dataclass(eq=False)
class Job:
    session: str
    segment: int
    audio: np.ndarray
    kind: Literal["final", "partial", "file"]
    options: TranscribeOptions = field(default_factory=TranscribeOptions)
    future: asyncio.Future[Transcription] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    submitted: float = field(default_factory=time.monotonic)
    on_text: Callable[[str], None] | None = None
    """For engines that stream: called with the text so far while the job decodes."""
    speculative: bool = False
    """A final decoded before its segment has closed: it counts as a final once the session `adopt`s it."""


@dataclass
class WorkerStats:
    finals: int = 0
    partials: int = 0
    files: int = 0
    """File jobs done (packed windows or segments of uploads and command-line files)."""
    partials_shed: int = 0
    errors: int = 0
    engine_latency: float = 0.0
    """Exponential moving average of the engine's seconds per request."""


class Worker:
    def __init__(self, engine: Engine, batch_size: int = 1, max_pending_audio_s: float = 600.0) -> None:
        self.engine = engine
        self.batch_size = max(1, batch_size)
        self.max_pending_samples = int(max_pending_audio_s * SAMPLE_RATE)
        self.stats = WorkerStats()
        self._finals: deque[Job] = deque()
        self._partials: dict[str, Job] = {}
        self._files: deque[Job] = deque()
        self._pending_samples = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: list[Job] = []
        self.on_batch: Callable[[int, float, str], None] | None = None
        """Called after each engine batch with its size, seconds and lane (realtime/web/metrics.py)."""
        self.on_idle: Callable[[], None] | None = None
        """Called on the event loop each time the queue empties (realtime/live/memory.py)."""

    # -- lifecycle
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="transcription-worker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for job in [*self._finals, *self._partials.values(), *self._files]:
            job.future.cancel()
        self._finals.clear()
        self._partials.clear()
        self._files.clear()

    # -- submission
    @property
    def pending_finals(self) -> int:
        return len(self._finals)

    @property
    def pending_files(self) -> int:
        return len(self._files)

    @property
    def pending_partials(self) -> int:
        return len(self._partials)

    def submit(self, job: Job) -> asyncio.Future[Transcription]:
        if job.kind == "final":
            if self._pending_samples + job.audio.size > self.max_pending_samples and self._finals:
                job.future.set_exception(Overloaded("the transcription engine is overloaded; segment skipped"))
                self.stats.errors += 1
                return job.future
            self._pending_samples += job.audio.size
            self._finals.append(job)
        elif job.kind == "file":
            self._files.append(job)
        else:
            old = self._partials.pop(job.session, None)
            if old is not None:
                old.future.cancel()
                self.stats.partials_shed += 1
            self._partials[job.session] = job
        self._wake.set()
        return job.future

    def busy_with_others(self, session: str) -> bool:
        """Whether any other session's job is queued or running."""
        return any(j.session != session for j in (*self._finals, *self._files, *self._partials.values(),
                                                     *self._running))

    def cancel(self, job: Job) -> None:
        """Withdraw one queued job (a speculative final whose pause turned out to be mid-sentence)."""
        if job in self._finals:
            self._finals.remove(job)
            self._pending_samples -= job.audio.size
        elif job in self._files:
            self._files.remove(job)
        elif self._partials.get(job.session) is job:
            del self._partials[job.session]
        job.future.cancel()

    def adopt(self, job: Job) -> None:
        """A speculative final is its segment's final after all (the pause closed the segment): it counts."""
        if job.speculative:
            job.speculative = False
            if job.future.done() and not job.future.cancelled() and job.future.exception() is None:
                self.stats.finals += 1

    def has_partial(self, session: str) -> bool:
        return session in self._partials or any(j.session == session and j.kind == "partial" for j in self._running)

    def drop_partial(self, session: str) -> None:
        job = self._partials.pop(session, None)
        if job is not None:
            job.future.cancel()
        for job in self._running:  # a running partial is stale too; abortable engines stop decoding it
            if job.session == session and job.kind == "partial":
                job.future.cancel()

    def cancel_session(self, session: str) -> None:
        """Forget everything queued for a session (it disconnected)."""
        self.drop_partial(session)
        kept: deque[Job] = deque()
        for job in self._finals:
            if job.session == session:
                self._pending_samples -= job.audio.size
                job.future.cancel()
            else:
                kept.append(job)
        self._finals = kept
        for job in [j for j in self._files if j.session == session]:
            self._files.remove(job)
            job.future.cancel()
        for job in self._running:
            if job.session == session:
                job.future.cancel()

    # -- the loop
    def _take(self) -> list[Job]:
        batch: list[Job] = []
        while self._finals and len(batch) < self.batch_size:
            job = self._finals.popleft()
            self._pending_samples -= job.audio.size
            batch.append(job)
        if batch:
            return batch
        # no final waits: partials (oldest request first across sessions) or file jobs, whichever lane's
        # oldest job came first; one lane per batch
        partials = sorted(self._partials.values(), key=lambda j: j.submitted)
        if self._files and (not partials or self._files[0].submitted <= partials[0].submitted):
            while self._files and len(batch) < self.batch_size:
                batch.append(self._files.popleft())
            return batch
        for job in partials[: self.batch_size]:
            del self._partials[job.session]
            batch.append(job)
        return batch

    def _streams(self, batch: list[Job]) -> bool:
        return self.engine.streaming and any(j.on_text is not None for j in batch)

    async def _call(self, job: Job) -> Transcription:
        """One job; through the engine's `transcribe_stream` (text deltas) when the job wants the text so far."""
        options = _marked(job)
        if job.on_text is None or not self.engine.streaming:
            return await self.engine.transcribe(job.audio, options)
        text = ""
        async for delta in self.engine.transcribe_stream(job.audio, options):
            text += delta
            if not job.future.done():
                job.on_text(text.strip())
        return Transcription(text=text.strip(), duration=job.audio.size / SAMPLE_RATE)

    async def _run_abortable(self, batch: list[Job]) -> list[Transcription | BaseException]:
        """One request per job, all at once (the engine batches them); cancelling a job's future aborts its request."""
        tasks = [asyncio.ensure_future(self._call(job)) for job in batch]
        for job, task in zip(batch, tasks, strict=True):
            job.future.add_done_callback(lambda f, t=task: t.cancel() if f.cancelled() else None)
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while batch := self._take():
                self._running = batch
                t0 = time.perf_counter()
                try:
                    if self.engine.abortable or self._streams(batch):
                        results = await self._run_abortable(batch)
                    elif len(batch) == 1:
                        try:
                            results: list[Transcription | BaseException] = [
                                await self.engine.transcribe(batch[0].audio, _marked(batch[0]))
                            ]
                        except Exception as exc:
                            results = [exc]
                    else:
                        results = await self.engine.transcribe_batch(
                            [j.audio for j in batch], [_marked(j) for j in batch]
                        )
                except asyncio.CancelledError:
                    for job in batch:
                        job.future.cancel()
                    raise
                except Exception as exc:  # an engine that raises for the whole batch
                    results = [exc] * len(batch)
                elapsed = time.perf_counter() - t0
                self._running = []
                log.debug("batch of %d (%s) in %.3fs", len(batch), ",".join(j.kind[0] for j in batch), elapsed)
                if self.on_batch is not None:
                    self.on_batch(len(batch), elapsed, batch[0].kind)
                per = elapsed / len(batch)
                ema = self.stats.engine_latency
                self.stats.engine_latency = per if ema == 0 else 0.7 * ema + 0.3 * per
                for job, result in zip(batch, results, strict=True):
                    if job.future.done():
                        continue
                    if isinstance(result, BaseException):
                        self.stats.errors += 1
                        # a file job's caller reports its error; a live one is only seen here and in the page
                        log.log(logging.DEBUG if job.kind == "file" else logging.WARNING,
                                "engine error on %s segment %d: %s", job.kind, job.segment, result)
                        job.future.set_exception(
                            result if isinstance(result, EngineError) else EngineError(str(result) or repr(result))
                        )
                    else:
                        if job.kind == "final":
                            self.stats.finals += not job.speculative
                        elif job.kind == "file":
                            self.stats.files += 1
                        else:
                            self.stats.partials += 1
                        job.future.set_result(result)
                await asyncio.sleep(0)
            if self.on_idle is not None:
                self.on_idle()


def _marked(job: Job) -> TranscribeOptions:
    """The job's options, marked `live` for a live final (every path to the engine: engines that queue work put it
    first, and the remote engine sends it with X-Transcription-Lane: final)."""
    return replace(job.options, live=True) if job.kind == "final" and not job.options.live else job.options
