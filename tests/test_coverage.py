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
from realtime.live.transcribe import Window, _account, decode_options
from realtime.live.worker import Worker

pytestmark = pytest.mark.fast


def words(*spans: tuple[float, float, str]) -> tuple[Word, ...]:
    return tuple(Word(a, b, f" {w}") for a, b, w in spans)


def test_a_segment_with_words_over_its_speech_is_covered():
    speech = [(0.2, 3.0), (3.4, 6.0), (6.4, 7.0)]
    said = [(0.3, 0.6), (0.7, 1.2), (1.5, 2.9), (3.5, 4.0), (4.1, 4.4), (4.6, 5.9), (6.5, 6.9)]
    assert coverage.uncovered(speech, said) == []


def test_a_skipped_sentence_under_stretched_words_is_uncovered():
    """The decode skipped the second sentence and the aligner spread the next one's first two words over it (what
    random compilations showed: 2 words over 6.6 s of speech): no gap, but too few words for that much speech."""
    speech = [(0.2, 3.0), (3.4, 10.0), (10.4, 13.0)]
    said = [(0.3, 0.6), (0.7, 1.2), (1.5, 2.9), (3.3, 6.5), (6.5, 10.1), (10.5, 11.0), (11.1, 12.0), (12.1, 12.9)]
    assert coverage.longest_gap(speech[1], said) == 0.0
    assert coverage.uncovered(speech, said) == [1]
    slow = [(3.5 + 0.8 * k, 4.0 + 0.8 * k) for k in range(8)]  # a slow speaker's 8 words in 6.6 s
    assert coverage.uncovered(speech[1:2], slow) == []
    assert coverage.uncovered([(0.0, 0.9)], [(0.0, 0.9)]) == [], "a word may fill a short segment"


def test_a_skipped_middle_segment_and_an_early_end_are_uncovered():
    speech = [(0.2, 3.0), (3.4, 6.0), (6.4, 9.0)]
    said = [(0.3, 1.2), (1.3, 2.0), (2.1, 2.9), (6.5, 7.2), (7.3, 8.1), (8.2, 8.9)]  # the second sentence skipped
    assert coverage.uncovered(speech, said) == [1]
    assert coverage.uncovered(speech, said[:3]) == [1, 2], "the decode ended after the first sentence"


def test_the_neighbours_of_an_uncovered_segment_with_words_over_it_are_suspect():
    """A decode that skipped a short sentence and the first words of the next one ("For a full hour he had paced":
    "He had" aligned over the skipped sentence, "paced" over the skipped words): the next segment goes back too."""
    speech = [(0.0, 2.0), (2.2, 4.7), (5.1, 7.8), (8.2, 9.7)]
    said = [(0.1, 0.6), (0.7, 1.9), (4.6, 5.1), (5.1, 5.1), (5.1, 6.7), (6.7, 6.9), (6.9, 7.1), (7.1, 7.7),
            (8.3, 8.9), (8.9, 9.6)]
    missing = coverage.uncovered(speech, said)
    assert missing == [1]
    assert coverage.suspect(speech, said, missing) == [0, 1, 2]
    assert coverage.suspect(speech, said[:2] + said[4:], [1]) == [1, 2], "no words over it: where the decode landed"
    brief = [(0.5, 0.6), (1.5, 4.0)]  # a falsetto phrase of which the VAD heard a tenth of a second
    assert coverage.uncovered(brief, said[:2]) == [1]
    assert coverage.suspect(brief, said[:2], [1]) == [0, 1] and coverage.suspect(brief, [(0.5, 0.6)], []) == []


def test_the_segment_after_a_skipped_one_is_suspect_where_the_decode_landed():
    """Seed 22623 of `bench file --random` (the text paths): a window's decode skipped "I'm Abigail Claflin" (a segment
    of its own) and "You can call me Abbie", 0.1 s before the next clip and one segment with it; alignment stretched
    that clip's "The invention" over the skipped phrase (a 1.5 s "invention"), so the next segment looked covered and
    only the skipped one went back. A decode that skipped a segment jumped; where it landed is not known, and the
    segment after it goes back with it."""
    speech = [(0.2, 5.67), (6.07, 7.54), (7.94, 12.39), (12.79, 14.23), (14.63, 24.04)]
    said = [(0.0, 0.32), (0.32, 0.54), (0.54, 0.8), (0.8, 1.2), (1.2, 1.38), (1.38, 1.9), (1.9, 2.34), (2.56, 2.66),
            (2.66, 2.9), (2.9, 3.12), (3.12, 3.32), (3.32, 3.7), (3.7, 4.0), (4.0, 4.28), (4.28, 4.72), (4.72, 5.04),
            (5.04, 5.22), (5.22, 5.7), (6.08, 6.46), (6.46, 6.88), (6.88, 7.14), (7.14, 7.58), (8.02, 8.08),
            (8.08, 8.34), (8.34, 8.9), (8.9, 8.9), (8.9, 9.28), (9.28, 9.64), (9.64, 9.84), (9.84, 10.06),
            (10.46, 10.54), (10.54, 10.68), (10.68, 10.94), (10.94, 11.28), (11.28, 11.5), (11.5, 11.7),
            (11.7, 11.88), (11.88, 12.1), (12.1, 12.36), (14.94, 15.06), (15.06, 16.52), (16.52, 16.86),
            (16.86, 17.28), (17.28, 17.64), (17.64, 18.0), (18.0, 18.34), (18.34, 18.38), (18.38, 18.56),
            (18.56, 18.78), (18.78, 18.96), (18.96, 19.6), (19.6, 19.86), (19.86, 20.5), (20.5, 21.0), (21.0, 21.32),
            (21.32, 21.58), (21.58, 22.26), (22.26, 22.52), (22.52, 22.82), (22.82, 23.12), (23.12, 23.26),
            (23.26, 23.38), (23.38, 23.6), (23.6, 23.9)]
    assert coverage.uncovered(speech, said) == [3]
    assert coverage.unaccounted(speech, said, words=True) == [3, 4]


