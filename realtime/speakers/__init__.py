"""Who spoke when: stretches of speech in, speaker turns out, for a whole recording or live, window by window.

Owns the speaker embeddings (`campplus`), their clustering (`cluster`) and what this module does with them:
windows inside the VAD's speech, turns from the windows' speakers, a speaker for each word, and names for speakers
from reference clips. May import only the ground (`realtime.audio`, `realtime.config`). A better model (an
overlap-aware segmentation, a larger embedding network) replaces `Embedder` or `cluster` behind `Diarizer`.
"""

from __future__ import annotations

import bisect
import itertools
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..audio import SAMPLE_RATE
from .campplus import INSTALL_HINT, Embedder, SpeakersUnavailable
from .cluster import ONLINE_COSINE, OnlineClusters, cluster, first_seen_order

__all__ = ["INSTALL_HINT", "Diarization", "Diarizer", "LiveSpeakers", "SpeakersUnavailable", "Turn",
           "letter", "speaker_windows"]

Span = tuple[float, float]
WINDOW_S = 1.5
HOP_S = 0.75
MIN_WINDOW_S = 0.5
"""Less speech than this gives no embedding of its own: it takes the speaker of the nearest window."""
BRIDGE_S = 0.5
"""A pause this short between two turns of the same speaker is part of the turn (as references annotate it)."""
NAME_COSINE = ONLINE_COSINE
"""A speaker takes a reference's name when their embeddings are at least this similar."""


@dataclass(frozen=True)
class Turn:
    start: float
    end: float
    speaker: int


def speaker_windows(speech: Sequence[Span]) -> list[Span]:
    """Windows of `WINDOW_S` every `HOP_S` inside each stretch of speech, the last one ending with it; a stretch
    shorter than a window is one window, and one shorter than `MIN_WINDOW_S` none."""
    out: list[Span] = []
    for start, end in speech:
        length = end - start
        if length < MIN_WINDOW_S:
            continue
        if length <= WINDOW_S:
            out.append((start, end))
            continue
        count = int(np.ceil((length - WINDOW_S) / HOP_S)) + 1
        out += [(start + i * HOP_S, start + i * HOP_S + WINDOW_S) for i in range(count - 1)]
        out.append((end - WINDOW_S, end))
    return out


def _turns(speech: Sequence[Span], windows: Sequence[Span], labels: Sequence[int]) -> list[Turn]:
    """Each stretch of speech cut where the nearest window's speaker changes (windows in time order)."""
    if not windows:
        return []
    centres = [(a + b) / 2 for a, b in windows]

    def nearest(t: float) -> int:
        i = bisect.bisect_left(centres, t)
        return min((j for j in (i - 1, i) if 0 <= j < len(centres)), key=lambda j: abs(centres[j] - t))

    turns: list[Turn] = []
    for start, end in speech:
        inside = [i for i, c in enumerate(centres) if start <= c <= end]
        if not inside:
            turns.append(Turn(start, end, int(labels[nearest((start + end) / 2)])))
            continue
        at = start
        for i, j in itertools.pairwise(inside):
            if labels[i] != labels[j]:
                cut = (centres[i] + centres[j]) / 2
                turns.append(Turn(at, cut, int(labels[i])))
                at = cut
        turns.append(Turn(at, end, int(labels[inside[-1]])))
    merged: list[Turn] = []
    for turn in sorted(turns, key=lambda t: t.start):
        if merged and merged[-1].speaker == turn.speaker and turn.start - merged[-1].end <= BRIDGE_S:
            merged[-1] = Turn(merged[-1].start, turn.end, turn.speaker)
        else:
            merged.append(turn)
    return merged


@dataclass
class Diarization:
    """A recording's speaker turns, with each speaker's mean embedding (row i is speaker i)."""

    turns: list[Turn]
    centroids: np.ndarray
    names: dict[int, str] = field(default_factory=dict)

    def speaker_at(self, start: float, end: float) -> int | None:
        """The speaker of most of [start, end], else of the nearest turn; None without turns."""
        if not self.turns:
            return None
        overlap: dict[int, float] = {}
        for turn in self.turns:
            shared = min(end, turn.end) - max(start, turn.start)
            if shared > 0:
                overlap[turn.speaker] = overlap.get(turn.speaker, 0.0) + shared
        if overlap:
            return max(overlap, key=lambda s: overlap[s])
        middle = (start + end) / 2
        return min(self.turns, key=lambda t: min(abs(t.start - middle), abs(t.end - middle))).speaker

    def label(self, speaker: int, numbered: bool = False) -> str:
        """A known speaker's name, else a letter in order of appearance (A, B, ...) as OpenAI labels them, or with
        `numbered` "Speaker 1", "Speaker 2", ... as the page labels them."""
        return self.names.get(speaker) or (f"Speaker {speaker + 1}" if numbered else letter(speaker))

    def rttm(self, file_id: str) -> str:
        return "".join(f"SPEAKER {file_id} 1 {t.start:.3f} {t.end - t.start:.3f} <NA> <NA> {self.label(t.speaker)} "
                       "<NA> <NA>\n" for t in self.turns)


