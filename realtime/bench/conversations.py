"""Constructed conversations: two or three real people's recordings taking turns, with a speaker reference.

A manifest's clips of one known speaker are that person's voice (`voices`). `random_conversation` draws from a
seed two or three voices, cuts their clips into phrases at the pauses inside them (`phrases`), and lets the voices
take turns of one to three phrases each, with the gaps of a conversation between turns (`GAPS_S`), now and then a
turn that starts before the last one ends (`OVERLAP_S`), and a level per voice. The reference (an RTTM) is each
phrase's speech where it was placed, known by construction. The audio is real speech, mixed (summed where turns
overlap) and level-changed; nothing is synthesized.
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from .corpus import LEVEL_DB, Clip

FRAME_S = 0.02
QUIET_SHARE = 0.35
"""A frame is speech when its level (RMS, dB) is above the clip's quiet frames' (5th percentile) by more than this
share of the way to its loud frames' (95th percentile), and at least `LEAST_RISE_DB` above."""
LEAST_RISE_DB = 6.0
PHRASE_PAUSE_S = 0.35
"""A pause at least this long inside a clip ends a phrase; shorter ones are part of the phrase's speech."""
SHORTEST_PHRASE_S = 0.3
LEAST_SPEECH_S = 10.0
"""A speaker with less speech than this in the manifest is not a voice of the conversations."""
GAPS_S = (0.15, 1.2)
"""The gap between two turns is drawn from this range..."""
OVERLAP_CHANCE = 0.15
OVERLAP_S = (0.2, 0.8)
"""...except that a turn starts this much before the last one ends with `OVERLAP_CHANCE` (never more than half of
either turn)."""
VOICE_SPREAD_DB = 3.0
"""Each voice is brought to `LEVEL_DB` plus or minus up to this much, the same for all its turns."""


@dataclass(frozen=True)
class Phrase:
    clip: Clip
    audio: np.ndarray
    speech: list[tuple[float, float]]
    """The phrase's speech, in seconds into `audio`."""


@dataclass(frozen=True)
class Conversation:
    path: Path
    reference: list[tuple[float, float, str]]
    """(start, end, speaker) of the speech, the RTTM's segments."""
    voices: tuple[str, ...]
    seed: int

    def rttm(self) -> str:
        return "".join(f"SPEAKER {self.path.stem} 1 {a:.3f} {b - a:.3f} <NA> <NA> {who} <NA> <NA>\n"
                       for a, b, who in self.reference)


def voices(clips: list[Clip], least_s: float = LEAST_SPEECH_S) -> dict[str, list[Clip]]:
    """The manifest's speakers with `least_s` of speech or more, each with its clips (one speaker each, not
    telephone-band)."""
    by: dict[str, list[Clip]] = defaultdict(list)
    for clip in clips:
        if clip.speaker not in ("", "-") and "," not in clip.speaker and clip.condition != "telephone":
            by[clip.speaker].append(clip)
    return {who: cs for who, cs in sorted(by.items()) if sum(c.duration for c in cs) >= least_s}


