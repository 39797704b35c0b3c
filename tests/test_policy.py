"""The decoding policy (realtime/engines/policy.py): pure rules, no model."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.bench.corpus import loops
from realtime.engines import policy
from realtime.engines.policy import Hypothesis, find_loop, judge, settle, trim_loop

from real_speech import clips

pytestmark = pytest.mark.fast


def test_loops_are_found_where_they_start_over():
    assert find_loop("and so my fellow Americans. And so my fellow Americans. And so") == 5
    assert find_loop("At that high level, the air is pure. At that high level, the air is pure.") == 8
    assert find_loop("the the the the the the end") == 1
    assert find_loop("thank you " * 6) == 2
    # people repeat a word or two a few times ("word word word word word" is in the real set's references)
    for fine in ("no no no, not like that", "it is what it is", "very very good", "one two three four",
                 "thank you, thank you", "word word word word word", "", "ok"):
        assert find_loop(fine) is None, fine


def test_no_reference_text_of_the_real_set_counts_as_a_loop():
    for clip in clips():
        assert find_loop(clip.text) is None, clip.name


def test_a_loop_is_cut_after_its_first_occurrence():
    assert trim_loop("and so my fellow Americans. And so my fellow Americans. And so") == "and so my fellow Americans."
    assert trim_loop("we will meet. we will meet. we will meet.") == "we will meet."
    assert trim_loop("no no no no no no no no") == "no no"
    assert trim_loop("a plain sentence") == "a plain sentence"


def test_judge_follows_whispers_rules_and_catches_short_loops():
    assert judge(Hypothesis("hello there", -0.3, 0.1)) == "ok"
    assert judge(Hypothesis("hello there", -1.5, 0.1)) == "retry"  # a guess: try a higher temperature
    assert judge(Hypothesis("hello", -1.5, 0.9)) == "silence"
    assert judge(Hypothesis("hello", -0.2, 0.9)) == "ok"  # confident text wins over the no-speech probability
    short_loop = "ask not. ask not. ask not."
    assert policy.compression_ratio(short_loop) < policy.COMPRESSION_RATIO_THRESHOLD  # Whisper's rule misses it
    assert judge(Hypothesis(short_loop, -0.2, 0.0)) == "retry"
    assert judge(Hypothesis("word " * 60, None, None)) == "retry"  # text-only engines: the same rules on text
    # a confident row of dots where the model finds no speech (a hum) is silence, not a retry that samples
    assert judge(Hypothesis(". . . . . . . . . . . . . . . . . . .", -0.19, 0.81)) == "silence"
    assert judge(Hypothesis(". . . . . . . . . . . . . . . . . . .", -0.19, 0.1)) == "retry"


def test_what_is_kept_when_no_temperature_is_left():
    assert settle(Hypothesis("ask not. ask not. ask not.", -0.2, 0.0)) == "ask not."
    assert settle(Hypothesis("real but unsure words", -2.5, 0.2)) == "real but unsure words"  # not dropped
    assert settle(Hypothesis("thanks for watching", -1.2, 0.8)) == ""
    assert settle(Hypothesis(". . . . . . . .", -0.5, 0.3)) == ""  # no word, nothing to show
    assert settle(Hypothesis("...", None, None)) == ""


def test_quiet_speech_is_raised_for_the_model_and_loud_or_silent_audio_left_alone():
    t = np.arange(16000) / 16000
    quiet = (0.005 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)  # peak -46 dBFS
    raised = policy.normalise(quiet)
    assert abs(float(np.max(np.abs(raised))) - policy.QUIET_PEAK) < 1e-3 and float(np.max(np.abs(quiet))) < 0.006
    loud = 0.5 * quiet / 0.005
    assert policy.normalise(loud) is loud
    silent = np.zeros(100, np.float32)
    assert policy.is_silent(silent) and policy.normalise(silent) is silent


def test_decode_length_grows_with_the_audio():
    assert policy.max_new_tokens(1.0) < policy.max_new_tokens(10.0) <= 448



def test_a_phrase_the_speakers_say_again_is_not_a_loop():
    """tests/data holds four recordings in a row that each say "Montreal Forced Aligner": a reading that gives
    two of them alike repeats a phrase as the speakers did; a loop is a repetition beyond the reference's."""
    reference = "we begin montreal forced aligner montreal forced aligner montreal forced aligner and so on"
    said = "We begin. Montreal Forest diviner. Montreal Forest diviner. Montreal forced a liner and so on."
    assert loops([said]) == [said] and loops([said], reference) == []
    looped = "We begin. And so on and so on and so on and so on. And so on."
    assert loops([looped], reference) == [looped]


