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
# more everyday sentences for long benchmark recordings (SENTENCES first)
MORE_SENTENCES = [
    "I usually take the bus to work when it rains in the morning.",
    "The restaurant on the corner serves the best soup in town.",
    "Remember to water the plants before you leave for the weekend.",
    "The meeting has been moved to Thursday afternoon at three.",
    "My grandmother grew up in a small village near the mountains.",
    "We need to buy milk, bread and eggs on the way home.",
    "The museum is closed on Mondays but open late on Fridays.",
    "He spent the whole summer learning how to play the guitar.",
    "The new phone has a better camera and a longer battery life.",
    "Please turn off the lights when you leave the office tonight.",
    "They walked along the beach and watched the boats come in.",
    "The doctor said I should drink more water and sleep longer.",
    "Our neighbours are planning a big party for the holidays.",
    "The price of the tickets went up again this year.",
    "She writes a short story every evening before going to bed.",
    "The bridge was closed for repairs for most of the winter.",
    "I forgot my umbrella at the office yesterday afternoon.",
    "The students asked the teacher to explain the problem again.",
    "We watched an old movie and ate popcorn on the sofa.",
    "The farmer sells fresh vegetables at the market every Saturday.",
    "It took us two hours to find a parking space downtown.",
    "The company hired three new engineers this month.",
    "Let me know if you need any help with the move next week.",
    "The library has a quiet room where you can study all day.",
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
    key = hashlib.sha1(f"{voice}|{speed}|{text}|undithered".encode()).hexdigest()[:16]
    out = cache / f"s-{key}.wav"
    if not out.exists():
        raw = cache / f"raw-{key}.wav"
        _run("espeak-ng", "-v", voice, "-s", str(speed), "-w", str(raw), text)
        # -D: sox dithers on the way to 16 bits, with a new random seed each run, and a greedy
        # decode of one sentence can turn on that noise
        _run("sox", "-D", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", str(out),
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


def long_recording(path: Path, minutes: float = 10.0, voices: tuple[str, ...] = ("en-us", "en-gb", "en-us+m3"),
                   seed: int = 0) -> Speech:
    """A multi-voice recording of at least `minutes` with random pauses and known text."""
    rng = np.random.default_rng(seed)
    pool = SENTENCES + MORE_SENTENCES
    texts, per_voice, gaps = [], [], []
    total, i = 0.0, 0
    cache = path.parent / ".speech-cache"
    cache.mkdir(exist_ok=True)
    while total < minutes * 60:
        text, voice = pool[i % len(pool)], voices[(i // len(pool) + i) % len(voices)]
        texts.append(text)
        per_voice.append(voice)
        gap = float(rng.uniform(0.4, 1.6))
        gaps.append(gap)
        total += sentence_audio(text, cache, voice=voice).size / RATE + gap
        i += 1
    return compose(path, texts, gaps=gaps[:-1], voices=per_voice)


def cer(reference: str, hypothesis: str) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    return float(jiwer.cer(norm(reference), norm(hypothesis)))


def wer(reference: str, hypothesis: str) -> float:
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    norm = EnglishTextNormalizer()
    ref, hyp = norm(reference), norm(hypothesis)
    if not ref.strip():
        return 0.0 if not hyp.strip() else 1.0
    return float(jiwer.wer(ref, hyp))