def test_a_word_across_two_segments_was_stretched_over_speech_the_decode_skipped():
    """Seed 5025 of `bench file --random --served` (the remote engine): a decode skipped the clause "ask what you can
    do for your country" and alignment spread the next sentence's "on" over it, into the next segment's speech;
    the words around it were dense enough for both segments to look covered."""
    speech = [(8.1, 10.4), (10.8, 13.2), (13.6, 15.7)]
    said = [(7.9, 8.6), (8.6, 8.8), (8.8, 11.3), (11.3, 11.5), (11.5, 11.9), (11.9, 12.3), (12.3, 12.4),
            (12.4, 12.7), (12.7, 13.3), (13.8, 13.9), (13.9, 14.2), (14.2, 14.3), (14.3, 14.5), (14.5, 15.1),
            (15.1, 15.7)]
    assert coverage.uncovered(speech, said) == []
    assert coverage.stretched(speech, said) == [0, 1]
    assert coverage.unaccounted(speech, said, words=True) == [0, 1, 2]
    assert coverage.unaccounted(speech, said) == [], "a timed piece's shared-out time may lie across segments"
    brushing = [(0.3, 1.4), (1.4, 2.9), (2.9, 3.4), (3.5, 4.6), (4.6, 5.7)]  # a word's end into the next onset
    assert coverage.stretched([(0.2, 2.8), (3.2, 5.8)], brushing) == []
    whole = [(0.0, 0.5), (0.5, 1.0), (1.0, 23.8), (23.8, 23.8), (23.8, 23.9), (23.9, 25.2)]  # seed 5047: a 23 s "the"
    assert coverage.stretched([(0.2, 2.6), (3.0, 5.3), (19.9, 22.2), (22.6, 24.4)], whole) == [0, 1, 2, 3]


def test_a_brief_segment_with_an_aligned_word_over_its_speech_has_its_text():
    """Seed 8622 of `bench file --random`: the VAD heard a speaker with a cold in a noisy room for a few hundredths
    of a second at a time, each a segment with the recording around it. The window's decode read the phrase, its
    aligned words over those hundredths but their middles beside them; all four brief segments went back, decoded
    alone they read "Yes?" and "this", and "probably sound quite different than" was lost. A word overlapping a brief
    segment's speech is text over it; a timed piece's words shared out evenly say less, and only their middles
    count."""
    speech = [(0.2, 5.5), (6.94, 7.01), (7.68, 7.74), (8.7, 10.0)]
    said = [(0.3, 1.1), (1.1, 1.9), (1.9, 2.7), (2.7, 3.5), (3.5, 4.3), (4.3, 5.4), (6.96, 7.52), (7.52, 7.8),
            (8.8, 9.5), (9.5, 9.9)]
    assert coverage.unaccounted(speech, said, words=True) == []
    assert coverage.unaccounted(speech, said) == [1, 2], "a piece's words: the middles only"
    assert coverage.unaccounted(speech, said, brief=False) == []
    assert coverage.unaccounted(speech, said[:6] + said[8:], words=True) == [1, 2], "no word there: a skip"


def test_words_aligned_after_a_window_start_without_text_are_suspect():
    """Seed 9517 of `bench file --random`: a window of eight segments whose decode read only its first two clips
    ("No, this is a long stop.") and stopped; alignment put those six words over the last segment's 4.4 s, so that
    one looked covered and its sentence ("He began a confused complaint against the wizard ...") was lost while the
    first seven went back. Whisper reads a window from its start: the first segment with words after a start
    without any goes back with them."""
    speech = [(0.2, 0.62), (1.02, 2.14), (2.54, 4.87), (5.27, 6.78), (7.18, 9.64), (10.04, 12.02), (12.42, 19.14),
              (19.54, 23.93)]
    said = [(20.36, 20.92), (21.3, 21.44), (21.44, 22.5), (22.5, 23.6), (23.6, 23.72), (23.72, 23.9)]
    assert coverage.unaccounted(speech, said, words=True) == list(range(8))
    started = [(0.3, 0.6), (1.1, 1.5), (1.5, 2.0), *said]
    assert coverage.unaccounted(speech[:2] + speech[-1:], started, words=True) == [], (
        "text at the start: the last segment's words are its own")


