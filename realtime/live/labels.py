"""Speaker labels on transcript entries: the rule every path follows to say who spoke which words.

A word takes the speaker of the turn it falls in (`Diarization.speaker_at` over its times); an entry with word
times is cut where the speaker changes, so one Whisper piece spoken by two people becomes two entries; an entry
without word times takes the speaker of most of its span. Also the speech spans of what the file path decoded,
which are what the speaker model windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from ..speakers import Diarization, Diarizer
from .transcribe import Window
from .transcript import Entry
from .vad import SegmentEnd

Span = tuple[float, float]


def speech_spans(end: SegmentEnd) -> list[Span]:
    """Stream times of a segment's audio (its speech with the VAD's padding), or of each segment packed into a
    window: what the speaker model windows."""
    if isinstance(end, Window):
        if end.context is not None or not end.parts:
            return [(end.start, end.end)]
        return [(end.stream_time(a), end.stream_time(b, end=True)) for a, b in end.bounds()]
    return [(end.audio_start, end.audio_start + end.audio.size / SAMPLE_RATE)]


def diarize_file(diarizer: Diarizer, path: str | Path, speech: Sequence[Span],
                 references: Mapping[str, np.ndarray] | None = None) -> Diarization:
    """A file's speaker turns over the speech its segments hold, named after the reference clips (in a thread)."""
    diarization = diarizer.file(decode_file(path), speech)
    return diarizer.name(diarization, references or {})


def label(entries: Iterable[Entry], diarization: Diarization, numbered: bool = False) -> list[Entry]:
    """The entries with their speakers' labels (letters, or with `numbered` "Speaker 1", ...), cut at each change
    of speaker inside one."""
    def named(who: int | None) -> str | None:
        return None if who is None else diarization.label(who, numbered)

    out: list[Entry] = []
    for e in entries:
        if not e.words:
            who = diarization.speaker_at(e.start, e.end)
            out.append(dataclasses.replace(e, speaker=named(who)))
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
            out.append(dataclasses.replace(e, speaker=named(who)))
            continue
        for who, words in runs:
            text = "".join(w.word for w in words).strip()
            if text:
                out.append(dataclasses.replace(e, start=words[0].start, end=words[-1].end, text=text,
                                               words=tuple(words),
                                               speaker=named(who)))
    return out


def diarized_segments(entries: Sequence[Entry]) -> list[dict]:
    """OpenAI's `diarized_json` segments (`TranscriptionDiarizedSegment`) from labelled entries."""
    return [{"type": "transcript.text.segment", "id": f"seg_{i:03d}", "start": round(e.start, 3),
             "end": round(e.end, 3), "text": e.text, "speaker": e.speaker or "A"}
            for i, e in enumerate(x for x in entries if x.text)]
