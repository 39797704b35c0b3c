"""A session's transcript (final entries and the current partial) and its export formats."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..engines.types import TokenLogprob, Word


@dataclass(frozen=True)
class Entry:
    """A closed speech segment: its final text, or an error that says why it has none."""

    segment: int
    start: float
    end: float
    text: str
    kind: Literal["final", "error"] = "final"
    latency: float | None = None
    language: str | None = None
    """The language the engine heard in it, when it says."""
    words: tuple[Word, ...] = ()
    """Its words with their times (same clock as `start`), when word timestamps were asked for."""
    speaker: str | None = None
    """Who spoke it, when speaker labels were asked for."""
    logprobs: tuple[TokenLogprob, ...] | None = None
    """Its text's tokens with their log probabilities, when they were asked for."""


@dataclass(frozen=True)
class Partial:
    segment: int
    start: float
    end: float
    committed: str
    tentative: str

    @property
    def text(self) -> str:
        return f"{self.committed} {self.tentative}".strip()


@dataclass
class Transcript:
    entries: list[Entry] = field(default_factory=list)
    partial: Partial | None = None

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.entries.sort(key=lambda e: e.segment)
        if self.partial is not None and self.partial.segment <= entry.segment:
            self.partial = None

    def replace(self, segment: int, entries: list[Entry]) -> None:
        """The segment's entries (together in segment order) replaced by `entries`: its final cut where the
        speaker changes, or put back whole."""
        at = [i for i, e in enumerate(self.entries) if e.segment == segment]
        if at:
            self.entries[at[0]:at[-1] + 1] = entries

    def entries_of(self, segment: int) -> list[Entry]:
        return [e for e in self.entries if e.segment == segment]

    def clear(self) -> None:
        self.entries.clear()
        self.partial = None

    def snapshot(self) -> TranscriptSnapshot:
        return TranscriptSnapshot(tuple(self.entries), self.partial)


@dataclass(frozen=True)
class TranscriptSnapshot:
    entries: tuple[Entry, ...]
    partial: Partial | None


def _timestamp(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _texts(entries: Iterable[Entry]) -> list[Entry]:
    return [e for e in entries if e.text and e.kind == "final"]


def to_text(entries: Iterable[Entry]) -> str:
    """A line per entry; a speaker's label, where there is one, starts it ("A: ...")."""
    return "\n".join(f"{e.speaker}: {e.text}" if e.speaker else e.text for e in _texts(entries))


def cues(entries: Iterable[Entry], max_chars: int | None = None) -> list[Entry]:
    """The entries with text, each cut at word boundaries into cues of at most `max_chars` characters where it
    has word times (a cue spans its words; a single longer word is a cue of its own); without, entries stay whole."""
    out: list[Entry] = []
    for e in _texts(entries):
        if not max_chars or not e.words or len(e.text) <= max_chars:
            out.append(e)
            continue
        line: list[Word] = []
        for w in (*e.words, None):
            joined = "".join(x.word for x in (*line, *([w] if w else []))).strip()
            if line and (w is None or len(joined) > max_chars):
                out.append(Entry(e.segment, line[0].start, line[-1].end, "".join(x.word for x in line).strip(),
                                 latency=e.latency, language=e.language, words=tuple(line), speaker=e.speaker))
                line = []
            if w is not None:
                line.append(w)
    return out


def to_srt(entries: Iterable[Entry], max_chars: int | None = None) -> str:
    """SubRip; with `max_chars`, entries with word times are cut into cues of at most that many characters.
    A speaker's label, where there is one, starts the cue's text ("A: ...")."""
    blocks = [
        f"{i}\n{_timestamp(e.start, ',')} --> {_timestamp(e.end, ',')}\n"
        f"{f'{e.speaker}: ' if e.speaker else ''}{e.text}\n"
        for i, e in enumerate(cues(entries, max_chars), 1)
    ]
    return "\n".join(blocks)


def to_vtt(entries: Iterable[Entry], max_chars: int | None = None) -> str:
    """WebVTT; `max_chars` as for `to_srt`. A speaker's label is the cue's voice tag (`<v A>...`)."""
    blocks = [f"{_timestamp(e.start, '.')} --> {_timestamp(e.end, '.')}\n"
              f"{f'<v {_voice(e.speaker)}>' if e.speaker else ''}{e.text}\n"
              for e in cues(entries, max_chars)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def _voice(name: str) -> str:
    """A WebVTT voice annotation may not hold '>' or a line break."""
    return " ".join(name.replace(">", " ").split())


def to_json(entries: Iterable[Entry], **extra: Any) -> str:
    items = list(entries)
    doc = {
        **extra,
        "text": " ".join(e.text for e in _texts(items)),
        "segments": [
            {"id": e.segment, "start": round(e.start, 3), "end": round(e.end, 3), "text": e.text}
            | ({"error": True} if e.kind == "error" else {})
            | ({"language": e.language} if e.language else {})
            | ({"speaker": e.speaker} if e.speaker else {})
            | ({"words": [{"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
                          for w in e.words]} if e.words else {})
            for e in items
        ],
    }
    return json.dumps(doc, ensure_ascii=False)
