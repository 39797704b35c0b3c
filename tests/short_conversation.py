"""A shorter conversation of the same four real voices (tests/real_speech.py `VOICES`), for the checks whose point
is a format's layout or a command's wiring rather than telling four voices apart over ten turns (that is
`build_conversation`'s).

Six turns with pauses, about half a minute: every voice speaks, two of them twice, and none of the clips is one of
test_speakers' `REFERENCE_CLIP` (the named voices' reference clips).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

from realtime.audio import SAMPLE_RATE, decode_file

from real_speech import DATA, PAUSE_S, VOICES, Conversation

SHORT_TURNS = [("lj", 1), ("s1089", 1), ("austen", 2), ("s1272", 0), ("lj", 2), ("s1089", 2)]
"""(voice, clip) of each turn: LJSpeech, LibriSpeech 1089, LibriVox's Sense and Sensibility reader, LibriSpeech
1272, then the first two again."""


def build_turns(path: Path, turns: list[tuple[str, int]]) -> Conversation:
    """`turns` ((voice, clip index) of `VOICES`) one after another with `PAUSE_S` pauses, written to `path`
    (16-bit), with each turn's (start, end, voice)."""
    pieces, spans, t = [], [], 0.0
    for who, i in turns:
        audio = decode_file(DATA / f"{VOICES[who][i]}.flac")
        pieces += [audio, np.zeros(round(PAUSE_S * SAMPLE_RATE), np.float32)]
        spans.append((t, t + audio.size / SAMPLE_RATE, who))
        t += audio.size / SAMPLE_RATE + PAUSE_S
    sf.write(str(path), np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    return Conversation(path, spans)


def short_conversation(path: Path) -> Conversation:
    """`SHORT_TURNS` written to `path`."""
    return build_turns(path, SHORT_TURNS)


CHANGE_GAP_S = 0.15
"""The pause between two voices that one VAD segment holds (far under the VAD's minimum silence)."""
CHANGE = (("lj", 3), ("s1089", 3))
"""The two turns said one after the other within one segment: LJ001-0004 ("...the true printed book,") then
1089-134691-0001 ("For a full hour he had paced up and down, waiting..."), each voice heard alone before."""


def trimmed(audio: np.ndarray) -> np.ndarray:
    """A clip without the quiet before and after its speech."""
    loud = np.flatnonzero(np.abs(audio) > 0.05 * np.abs(audio).max())
    return audio[loud[0]:loud[-1] + 1]


def conversation_with_a_change(path: Path) -> Conversation:
    """`SHORT_TURNS`, then the two turns of `CHANGE` with `CHANGE_GAP_S` between them: a segment in which the
    speaker changes. Its spans are the turns' (the last two those of `CHANGE`)."""
    talk = short_conversation(path)
    audio, _ = sf.read(str(path), dtype="float32")
    first, second = (trimmed(decode_file(DATA / f"{VOICES[who][i]}.flac")) for who, i in CHANGE)
    t = audio.size / SAMPLE_RATE
    gap = np.zeros(round(CHANGE_GAP_S * SAMPLE_RATE), np.float32)
    tail = np.zeros(round(PAUSE_S * SAMPLE_RATE), np.float32)
    sf.write(str(path), np.concatenate([audio, first, gap, second, tail]), SAMPLE_RATE, subtype="PCM_16")
    spans = [(t, t + first.size / SAMPLE_RATE, CHANGE[0][0]),
             (t + (first.size + gap.size) / SAMPLE_RATE, t + (first.size + gap.size + second.size) / SAMPLE_RATE,
              CHANGE[1][0])]
    return Conversation(path, [*talk.turns, *spans])
