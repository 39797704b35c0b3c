"""Real recordings with reference texts: a manifest of clips, corpus WER, and compilations for live runs.

A manifest is a tab-separated file (`file`, `duration_s`, `condition`, `speaker`, `text`, more columns allowed)
beside its audio, like tests/data/manifest.tsv. `compilation` joins clips with pauses into one recording whose
utterance times are known, for streaming them live as one person speaking with pauses.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from ..engines.policy import find_loop


@dataclass(frozen=True)
class Clip:
    path: Path
    text: str
    condition: str
    duration: float
    speaker: str

    @property
    def name(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class Compilation:
    path: Path
    clips: list[Clip]
    spans: list[tuple[float, float]]
    """(start, end) of each clip in the recording, seconds."""

    @property
    def texts(self) -> list[str]:
        return [c.text for c in self.clips]

    @property
    def text(self) -> str:
        return " ".join(self.texts)


def read_manifest(path: Path, conditions: set[str] | None = None, longest: float | None = None) -> list[Clip]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    clips = [Clip(path.parent / r["file"], r["text"], r["condition"], float(r["duration_s"]), r["speaker"])
             for r in rows]
    return [c for c in clips if (conditions is None or c.condition in conditions)
            and (longest is None or c.duration <= longest)]


def compilation(clips: list[Clip], path: Path, gap: float = 1.2, lead: float = 0.5, tail: float = 1.0
                ) -> Compilation:
    """The clips one after another with `gap` seconds of silence between them, as a 16 kHz mono WAV."""
    import soundfile as sf

    parts = [np.zeros(int(lead * SAMPLE_RATE), np.float32)]
    spans, t = [], lead
    for i, clip in enumerate(clips):
        audio = decode_file(clip.path)
        spans.append((t, t + audio.size / SAMPLE_RATE))
        parts.append(audio)
        t += audio.size / SAMPLE_RATE
        if i < len(clips) - 1:
            parts.append(np.zeros(int(gap * SAMPLE_RATE), np.float32))
            t += gap
    parts.append(np.zeros(int(tail * SAMPLE_RATE), np.float32))
    sf.write(str(path), np.concatenate(parts), SAMPLE_RATE, subtype="PCM_16")
    return Compilation(path, list(clips), spans)


def corpus_wer(references: list[str], hypotheses: list[str]) -> float:
    """Word errors over all clips divided by their reference words (Whisper's English normaliser on both sides)."""
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    pairs = [(norm(r), norm(h)) for r, h in zip(references, hypotheses, strict=True)]
    pairs = [(r, h) for r, h in pairs if r.strip()]
    return float(jiwer.wer([r for r, _ in pairs], [h if h.strip() else "<empty>" for _, h in pairs]))


LOST_RUN_WORDS = 5
"""A run of this many reference words in a row with none of them in the transcript is a lost stretch of speech."""


def lost_runs(reference: str, hypothesis: str, words: int = LOST_RUN_WORDS) -> list[str]:
    """The stretches of at least `words` reference words that the hypothesis leaves out entirely (deleted in the
    word alignment, after Whisper's English normaliser on both sides), in order."""
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    ref, hyp = norm(reference), norm(hypothesis)
    if not ref.strip():
        return []
    said = ref.split()
    if not hyp.strip():
        return [" ".join(said)] if len(said) >= words else []
    out = jiwer.process_words(ref, hyp)
    return [" ".join(said[c.ref_start_idx:c.ref_end_idx]) for c in out.alignments[0]
            if c.type == "delete" and c.ref_end_idx - c.ref_start_idx >= words]


def loops(hypotheses: list[str]) -> list[str]:
    """The hypotheses that repeat themselves back to back."""
    return [h for h in hypotheses if find_loop(h) is not None]
