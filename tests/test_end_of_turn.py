"""End of turn (realtime/live/end_of_turn.py) on real speech: the model tells a finished sentence from a pause inside
one, and a segmenter that holds its pauses for it closes where it is told to, or at the eagerness's longest wait."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.audio import SAMPLE_RATE, decode_file
from realtime.config import Settings, TurnConfig, VADConfig, from_namespace, parse_settings
from realtime.live.end_of_turn import TurnModel, available, drawn_out
from realtime.live.vad import SegmentEnd, Segmenter, SegmentStart

from real_speech import DATA

pytestmark = [pytest.mark.fast, pytest.mark.skipif(not available(), reason="needs pipecat-ai's Smart Turn weights")]

JFK_MID = 4.45
"""Just after "And so my fellow Americans, ask not" in jfk.flac: a pause inside its sentence."""


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), np.float32)


def test_the_model_hears_a_finished_sentence_and_an_unfinished_one():
    model = TurnModel.shared()
    jfk = decode_file(DATA / "jfk.flac")
    timit = decode_file(DATA / "timit-LDC93S1.flac")
    unfinished = np.concatenate([jfk[: int(JFK_MID * SAMPLE_RATE)], silence(0.16)])
    finished = np.concatenate([timit, silence(0.16)])
    assert model.complete(finished) > 0.5 > model.complete(unfinished)
    assert model.complete(jfk) > 0.5  # "...ask what you can do for your country."
    # judged 64 ms early (`LEAD_S`): the pause so far, its own sound drawn out to 160 ms, gives the same verdicts
    early = drawn_out(jfk[: int((JFK_MID + 0.096) * SAMPLE_RATE)], 0.096, 0.16)
    assert abs(early.size - (JFK_MID + 0.16) * SAMPLE_RATE) <= 1
    assert model.complete(drawn_out(timit, 0.0, 0.16)) > 0.5 > model.complete(early)


def events_of(seg: Segmenter, audio: np.ndarray) -> list[SegmentStart | SegmentEnd]:
    out = []
    for i in range(0, audio.size, 320):
        out += seg.feed(audio[i:i + 320])
    return out


def test_a_held_pause_closes_when_the_turn_ends_or_at_the_longest_wait():
    """A sentence with a 3 s pause in its middle: silence timing cuts it there; a segmenter that holds pauses up to
    4 s keeps one segment through it; one that holds them up to 2 s closes at 2 s; and `end_turn` closes at once, at
    the pause's start."""
    jfk = decode_file(DATA / "jfk.flac")
    cut = int(JFK_MID * SAMPLE_RATE)
    paused = np.concatenate([jfk[:cut], silence(2.0), jfk[cut:], silence(0.5)])  # a 3 s pause in all

    plain = Segmenter(VADConfig())
    ends = [e for e in events_of(plain, paused) if isinstance(e, SegmentEnd)]
    assert any(abs(e.end - JFK_MID) < 0.4 for e in ends), [e.end for e in ends]

    held = Segmenter(VADConfig())
    held.hold_s = 4.0
    assert not any(abs(e.end - JFK_MID) < 0.4 for e in events_of(held, paused) if isinstance(e, SegmentEnd))

    short = Segmenter(VADConfig())
    short.hold_s = 2.0
    first = next(e for e in events_of(short, paused) if isinstance(e, SegmentEnd))
    assert abs(first.end - JFK_MID) < 0.4 and first.audio_start + first.audio.size / SAMPLE_RATE < JFK_MID + 0.5

    told = Segmenter(VADConfig())
    told.hold_s = 4.0
    events_of(told, paused[: cut + int(0.3 * SAMPLE_RATE)])
    assert told.pause is not None and told.pause_s > 0.1
    closed = told.end_turn()
    assert [type(e) for e in closed] == [SegmentEnd]
    assert abs(closed[0].end - JFK_MID) < 0.4 and told.pause is None and not told.active


