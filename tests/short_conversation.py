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
