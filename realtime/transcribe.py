"""File transcription: decode as a stream, cut with the same VAD as live audio, transcribe each segment."""

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
    """Yield one `Entry` per speech segment of the file, in order. Raises AudioDecodeError on bad input."""
    options = options or TranscribeOptions()
    segmenter = Segmenter(vad)
    ends: list[SegmentEnd] = []
    for chunk in iter_file(path):
        ends.extend(e for e in segmenter.feed(chunk) if isinstance(e, SegmentEnd))
        while ends:
            yield await _run(engine, ends.pop(0), options)
    ends.extend(e for e in segmenter.flush() if isinstance(e, SegmentEnd))
    for end in ends:
        yield await _run(engine, end, options)


async def _run(engine: Engine, end: SegmentEnd, options: TranscribeOptions) -> Entry:
    try:
        result = await engine.transcribe(end.audio, options)
    except Exception as exc:
        return Entry(end.segment, end.start, end.end, f"transcription failed: {exc}", kind="error")
    return Entry(end.segment, end.start, end.end, result.text)


async def transcribe_file(
    path: str | Path, engine: Engine, vad: VADConfig | None = None, options: TranscribeOptions | None = None
) -> list[Entry]:
    return [e async for e in transcribe_segments(path, engine, vad, options)]
