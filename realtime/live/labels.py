"""Speaker labels on transcript entries: the rule every path follows to say who spoke which words.

A word takes the speaker of the turn it falls in (`Diarization.speaker_at` over its times); an entry with word
times becomes runs of consecutive words by one speaker, cut where the speaker changes and at a pause of
`TURN_PAUSE_S` or more, each timed by its first word's start and its last word's end: one Whisper piece spoken by two
people becomes two entries, and no entry spans a silence that belongs to no word. An entry without word times takes
the speaker of most of its span. Also the speech spans of what the file path decoded, which are what the speaker
model windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from ..engines.types import Word
from ..speakers import Diarization, Diarizer
from .transcribe import Window
from .transcript import Entry
from .vad import SegmentEnd

Span = tuple[float, float]
TURN_PAUSE_S = 1.0
"""A pause between two words this long or longer ends a labelled entry, even where the speaker stays the same."""


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
    """The entries with their speakers' labels (letters, or with `numbered` "Speaker 1", ...); an entry with words
    is cut into runs of one speaker's words without a long pause, timed by its words."""
    def named(who: int | None) -> str | None:
        return None if who is None else diarization.label(who, numbered)

    out: list[Entry] = []
    for e in entries:
        if not e.words:
            out.append(dataclasses.replace(e, speaker=named(diarization.speaker_at(e.start, e.end))))
            continue
        runs: list[tuple[int | None, list[Word]]] = []
        for w in e.words:
            who = diarization.speaker_at(w.start, w.end)
            if runs and runs[-1][0] == who and w.start - runs[-1][1][-1].end < TURN_PAUSE_S:
                runs[-1][1].append(w)
            else:
                runs.append((who, [w]))
        for who, words in runs:
            text = e.text if len(runs) == 1 else "".join(w.word for w in words).strip()
            if text:
                out.append(dataclasses.replace(e, start=words[0].start, end=words[-1].end,
                                               text=text, words=tuple(words), speaker=named(who)))
    return out


def diarized_segments(entries: Sequence[Entry]) -> list[dict]:
    """OpenAI's `diarized_json` segments (`TranscriptionDiarizedSegment`) from labelled entries."""
    return [{"type": "transcript.text.segment", "id": f"seg_{i:03d}", "start": round(e.start, 3),
             "end": round(e.end, 3), "text": e.text, "speaker": e.speaker or "A"}
            for i, e in enumerate(x for x in entries if x.text)]
