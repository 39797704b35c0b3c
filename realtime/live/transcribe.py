"""File transcription: decode as a stream, cut with the same VAD as live audio, transcribe the segments in batches.

Decoding and VAD run in a thread of their own and hand speech segments to the event loop through a bounded
queue, so a long file never sits in memory whole (at most `max_queued` segments wait) and the event loop stays
free for live sessions. Segments go to the engine as file jobs of the shared `Worker` (live finals go first), in
batches of up to `batch_size` (the worker's by default) while the thread keeps cutting the next ones; a file keeps
`READ_AHEAD_BATCHES` batches with the worker while the results before them are checked, and results come out in
order. Given an engine instead of a worker, a worker of its own serves the file.

With `window_s`, consecutive segments are packed into windows of up to that many seconds (the silence between
them dropped) before they reach the engine: Whisper sees neighbouring sentences, as faster-whisper's own
long-form and batched pipelines let it, which cuts errors on isolated short sentences. A full window ends at the
longest pause between its segments in its last part (`CUT_SHARE`), so that the next does not begin inside a
phrase. Formats with times get one entry per timed piece, mapped back to the file's time (`timed_entries`): pieces
cut from the aligned words of the same decode as the text formats' where the engine aligns words (`decode_options`),
else Whisper's timed pieces; text formats take a window as one entry.

A lone short segment (a window of one segment with under `CONTEXT_SPEECH_S` of speech) is decoded with the recording
around it: `CONTEXT_BEFORE_S` before and `CONTEXT_AFTER_S` after, never into a neighbouring segment's audio or context
(no audio is decoded twice), and only once any faint speech in it has been judged. The VAD may hear only a fraction of a
second of a falsetto, creaky or quick voice, too little for Whisper, where the recording around it holds the rest of the
phrase (faster-whisper's VAD, which waits 2 s of silence before it ends a span, gives it that much). A short segment
packed with others gets that audio as its part of the window only where the recording beside it stays loud (`QUIET_DB`)
for `UNHEARD_S` or more, up to `UNHEARD_AFTER_S` after it: speech the VAD did not hear. Where windows hold one segment
each (an engine that gives no times to check a packed window by), nothing else decodes the audio between segments: a
short segment's context reaches `LONE_BEFORE_S` back, and holds back from the next no more than it decodes. Live
sessions cannot wait for the audio after a segment, so this is for files.
Used by `python -m realtime transcribe` and by the HTTP API (realtime/web/api.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np

from ..audio import SAMPLE_RATE, iter_file, quietest_frame
from ..engines import Engine, TimedText, TranscribeOptions, Transcription, policy
from ..engines import logprobs as lp
from ..engines.types import Word
from . import coverage
from .transcript import Entry
from .vad import SegmentEnd, Segmenter, SegmentStart, VADConfig, VADEvent
from .worker import Job, Worker

log = logging.getLogger(__name__)
_DONE = object()
CONTEXT_BEFORE_S = 1.0
CONTEXT_AFTER_S = 2.0
UNHEARD_AFTER_S = 4.0
LONE_BEFORE_S = 4.0
"""How far back a short segment's context reaches where windows hold one segment each."""
CONTEXT_SPEECH_S = 2.0
"""A lone segment with less speech than this is decoded with the audio around it."""
READ_AHEAD_BATCHES = 2
"""A file keeps this many batches of windows with the worker while the results before them are checked (the
engine's workers decode new windows while others decode a window's segments again)."""


