"""The real-speech test set (tests/data/manifest.tsv): recordings of people with their reference texts.

Sources and licences are in tests/data/README.md. `quiet_copy` makes the quiet-microphone variant of a clip
(peak near -45 dBFS), the level laptop microphones give with the browser's auto gain off.
"""

from __future__ import annotations

import asyncio
import csv
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from realtime.audio import SAMPLE_RATE, decode_file
from realtime.bench.corpus import Clip, Compilation, compilation, corpus_wer, loops, lost_runs, read_manifest
from realtime.bench.synth import wer
from realtime.engines import Engine

DATA = Path(__file__).resolve().parent / "data"
MANIFEST = DATA / "manifest.tsv"


def clips(conditions: set[str] | None = None, longest: float | None = None) -> list[Clip]:
    return read_manifest(MANIFEST, conditions, longest)


def base_clips() -> list[Clip]:
    """The clips the multilingual base is measured on, by the embedded and the vLLM engine alike (base float32
    decodes at a fraction of tiny.en's speed here; tiny.en takes every clip, the long ones too)."""
    return clips({"short", "read"}, longest=12.0)


def quiet_copy(clip: Clip, path: Path, peak_dbfs: float = -45.0) -> Path:
    """The clip at 16 kHz mono 16-bit with its peak at `peak_dbfs`."""
    audio = decode_file(clip.path)
    audio = audio * (10 ** (peak_dbfs / 20) / float(np.max(np.abs(audio))))
    sf.write(str(path), audio, SAMPLE_RATE, subtype="PCM_16")
    return path


def transcribe_clips(engine: Engine, paths: list[Path], timestamps: bool) -> list[str]:
    """The file path's text of each file, one file at a time (timed: Whisper's timestamps, as srt, vtt and
    verbose_json are decoded; else packed windows, as json and text are)."""
    from realtime.config import WINDOW_S
    from realtime.engines import TranscribeOptions
    from realtime.live.transcribe import transcribe_file

    async def run() -> list[str]:
        texts = []
        for path in paths:
            entries = await transcribe_file(path, engine, options=TranscribeOptions(timestamps=timestamps),
                                            window_s=WINDOW_S)
            texts.append(" ".join(e.text for e in entries if e.text))
        return texts

    return asyncio.run(run())


def norm_word(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())


def matched_starts(ours: list[tuple[str, float]], theirs: list[tuple[str, float]]) -> list[tuple[float, float]]:
    """(our start, their start) of every word both transcripts have at the same place in the text."""
    a, b = [norm_word(w) for w, _ in ours], [norm_word(w) for w, _ in theirs]
    pairs = []
    for block in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_matching_blocks():
        pairs += [(ours[block.a + k][1], theirs[block.b + k][1]) for k in range(block.size) if a[block.a + k]]
    return pairs


def long_recording(path: Path) -> Compilation:
    """Every clip of the set one after another with 0.8 s pauses (about 9.5 minutes, many speakers and
    conditions): the long recording on which nothing may be lost."""
    return compilation(clips(), path, gap=0.8)


SEVERAL = ("jfk.flac", "librivox-sense-and-sensibility-01-0870.flac", "librivox-sense-and-sensibility-01-0890.flac",
           "speechbrain-spk1_snt1.flac")


def several_speakers(path: Path) -> Compilation:
    """Four people's recordings one after another in one file (a window that must keep every speaker)."""
    by_name = {c.name: c for c in clips()}
    return compilation([by_name[n] for n in SEVERAL], path)


LIVE_SECONDS = 180.0


def live_clips() -> list[Clip]:
    """Real utterances of up to 12 s (short, read and spontaneous speech), about three minutes in all."""
    picked, total = [], 0.0
    for clip in clips():
        if clip.condition in ("short", "read", "spontaneous") and clip.duration <= 12 and \
                total + clip.duration <= LIVE_SECONDS:
            picked.append(clip)
            total += clip.duration
    return picked


def live_recording(path: Path) -> Compilation:
    """`live_clips` with 1.2 s pauses: one person speaking with pauses, streamed live."""
    return compilation(live_clips(), path)


WORD_CLIPS = ("jfk.flac", "librispeech-1272-128104-0004-8k.flac", "mfa-cold_corpus.flac",
              "librivox-shakespeare-sonnet-001.flac")
"""Read, telephone (8 kHz), spontaneous and long (several windows) speech, for word timestamps."""