def test_a_decode_that_stopped_inside_the_segment_before_a_skipped_one_makes_it_suspect():
    """Seed 7102 of `bench file --random`: two clips with a pause the VAD did not cut at made one segment; the decode
    read the first ("A thin stripe runs down the middle.") and stopped, skipping the second clip and the next two
    segments. The first segment looked covered by a lone segment's gap (1.6 s, 7 words in 4.5 s), but its last
    second has no text and the segment after it none at all: it goes back with them."""
    speech = [(0.2, 4.7), (5.1, 6.3), (6.7, 12.1)]
    said = [(0.0, 0.5), (0.5, 1.0), (1.0, 1.4), (1.4, 1.9), (1.9, 2.3), (2.3, 2.4), (2.4, 2.7)]
    assert coverage.uncovered(speech, said, coverage.LONE_GAP_S) == [1, 2]
    assert coverage.uncovered(speech, said) == [0, 1, 2]
    assert coverage.unaccounted(speech, said, words=True) == [0, 1, 2]
    spoken = [*said, (2.9, 3.3), (3.4, 3.9), (4.0, 4.6)]  # the second sentence read: its edge has text
    assert coverage.unaccounted(speech, spoken, words=True) == [1, 2]
    assert coverage.bare_edge((6.7, 12.1), [(7.0, 8.0)], at_end=False) is False
    assert coverage.bare_edge((6.7, 12.1), [(8.5, 9.0)], at_end=False) is True
    assert coverage.bare_edge((0.0, 0.9), [], at_end=True) is False, "a short segment is judged by its gaps"


def test_a_short_sentence_skipped_at_the_end_of_a_long_segment_is_uncovered():
    """Seed 7644 of `bench file --random`: "Mend the coat before you go out" (2 s) followed a 13 s sentence 0.17 s
    later, so the VAD made them one segment; the window's decode skipped it, and the long sentence's 32 words left
    1.6 s of the segment's end without text: more than a window's gap, less than a lone segment's."""
    speech = [(1.75, 10.14), (10.54, 23.56), (23.96, 26.55)]
    said = [(1.8 + 0.5 * k, 2.2 + 0.5 * k) for k in range(16)]
    said += [(10.6 + 0.3445 * k, 10.9 + 0.3445 * k) for k in range(32)]
    said += [(24.0 + 0.28 * k, 24.3 + 0.28 * k) for k in range(9)]
    assert coverage.longest_gap(speech[1], said) == pytest.approx(1.58, abs=0.02)
    assert coverage.uncovered(speech, said, coverage.LONE_GAP_S) == []
    assert coverage.unaccounted(speech, said, words=True) == [0, 1, 2], "with its neighbours, as it has words"


def test_a_phrase_skipped_at_a_segments_start_is_uncovered():
    """Seed 8230 of `bench file --random`: "so this is the sick corpus" opened a 6.6 s segment, and the window's
    decode began it at "I have a cold", 1.3 s in; with the reach of the words on either side, 0.8 s showed bare."""
    speech = [(15.46, 18.06), (18.46, 25.02)]
    said = [(15.5 + 0.3 * k, 15.76 + 0.3 * k) for k in range(9)]
    said += [(19.76 + 0.36 * k, 20.0 + 0.36 * k) for k in range(14)]
    assert coverage.longest_gap(speech[1], said) == pytest.approx(0.8, abs=0.02)
    assert coverage.unaccounted(speech, said, words=True) == [0, 1]


def test_a_long_segment_whose_text_stops_halfway_is_uncovered():
    assert coverage.uncovered([(0.0, 12.0)], [(0.1, 5.0)]) == [0]
    spoken = [(0.1 + 0.4 * k, 0.4 + 0.4 * k) for k in range(12)] + [(5.2 + 0.4 * k, 5.5 + 0.4 * k) for k in range(15)]
    assert coverage.uncovered([(0.0, 12.0)], spoken) == [], "short pauses between words are fine"


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
    shared = Transcription("a b c", duration=9.0, segments=(TimedText(0.0, 2.0, "a"), TimedText(5.0, 9.0, "b c")))
    assert coverage.timing(shared) == [(0.0, 2.0), (5.0, 7.0), (7.0, 9.0)], "a piece's time shared by its words"
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