@dataclass(frozen=True)
class Window(SegmentEnd):
    """Consecutive segments packed into one clip, the silence between them dropped."""

    parts: tuple[tuple[float, float], ...] = ()
    """(offset in `audio`, stream time) of each packed segment's first sample, in order."""
    context: np.ndarray | None = None
    """A lone short segment's audio with the recording around it (see the module docstring), else None."""
    context_start: float = 0.0
    """Stream time of the first sample of `context`."""
    speech: tuple[tuple[float, float], ...] = ()
    """(start, end) of each packed segment's speech, in seconds into `audio`."""
    unheard: tuple[int, ...] = ()
    """Indexes of the packed segments whose part is the loud audio around them (`_Context.unheard`)."""

    @property
    def heard(self) -> np.ndarray:
        """The audio an engine is given: the context of a lone short segment, else the window's own."""
        return self.audio if self.context is None else self.context

    @property
    def heard_speech(self) -> tuple[tuple[float, float], ...]:
        """Each segment's speech in seconds into `heard`."""
        if self.context is None:
            return self.speech
        return ((self.start - self.context_start, self.end - self.context_start),)

    def bounds(self) -> list[tuple[float, float]]:
        """(first, end) of each segment's audio in seconds into `heard`; a window over its context is one."""
        if self.context is not None or len(self.parts) < 2:
            return [(0.0, self.heard.size / SAMPLE_RATE)]
        starts = [o for o, _ in self.parts]
        return list(itertools.pairwise([*starts, self.audio.size / SAMPLE_RATE]))

    def part_at(self, t: float) -> int:
        """The packed segment whose audio holds `t` seconds into `heard` (the nearest one, for a time beside them)."""
        bounds = self.bounds()
        return min(range(len(bounds)), key=lambda k: max(bounds[k][0] - t, 0.0, t - bounds[k][1]))

    def part_audio(self, i: int) -> np.ndarray:
        """The audio of packed segment `i` alone (a window over its context gives the context)."""
        a, b = self.bounds()[i]
        return self.heard[round(a * SAMPLE_RATE):round(b * SAMPLE_RATE)]

    def sub(self, first: int, stop: int) -> Window:
        """The window of packed segments `first` to `stop` (excluded) alone."""
        bounds = self.bounds()
        a, b = bounds[first][0], bounds[stop - 1][1]
        audio = self.audio[round(a * SAMPLE_RATE):round(b * SAMPLE_RATE)]
        return Window(self.segment, self.start, self.end, audio, self.forced, self.parts[first][1],
                      tuple((o - a, t) for o, t in self.parts[first:stop]),
                      speech=tuple((x - a, y - a) for x, y in self.speech[first:stop]),
                      unheard=tuple(i - first for i in self.unheard if first <= i < stop))

    def halves(self) -> Window | None:
        """A lone segment's window as two segments, cut at the quietest moment of the middle half of its speech
        (`audio.quietest_frame`); None for a window of several segments or over its context."""
        if self.context is not None or len(self.speech) != 1:
            return None
        (a, b), = self.speech
        cut = quietest_frame(self.audio, round((a + (b - a) / 4) * SAMPLE_RATE),
                             round((b - (b - a) / 4) * SAMPLE_RATE)) / SAMPLE_RATE
        offset, at = self.parts[0]
        return Window(self.segment, self.start, self.end, self.audio, self.forced, self.audio_start,
                      ((offset, at), (cut, at + cut - offset)), speech=((a, cut), (cut, b)))

    def decoded(self, result: Transcription, timed: bool) -> Window:
        """The window as its result was decoded: over its context, if it had one, so that times and words map to
        the stream. Its span grows to the timed pieces that Whisper found in the context."""
        if self.context is None:
            return self
        start, end = self.start, self.end
        pieces = [p for p in result.segments if p.text] if timed and result.text.strip() else []
        if pieces:
            start = min(start, self.context_start + pieces[0].start)
            end = max(end, self.context_start + pieces[-1].end)
        return Window(self.segment, start, end, self.context, self.forced, self.context_start,
                      ((0.0, self.context_start),), speech=self.heard_speech)

    def stream_time(self, t: float, end: bool = False) -> float:
        """The stream time of `t` seconds into `heard` (an end belongs to the part before it)."""
        if self.context is not None:
            return self.context_start + t
        offset, at = self.parts[0]
        for o, a in self.parts[1:]:
            if t > o or (t == o and not end):
                offset, at = o, a
        return at + (t - offset)


CUT_SHARE = 0.75
"""A full window ends at the longest pause between its segments after this share of its length (`_Packer._cut`)."""


class _Packer:
    """Packs consecutive segments into windows of at most `seconds` of audio (a longer segment stays alone) and at
    most `max_parts` segments; a short segment beside unheard speech has that audio as its part of a window it
    shares (`_Context.unheard`)."""

    def __init__(self, seconds: float, max_parts: int | None = None) -> None:
        self.limit = int(seconds * SAMPLE_RATE)
        self.max_parts = max_parts
        self.parts: list[SegmentEnd] = []
        self.contexts: list[_Context | None] = []
        self.size = 0
        self.index = 0

    @staticmethod
    def _size(end: SegmentEnd, context: _Context | None) -> int:
        return max(end.audio.size, context.unheard[0].size if context and context.unheard else 0)

    def add(self, end: SegmentEnd, context: _Context | None = None) -> list[SegmentEnd]:
        size = self._size(end, context)
        full = self.size + size > self.limit or len(self.parts) == (self.max_parts or -1)
        out = [self._emit(self._cut(end, size))] if self.parts and full else []
        self.parts.append(end)
        self.contexts.append(context)
        self.size += size
        return out

    def flush(self) -> list[SegmentEnd]:
        return [self._emit(len(self.parts))] if self.parts else []

    def _cut(self, end: SegmentEnd, size: int) -> int:
        """Where a full window ends (its first parts go, the rest start the next window with `end`): at the longest
        pause between its segments' speech once it holds `CUT_SHARE` of its length, so that a window does not end
        inside a phrase that the next one would then begin without its start."""
        sizes = [self._size(p, c) for p, c in zip(self.parts, self.contexts, strict=True)]
        best, longest = len(self.parts), end.start - self.parts[-1].end
        held = sum(sizes)
        for k in range(len(self.parts) - 1, 0, -1):
            held -= sizes[k]
            carried = self.size - held + size
            if held < CUT_SHARE * self.limit or carried > self.limit or (
                    self.max_parts and len(self.parts) - k + 1 > self.max_parts):
                break
            pause = self.parts[k].start - self.parts[k - 1].end
            if pause > longest:
                best, longest = k, pause
        return best

    def _emit(self, cut: int) -> Window:
        parts, contexts = self.parts[:cut], self.contexts[:cut]
        self.parts, self.contexts = self.parts[cut:], self.contexts[cut:]
        self.size = sum(self._size(p, c) for p, c in zip(self.parts, self.contexts, strict=True))
        context, context_start = contexts[0].around if len(parts) == 1 and contexts[0] else (None, 0.0)
        unheard = tuple(i for i, c in enumerate(contexts) if c and c.unheard) if len(parts) > 1 else ()
        if unheard:  # a short segment beside unheard speech: its part is that audio
            parts = [replace(p, audio=c.unheard[0], audio_start=c.unheard[1]) if c and c.unheard else p
                     for p, c in zip(parts, contexts, strict=True)]
        audio = parts[0].audio if len(parts) == 1 else np.concatenate([p.audio for p in parts])
        offsets = np.cumsum([0, *(p.audio.size for p in parts[:-1])]) / SAMPLE_RATE
        window = Window(self.index, parts[0].start, parts[-1].end, audio, parts[-1].forced, parts[0].audio_start,
                        tuple((float(o), p.audio_start) for o, p in zip(offsets, parts, strict=True)),
                        context, context_start,
                        tuple((float(o) + p.start - p.audio_start, float(o) + p.end - p.audio_start)
                              for o, p in zip(offsets, parts, strict=True)), unheard)
        self.index += 1
        return window


