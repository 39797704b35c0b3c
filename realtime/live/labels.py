"""Speaker labels on transcript entries: the rule every path follows to say who spoke which words.

A word takes the speaker of the turn it falls in (`Diarization.speaker_at` over its times), within the stretch of
speech it overlaps most (alignment may stretch a sentence's last word over the silence after it). An entry with
word times becomes runs of consecutive words by one speaker, cut where the speaker changes and at a pause of
`TURN_PAUSE_S` or more between words; each run is timed by the speech its words are in: from the start of the turn
its first word lies in to the end of the turn its last word lies in, never over another run's time. So one Whisper
piece spoken by two people becomes two entries, and no entry spans silence: turns are the VAD's speech. An entry
without word times takes the speaker of most of its span. Also the speech spans of what the file path decoded, which
are what the speaker model windows.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from ..config import VADConfig
from ..engines.types import Word
from ..speakers import Diarization, Diarizer, Turn
from .transcribe import Window
from .transcript import Entry
from .vad import SegmentEnd

Span = tuple[float, float]
TURN_PAUSE_S = 1.0
"""A pause between two words this long or longer ends a labelled entry, even where the speaker stays the same."""


def speech_spans(end: SegmentEnd, vad: VADConfig | None = None) -> list[Span]:
    """Stream times of a segment's speech with the VAD's padding (`vad`'s, by default the app's default), or of each
    segment packed into a window: what the speaker model windows. The audio a window gives the engine beside a
    segment's speech (the recording around a short one) is not speech the VAD heard, and is left out."""
    if not isinstance(end, Window) or not end.speech:
        return [(end.audio_start, end.audio_start + end.audio.size / SAMPLE_RATE)]
    config = vad or VADConfig()
    before, after = config.pad_before_ms / 1000, config.pad_after_ms / 1000
    return [(end.stream_time(max(a, x - before)), end.stream_time(min(b, y + after), end=True))
            for (a, b), (x, y) in zip(end.bounds(), end.heard_speech, strict=True)]


def diarize_file(diarizer: Diarizer, path: str | Path, speech: Sequence[Span],
                 references: Mapping[str, np.ndarray] | None = None) -> Diarization:
    """A file's speaker turns over the speech its segments hold, named after the reference clips (in a thread)."""
    diarization = diarizer.file(decode_file(path), speech)
    return diarizer.name(diarization, references or {})


def _within_speech(word: Word, turns: Sequence[Turn], starts: Sequence[float]) -> Word:
    """The word cut to the turn it overlaps most (turns in time order and apart, `starts` theirs), or as it is
    outside them."""
    best, shared = None, 0.0
    i = bisect.bisect_left(starts, word.end) - 1
    while i >= 0 and turns[i].end > word.start:
        overlap = min(word.end, turns[i].end) - max(word.start, turns[i].start)
        if overlap > shared:
            best, shared = turns[i], overlap
        i -= 1
    if best is None:
        return word
    return dataclasses.replace(word, start=max(word.start, best.start), end=min(word.end, best.end))


def _holding(t: float, turns: Sequence[Turn], starts: Sequence[float]) -> Turn | None:
    """The turn that holds time `t`, if any."""
    i = bisect.bisect_right(starts, t) - 1
    return turns[i] if i >= 0 and turns[i].start <= t <= turns[i].end else None


def label(entries: Iterable[Entry], diarization: Diarization, numbered: bool = False) -> list[Entry]:
    """The entries with their speakers' labels (letters, or with `numbered` "Speaker 1", ...); an entry with words
    is cut into runs of one speaker's words without a long pause, each timed by the speech its words are in."""
    def named(who: int | None) -> str | None:
        return None if who is None else diarization.label(who, numbered)

    turns = sorted(diarization.turns, key=lambda t: t.start)
    starts = [t.start for t in turns]
    out: list[Entry] = []
    for e in entries:
        if not e.words:
            out.append(dataclasses.replace(e, speaker=named(diarization.speaker_at(e.start, e.end))))
            continue
        runs: list[tuple[int | None, list[Word]]] = []
        for w in (_within_speech(w, turns, starts) for w in e.words):
            who = diarization.speaker_at(w.start, w.end)
            if runs and runs[-1][0] == who and w.start - runs[-1][1][-1].end < TURN_PAUSE_S:
                runs[-1][1].append(w)
            else:
                runs.append((who, [w]))
        for who, words in runs:
            text = e.text if len(runs) == 1 else "".join(w.word for w in words).strip()
            if text:
                out.append(dataclasses.replace(e, start=words[0].start, end=words[-1].end, text=text,
                                               words=tuple(words), speaker=named(who)))
    for i, e in enumerate(out):  # each run widened to the speech its first and last words are in
        if not e.words:
            continue
        first, last = _holding(e.start, turns, starts), _holding(e.end, turns, starts)
        start = max(first.start, out[i - 1].end if i else first.start) if first else e.start
        end = min(last.end, out[i + 1].start if i + 1 < len(out) else last.end) if last else e.end
        out[i] = dataclasses.replace(e, start=min(start, e.start), end=max(end, e.end))
    return out


def diarized_segments(entries: Sequence[Entry]) -> list[dict]:
    """OpenAI's `diarized_json` segments (`TranscriptionDiarizedSegment`) from labelled entries."""
    return [{"type": "transcript.text.segment", "id": f"seg_{i:03d}", "start": round(e.start, 3),
             "end": round(e.end, 3), "text": e.text, "speaker": e.speaker or "A"}
            for i, e in enumerate(x for x in entries if x.text)]
