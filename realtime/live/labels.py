"""Speaker labels on transcript entries: the rule every path follows to say who spoke which words.

A word takes the speaker of the turn it falls in (`Diarization.speaker_at` over its times); an entry with word
times is cut where the speaker changes, so one Whisper piece spoken by two people becomes two entries; an entry
without word times takes the speaker of most of its span. Also the speech spans of what the file path decoded,
which are what the speaker model windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from ..speakers import Diarization
from .transcribe import Window
from .transcript import Entry
from .vad import SegmentEnd

Span = tuple[float, float]


def speech_spans(end: SegmentEnd) -> list[Span]:
    """Stream times of the speech in a segment, or in each segment packed into a window."""
    if isinstance(end, Window) and end.context is None and end.speech and end.parts:
        return [(end.stream_time(a), end.stream_time(b, end=True)) for a, b in end.speech]
    return [(end.start, end.end)]


def label(entries: Iterable[Entry], diarization: Diarization) -> list[Entry]:
    """The entries with their speakers' labels, cut at each change of speaker inside one."""
    out: list[Entry] = []
    for e in entries:
        if not e.words:
            who = diarization.speaker_at(e.start, e.end)
            out.append(dataclasses.replace(e, speaker=None if who is None else diarization.label(who)))
            continue
        runs: list[tuple[int | None, list]] = []
        for w in e.words:
            who = diarization.speaker_at(w.start, w.end)
            if runs and runs[-1][0] == who:
                runs[-1][1].append(w)
            else:
                runs.append((who, [w]))
        if len(runs) == 1:
            who = runs[0][0]
            out.append(dataclasses.replace(e, speaker=None if who is None else diarization.label(who)))
            continue
        for who, words in runs:
            text = "".join(w.word for w in words).strip()
            if text:
                out.append(dataclasses.replace(e, start=words[0].start, end=words[-1].end, text=text,
                                               words=tuple(words),
                                               speaker=None if who is None else diarization.label(who)))
    return out


def diarized_segments(entries: Sequence[Entry]) -> list[dict]:
    """OpenAI's `diarized_json` segments (`TranscriptionDiarizedSegment`) from labelled entries."""
    return [{"type": "transcript.text.segment", "id": f"seg_{i:03d}", "start": round(e.start, 3),
             "end": round(e.end, 3), "text": e.text, "speaker": e.speaker or "A"}
            for i, e in enumerate(x for x in entries if x.text)]