def speech_runs(audio: np.ndarray, pause_s: float = PHRASE_PAUSE_S) -> list[tuple[float, float]]:
    """The stretches of a clip's speech by level (`QUIET_SHARE`), joined across pauses under `pause_s`
    and without blips under `SHORTEST_PHRASE_S`, in seconds."""
    hop = round(FRAME_S * SAMPLE_RATE)
    frames = audio[:audio.size // hop * hop].reshape(-1, hop)
    db = 10 * np.log10(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12)
    quiet, loudest = np.percentile(db, 5), np.percentile(db, 95)
    loud = db > quiet + max(QUIET_SHARE * (loudest - quiet), LEAST_RISE_DB)
    runs: list[list[float]] = []
    for i in np.flatnonzero(loud):
        t = float(i * FRAME_S)
        if runs and t - runs[-1][1] < pause_s:
            runs[-1][1] = t + FRAME_S
        else:
            runs.append([t, t + FRAME_S])
    return [(a, b) for a, b in runs if b - a >= SHORTEST_PHRASE_S]


def phrases(clip: Clip, audio: np.ndarray) -> list[Phrase]:
    """A clip (its `audio`) cut into its phrases at the middle of each pause between them, each with its speech."""
    runs = speech_runs(audio)
    cuts = [0.0] + [(b + a2) / 2 for (_, b), (a2, _) in itertools.pairwise(runs)] + [audio.size / SAMPLE_RATE]
    return [Phrase(clip, audio[round(lo * SAMPLE_RATE):round(hi * SAMPLE_RATE)], [(a - lo, b - lo)])
            for lo, hi, (a, b) in zip(cuts[:-1], cuts[1:], runs, strict=True)]


def _level(audios: list[np.ndarray]) -> float:
    audio = np.concatenate(audios)
    return max(float(np.sqrt(np.mean(audio ** 2))), 1e-5)


def random_conversation(by_voice: dict[str, list[Clip]], path: Path, seed: int, people: tuple[int, int] = (2, 3),
                        length_s: tuple[float, float] = (40.0, 60.0)) -> Conversation:
    """A conversation drawn from `seed`: `people` voices (a number drawn from that range) of `by_voice` taking turns
    of one to three phrases of their clips (each voice's clips in a random order, a clip's phrases in order) until
    the speech drawn reaches a length drawn from `length_s` or a voice runs out, with `GAPS_S` between turns or an
    overlap (`OVERLAP_CHANCE`, `OVERLAP_S`), written to `path` (16 kHz mono, 16-bit) with its reference."""
    import soundfile as sf

    rng = random.Random(seed)
    who = rng.sample(sorted(by_voice), rng.randint(*people))
    audio = {c.path: decode_file(c.path) for w in who for c in by_voice[w]}
    queues = {w: [p for c in rng.sample(by_voice[w], len(by_voice[w])) for p in phrases(c, audio[c.path])]
              for w in who}
    gains = {w: 10 ** ((LEVEL_DB + rng.uniform(-VOICE_SPREAD_DB, VOICE_SPREAD_DB)) / 20)
             / _level([audio[c.path] for c in by_voice[w]]) for w in who}
    target = rng.uniform(*length_s)
    placed: list[tuple[float, str, Phrase]] = []
    t, last, spoken, order = rng.uniform(0.3, 1.0), None, 0.0, list(who)
    while spoken < target:
        speaker = order[len(placed) % len(order)] if len(placed) < len(order) else \
            rng.choice([w for w in who if w != last])
        if not queues[speaker]:
            break
        turn = [queues[speaker].pop(0) for _ in range(min(rng.randint(1, 3), len(queues[speaker])))]
        length = sum(p.audio.size for p in turn) / SAMPLE_RATE
        if placed:
            previous, first = placed[-1][2], turn[0].speech[0]
            prev_end = placed[-1][0] + previous.speech[-1][1]
            if rng.random() < OVERLAP_CHANCE:
                most = 0.5 * min(previous.speech[-1][1] - previous.speech[0][0], first[1] - first[0])
                t = prev_end - min(rng.uniform(*OVERLAP_S), most) - first[0]
            else:
                t = prev_end + rng.uniform(*GAPS_S) - first[0]
        for phrase in turn:
            placed.append((t, speaker, phrase))
            t += phrase.audio.size / SAMPLE_RATE
        spoken += length
        last = speaker
    end = max(start + p.audio.size / SAMPLE_RATE for start, _, p in placed) + rng.uniform(0.5, 1.5)
    mix = np.zeros(round(end * SAMPLE_RATE), np.float64)
    reference = []
    for start, speaker, phrase in placed:
        i = round(start * SAMPLE_RATE)
        mix[i:i + phrase.audio.size] += phrase.audio * gains[speaker]
        reference += [(round(start + a, 3), round(start + b, 3), speaker) for a, b in phrase.speech]
    peak = float(np.abs(mix).max())
    if peak > 0.99:
        mix *= 0.99 / peak
    sf.write(str(path), mix.astype(np.float32), SAMPLE_RATE, subtype="PCM_16")
    talk = Conversation(path, sorted(reference), tuple(who), seed)
    path.with_suffix(".rttm").write_text(talk.rttm())
    return talk