FRAME = SAMPLE_RATE // 10
QUIET_DB = 10.0
"""Audio within this of a segment's level is loud."""
UNHEARD_S = 0.3
"""Loud audio this long beside a short segment, outside every segment, is speech the VAD did not hear (a few
words fit in it)."""


@dataclass(frozen=True)
class _Context:
    """The recording around a short segment: (audio, stream time of its first sample)."""

    around: tuple[np.ndarray, float]
    """`CONTEXT_BEFORE_S` before (`LONE_BEFORE_S` where windows hold one segment), `CONTEXT_AFTER_S` after: what a
    lone short segment is decoded with."""
    unheard: tuple[np.ndarray, float] | None
    """The segment's audio with the loud audio beside it, where that is `UNHEARD_S` more than its own, else None."""


def _sounding(audio: np.ndarray, first: int, stop: int, segment: np.ndarray) -> tuple[int, int]:
    """The part of a context to keep: the segment's own audio (`first` to `stop`), widened to the furthest 0.1 s
    frames before and after it that are within `QUIET_DB` of the segment's level, and a frame more each way."""
    level = float(np.sqrt(np.mean(segment.astype(np.float64) ** 2))) if segment.size else 0.0
    floor = level * 10 ** (-QUIET_DB / 20)

    def loud(part: np.ndarray) -> np.ndarray:
        frames = part[:part.size // FRAME * FRAME].reshape(-1, FRAME).astype(np.float64)
        return np.sqrt(np.mean(frames ** 2, axis=1)) >= floor if frames.size and level > 0 else np.zeros(0, bool)

    first, stop = max(0, first), min(audio.size, stop)
    after = np.flatnonzero(loud(audio[stop:]))
    before = np.flatnonzero(loud(audio[:first][::-1]))
    hi = min(audio.size, stop + (int(after[-1]) + 2) * FRAME) if after.size else stop
    lo = max(0, first - (int(before[-1]) + 2) * FRAME) if before.size else first
    return lo, hi


class _Surroundings:
    """The recent audio of a file, and the segments waiting for the audio after them (`UNHEARD_AFTER_S`, or
    `CONTEXT_AFTER_S` where windows hold one segment: `lone`) before they go on, in order, each short one with its
    context."""

    def __init__(self, vad: VADConfig, lone: bool = False) -> None:
        self.lone = lone
        self.before = round((LONE_BEFORE_S if lone else CONTEXT_BEFORE_S) * SAMPLE_RATE)
        self.keep = round((vad.max_segment_s + 2.0) * SAMPLE_RATE) + self.before
        self.after = round((CONTEXT_AFTER_S if lone else UNHEARD_AFTER_S) * SAMPLE_RATE)  # what a short one holds
        self.audio = np.zeros(0, np.float32)
        self.origin = 0  # stream sample index of audio[0]
        self.waiting: deque[tuple[SegmentEnd, int, int]] = deque()  # end, its context's first and last sample
        self.last_end = 0  # stream sample index where the previous segment's audio (or context) ended
        self.pad_before = vad.pad_before_ms * SAMPLE_RATE // 1000

    @property
    def read_to(self) -> int:
        return self.origin + self.audio.size

    def read(self, chunk: np.ndarray) -> None:
        self.audio = np.concatenate([self.audio, chunk])

    def events(self, events: Iterable[object]) -> None:
        for event in events:
            if isinstance(event, SegmentStart):  # the waiting segments' context ends where this one's audio starts
                at = round(event.start * SAMPLE_RATE) - self.pad_before
                self.waiting = deque((e, a, b if b < 0 else max(min(b, at), a)) for e, a, b in self.waiting)
                self.last_end = max([self.last_end, *(b for _, _, b in self.waiting)])  # no audio twice
            elif isinstance(event, SegmentEnd):
                first = round(event.audio_start * SAMPLE_RATE)
                last = first + event.audio.size
                short = event.end - event.start < CONTEXT_SPEECH_S
                a = min(first, max(self.last_end, self.origin, first - self.before))
                self.waiting.append((event, a, last + self.after if short else -1))
                self.last_end = max(self.last_end, last)

    def ready(self, flush: bool = False, hold: int | None = None) -> list[tuple[SegmentEnd, _Context | None]]:
        """The segments whose context has been read, in order; a segment whose context reaches `hold` (where the
        audio of speech that may yet be a segment starts) waits for that speech's verdict."""
        out = []
        limit = self.read_to if hold is None else min(self.read_to, hold)
        while self.waiting and (flush or self.waiting[0][2] <= limit):
            end, a, b = self.waiting.popleft()
            context = None
            if b >= 0:
                audio = self.audio[a - self.origin:min(b, self.read_to) - self.origin]
                first = round(end.audio_start * SAMPLE_RATE) - a
                stop = first + end.audio.size
                around = (audio[:stop + round(CONTEXT_AFTER_S * SAMPLE_RATE)].copy(), a / SAMPLE_RATE)
                unheard = None
                if not self.lone:  # only a window of several segments takes it
                    lo, hi = _sounding(audio, first, stop, end.audio)
                    if lo <= first and hi >= stop and hi - lo >= end.audio.size + UNHEARD_S * SAMPLE_RATE:
                        unheard = (audio[lo:hi].copy(), (a + lo) / SAMPLE_RATE)
                context = _Context(around, unheard)
            out.append((end, context))
        floor = min([self.read_to - self.keep, *(a for _, a, _ in self.waiting)])
        if floor > self.origin:
            self.audio, self.origin = self.audio[floor - self.origin:], floor
        return out


def timed_entries(end: SegmentEnd, result: Transcription, first: int = 0) -> list[Entry]:
    """One entry per timed piece of a result (Whisper's own segments, in stream time), numbered from `first`;
    a result without times is one entry for the whole segment or window. Each carries the result's language and
    its words in stream time, where the result has words."""
    pieces = [s for s in result.segments if s.text] if result.text else []
    if len(pieces) < 2:
        return [Entry(first, end.start, end.end, result.text.strip(), language=result.language,
                      words=stream_words(end, result.words), logprobs=result.logprobs)]
    out = []
    for n, piece in enumerate(pieces):
        if isinstance(end, Window):
            start, stop = end.stream_time(piece.start), end.stream_time(piece.end, end=True)
        else:
            start, stop = end.audio_start + piece.start, end.audio_start + piece.end
        start, stop = max(end.start, min(start, end.end)), min(end.end, max(stop, start))
        out.append(Entry(first + n, round(start, 3), round(max(stop, start), 3), piece.text.strip(),
                         language=result.language, words=stream_words(end, piece.words), logprobs=piece.logprobs))
    return out


def stream_words(end: SegmentEnd, words: Iterable[Word]) -> tuple[Word, ...]:
    """Words of a segment's or window's result in stream time."""
    out = []
    for w in words:
        if isinstance(end, Window):
            start, stop = end.stream_time(w.start), end.stream_time(w.end, end=True)
        else:
            start, stop = end.audio_start + w.start, end.audio_start + w.end
        out.append(replace(w, start=round(start, 3), end=round(max(stop, start), 3)))
    return tuple(out)


class SegmentStream:
    """Speech segments of a file, cut by a decode + VAD thread and handed over through a bounded queue.

    Iterate it on the event loop; `duration` is the file's length in seconds once iteration has ended.
    A decode error is raised by the iteration at the point where it happened. `close()` stops the thread.
    With `window_s` the items are windows of packed segments (numbered 0, 1, ... themselves), at most `max_parts`
    segments each (`window_parts`).
    """

    def __init__(self, path: str | Path, vad: VADConfig | None = None, max_queued: int = 8,
                 window_s: float | None = None, max_parts: int | None = None) -> None:
        self.path = Path(path)
        self.vad = vad
        self.window_s = window_s
        self.max_parts = max_parts
        self.duration = 0.0
        self._slots = threading.Semaphore(max(1, max_queued))
        self._stop = threading.Event()
        self._items: deque[object] = deque()
        self._arrived: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def _push(self, item: object) -> None:  # on the event loop
        self._items.append(item)
        assert self._arrived is not None
        self._arrived.set()

    def _put(self, loop: asyncio.AbstractEventLoop, item: object) -> bool:
        while not self._slots.acquire(timeout=0.2):
            if self._stop.is_set():
                return False
        if self._stop.is_set():
            return False
        try:
            loop.call_soon_threadsafe(self._push, item)
        except RuntimeError:  # the loop has closed
            return False
        return True

    def _produce(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            segmenter = Segmenter(self.vad, faint=True)
            packer = _Packer(self.window_s, self.max_parts) if self.window_s else None
            around = _Surroundings(segmenter.config, lone=self.max_parts == 1) if packer else None

            def put(events: list[VADEvent], flush: bool = False) -> bool:
                if packer is None or around is None:
                    return all(self._put(loop, e) for e in events if isinstance(e, SegmentEnd))
                around.events(events)
                for end, context in around.ready(flush, segmenter.faint_from):
                    for item in packer.add(end, context):
                        if not self._put(loop, item):
                            return False
                return True

            for chunk in iter_file(self.path):
                if around is not None:
                    around.read(chunk)
                if not put(segmenter.feed(chunk)) or self._stop.is_set():
                    return
            self.duration = segmenter.samples / SAMPLE_RATE
            if not put(segmenter.flush(), flush=True):
                return
            for item in packer.flush() if packer else []:
                if not self._put(loop, item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            self._put(loop, exc)
            return
        self._put(loop, _DONE)

    def _take(self) -> object:
        item = self._items.popleft()
        self._slots.release()
        return item

    async def __aiter__(self) -> AsyncIterator[SegmentEnd]:
        if self._thread is not None:
            raise RuntimeError("a SegmentStream is iterated once")
        self._arrived = asyncio.Event()
        self._thread = threading.Thread(target=self._produce, args=(asyncio.get_running_loop(),),
                                        name="decode-vad", daemon=True)
        self._thread.start()
        try:
            while True:
                while not self._items:
                    self._arrived.clear()
                    await self._arrived.wait()
                item = self._take()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, SegmentEnd)
                yield item
        finally:
            self.close()

    def ready(self, limit: int) -> list[SegmentEnd]:
        """Up to `limit` segments already cut (no waiting); an error or the end stays for the iterator."""
        out: list[SegmentEnd] = []
        while self._items and len(out) < limit and isinstance(self._items[0], SegmentEnd):
            out.append(self._take())  # type: ignore[arg-type]
        return out

    def close(self) -> None:
        self._stop.set()


def _lane(options: TranscribeOptions) -> Literal["final", "file"]:
    """The worker's lane for a file's jobs: the finals lane for another app's live final (`options.live`, set by
    the API from the remote engine's hint), else the file lane."""
    return "final" if options.live else "file"


@contextlib.asynccontextmanager
async def _worker_for(runner: Engine | Worker) -> AsyncIterator[Worker]:
    if isinstance(runner, Worker):
        yield runner
        return
    worker = Worker(runner, batch_size=runner.max_batch_size)
    worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


def window_parts(engine: Engine) -> int | None:
    """How many segments a window may pack for this engine: any number where its results can be checked for
    coverage (realtime/live/coverage.py), else one."""
    return None if coverage.checkable(engine) else 1


def decode_options(engine: Engine, asked: TranscribeOptions) -> TranscribeOptions:
    """The options a file's windows are decoded with. Formats with times are decoded as the text formats are, where
    the engine aligns words: without Whisper's timestamp tokens, each window in one pass, and their pieces cut from
    the aligned words (`timed_pieces`). With timestamp tokens Whisper reads a voice it barely knows (a cold in a
    noisy room) worse, and a misreading that keeps as many words over the same speech is no gap to the coverage
    check; only a window whose text decode is rejected has its segments decoded alone."""
    if asked.timestamps and engine.word_timestamps and coverage.checkable(engine):
        return replace(asked, timestamps=False, word_timestamps=True)
    return asked


async def transcribe_results(
    path: str | Path,
    runner: Engine | Worker,
    vad: VADConfig | None = None,
    options: TranscribeOptions | None = None,
    *,
    batch_size: int | None = None,
    stream: SegmentStream | None = None,
    window_s: float | None = None,
) -> AsyncIterator[tuple[SegmentEnd, Transcription | BaseException]]:
    """(segment, result or the engine's error) per speech segment of the file, in order.

    Raises AudioDecodeError on input that does not decode. Pass `stream` to read its `duration` afterwards;
    `window_s` packs segments into windows (see the module docstring) when no `stream` is given. Every segment of
    a window is accounted for (`_account`) before the window's result is given.
    """
    asked = options or TranscribeOptions()
    engine = runner.engine if isinstance(runner, Worker) else runner
    segments = stream or SegmentStream(path, vad, window_s=window_s, max_parts=window_parts(engine))
    iterator = segments.__aiter__()
    name = f"file-{uuid.uuid4().hex[:12]}"
    async with _worker_for(runner) as worker:
        size = max(1, batch_size or worker.batch_size)
        decode = decode_options(worker.engine, asked)
        checked = coverage.check_options(worker.engine, decode)
        ahead: asyncio.Queue[tuple[SegmentEnd, asyncio.Task[Transcription | BaseException]] | BaseException | None]
        ahead = asyncio.Queue()
        room = asyncio.Semaphore(READ_AHEAD_BATCHES * size)

        async def settle(end: SegmentEnd, decoded: asyncio.Future[Transcription]) -> Transcription | BaseException:
            result = (await asyncio.gather(decoded, return_exceptions=True))[0]
            if isinstance(end, Window) and isinstance(result, Transcription):
                result = await _account(worker, name, end, result, checked, decode, asked)
            return result

        async def read() -> None:
            n = 0
            try:
                async for first in iterator:
                    for end in [first, *(segments.ready(size - 1) if n else ())]:
                        await room.acquire()
                        job = Job(name, n, end.heard, _lane(asked),
                                  coverage.window_options(checked, len(end.heard_speech))
                                  if isinstance(end, Window) else asked)
                        n += 1
                        task = asyncio.ensure_future(settle(end, worker.submit(job)))
                        ahead.put_nowait((end, task))
                    if n == 1:  # the first is decoded and checked alone before any other: its text comes first
                        await asyncio.wait([task])
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # a decode error, raised after the results before it
                ahead.put_nowait(exc)
                return
            ahead.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await ahead.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                end, task = item
                result = await task
                room.release()
                if isinstance(end, Window) and isinstance(result, Transcription):
                    end = end.decoded(result, asked.timestamps)
                yield end, result
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            while not ahead.empty():
                if isinstance(item := ahead.get_nowait(), tuple):
                    item[1].cancel()
            worker.cancel_session(name)
            segments.close()
            await iterator.aclose()  # type: ignore[attr-defined]


def _whole_pieces(window: Window, result: Transcription, missing: list[int]) -> list[int]:
    """`missing` with every segment that a timed piece over one of them also lies over (a result without words is
    spliced piece by piece, so a piece over two segments goes back whole, or its text would be given twice)."""
    if result.words or not missing:
        return missing
    bounds = window.bounds()
    pieces = [(p.start, p.end) for p in result.segments if p.text.strip()]
    out = set(missing)
    grown = True
    while grown:
        grown = False
        for a, b in pieces:
            over = {k for k, (x, y) in enumerate(bounds) if min(b, y) - max(a, x) > coverage.REACH_S}
            if over & out and not over <= out:
                out |= over
                grown = True
    return sorted(out)


def _runs(indexes: list[int]) -> list[tuple[int, int]]:
    """Consecutive indexes as (first, stop) ranges."""
    out: list[tuple[int, int]] = []
    for i in indexes:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


async def _check(worker: Worker, name: str, window: Window, result: Transcription, options: TranscribeOptions,
                 asked: TranscribeOptions, again: bool = False) -> Transcription | BaseException:
    """The coverage rule on a window's result, its answers spliced in (see `_account`); the answer for a lone
    segment decoded `again` is held to `coverage.GAP_S` through `coverage.keeps`, and one still too short for its
    speech is decoded in halves (`_in_halves`)."""
    checked = await _check_window(worker, name, window, result, options, asked, again)
    if isinstance(checked, Transcription) and len(window.heard_speech) == 1:
        return await _in_halves(worker, name, window, checked, options, asked)
    return checked


async def _in_halves(worker: Worker, name: str, window: Window, result: Transcription, options: TranscribeOptions,
                     asked: TranscribeOptions) -> Transcription:
    """A lone segment's answer that does not say where its text lies (`coverage.timing` is None: no word times, one
    timed piece over the whole clip) and says too few words for its speech (`coverage.sparse`): an engine that gives
    Whisper's timed pieces but no word times may time one sentence over two, and decodes the same audio again the
    same way, so no second answer of the whole can be better. Its two halves decoded, each checked in turn, stand
    for it when together they say more and keep what it said (`coverage.keeps`); only then is each half that is
    still too short for its speech decoded in halves in turn (a slow speaker's halves say no more, and are not cut
    again). Where an answer's words or pieces are timed, the rule for a lone segment is `coverage.LONE_GAP_S`."""
    speech = window.heard_speech
    split = window.halves()
    if split is None or coverage.timing(result) is not None or policy.rejected(result) or \
            speech[0][1] - speech[0][0] < (coverage.SPLIT_S if coverage.checkable(worker.engine)
                                           else coverage.UNTIMED_SPLIT_S) or \
            not coverage.sparse(speech[0], result, coverage.UNTIMED_WORDS_PER_S):
        return result
    log.info("file window %d: %d words for %.1f s of speech, decoding it in halves", window.segment,
             len(result.text.split()), speech[0][1] - speech[0][0])
    halves = [split.sub(k, k + 1) for k in (0, 1)]
    jobs = [Job(name, window.segment, half.audio, _lane(asked), coverage.window_options(options, 1))
            for half in halves]
    answers = await asyncio.gather(*(worker.submit(j) for j in jobs), return_exceptions=True)
    checked = [await _check_window(worker, name, half, a, options, asked, again=True)
               if isinstance(a, Transcription) else a for half, a in zip(halves, answers, strict=True)]
    if not all(isinstance(a, Transcription) for a in checked):
        return result
    joined = _splice(split, result, {(k, k + 1): a for k, a in enumerate(checked)})  # type: ignore[misc]
    if not coverage.keeps(joined, result):
        return result
    deeper = [await _in_halves(worker, name, half, a, options, asked)  # type: ignore[arg-type]
              for half, a in zip(halves, checked, strict=True)]
    return _splice(split, result, {(k, k + 1): a for k, a in enumerate(deeper)})


async def _check_window(worker: Worker, name: str, window: Window, result: Transcription,
                        options: TranscribeOptions, asked: TranscribeOptions,
                        again: bool) -> Transcription | BaseException:
    """`_check` up to the halves: the window's uncovered segments decoded again and spliced in, and its segments of
    speech the VAD did not hear decoded alone (`_unheard`)."""
    spans = coverage.timing(result)
    speech = window.heard_speech
    rejected = policy.rejected(result) and not policy.cut_at_loop(result)
    checked = bool(spans) and not rejected and len(speech) > 1  # the answers are checked in turn
    loose = False  # a lone segment short by GAP_S only: its second answer must keep the first
    if spans is None or rejected:
        missing = list(range(len(speech))) if len(speech) > 1 else []
    elif not checked:
        missing = coverage.uncovered(speech, spans, coverage.LONE_GAP_S)
        if not missing and again:
            missing = coverage.uncovered(speech, spans)
            loose = bool(missing)
    else:
        missing = coverage.unaccounted(speech, spans, words=bool(result.words))
        pieces = coverage.piece_timing(result) if result.words else None
        if pieces:  # timed pieces with their words: either can look covered where the other does not
            missing = sorted({*missing, *coverage.unaccounted(speech, pieces, brief=False)})
        missing = _whole_pieces(window, result, missing)
    alone = _unheard(window, result, missing) if checked else []
    if not missing and not alone:
        return result
    runs: list[tuple[int, int]] = []
    if missing:
        log.info("file window %d: %d of %d segments without text over their speech, decoding them again",
                 window.segment, len(missing), len(speech))
        runs = _runs(missing) if checked else [(i, i + 1) for i in missing]
        if runs == [(0, len(speech))]:  # nothing in the window to build on: each segment alone
            runs = [(i, i + 1) for i in missing]
    if alone:
        log.info("file window %d: segments %s hold speech the VAD did not hear, decoding them alone too",
                 window.segment, alone)
    redo = coverage.redecode_options(worker.engine, options, asked, packed=len(speech) > 1)
    asks = [*runs, *((i, i + 1) for i in alone)]
    subs = [window.sub(a, b) for a, b in asks] if checked else []
    jobs = [Job(name, window.segment, subs[k].audio if checked else window.part_audio(a), _lane(asked),
                coverage.window_options(options, len(subs[k].heard_speech)) if checked else redo)
            for k, (a, _) in enumerate(asks)]
    answers: list[Transcription | BaseException] = list(
        await asyncio.gather(*(worker.submit(j) for j in jobs), return_exceptions=True))
    for k, answer in enumerate(answers):
        if checked and isinstance(answer, Transcription):
            answers[k] = await _check(worker, name, subs[k], answer, options, asked, again=True)
    answers, lone = answers[:len(runs)], answers[len(runs):]
    failed = next((a for a in answers if isinstance(a, BaseException)), None)
    if failed is not None:
        return result if loose else failed
    if loose and not coverage.keeps(answers[0], result):  # type: ignore[arg-type]
        return result
    redone = {run: a for run, a in zip(runs, answers, strict=True) if isinstance(a, Transcription)}
    for i, answer in zip(alone, lone, strict=True):
        if isinstance(answer, Transcription) and coverage.adds(answer, _said_in(window, result, i - 1, i + 2)):
            redone[(i, i + 1)] = answer
    return _splice(window, result, redone) if redone else result


def _unheard(window: Window, result: Transcription, missing: list[int]) -> list[int]:
    """The window's segments whose part is speech the VAD did not hear (`Window.unheard`) and that are not decoded
    again anyway, where their text can be spliced alone (a result without words: no timed piece lies over a
    neighbour too). Such a voice is one Whisper barely knows (a falsetto, a cold), and in a window its reading
    leans on the sentences around it: after a string of digits, a falsetto phrase read as more digits. Each is
    decoded alone as well, and that answer takes its place where it adds words to the window's (`coverage.adds`)."""
    return [i for i in window.unheard if i not in missing and _whole_pieces(window, result, [i]) == [i]]


def _said_in(window: Window, result: Transcription, first: int, stop: int) -> list[str]:
    """The words of the result that lie in the parts of segments `first` to `stop` (excluded) of the window (a word,
    or a timed piece's words, by its middle)."""
    bounds = window.bounds()
    a, b = bounds[max(first, 0)][0], bounds[min(stop, len(bounds)) - 1][1]
    if result.words:
        return [w.word for w in result.words if a <= (w.start + w.end) / 2 < b]
    return [w for p in result.segments if a <= (p.start + p.end) / 2 < b for w in p.text.split()]


async def _account(worker: Worker, name: str, window: Window, result: Transcription, options: TranscribeOptions,
                   decode: TranscribeOptions, asked: TranscribeOptions) -> Transcription | BaseException:
    """The coverage rule (realtime/live/coverage.py) on a window's result: segments whose speech its text does not
    cover are decoded again, and their answer takes their place: a run of consecutive ones together (a decode that
    ended early leaves the rest of the window to be decoded with its context), a single one alone, each answer
    checked in turn as a window of its own, down to a lone segment decoded as `redecode_options` says, whose answer
    stands. A result without times (an endpoint that gave none), or one sampled after the greedy decode was
    rejected, has every segment of a packed window decoded alone, as asked; a greedy decode rejected only for
    starting over is its text up to there (`policy.cut_at_loop`), checked as any. A text format's window stays one
    piece, a format with times decoded as text (`decode_options`) has its pieces cut from its words
    (`timed_pieces`), and word times the caller did not ask for are dropped from the result."""
    checked = await _check(worker, name, window, result, options, decode)
    if isinstance(checked, BaseException):
        return checked
    result = checked
    if asked.timestamps and not decode.timestamps:
        result = timed_pieces(window, result)
    if not asked.timestamps:  # a text format: the window is one entry
        words = result.words if asked.word_timestamps else ()
        text = result.text.strip()
        result = replace(result, segments=(TimedText(0.0, result.duration, text, words, result.logprobs),)
                         if text else ())
    elif result.words and not asked.word_timestamps:
        result = replace(result, segments=tuple(replace(p, words=()) for p in result.segments if p.text))
    return result


PAUSE_S = 0.8
"""A timed piece cut from aligned words ends at a pause between two words this long (`timed_pieces`)."""
PIECE_S = 2.0
"""...and between two packed segments once it lasts this long (alignment may stretch words over the pause between
them, and the VAD may cut a faint voice's phrase in pieces)."""
ABBREVIATIONS = frozenset({"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "vs.", "etc.", "e.g.", "i.e.", "no.",
                           "prof.", "mt."})
"""Words that end in a full stop and end no sentence."""


def _ends_sentence(word: str) -> bool:
    word = word.strip().lower()
    return word.endswith(("?", "!")) or (word.endswith(".") and word not in ABBREVIATIONS)


def timed_pieces(window: Window, result: Transcription) -> Transcription:
    """A result decoded without timestamp tokens as timed pieces cut from its aligned words: at each sentence's end
    and at a pause of `PAUSE_S` or more in the recording (the silence dropped between packed segments counts), and
    between two packed segments once it lasts `PIECE_S`. A piece without words, or whose words do not spell its
    text, stays as it is."""
    def pause(before: Word, word: Word) -> float:
        return window.stream_time(word.start) - window.stream_time(before.end, end=True)

    def part(w: Word) -> int:
        return window.part_at((w.start + w.end) / 2)

    pieces: list[TimedText] = []
    for piece in result.segments:
        words = [w for w in piece.words if w.word.strip()]
        if not words or "".join(w.word for w in words).split() != piece.text.split():
            pieces.append(piece)
            continue
        runs: list[list[Word]] = [[words[0]]]
        for before, word in itertools.pairwise(words):
            if _ends_sentence(before.word) or pause(before, word) >= PAUSE_S or \
                    (part(word) != part(before) and before.end - runs[-1][0].start >= PIECE_S):
                runs.append([])
            runs[-1].append(word)
        pieces += [TimedText(run[0].start, run[-1].end, "".join(w.word for w in run).strip(), tuple(run),
                             lp.of_words(run) if piece.logprobs is not None else None) for run in runs]
    return replace(result, segments=tuple(pieces))


def _splice(window: Window, result: Transcription, redone: dict[tuple[int, int], Transcription]) -> Transcription:
    """The window's result with the runs of segments in `redone` ((first, stop) of each) answered by their own
    decode: its words (or timed pieces) that lie in another segment's audio kept, in order, with the new answers
    in their places."""
    bounds = window.bounds()
    again = {i for a, b in redone for i in range(a, b)}
    part = window.part_at

    def shifted(answer: Transcription, offset: float, length: float) -> list[TimedText]:
        pieces = [p for p in answer.segments if p.text.strip()] or (
            [TimedText(0.0, length, answer.text.strip())] if answer.text.strip() else [])
        return [TimedText(p.start + offset, p.end + offset, p.text.strip(),
                          tuple(replace(w, start=w.start + offset, end=w.end + offset) for w in p.words),
                          p.logprobs if answer.segments else answer.logprobs)
                for p in pieces]

    pieces: list[TimedText] = []
    firsts = {a: (a, b) for a, b in redone}
    if result.words:  # one piece per segment, its words
        words = [w for w in result.words if part((w.start + w.end) / 2) not in again]
        for k, (a, _) in enumerate(bounds):
            if k in firsts:
                run = firsts[k]
                pieces += shifted(redone[run], a, bounds[run[1] - 1][1] - a)
            if k in again:
                continue
            mine = tuple(w for w in words if part((w.start + w.end) / 2) == k)
            if mine:
                pieces.append(TimedText(mine[0].start, mine[-1].end, "".join(w.word for w in mine).strip(), mine,
                                        lp.of_words(mine) if result.logprobs is not None else None))
    else:
        pieces = [p for p in result.segments if p.text.strip() and part((p.start + p.end) / 2) not in again]
        for (a, b), answer in redone.items():
            pieces += shifted(answer, bounds[a][0], bounds[b - 1][1] - bounds[a][0])
        pieces.sort(key=lambda p: p.start)
    text = " ".join(p.text for p in pieces if p.text)
    logprobs = None
    if result.logprobs is not None and all(p.logprobs is not None for p in pieces):
        logprobs = tuple(t for p in pieces for t in p.logprobs or ())
    return replace(result, text=text, segments=tuple(pieces), logprobs=logprobs,
                   extra={**result.extra, "redecoded": sorted(again)})


async def stream_text(worker: Worker, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
    """One clip as a file job, its text in deltas as a streaming engine decodes it (else the whole text once)."""
    texts: asyncio.Queue[str] = asyncio.Queue()
    job = Job(f"file-{uuid.uuid4().hex[:12]}", 0, audio, _lane(options), options, on_text=texts.put_nowait)
    future = worker.submit(job)
    said = ""
    try:
        while not (future.done() and texts.empty()):
            getter = asyncio.ensure_future(texts.get())
            await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                continue
            text = getter.result()
            if text.startswith(said) and len(text) > len(said):
                yield text[len(said):]
                said = text
        final = future.result().text  # raises the engine's error
        if final.startswith(said) and len(final) > len(said):
            yield final[len(said):]
    finally:
        worker.cancel(job)


async def transcribe_segments(
    path: str | Path,
    runner: Engine | Worker,
    vad: VADConfig | None = None,
    options: TranscribeOptions | None = None,
    batch_size: int | None = None,
    window_s: float | None = None,
    on_segment: Callable[[SegmentEnd], object] | None = None,
) -> AsyncIterator[Entry]:
    """Yield the entries of the file in order: one per speech segment or packed window, or with
    `options.timestamps` one per timed piece that Whisper found in it. `on_segment` sees each segment or window
    as it is answered (the speaker model windows their speech).

    Raises AudioDecodeError on bad input."""
    n = 0
    async for end, result in transcribe_results(path, runner, vad, options, batch_size=batch_size,
                                                window_s=window_s):
        if on_segment is not None:
            on_segment(end)
        if isinstance(result, BaseException):
            entries = [Entry(n, end.start, end.end, f"transcription failed: {result}", kind="error")]
        else:
            entries = timed_entries(end, result, n)
        n += len(entries)
        for entry in entries:
            yield entry


async def transcribe_file(
    path: str | Path,
    runner: Engine | Worker,
    vad: VADConfig | None = None,
    options: TranscribeOptions | None = None,
    batch_size: int | None = None,
    window_s: float | None = None,
    on_segment: Callable[[SegmentEnd], object] | None = None,
) -> list[Entry]:
    return [e async for e in transcribe_segments(path, runner, vad, options, batch_size, window_s, on_segment)]