def test_end_of_turn_settings():
    assert parse_settings([]).turn_config() is None
    assert parse_settings(["--end-of-turn", "high"]).turn_config() == TurnConfig("high")
    assert TurnConfig("low").max_wait_s == 8.0 and TurnConfig().max_wait_s == 4.0
    with pytest.raises(ValueError, match="end-of-turn"):
        from_namespace(parse_args_of(["--end-of-turn", "sometimes"]))
    with pytest.raises(ValueError):
        TurnConfig("eventually")  # type: ignore[arg-type]
    assert Settings().end_of_turn == "silence"


def parse_args_of(argv: list[str]):
    import argparse

    from realtime.config import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_a_vocabulary_is_read_from_a_string_or_a_list_and_goes_before_the_prompt():
    """Issue 41's vocabulary (realtime/engines/types.py): what every engine reads before the audio."""
    from realtime.config import MAX_TERMS, vocabulary_of
    from realtime.engines.types import TranscribeOptions

    assert vocabulary_of(" Abigail  Claflin, Abbie,,Abbie ") == ("Abigail Claflin", "Abbie")
    assert vocabulary_of(["Linnell", "Birket Foster, Carker"]) == ("Linnell", "Birket Foster", "Carker")
    assert vocabulary_of(None) == vocabulary_of("") == ()
    with pytest.raises(ValueError, match="at most"):
        vocabulary_of([f"t{i}" for i in range(MAX_TERMS + 1)])
    with pytest.raises(ValueError):
        vocabulary_of("x" * 61)
    both = TranscribeOptions(prompt=" Earlier, she said. ", vocabulary=("Claflin", "Abbie"))
    assert both.whisper_prompt == "Claflin, Abbie. Earlier, she said."
    assert TranscribeOptions(vocabulary=("Claflin",)).whisper_prompt == "Claflin."
    assert TranscribeOptions(vocabulary=("Acme Inc.",)).terms == "Acme Inc."
    assert TranscribeOptions(prompt="x").whisper_prompt == "x" and TranscribeOptions().whisper_prompt is None
    assert parse_settings(["--vocabulary", "Claflin, Abbie"]).vocabulary_terms == ("Claflin", "Abbie")


def test_a_pause_judged_ahead_gets_the_verdict_it_gets_when_it_lasts(tmp_path):
    """The session asks the model `LEAD_S` before a pause lasts the turn's 160 ms, on the pause's sound drawn out to
    160 ms: on the real pauses of `bench turns`' speech (tests/data's clips with a pause stretched inside each, as
    the live VAD hears them), that verdict is the one the pause gets once it lasts 160 ms."""
    from realtime.bench.turns import paused_sentences
    from realtime.live.end_of_turn import LEAD_S
    from realtime.live.vad import WINDOW

    audio, _, _ = paused_sentences(DATA / "manifest.tsv", 90.0, tmp_path)
    model, after = TurnModel.shared(), TurnConfig().judge_after_ms / 1000
    seg = Segmenter()
    seg.hold_s = 2.0
    ahead: dict[tuple[int, float], float | None] = {}
    pairs = []
    for i in range(0, audio.size, WINDOW):
        seg.feed(audio[i:i + WINDOW])
        pause = seg.pause
        if pause is None:
            continue
        if pause not in ahead and seg.pause_s >= after - LEAD_S:
            ahead[pause] = model.complete(drawn_out(seg.audio_so_far(), seg.pause_s, after))
        if ahead.get(pause) is not None and seg.pause_s >= after:
            pairs.append((ahead[pause] >= 0.5, model.complete(seg.audio_so_far()) >= 0.5))
            ahead[pause] = None
    agree = sum(a == b for a, b in pairs)
    print(f"\nverdicts ahead agree on {agree} of {len(pairs)} pauses")
    assert len(pairs) >= 30 and agree >= 0.95 * len(pairs)