def test_a_word_said_over_and_over_and_written_once_more_is_miscounted_not_looped():
    """`mfa-words` says "word" five times in a row; the long recording's timed reading once wrote it six times (a
    breath after the last read as one more), which the policy's rule for one word calls a loop. Against the
    reference, one more of a single word is a miscount; two more, or a phrase once more, is a loop."""
    reference = "here's some more word word word word word"
    assert loops(["Here's some more word, word, word, word, word. Word."], reference) == []
    assert loops(["Here's some more word, word, word, word, word, word, word."], reference)
    assert loops(["Here's some more. Here's some more."], reference)


def test_a_decode_asked_without_fallback_is_tried_once_and_marked_when_rejected():
    import asyncio

    from realtime.engines import TranscribeOptions, Transcription

    asked: list[float | None] = []

    async def decode(options: TranscribeOptions) -> Transcription:
        asked.append(options.temperature)
        return Transcription("the the the the the the the the", duration=3.0, avg_logprob=-1.5, no_speech_prob=0.1)

    looped = asyncio.run(policy.with_fallback(decode, TranscribeOptions(fallback=False)))
    assert asked == [None] and policy.rejected(looped) and looped.text == settle(Hypothesis("the " * 8, -1.5, 0.1))
    asked.clear()
    sampled = asyncio.run(policy.with_fallback(decode, TranscribeOptions()))
    assert asked == [None, *policy.FINAL_TEMPERATURES[1:]] and policy.rejected(sampled)
    assert policy.temperatures(TranscribeOptions(fallback=False)) == (0.0,)
    assert policy.temperatures(TranscribeOptions(fallback=False, temperature=0.4)) == (0.4,)


def test_a_rejection_says_whether_the_text_up_to_its_loop_passes():
    """A packed window's greedy decode asked without fallback (realtime/live/coverage.py) is rejected where it
    starts over, and a window of several clips can say the same phrase twice (seed 8303 of `bench file --random`:
    "Montreal forced aligner" in two clips in a row): the text up to the repeat stands for the speech it covers
    (`cut_at_loop`). A guess, or a loop whose first run is itself a guess, stands for nothing."""
    import asyncio

    from realtime.engines import TranscribeOptions, Transcription

    said = "No Montreal forced aligner. Montreal forced aligner? I hardly know her."
    assert policy.rejection(Hypothesis(said, -0.3, 0.01)) == policy.LOOP
    assert policy.rejection(Hypothesis(said, -1.5, 0.01)) == policy.GUESS
    assert policy.rejection(Hypothesis("One two three four.", -1.5, 0.01)) == policy.GUESS

    def decoded(text: str, logprob: float, fallback: bool = False) -> Transcription:
        async def decode(options: TranscribeOptions) -> Transcription:
            return Transcription(text, duration=5.0, avg_logprob=logprob, no_speech_prob=0.01)
        return asyncio.run(policy.with_fallback(decode, TranscribeOptions(fallback=fallback)))

    cut = decoded(said, -0.3)
    assert policy.rejected(cut) and policy.cut_at_loop(cut) and cut.text == "No Montreal forced aligner."
    assert policy.rejected(decoded(said, -1.5)) and not policy.cut_at_loop(decoded(said, -1.5))
    assert not policy.rejected(decoded("No Montreal forced aligner.", -0.3))
    sampled = decoded(said, -0.3, fallback=True)
    assert policy.rejected(sampled) and not policy.cut_at_loop(sampled)
