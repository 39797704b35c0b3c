"""Real recordings with reference texts: a manifest of clips, corpus WER, and compilations for live runs.

A manifest is a tab-separated file (`file`, `duration_s`, `condition`, `speaker`, `text`, more columns allowed)
beside its audio, like tests/data/manifest.tsv. `compilation` joins clips with pauses into one recording whose
utterance times are known, for streaming them live as one person speaking with pauses; `random_compilation` draws
the clips, their order, the pauses between them and their levels from a seed, for checks on recordings that no
earlier run has seen. `lost_runs` finds the stretches of speech an answer leaves out.
"""

from __future__ import annotations

import csv
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from ..engines.policy import find_loop, word_key


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
    gains_db: tuple[float, ...] = ()
    """The gain each clip was given (`random_compilation`), dB."""
    seed: int | None = None

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


PAUSES_S = (0.1, 1.5)
"""The pauses between a random compilation's clips are drawn from this range: some shorter than the VAD's minimum
silence (two clips in one segment), some long enough to close a segment."""
LEVEL_DB = -26.0
"""A random compilation's clips are brought to this RMS level before their gains are drawn."""
LEVEL_SPREAD_DB = 6.0
"""...and then given a gain drawn from plus or minus this much: levels differ by up to twice it between clips."""


def random_compilation(clips: list[Clip], path: Path, seed: int, count: tuple[int, int] = (6, 14)) -> Compilation:
    """A recording drawn from `seed`: `count` clips (a number drawn from that range) in a random order, random pauses
    (`PAUSES_S`) and levels (`LEVEL_DB`, `LEVEL_SPREAD_DB`; a clip whose peak would clip is turned down), as a 16 kHz
    mono WAV. The same seed and clips give the same recording."""
    import soundfile as sf

    rng = random.Random(seed)
    picked = rng.sample(clips, min(len(clips), rng.randint(*count)))
    parts = [np.zeros(int(rng.uniform(0.1, 1.0) * SAMPLE_RATE), np.float32)]
    spans, gains, t = [], [], parts[0].size / SAMPLE_RATE
    for clip in picked:
        audio = decode_file(clip.path)
        rms = max(float(np.sqrt(np.mean(audio ** 2))), 1e-5)
        gain = min(10 ** ((LEVEL_DB + rng.uniform(-LEVEL_SPREAD_DB, LEVEL_SPREAD_DB)) / 20) / rms,
                   0.99 / max(float(np.abs(audio).max()), 1e-5))
        gains.append(round(20 * float(np.log10(gain)), 1))
        spans.append((t, t + audio.size / SAMPLE_RATE))
        parts += [(audio * gain).astype(np.float32), np.zeros(int(rng.uniform(*PAUSES_S) * SAMPLE_RATE), np.float32)]
        t += (parts[-2].size + parts[-1].size) / SAMPLE_RATE
    sf.write(str(path), np.concatenate(parts), SAMPLE_RATE, subtype="PCM_16")
    return Compilation(path, picked, spans, tuple(gains), seed)


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


DIGIT_WORDS = {"zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5", "six": "6",
               "seven": "7", "eight": "8", "nine": "9"}


@functools.cache
def _normaliser() -> Callable[[str], str]:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def spoken_words(text: str) -> list[str]:
    """The words a text says, as the lost-speech check compares them: Whisper's English normaliser, then every number
    spelt digit by digit, so that "0 1 8 0 3", "01803" and "zero one eight oh three" are the same five words (the
    normaliser writes a lone "1" as "one", drops a leading zero and joins some digit runs but not others)."""
    out: list[str] = []
    for word in _normaliser()(text).split():
        word = DIGIT_WORDS.get(word, word)
        out.extend(word if word.isdigit() else [word])
    return out


def lost_runs(reference: str, hypothesis: str, words: int = LOST_RUN_WORDS) -> list[str]:
    """The stretches of at least `words` reference words that the hypothesis leaves out entirely (deleted in the
    word alignment, after `spoken_words` on both sides), in order."""
    import jiwer

    ref, hyp = " ".join(spoken_words(reference)), " ".join(spoken_words(hypothesis))
    if not ref.strip():
        return []
    said = ref.split()
    if not hyp.strip():
        return [" ".join(said)] if len(said) >= words else []
    out = jiwer.process_words(ref, hyp)
    return [" ".join(said[c.ref_start_idx:c.ref_end_idx]) for c in out.alignments[0]
            if c.type == "delete" and c.ref_end_idx - c.ref_start_idx >= words]


def lost_speech(compilation: Compilation, alone: dict[str, str], answer: str) -> list[str]:
    """The stretches of speech an answer for a compilation leaves out: runs of `LOST_RUN_WORDS` or more words that
    the same pipeline writes for the clips posted alone (`alone`, by clip name) and that the answer lacks. A run
    that is not speech of the clips (most of its words in none of their reference texts: a phrase Whisper made up
    over a clip's silence, "we'll see you next time") is not counted."""
    said = set(spoken_words(compilation.text))
    runs = lost_runs(" ".join(alone[c.name] for c in compilation.clips), answer)
    return [r for r in runs if 2 * sum(w in said for w in r.split()) >= len(r.split())]


def loops(hypotheses: list[str], reference: str | None = None) -> list[str]:
    """The hypotheses that repeat themselves back to back; with a `reference`, only those that repeat a run more
    times in a row than the reference repeats any run of that many words (clips that say the same phrase one after
    another, as tests/data's "Montreal Forced Aligner" recordings do, are not a loop), a single word more than once
    more (a word said five times and written six, as `mfa-words` is, is miscounted, not a loop)."""
    out = []
    for h in hypotheses:
        at = find_loop(h)
        if at is None:
            continue
        keys = [word_key(w) for w in h.split()]
        n = next(k for k in range(1, at + 1) if keys[at - k:at] == keys[at:at + k])
        if reference is None or _most_repeats(keys[at - n:], n, 0) > _most_repeats(
                [word_key(w) for w in reference.split()], n) + (n == 1):
            out.append(h)
    return out


def _most_repeats(keys: list[str], n: int, only: int | None = None) -> int:
    """The most times a run of `n` words comes back to back (of the run at index `only`, else of any)."""
    best = 1
    for i in ([only] if only is not None else range(len(keys) - n)):
        k = 1
        while keys[i + k * n:i + (k + 1) * n] == keys[i:i + n]:
            k += 1
        best = max(best, k)
    return best
