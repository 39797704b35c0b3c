"""Synthesized speech with known text and boundaries (espeak-ng + sox), and WER, for tests and benchmarks.

Needs the system tools espeak-ng and sox, and the packages jiwer and whisper-normalizer for `wer`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

SENTENCES = [
    "The weather today is sunny with a light breeze from the west.",
    "We will meet at the library tomorrow morning at ten o'clock.",
    "She opened the window and let the fresh air into the room.",
    "The train to the city leaves every hour from the main station.",
    "He likes to read the newspaper while drinking his morning coffee.",
    "The children played in the garden until the sun went down.",
    "Could you send me the report by the end of the day?",
    "Please call Stella and ask her to bring these things with her from the store.",
]
RATE = 16000


@dataclass
class Speech:
    path: Path
    texts: list[str]
    spans: list[tuple[float, float]]
    """(start, end) of each sentence's speech in the file, seconds."""

    @property
    def text(self) -> str:
        return " ".join(self.texts)

    @property
    def duration(self) -> float:
        return sf.info(str(self.path)).duration


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


def sentence_audio(text: str, cache: Path, voice: str = "en-us", speed: int = 150) -> np.ndarray:
    """One sentence, 16 kHz mono float32, leading and trailing silence trimmed."""
    if shutil.which("espeak-ng") is None or shutil.which("sox") is None:
        raise RuntimeError("espeak-ng and sox are required (apt-get install espeak-ng sox)")
    key = hashlib.sha1(f"{voice}|{speed}|{text}".encode()).hexdigest()[:16]
    out = cache / f"s-{key}.wav"
    if not out.exists():
        raw = cache / f"raw-{key}.wav"
        _run("espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text)
        _run("sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out),
             "silence", "1", "0.02", "0.5%", "reverse", "silence", "1", "0.02", "0.5%", "reverse")
        raw.unlink()
    audio, rate = sf.read(str(out), dtype="float32")
    assert rate == RATE
    return audio


def compose(
    path: Path,
    texts: list[str],
    gaps: list[float] | float = 1.0,
    lead: float = 0.5,
    tail: float = 1.0,
    voices: list[str] | None = None,
    noise: float = 0.0,
) -> Speech:
    """Sentences separated by silences of known length, written as a 16 kHz WAV."""
    cache = path.parent / ".speech-cache"
    cache.mkdir(exist_ok=True)
    gap_list = gaps if isinstance(gaps, list) else [gaps] * max(0, len(texts) - 1)
    parts = [np.zeros(int(lead * RATE), dtype=np.float32)]
    spans = []
    t = lead
    for i, text in enumerate(texts):
        voice = voices[i % len(voices)] if voices else "en-us"
        a = sentence_audio(text, cache, voice=voice)
        spans.append((t, t + a.size / RATE))
        parts.append(a)
        t += a.size / RATE
        if i < len(texts) - 1:
            parts.append(np.zeros(int(gap_list[i] * RATE), dtype=np.float32))
            t += gap_list[i]
    parts.append(np.zeros(int(tail * RATE), dtype=np.float32))
    audio = np.concatenate(parts)
    if noise:
        audio = audio + np.random.default_rng(0).normal(0, noise, audio.size).astype(np.float32)
    sf.write(str(path), audio, RATE, subtype="PCM_16")
    return Speech(path, list(texts), spans)


def wer(reference: str, hypothesis: str) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    ref, hyp = norm(reference), norm(hypothesis)
    if not ref.strip():
        return 0.0 if not hyp.strip() else 1.0
    return float(jiwer.wer(ref, hyp))