def letter(speaker: int) -> str:
    letters = string.ascii_uppercase
    return letters[speaker] if speaker < len(letters) else f"{letters[speaker // 26 - 1]}{letters[speaker % 26]}"


def _centroids(embeddings: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each speaker's mean embedding, row i for speaker i."""
    return np.stack([embeddings[labels == s].mean(0) for s in range(int(labels.max()) + 1)])


def _cut(audio: np.ndarray, span: Span) -> np.ndarray:
    return audio[round(span[0] * SAMPLE_RATE):round(span[1] * SAMPLE_RATE)]


class Diarizer:
    """Speaker turns of a recording from its stretches of speech (the VAD's), and names from reference clips."""

    def __init__(self, embedder: Embedder | None = None) -> None:
        self.embedder = embedder or Embedder()

    def file(self, audio: np.ndarray, speech: Sequence[Span]) -> Diarization:
        """All windows embedded, then clustered together (for a file, or a session once it ends)."""
        speech = sorted(speech)
        windows = speaker_windows(speech)
        if not windows:
            return Diarization([], np.zeros((0, self.embedder.dim)))
        embeddings = self.embedder.embed([_cut(audio, w) for w in windows])
        labels = cluster(embeddings)
        return Diarization(_turns(speech, windows, labels), _centroids(embeddings, labels))

    def name(self, diarization: Diarization, references: Mapping[str, np.ndarray]) -> Diarization:
        """Each reference's name given to the speaker most like it (at least `NAME_COSINE`), one speaker each."""
        if not references or len(diarization.centroids) == 0:
            return diarization
        names = list(references)
        refs = []
        for clip in references.values():
            windows = speaker_windows([(0.0, clip.size / SAMPLE_RATE)]) or [(0.0, clip.size / SAMPLE_RATE)]
            refs.append(self.embedder.embed([_cut(clip, w) for w in windows]).mean(0))
        ref = np.stack(refs)
        ref /= np.maximum(np.linalg.norm(ref, axis=1, keepdims=True), 1e-9)
        centroids = diarization.centroids / np.maximum(
            np.linalg.norm(diarization.centroids, axis=1, keepdims=True), 1e-9)
        similarity = centroids @ ref.T
        chosen: dict[int, str] = {}
        for flat in np.argsort(similarity, axis=None)[::-1]:
            speaker, r = np.unravel_index(int(flat), similarity.shape)
            if similarity[speaker, r] < NAME_COSINE:
                break
            if int(speaker) not in chosen and names[r] not in chosen.values():
                chosen[int(speaker)] = names[r]
        diarization.names = chosen
        return diarization


class LiveSpeakers:
    """A live session's speakers: each stretch of speech is windowed and every window joins the nearest speaker
    (or opens one) as it is heard. `online()` gives the session's turns as labelled live."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self.clusters = OnlineClusters()
        self.windows: list[Span] = []
        self.embeddings: list[np.ndarray] = []
        self.labels: list[int] = []

    def add(self, audio: np.ndarray, start: float) -> tuple[list[Turn], dict[int, int]]:
        """The turns of one closed stretch of speech (`audio` starting at stream time `start`), and the speakers
        merged into others since the last call ({merged: kept}: earlier labels to revise)."""
        end = start + audio.size / SAMPLE_RATE
        windows = speaker_windows([(start, end)]) or [(start, end)]
        embeddings = self.embedder.embed([_cut(audio, (a - start, b - start)) for a, b in windows])
        labels = [self.clusters.add(e, b - a) for e, (a, b) in zip(embeddings, windows, strict=True)]
        merged = self.clusters.merge_close()
        self.windows += windows
        self.embeddings += list(embeddings)
        self.labels = [merged.get(v, v) for v in [*self.labels, *labels]]
        return _turns([(start, end)], windows, [merged.get(v, v) for v in labels]), merged

    def _diarization(self, speech: Sequence[Span], labels: np.ndarray, order: np.ndarray) -> Diarization:
        windows = [self.windows[i] for i in order]
        embeddings = np.stack([self.embeddings[i] for i in order])
        return Diarization(_turns(sorted(speech), windows, labels), _centroids(embeddings, labels))

    def online(self, speech: Sequence[Span]) -> Diarization:
        """The session's turns as they were labelled live, renumbered in order of appearance."""
        if not self.windows:
            return Diarization([], np.zeros((0, self.embedder.dim)))
        order = np.argsort([a for a, _ in self.windows], kind="stable")
        return self._diarization(speech, first_seen_order(np.array([self.labels[i] for i in order])), order)
