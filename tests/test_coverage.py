"""The coverage rule (realtime/live/coverage.py and the file path's use of it): which segments of a decoded window its
text covers, and what takes the place of those it does not. Pure logic and a deterministic engine (fast)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest

from realtime.audio import SAMPLE_RATE
from realtime.engines import EngineBase, TimedText, TranscribeOptions, Transcription
from realtime.engines.types import Word
from realtime.live import coverage
from realtime.live.transcribe import Window, _account
from realtime.live.worker import Worker

pytestmark = pytest.mark.fast


def words(*spans: tuple[float, float, str]) -> tuple[Word, ...]:
    return tuple(Word(a, b, f" {w}") for a, b, w in spans)


def test_a_segment_with_words_over_its_speech_is_covered():
    speech = [(0.2, 3.0), (3.4, 6.0), (6.4, 7.0)]
    said = [(0.3, 0.6), (0.7, 1.2), (1.5, 2.9), (3.5, 4.4), (4.6, 5.9), (6.5, 6.9)]
    assert coverage.uncovered(speech, said) == []


def test_a_skipped_middle_segment_and_an_early_end_are_uncovered():
    speech = [(0.2, 3.0), (3.4, 6.0), (6.4, 9.0)]
    said = [(0.3, 1.2), (1.5, 2.9), (6.5, 8.9)]  # the second sentence skipped
    assert coverage.uncovered(speech, said) == [1]
    assert coverage.uncovered(speech, [(0.3, 2.9)]) == [1, 2], "the decode ended after the first sentence"


def test_a_long_segment_whose_text_stops_halfway_is_uncovered():
    assert coverage.uncovered([(0.0, 12.0)], [(0.1, 5.0)]) == [0]
    assert coverage.uncovered([(0.0, 12.0)], [(0.1, 5.0), (5.2, 11.0)]) == [], "short pauses between words are fine"


def test_short_segments_need_a_word_but_clicks_need_none():
    assert coverage.uncovered([(1.0, 1.6)], []) == [0]
    assert coverage.uncovered([(1.0, 1.6)], [(1.1, 1.5)]) == []
    assert coverage.uncovered([(1.0, 1.2)], []) == [], "less speech than MIN_SPEECH_S"


def test_longest_gap_counts_the_reach_around_each_word():
    assert coverage.longest_gap((0.0, 10.0), [(2.0, 3.0)], reach=0.5) == pytest.approx(6.5)
    assert coverage.longest_gap((0.0, 10.0), [], reach=0.5) == 10.0
    assert coverage.longest_gap((0.0, 10.0), [(-1.0, 11.0)], reach=0.0) == 0.0


def test_timing_prefers_words_then_pieces_and_knows_when_there_is_none():
    worded = Transcription("ask not", duration=5.0, segments=(TimedText(0.0, 5.0, "ask not",
                                                                        words((0.5, 0.9, "ask"), (1.0, 1.3, "not"))),))
    assert coverage.timing(worded) == [(0.5, 0.9), (1.0, 1.3)]
    pieces = Transcription("a b", duration=9.0, segments=(TimedText(0.0, 2.0, "a"), TimedText(5.0, 9.0, "b")))
    assert coverage.timing(pieces) == [(0.0, 2.0), (5.0, 9.0)]
    assert coverage.timing(Transcription("a b", duration=9.0, segments=(TimedText(0.0, 9.0, "a b"),))) is None
    assert coverage.timing(Transcription("a b", duration=9.0)) is None
    assert coverage.timing(Transcription("", duration=9.0)) == []


class Scripted(EngineBase):
    """Answers each clip from a script keyed by its length in samples: the window's first decode, then each
    segment's own; records what it was asked."""

    name = "scripted"

    def __init__(self, answers: dict[int, Transcription], timestamps: bool = True, words: bool = True) -> None:
        self.answers = answers
        self.timestamps = timestamps
        self.word_timestamps = words
        self.asked: list[tuple[int, TranscribeOptions]] = []

    async def _decode(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        self.asked.append((audio.size, options))
        return self.answers[audio.size]


def window(parts: Sequence[float]) -> Window:
    """A window packing segments of these lengths (seconds), each all speech but 0.2 s of padding at each end."""
    sizes = [round(p * SAMPLE_RATE) for p in parts]
    audio = (0.3 * np.sin(np.arange(sum(sizes)) / 7)).astype(np.float32)
    offsets = np.cumsum([0, *sizes[:-1]]) / SAMPLE_RATE
    stream = offsets * 2  # the file had pauses between them
    return Window(0, float(stream[0] + 0.2), float(stream[-1] + parts[-1] - 0.2), audio, False, 0.0,
                  tuple((float(o), float(t)) for o, t in zip(offsets, stream, strict=True)),
                  speech=tuple((float(o) + 0.2, float(o) + p - 0.2) for o, p in zip(offsets, parts, strict=True)))


def account(engine: Scripted, w: Window, first: Transcription, asked: TranscribeOptions) -> Transcription:
    async def run() -> Transcription | BaseException:
        worker = Worker(engine, batch_size=4)
        worker.start()
        try:
            return await _account(worker, "f", w, first, coverage.check_options(engine, asked), asked)
        finally:
            await worker.stop()

    result = asyncio.run(run())
    assert isinstance(result, Transcription), result
    return result


def test_a_skipped_segment_is_decoded_alone_and_its_text_takes_its_place():
    w = window([3.0, 4.0, 3.0])
    skipped = Transcription("One two. Five six.", duration=10.0, segments=(TimedText(0.0, 10.0, "One two. Five six.", (
        *words((0.3, 1.2, "One"), (1.4, 2.7, "two.")), *words((7.3, 8.2, "Five"), (8.4, 9.7, "six."))),),))
    alone = Transcription("Three four.", duration=4.0, segments=(TimedText(0.2, 3.8, "Three four."),))
    engine = Scripted({w.part_audio(1).size: alone})
    text = TranscribeOptions()
    got = account(engine, w, skipped, text)
    assert got.text == "One two. Three four. Five six." and got.extra["redecoded"] == [1]
    assert [(size, o.timestamps, o.word_timestamps) for size, o in engine.asked] == [(4 * SAMPLE_RATE, False, False)]
    assert got.segments == (TimedText(0.0, 10.0, got.text),), "text formats get no words they did not ask for"


def test_timed_pieces_over_an_uncovered_segment_are_replaced_by_its_own():
    w = window([3.0, 4.0, 3.0])
    first = Transcription("One two. Five six.", duration=10.0,
                          segments=(TimedText(0.1, 2.9, "One two."), TimedText(7.1, 9.9, "Five six.")))
    alone = Transcription("Three four.", duration=4.0, segments=(TimedText(0.3, 3.7, "Three four."),))
    engine = Scripted({w.part_audio(1).size: alone}, words=False)
    got = account(engine, w, first, TranscribeOptions(timestamps=True))
    assert [(p.start, p.end, p.text) for p in got.segments] == [
        (0.1, 2.9, "One two."), (pytest.approx(3.3), pytest.approx(6.7), "Three four."), (7.1, 9.9, "Five six.")]
    assert got.text == "One two. Three four. Five six."


def test_a_lone_segment_whose_text_stops_short_is_decoded_again_with_timestamps():
    w = window([12.0])
    short = Transcription("One two.", duration=12.0, segments=(TimedText(0.0, 12.0, "One two.", words(
        (0.3, 1.2, "One"), (1.4, 2.7, "two."))),))
    whole = Transcription("One two. Three four.", duration=12.0,
                          segments=(TimedText(0.2, 3.0, "One two."), TimedText(6.0, 11.8, "Three four.")))
    engine = Scripted({w.part_audio(0).size: whole})
    got = account(engine, w, short, TranscribeOptions())
    assert got.text == "One two. Three four." and [o.timestamps for _, o in engine.asked] == [True]


def test_an_answer_without_times_has_each_packed_segment_decoded_alone():
    w = window([3.0, 4.0])
    bare = Transcription("One two.", duration=7.0)
    engine = Scripted({w.part_audio(0).size: Transcription("One two.", duration=3.0),
                       w.part_audio(1).size: Transcription("Three four.", duration=4.0)}, words=False)
    got = account(engine, w, bare, TranscribeOptions())
    assert got.text == "One two. Three four." and len(engine.asked) == 2


def test_a_covered_window_is_not_decoded_again():
    w = window([3.0, 4.0])
    said = Transcription("One two. Three four.", duration=7.0, segments=(TimedText(0.0, 7.0, "x", words(
        (0.3, 1.2, "One"), (1.4, 2.7, "two."), (3.3, 4.5, "Three"), (4.7, 6.7, "four."))),))
    said = replace(said, segments=(replace(said.segments[0], text=said.text),))
    engine = Scripted({})
    got = account(engine, w, said, TranscribeOptions())
    assert got.text == said.text and not engine.asked and "redecoded" not in got.extra