class InTurn(Scripted):
    """Answers each clip with the next of `answers`, whatever its length (a segment decoded twice); records what it
    was asked."""

    def __init__(self, answers: Sequence[Transcription]) -> None:
        super().__init__({})
        self.turns = iter(answers)

    async def _decode(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        self.asked.append((audio.size, options))
        return next(self.turns)

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
            decode = decode_options(engine, asked)
            return await _account(worker, "f", w, first, coverage.check_options(engine, decode), decode, asked)
        finally:
            await worker.stop()

    result = asyncio.run(run())
    assert isinstance(result, Transcription), result
    return result


def test_a_skipped_segment_is_decoded_again_with_the_next_and_their_text_takes_their_place():
    w = window([3.0, 4.0, 3.0])
    said = "One two three. Seven eight nine."
    skipped = Transcription(said, duration=10.0, segments=(TimedText(0.0, 10.0, said, (
        *words((0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three.")),
        *words((7.3, 8.0, "Seven"), (8.1, 8.8, "eight"), (8.9, 9.7, "nine."))),),))
    read = "Four, five and six. Seven eight nine."
    again = Transcription(read, duration=7.0, segments=(TimedText(0.0, 7.0, read, words(
        (0.3, 1.0, "Four,"), (1.1, 1.8, "five"), (1.9, 2.4, "and"), (2.5, 3.6, "six."),
        (4.3, 5.0, "Seven"), (5.1, 5.8, "eight"), (5.9, 6.7, "nine."))),))
    engine = Scripted({w.sub(1, 3).audio.size: again})
    text = TranscribeOptions()
    got = account(engine, w, skipped, text)
    assert got.text == "One two three. Four, five and six. Seven eight nine." and got.extra["redecoded"] == [1, 2]
    assert [(size, o.timestamps, o.word_timestamps) for size, o in engine.asked] == [(7 * SAMPLE_RATE, False, True)], \
        "decoded as the window was, so that its answer is checked in turn"
    assert got.segments == (TimedText(0.0, 10.0, got.text),), "text formats get no words they did not ask for"


def test_formats_with_times_are_decoded_as_text_and_cut_into_pieces_at_sentences_and_pauses():
    """Seed 23018 of `bench file --random` (the timed paths and the remote engines): decoded with Whisper's timestamp
    tokens, the speaker with a cold's "I have a cold, so I probably sound quite different" was read "I have also
    applied something", as many words over the same speech (no gap for the coverage check), where the text formats'
    decode read it right. Where the engine aligns words, formats with times are decoded as the text formats are, and
    their pieces cut from the words: at sentence ends (not after "Mr."), at pauses, at the silence between packed
    segments."""
    w = window([3.0, 4.0, 3.0])
    said = "Mr. Smith came. He sat and then he left for good. Bye! Now go"
    first = Transcription(said, duration=10.0, segments=(TimedText(0.0, 10.0, said, words(
        (0.3, 0.6, "Mr."), (0.7, 1.0, "Smith"), (1.1, 1.6, "came."), (1.8, 2.0, "He"), (2.1, 2.5, "sat"),
        (3.3, 3.6, "and"), (3.7, 4.0, "then"), (4.1, 4.3, "he"), (4.4, 4.8, "left"), (5.8, 6.0, "for"),
        (6.1, 6.7, "good."), (7.3, 7.8, "Bye!"), (8.0, 8.4, "Now"), (8.5, 9.0, "go"))),))
    engine = Scripted({w.audio.size: first})
    asked = TranscribeOptions(timestamps=True)
    decode = decode_options(engine, asked)
    assert (decode.timestamps, decode.word_timestamps) == (False, True)
    got = account(engine, w, first, asked)
    assert [p.text for p in got.segments] == ["Mr. Smith came.", "He sat", "and then he left", "for good.", "Bye!",
                                              "Now go"]
    assert [(p.start, p.end) for p in got.segments] == [(0.3, 1.6), (1.8, 2.5), (3.3, 4.8), (5.8, 6.7), (7.3, 7.8),
                                                        (8.0, 9.0)]
    assert not any(p.words for p in got.segments), "no word times that were not asked for"
    assert engine.asked == [], "nothing decoded again"
    pieces = Scripted({}, words=False)
    assert decode_options(pieces, asked) is asked, "an engine without word times decodes with timestamp tokens"


def test_timed_pieces_over_an_uncovered_segment_are_replaced_by_its_own():
    w = window([3.0, 4.0, 3.0])
    first = Transcription("One two three. Seven eight nine.", duration=10.0,
                          segments=(TimedText(0.1, 2.9, "One two three."), TimedText(7.1, 9.9, "Seven eight nine.")))
    again = Transcription("Four, five and six. Seven eight nine.", duration=7.0, segments=(
        TimedText(0.3, 3.7, "Four, five and six."), TimedText(4.1, 6.9, "Seven eight nine.")))
    engine = Scripted({w.sub(1, 3).audio.size: again}, words=False)
    got = account(engine, w, first, TranscribeOptions(timestamps=True))
    assert [(p.start, p.end, p.text) for p in got.segments] == [
        (0.1, 2.9, "One two three."), (pytest.approx(3.3), pytest.approx(6.7), "Four, five and six."),
        (pytest.approx(7.1), pytest.approx(9.9), "Seven eight nine.")]
    assert got.text == "One two three. Four, five and six. Seven eight nine."


def test_timed_pieces_with_words_are_checked_by_both():
    """Seed 5045 of `bench file --random`: Whisper skipped a window's first sentence and gave the next one the
    skipped one's time, so the timed pieces looked covered; the words aligned on the audio show the first segment
    bare. A segment that either shows uncovered is decoded again."""
    w = window([3.0, 4.0])
    said = "Four five six seven."
    first = Transcription(said, duration=7.0, segments=(TimedText(0.0, 3.0, said, words(
        (3.3, 4.2, " Four"), (4.3, 5.0, " five"), (5.1, 5.8, " six"), (5.9, 6.7, " seven."))),))
    assert coverage.uncovered(w.speech, coverage.piece_timing(first)) == [1], "the pieces alone miss the first"
    assert coverage.uncovered(w.speech, coverage.timing(first)) == [0], "the words alone miss the second"
    engine = Scripted({w.part_audio(0).size: Transcription("One two three.", duration=3.0,
                                                           segments=(TimedText(0.2, 2.8, "One two three."),)),
                       w.part_audio(1).size: Transcription(said, duration=4.0, segments=(TimedText(0.2, 3.8, said),))})
    got = account(engine, w, first, TranscribeOptions(timestamps=True))
    assert got.text == "One two three. Four five six seven." and got.extra["redecoded"] == [0, 1]
    assert all(not p.words for p in got.segments), "timed formats get no words they did not ask for"


def test_a_lone_segment_whose_text_stops_short_is_decoded_again_with_timestamps():
    w = window([12.0])
    short = Transcription("One two.", duration=12.0, segments=(TimedText(0.0, 12.0, "One two.", words(
        (0.3, 1.2, "One"), (1.4, 2.7, "two."))),))
    whole = Transcription("One two. Three four.", duration=12.0,
                          segments=(TimedText(0.2, 3.0, "One two."), TimedText(6.0, 11.8, "Three four.")))
    engine = Scripted({w.part_audio(0).size: whole})
    got = account(engine, w, short, TranscribeOptions())
    assert got.text == "One two. Three four." and [o.timestamps for _, o in engine.asked] == [True]


def paused(seconds: float, pause: tuple[float, float]) -> Window:
    """A window of one segment this long whose audio is silent over `pause` (the gap between two clips the VAD
    joined into one segment)."""
    w = window([seconds])
    audio = w.audio.copy()
    audio[round(pause[0] * SAMPLE_RATE):round(pause[1] * SAMPLE_RATE)] = 0.0
    return replace(w, audio=audio)


def piece(text: str, seconds: float) -> Transcription:
    """An answer as one timed piece over the whole clip (no word times)."""
    return Transcription(text, duration=seconds, segments=(TimedText(0.0, seconds, text),))


def test_a_lone_segment_timed_as_one_sentence_over_two_is_decoded_in_halves():
    """Seed 20077 of `bench file --random` (the vLLM engine: Whisper's timed pieces, no word times): two clips 0.23 s
    apart made one segment, and the decode gave its first sentence ("Feels like these days go on forever.") as one
    piece over the whole 12 s, again when the segment was decoded alone: the 8 s sentence after it was lost. Too few
    words for its speech, it is decoded in halves cut at the quietest moment of its middle, and they stand for it;
    where the halves say no more (a slow speaker), the first answer stands."""
    w = paused(12.0, (4.0, 4.2))
    split = w.halves()
    assert split is not None and split.speech == (pytest.approx((0.2, 4.0)), pytest.approx((4.0, 11.8)))
    first_text, second_text = ("Feels like these days go on forever.",
                               "The invention of movable metal letters in the middle of the fifteenth century.")

    sizes = [split.part_audio(k).size for k in (0, 1)]
    first = piece(first_text, 12.0)
    engine = Scripted({sizes[0]: piece(first_text, sizes[0] / SAMPLE_RATE),
                       sizes[1]: piece(second_text, sizes[1] / SAMPLE_RATE)}, words=False)
    got = account(engine, w, first, TranscribeOptions(timestamps=True))
    assert got.text == f"{first_text} {second_text}", got.text
    assert [p.text for p in got.segments] == [first_text, second_text]
    assert got.segments[1].start == pytest.approx(4.0)
    slow = piece("This is a long stop.", 12.0)
    engine = Scripted({sizes[0]: piece("This is a", sizes[0] / SAMPLE_RATE),
                       sizes[1]: piece("long stop.", sizes[1] / SAMPLE_RATE)}, words=False)
    assert account(engine, w, slow, TranscribeOptions(timestamps=True)).text == "This is a long stop."
    assert len(engine.asked) == 2, "halves that say no more are not cut again"
    assert coverage.sparse((0.2, 11.8), first) and not coverage.sparse((0.2, 11.8), piece(" ".join(["word"] * 12), 12))
    assert not coverage.sparse((0.2, 11.8), piece("", 12.0)), "no text is Whisper's no-speech verdict"


def test_a_lone_segment_of_two_sentences_that_says_one_is_decoded_in_halves():
    """Seed 21208 of `bench file --random` (the vLLM engine): two clips 0.24 s apart made one segment of 4.8 s of
    speech, and vLLM's answer was the first sentence alone as one piece over the whole ("A thin stripe runs down the
    middle.", 7 words: 1.5 a second, more than a slow speaker's `MIN_WORDS_PER_S`): "Mend the coat before you go
    out" was lost. Under `UNTIMED_WORDS_PER_S`, such an answer is decoded in halves, which stand when they keep it
    and say more; a reading as fast as read speech is left alone, with no decode beyond its own."""
    w = paused(5.2, (2.55, 2.79))
    split = w.halves()
    assert split is not None and split.speech[0][1] == pytest.approx(2.55, abs=0.02)
    first_text, second_text = "A thin stripe runs down the middle.", "Mend the coat before you go out."

    sizes = [split.part_audio(k).size for k in (0, 1)]
    halves = {sizes[0]: piece(first_text, sizes[0] / SAMPLE_RATE), sizes[1]: piece(second_text, sizes[1] / SAMPLE_RATE)}
    engine = Scripted(dict(halves), words=False)
    got = account(engine, w, piece(first_text, 5.2), TranscribeOptions(timestamps=True))
    assert got.text == f"{first_text} {second_text}", got.text
    assert got.segments[1].start == pytest.approx(2.55, abs=0.02)
    assert coverage.MIN_WORDS_PER_S < 7 / 4.8 < coverage.UNTIMED_WORDS_PER_S
    both = f"{first_text} {second_text}"
    engine = Scripted(dict(halves), words=False)
    assert account(engine, w, piece(both, 5.2), TranscribeOptions(timestamps=True)).text == both
    assert engine.asked == [], "a reading at the pace of speech is not decoded again"


def test_on_an_engine_without_times_a_short_segment_of_two_phrases_that_says_one_is_decoded_in_halves():
    """Seed 21480 of `bench file --random` (the vLLM engine, which gives no times: a segment is a window of its own):
    "Four of clubs" and "What joy there is in living" 0.11 s apart made one segment of 3.5 s of speech, read "for
    Queen of Clothes." (4 words). Under `SPLIT_S` but over `UNTIMED_SPLIT_S`, it is decoded in halves; where the
    halves say more, each half still too short is cut again; on an engine whose answers are checked by their times,
    the floor stays `SPLIT_S`."""
    w = paused(3.9, (1.9, 2.01))
    split = w.halves()
    assert split is not None and split.speech[0][1] == pytest.approx(1.9, abs=0.02)
    first_text, second_text = "Four, Queen of Clothes.", "What joy there is in living."

    def said(text: str, seconds: float) -> Transcription:
        return Transcription(text, duration=seconds)

    sizes = [split.part_audio(k).size for k in (0, 1)]
    script = {sizes[0]: said(first_text, sizes[0] / SAMPLE_RATE), sizes[1]: said(second_text, sizes[1] / SAMPLE_RATE)}
    untimed = Scripted(dict(script), timestamps=False, words=False)
    assert not coverage.checkable(untimed)
    got = account(untimed, w, said(first_text, 3.9), TranscribeOptions())
    assert got.text == f"{first_text} {second_text}", got.text
    assert coverage.UNTIMED_SPLIT_S < 3.5 < coverage.SPLIT_S
    timed = Scripted(dict(script), words=False)
    assert account(timed, w, said(first_text, 3.9), TranscribeOptions()).text == first_text
    assert timed.asked == []


@pytest.mark.parametrize(("alone", "stands"), [("I really don't know how to talk like this!", True),
                                              ("1 03 or so.", False)])
def test_speech_the_vad_did_not_hear_is_read_alone_too_and_that_reading_stands_where_it_adds_words(alone, stands):
    """Seed 20272 of `bench file --random`: a falsetto phrase of which the VAD heard 0.3 s, packed as the loud audio
    around it right after a string of digits, which the window's decode read as more digits ("1-03"), its words
    over that speech (covered). Decoded alone, it reads the phrase; an alone reading that adds no run of words
    leaves the window's (with its context) as it was."""
    w = window([3.0, 2.5, 4.0])
    w = replace(w, speech=(w.speech[0], (3.2, 3.5), w.speech[2]), unheard=(1,))
    said = "One two three. 1 03 Seven eight nine ten."
    first = Transcription(said, duration=9.5, segments=(TimedText(0.0, 9.5, said, words(
        (0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three."), (3.2, 3.6, "1"), (3.6, 5.3, "03"),
        (5.8, 6.6, "Seven"), (6.7, 7.5, "eight"), (7.6, 8.4, "nine"), (8.5, 9.2, "ten."))),))
    assert coverage.unaccounted(w.speech, coverage.timing(first), words=True) == [], "its speech looks covered"
    engine = Scripted({w.part_audio(1).size: Transcription(alone, duration=2.5,
                                                           segments=(TimedText(0.0, 2.5, alone),))})
    got = account(engine, w, first, TranscribeOptions())
    assert [size for size, _ in engine.asked] == [w.part_audio(1).size]
    if stands:
        assert got.text == f"One two three. {alone} Seven eight nine ten." and got.extra["redecoded"] == [1]
    else:
        assert got.text == said and "redecoded" not in got.extra
    assert coverage.adds(Transcription(alone), ["three.", "1", "03", "Seven"]) is stands


def test_an_answer_without_times_has_each_packed_segment_decoded_alone():
    w = window([3.0, 4.0])
    bare = Transcription("One two.", duration=7.0)
    engine = Scripted({w.part_audio(0).size: Transcription("One two.", duration=3.0),
                       w.part_audio(1).size: Transcription("Three four.", duration=4.0)}, words=False)
    got = account(engine, w, bare, TranscribeOptions())
    assert got.text == "One two. Three four." and len(engine.asked) == 2


def test_a_covered_window_is_not_decoded_again():
    w = window([3.0, 4.0])
    said = Transcription("One two three. Four five six seven.", duration=7.0, segments=(TimedText(0.0, 7.0, "x", words(
        (0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three."), (3.3, 4.2, "Four"), (4.3, 5.0, "five"),
        (5.1, 5.8, "six"), (5.9, 6.7, "seven."))),))
    said = replace(said, segments=(replace(said.segments[0], text=said.text),))
    engine = Scripted({})
    got = account(engine, w, said, TranscribeOptions())
    assert got.text == said.text and not engine.asked and "redecoded" not in got.extra


def test_segments_skipped_together_are_decoded_together_and_checked_again():
    """A decode that ended after the first sentence: the three segments after it go back as one window (their
    sentences keep each other's context), and the last one, which that window's answer skips in turn, is decoded
    alone."""
    w = window([3.0, 3.0, 3.0, 3.0])
    first = Transcription("One two three.", duration=12.0, segments=(TimedText(0.0, 12.0, "One two three.", words(
        (0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three."))),))
    rest = w.sub(1, 4)
    assert rest.audio.size == 9 * SAMPLE_RATE and rest.speech[0] == pytest.approx((0.2, 2.8))
    again = Transcription("Four five six. Seven eight nine.", duration=9.0, segments=(TimedText(
        0.0, 9.0, "Four five six. Seven eight nine.", words(
            (0.3, 1.0, "Four"), (1.1, 1.8, "five"), (1.9, 2.7, "six."),
            (3.3, 4.0, "Seven"), (4.1, 4.8, "eight"), (4.9, 5.7, "nine."))),))
    alone = Transcription("Ten eleven twelve.", duration=3.0, segments=(TimedText(0.2, 2.8, "Ten eleven twelve."),))
    engine = Scripted({9 * SAMPLE_RATE: again, 3 * SAMPLE_RATE: alone})
    got = account(engine, w, first, TranscribeOptions())
    assert got.text == "One two three. Four five six. Seven eight nine. Ten eleven twelve."
    asked = [(size, o.word_timestamps, o.fallback) for size, o in engine.asked]
    assert asked == [(9 * SAMPLE_RATE, True, False), (3 * SAMPLE_RATE, True, True)], \
        "the three segments are a packed window (asked without fallback), the one decoded alone is not"
    assert got.extra["redecoded"] == [1, 2, 3]


def test_a_word_too_long_to_be_said_was_stretched_over_speech_the_decode_skipped():
    """`bench file --random` seed 7313: two clips with a pause the VAD did not cut at were one segment; the window's
    decode skipped the first ("Mend the coat before you go out") and alignment spread the second's "that" over it,
    2.4 s, in one segment, with words dense enough and no gap long enough for it to look covered."""
    speech = [(8.42, 10.66), (11.06, 16.18), (16.58, 16.96)]
    said = [(8.62, 8.78), (8.78, 9.16), (9.16, 9.32), (9.32, 9.46), (9.94, 10.16), (10.16, 10.42), (10.42, 10.9),
            (11.68, 11.68), (11.68, 14.1), (14.1, 14.48), (14.48, 14.88), (15.02, 15.18), (15.18, 15.4),
            (15.4, 15.7), (15.7, 16.2), (16.58, 16.82)]
    assert coverage.uncovered(speech, said) == []
    assert coverage.stretched(speech, said) == [1]
    assert coverage.unaccounted(speech, said, words=True) == [0, 1, 2]
    drawn = [(11.1, 12.6), *said[9:]]  # a word drawn out for 1.5 s is said so
    assert coverage.stretched(speech, drawn) == []


def test_segments_under_a_stretched_word_are_decoded_again():
    """The second segment's first sentence was skipped and its last word stretched back over it: each segment holds
    enough words to look covered, but one word lies across both."""
    w = window([3.0, 3.0])
    said = "One two three seven eight nine."
    first = Transcription(said, duration=6.0, segments=(TimedText(0.0, 6.0, said, words(
        (0.3, 0.9, "One"), (1.0, 1.5, "two"), (1.6, 4.0, "three"), (4.1, 4.6, "seven"), (4.7, 5.2, "eight"),
        (5.3, 5.7, "nine."))),))
    answers = iter(["One two three.", "Four five six seven eight nine."])

    class Alone(Scripted):
        async def _decode(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
            self.asked.append((audio.size, options))
            return Transcription(next(answers), duration=3.0)

    engine = Alone({})
    got = account(engine, w, first, TranscribeOptions())
    assert got.text == "One two three. Four five six seven eight nine." and got.extra["redecoded"] == [0, 1]
    assert [size for size, _ in engine.asked] == [3 * SAMPLE_RATE] * 2


@pytest.mark.parametrize("how", ["rejected", "sampled"])
def test_a_packed_window_whose_greedy_decode_was_rejected_has_each_segment_decoded_alone(how):
    """A packed window is asked without fallback (`window_options`): its rejected greedy decode comes back marked,
    and its segments are decoded alone, with fallback; a sample from an engine that falls back anyway counts alike."""
    w = window([3.0, 4.0])
    assert not coverage.window_options(TranscribeOptions(), 2).fallback
    assert coverage.window_options(TranscribeOptions(), 1).fallback
    said = "One two three. Four five six seven."
    guess = Transcription(said, duration=7.0, segments=(TimedText(0.0, 7.0, said, words(
        (0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three."), (3.3, 4.2, "Four"), (4.3, 5.0, "five"),
        (5.1, 5.8, "six"), (5.9, 6.7, "seven."))),), extra={"rejected": True} if how == "rejected" else
        {"temperature": 0.4})
    engine = Scripted({w.part_audio(0).size: Transcription("One two three.", duration=3.0),
                       w.part_audio(1).size: Transcription("Four five six seven.", duration=4.0)})
    got = account(engine, w, guess, TranscribeOptions())
    assert got.text == said and got.extra["redecoded"] == [0, 1]
    assert [o.fallback for _, o in engine.asked] == [True, True]


def test_a_packed_window_cut_where_its_decode_started_over_keeps_its_text_and_decodes_the_rest_together():
    """Seed 8303 of `bench file --random`: a window of eleven segments whose greedy decode the policy rejected as a
    loop where two clips in a row say "Montreal forced aligner". Decoded alone, a segment of a speaker with a cold
    lost the phrase around it ("I have a cold soil price"). The text up to the repeat stands for the segments it
    covers (`policy.cut_at_loop`), and the rest are decoded again together, as after any early end."""
    w = window([3.0, 4.0, 3.5])
    said = "One two three."
    cut = Transcription(said, duration=10.0, segments=(TimedText(0.0, 10.0, said, words(
        (0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three."))),), extra={"rejected": "loop", "temperature": 0.0})
    rest = Transcription("Four five six seven. Eight nine ten eleven.", duration=7.5, segments=(TimedText(
        0.0, 7.5, "Four five six seven. Eight nine ten eleven.", words(
            (0.3, 1.1, "Four"), (1.2, 2.0, "five"), (2.1, 2.9, "six"), (3.0, 3.7, "seven."), (4.3, 5.0, "Eight"),
            (5.1, 5.8, "nine"), (5.9, 6.5, "ten"), (6.6, 7.2, "eleven."))),))
    engine = Scripted({w.sub(1, 3).audio.size: rest})
    got = account(engine, w, cut, TranscribeOptions())
    assert got.text == "One two three. Four five six seven. Eight nine ten eleven."
    assert got.extra["redecoded"] == [1, 2]
    assert [size for size, _ in engine.asked] == [w.sub(1, 3).audio.size]
    guess = replace(cut, extra={"rejected": "guess", "temperature": 0.0})
    alone = Scripted({w.part_audio(k).size: Transcription(t, duration=3.0) for k, t in enumerate(
        ["One two three.", "Four five six seven.", "Eight nine ten eleven."])})
    assert account(alone, w, guess, TranscribeOptions()).extra["redecoded"] == [0, 1, 2]


def test_an_answer_decoded_alone_that_stops_short_is_decoded_with_timestamps():
    """A segment holding two sentences, skipped in its window, and whose own decode ends after the first: that
    answer is checked too, and the segment decoded once more with Whisper's timestamps (long-form decoding carries
    on past an early end); that answer stands."""
    w = window([3.0, 8.0])
    first = Transcription("One two three.", duration=11.0, segments=(TimedText(0.0, 11.0, "One two three.", words(
        (0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three."))),))
    short = Transcription("Four five.", duration=8.0, segments=(TimedText(0.0, 8.0, "Four five.", words(
        (0.3, 1.0, "Four"), (1.1, 1.8, "five."))),))
    whole = Transcription("Four five. Six seven eight nine.", duration=8.0, segments=(
        TimedText(0.2, 2.0, "Four five."), TimedText(3.0, 7.8, "Six seven eight nine.")))
    engine = InTurn([short, whole])
    got = account(engine, w, first, TranscribeOptions())
    assert got.text == "One two three. Four five. Six seven eight nine."
    assert [(size, o.timestamps) for size, o in engine.asked] == [(8 * SAMPLE_RATE, False), (8 * SAMPLE_RATE, True)]


@pytest.mark.parametrize("second", ["Mend the coat. That high level, the air is pure.",
                                    "A little bit behind me, go straight back to the left."])
def test_a_lone_answer_short_by_the_window_gap_only_is_replaced_only_by_one_that_keeps_it(second: str):
    """Seed 7313 of `bench file --random`: a segment holding two sentences, skipped in its window, whose own decode
    skipped the first sentence again and spread the second's words over 1.2 s less than the whole: short of a lone
    segment's gap (`LONE_GAP_S`), but not of a window's (`GAP_S`). Decoded once more with timestamps, that answer
    stands where it says what the first said and more; a second decode that says other words (Whisper lost in a
    voice it barely knows, the long recording's falsetto clip) does not."""
    w = window([3.0, 5.0])
    first = Transcription("One two three.", duration=8.0, segments=(TimedText(0.0, 8.0, "One two three.", words(
        (0.3, 1.0, "One"), (1.1, 1.8, "two"), (1.9, 2.7, "three."))),))
    said = "That high level, the air is pure."
    short = Transcription(said, duration=5.0, segments=(TimedText(0.0, 5.0, said, words(
        (2.0, 2.4, "That"), (2.4, 2.8, "high"), (2.8, 3.3, "level,"), (3.3, 3.5, "the"), (3.5, 3.9, "air"),
        (3.9, 4.2, "is"), (4.2, 4.8, "pure."))),))
    assert coverage.uncovered(w.sub(1, 2).speech, coverage.timing(short), coverage.LONE_GAP_S) == []
    assert coverage.uncovered(w.sub(1, 2).speech, coverage.timing(short)) == [0]
    whole = Transcription(second, duration=5.0, segments=(TimedText(0.2, 4.8, second),))
    engine = InTurn([short, whole])
    got = account(engine, w, first, TranscribeOptions())
    assert [(size, o.timestamps) for size, o in engine.asked] == [(5 * SAMPLE_RATE, False), (5 * SAMPLE_RATE, True)]
    assert got.text == "One two three. " + (second if second.startswith("Mend") else said)


def test_a_timed_piece_over_a_segment_that_goes_back_takes_the_other_segment_with_it():
    """Timed pieces are spliced whole: a piece over a brief segment that goes back (the VAD heard a tenth of a
    second of it, and no word lies there) and over the next one would keep the next one's text and add the
    redecoded answer's, the same words twice. The next segment goes back with it."""
    w = replace(window([3.0, 3.0, 3.0]), speech=((0.2, 2.8), (4.4, 4.5), (6.2, 8.8)))
    first = Transcription("One two three. Four five six seven eight nine.", duration=9.0, segments=(
        TimedText(0.1, 2.9, "One two three."), TimedText(3.1, 8.9, "Four five six seven eight nine.")))
    again = Transcription("Four five six. Seven eight nine.", duration=6.0, segments=(
        TimedText(0.2, 2.8, "Four five six."), TimedText(3.2, 5.8, "Seven eight nine.")))
    alone = Transcription("Four five six.", duration=3.0, segments=(TimedText(0.2, 2.8, "Four five six."),))
    engine = Scripted({6 * SAMPLE_RATE: again, 3 * SAMPLE_RATE: alone}, words=False)
    got = account(engine, w, first, TranscribeOptions(timestamps=True))
    assert got.text == "One two three. Four five six. Seven eight nine."
    assert [size for size, _ in engine.asked] == [6 * SAMPLE_RATE, 3 * SAMPLE_RATE]
    assert got.extra["redecoded"] == [1, 2]