def word_clips() -> list[Path]:
    return [DATA / n for n in WORD_CLIPS]


def script_compilation(seed: int, path: Path) -> Compilation:
    """A compilation as ../shared/tools/random_compilations.py built it (the clips of up to 40 s in the manifest's
    order, 14 drawn, pauses of 0.3 to 1.3 s, resampled by interpolation): its seeds 1, 2, 5 and 11 lost a sentence."""
    import random

    rng = random.Random(seed)
    picked = rng.sample(clips(longest=40), 14)
    parts, spans, t = [np.zeros(8000, dtype=np.float32)], [], 0.5
    for clip in picked:
        a, sr = sf.read(str(clip.path), dtype="float32")
        a = a.mean(axis=1) if a.ndim > 1 else a
        if sr != SAMPLE_RATE:
            x = np.arange(0, len(a) * SAMPLE_RATE // sr) * sr / SAMPLE_RATE
            a = np.interp(x, np.arange(len(a)), a).astype(np.float32)
        spans.append((t, t + a.size / SAMPLE_RATE))
        parts += [a, np.zeros(int(SAMPLE_RATE * rng.uniform(0.3, 1.3)), dtype=np.float32)]
        t += (parts[-2].size + parts[-1].size) / SAMPLE_RATE
    sf.write(str(path), np.concatenate(parts), SAMPLE_RATE)
    return Compilation(path, picked, spans, seed=seed)


LANGUAGES = DATA / "languages"
ENGLISH = ("jfk.flac", "librispeech-1272-141231-0002.flac")


@dataclass(frozen=True)
class Recording:
    path: Path
    language: str


def recordings() -> list[Recording]:
    """Recordings of one language each (tests/data/languages, and two English clips), with that language."""
    with (LANGUAGES / "manifest.tsv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f, delimiter="\t") if "," not in r["language"]]
    return [Recording(LANGUAGES / r["file"], r["language"]) for r in rows] + [Recording(DATA / n, "en")
                                                                             for n in ENGLISH]


__all__ = ["DATA", "LANGUAGES", "MANIFEST", "Clip", "Compilation", "Recording", "clips", "compilation", "corpus_wer",
           "live_clips", "live_recording", "long_recording", "loops", "lost_runs", "matched_starts", "norm_word",
           "quiet_copy", "recordings", "script_compilation", "several_speakers", "transcribe_clips", "wer",
           "word_clips"]


VOICES = {
    "lj": ["ljspeech-LJ001-0001", "ljspeech-LJ001-0002", "ljspeech-LJ001-0003", "ljspeech-LJ001-0004"],
    "s1089": ["librispeech-1089-134686-0000", "librispeech-1089-134686-0001", "librispeech-1089-134691-0000",
              "librispeech-1089-134691-0001"],
    "s1272": ["librispeech-1272-128104-0000", "librispeech-1272-141231-0002", "librispeech-1272-128104-0004-8k"],
    "austen": ["librivox-sense-and-sensibility-01-0870", "librivox-sense-and-sensibility-01-0880",
               "librivox-sense-and-sensibility-01-0890", "librivox-sense-and-sensibility-01-0920"],
}
"""Four people's real recordings (LJSpeech, LibriSpeech 1089 and 1272, LibriVox's Sense and Sensibility reader)."""
TURNS = [("lj", 0), ("s1089", 0), ("s1272", 0), ("lj", 1), ("austen", 0), ("s1089", 1), ("s1272", 1),
         ("austen", 1), ("lj", 2), ("s1089", 2)]
PAUSE_S = 0.8


@dataclass(frozen=True)
class Conversation:
    path: Path
    turns: list[tuple[float, float, str]]
    """(start, end, voice) of each turn: the reference, known by construction."""


def build_conversation(path: Path) -> Conversation:
    """The four voices taking turns (`TURNS`) with pauses, written to `path` (16-bit)."""
    pieces, turns, t = [], [], 0.0
    for who, i in TURNS:
        audio = decode_file(DATA / f"{VOICES[who][i]}.flac")
        pieces += [audio, np.zeros(round(PAUSE_S * SAMPLE_RATE), np.float32)]
        turns.append((t, t + audio.size / SAMPLE_RATE, who))
        t += audio.size / SAMPLE_RATE + PAUSE_S
    sf.write(str(path), np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    return Conversation(path, turns)
