"""File transcription: decode as a stream, cut with the same VAD as live audio, transcribe segments in batches."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

from .audio import iter_file
from .engines import Engine, TranscribeOptions
from .transcript import Entry
from .vad import SegmentEnd, Segmenter, VADConfig


async def transcribe_segments(
    path: str | Path, engine: Engine, vad: VADConfig | None = None, options: TranscribeOptions | None = None
) -> AsyncIterator[Entry]:
    """Yield one `Entry` per speech segment of the file, in order. Raises AudioDecodeError on bad input.

    Memory stays bounded: audio is decoded in chunks and at most one batch of segments is held.
    """
    options = options or TranscribeOptions()
    batch_size = max(1, getattr(engine, "max_batch_size", 1))
    segmenter = Segmenter(vad)
    pending: list[SegmentEnd] = []
    for chunk in iter_file(path):
        pending.extend(e for e in segmenter.feed(chunk) if isinstance(e, SegmentEnd))
        while len(pending) >= batch_size:
            for entry in await _run(engine, pending[:batch_size], options):
                yield entry
            del pending[:batch_size]
    pending.extend(e for e in segmenter.flush() if isinstance(e, SegmentEnd))
    for i in range(0, len(pending), batch_size):
        for entry in await _run(engine, pending[i : i + batch_size], options):
            yield entry


async def _run(engine: Engine, ends: list[SegmentEnd], options: TranscribeOptions) -> list[Entry]:
    try:
        results = await engine.transcribe_batch([e.audio for e in ends], [options] * len(ends))
    except Exception as exc:
        results = [exc] * len(ends)
    entries = []
    for end, result in zip(ends, results, strict=True):
        if isinstance(result, BaseException):
            entries.append(Entry(end.segment, end.start, end.end, f"transcription failed: {result}", kind="error"))
        else:
            entries.append(Entry(end.segment, end.start, end.end, result.text))
    return entries


async def transcribe_file(
    path: str | Path, engine: Engine, vad: VADConfig | None = None, options: TranscribeOptions | None = None
) -> list[Entry]:
    return [e async for e in transcribe_segments(path, engine, vad, options)]
