"""Nothing lost on recordings no test has seen: random compilations of tests/data's clips (random clips, order,
pauses and levels: realtime/bench/corpus.py, `random_compilation`), transcribed by the file path's text and timed
decodes. A stretch of 5 or more words that the same path writes for a clip posted alone (conftest.py: `readings`)
and leaves out of the compilation's answer is lost (`lost_speech`).

Each run draws fresh seeds (listed at the end of every run, and named in a failure with the command that rebuilds
the compilation); the compilations of the shared script that lost a sentence before (its seeds 1, 2, 5 and 11)
stay as regression tests.
A failure is a bug to fix, never a seed to skip.
"""

from __future__ import annotations

import os
import time

import pytest

from realtime.bench.corpus import lost_runs, lost_speech, random_compilation
from realtime.engines.embedded import EmbeddedEngine

from real_speech import clips, script_compilation, transcribe_clips

COMPILATIONS = 2
"""Fresh compilations per run, each read by both decodes."""
CLIPS = (4, 8)
"""How many clips a compilation of the suite draws (the benchmark draws 6 to 14)."""


@pytest.mark.fast
def test_a_number_written_another_way_is_not_lost_but_its_digits_are_words():
    """Seed 20007 of `bench file --random` (the remote engine's paths): the digits clip alone read "0 1 8 0 3", the
    compilation "01803" (which Whisper's normaliser turns into "one 8 0 3" and "1803"): the same digits, not speech
    lost. A number the answer leaves out is lost as the digits said, one word each."""
    alone = "1 0 0 1. 90210. 0 1 8 0 3 So this is the sick purpose. I have a cold"
    assert lost_runs(alone, "1 0 0 1 90210. 01803. is the sick purpose I have a cold") == []
    assert lost_runs(alone, "One zero oh one, nine oh two one oh, zero one eight zero three. So this is the sick "
                            "purpose. I have a cold") == []
    runs = lost_runs(alone, "1 0 0 1 and I have a cold")
    assert len(runs) == 1 and runs[0].endswith("0 2 1 0 0 1 8 0 3 so this is the sick purpose"), runs


def fresh_seed() -> int:
    """The run's first seed: RANDOM_SEED if set (to rerun a failure), else from the clock."""
    return int(os.environ.get("RANDOM_SEED") or time.time_ns() // 1000 % 1_000_000)


@pytest.mark.xdist_group("lost-speech")
def test_random_compilations_lose_no_speech(engine, readings, tmp_path, record_property):
    first = fresh_seed()
    record_property("random seeds", f"{first} to {first + COMPILATIONS - 1} (RANDOM_SEED={first} reruns them)")
    print(f"\nrandom compilations: seeds {first} to {first + COMPILATIONS - 1} (RANDOM_SEED={first} reruns them)")
    lost = {}
    for seed in range(first, first + COMPILATIONS):
        comp = random_compilation(clips(longest=40), tmp_path / f"compilation-{seed}.wav", seed, count=CLIPS)
        for kind, timed in (("text", False), ("timed", True)):
            answer = transcribe_clips(engine, [comp.path], timed)[0]
            if runs := lost_speech(comp, readings[kind], answer):
                lost[(seed, kind)] = runs
        print(f"seed {seed}: {len(comp.clips)} clips, {comp.spans[-1][1]:.0f} s, gains {comp.gains_db} dB: "
              f"lost {[v for (s, _), v in lost.items() if s == seed]}")
    assert not lost, (f"speech lost (seed, decode: stretches): {lost}; the compilations: `python -m realtime bench "
                      f"file --random {COMPILATIONS} --seed {first}`, or RANDOM_SEED={first} for this test")


@pytest.mark.xdist_group("lost-speech")
@pytest.mark.parametrize(("seed", "timed"), [(7102, False), (7161, False), (7313, False), (7334, True), (7415, False),
                                               (7644, False), (7653, False), (8230, False), (8303, False),
                                               (8622, False), (8622, True), (8848, False), (9517, False),
                                               (20272, False), (21089, False), (22140, False),
                                               (22173, True), (22441, True),
                                               (22616, True), (22623, False), (23018, True)])
def test_the_benchmark_compilations_that_lost_a_sentence_lose_none(engine, readings, tmp_path, seed, timed):
    """`bench file --random` seed 7102: two short clips with a pause the VAD did not cut at were one segment, and the
    window's decode stopped after the first, skipping "What joy there is in living?" inside a segment that looked
    covered (realtime/live/coverage.py, `bare_edge`). Seed 7161: a noisy recording at -7.6 dB whose "and I'm saying a
    bunch of different words" Silero heard as faint speech running into the next segment, dropped as its onset
    (realtime/live/vad.py, `FAINT_ONSET_S`). Seed 7313: "Mend the coat before you go out" and the next clip were one
    segment; the window's decode, and the segment's own, skipped the first and aligned the next one's words over it
    (a 2.4 s "that": `coverage.LONG_WORD_S`; then a 1.2 s gap: `coverage.GAP_S`). Seeds 7334 (the timed
    path) and 7415 (every path): `mfa-falsetto2`, of which Silero heard no more than a fifth of a second at a time
    (realtime/live/vad.py, `FAINT_LOUD_DB`). Seed 7644: "Mend the coat before you go out" 0.17 s after a 13 s
    sentence, one segment; the window's decode skipped it and left 1.6 s without text (`coverage.GAP_S`). Seed 7653:
    `mfa-falsetto2` again, loud for 1.7 s of which Silero heard 0.13 s (realtime/live/vad.py, `FAINT_BACK_S`). Seed
    8230: "so this is the sick corpus" skipped at a segment's start, 0.8 s bare (`coverage.GAP_S`). Seed 8303: a window
    rejected as a loop where two clips say "Montreal forced aligner", its segments decoded alone, and the speaker with
    a cold misread without the sentences around ("I have a cold soil price", `policy.cut_at_loop`). Seed 8622 (both
    paths): that speaker heard by the VAD for a few hundredths of a second at a time, brief segments whose aligned
    words' middles lay beside them, decoded again alone ("Yes?"), and the phrase lost (`coverage.suspect`). Seed 8848
    (every path but the remote): a window full inside that phrase, the next one begun without its start and misread
    (realtime/live/transcribe.py, `CUT_SHARE`). Seed 9517 (the text paths): a window's decode read its first two
    clips and stopped, its words aligned over the last segment, whose sentence was lost (`coverage.suspect`). Seed
    20272 (the text paths): `mfa-falsetto2` right after the digits clip, in a part of its window that is speech the
    VAD did not hear, read "1-03" by the window's decode and "I really don't know how people talk like this" alone
    (realtime/live/transcribe.py, `_unheard`). Seed 21089 (the text paths): "So this is the sick corpus" of
    `mfa-cold_corpus`, whose "this is the" Silero heard only faintly up to the segment's start, dropped as its onset
    (realtime/live/vad.py: an onset starts the segment's audio). Seed 22140 (the text paths): that speaker 6 dB down,
    whose "I have a cold" the VAD did not hear between two segments: 0.46 s of it fell between their padded audio and
    was dropped from the window, the rest misread "I have to apply something" (`UNHEARD_S`); seed 22173 (the timed
    paths), the same phrase read "I have also applied something" (`UNHEARD_S` too). Seed 22441 (the timed paths): a
    window ending in that speaker, whose decode with Whisper's timestamp tokens was rejected as a guess; its nine
    segments decoded alone read "So I place them a little bit different than the... stick for this. Um," for "So
    this is the sick corpus. I have a cold, so I probably sound quite different" (the window was then decoded again
    as the text formats decode it; now every window is: `decode_options`). Seed 22616 (the timed paths, with that
    change): a window decoded so, whose check decoded the digits clip's segments alone, without word times; the
    window's segments made again from its words dropped "90210 01803" (`timed_pieces` keeps a piece without words as
    it came). Seed 22623 (the text paths): a window's decode skipped "I'm Abigail Claflin" (a segment) and
    "You can call me Abbie" (the start of the next, one segment with the clip after it), whose first words it
    aligned over the skipped phrase; only the first went back and read "I'm Abigail Clathlon" alone (the segment
    after a skipped one goes back with it: `coverage.suspect`). Seed 23018 (the timed paths): "I have a cold, so I
    probably sound quite different" read "I have also applied something" by a decode with Whisper's timestamp tokens,
    as many words over the same speech (realtime/live/transcribe.py, `decode_options`)."""
    comp = random_compilation(clips(longest=40), tmp_path / f"bench-{seed}.wav", seed)
    answer = transcribe_clips(engine, [comp.path], timed)[0]
    assert not lost_speech(comp, readings["timed" if timed else "text"], answer), answer


class Untimed(EmbeddedEngine):
    """The embedded engine as an engine that gives no times (vLLM's): its file windows hold one segment each."""

    timestamps = False
    word_timestamps = False


@pytest.mark.xdist_group("lost-speech")
def test_an_engine_without_times_loses_no_speech_between_its_windows(tmp_path):
    """Seed 22441 of `bench file --random` (the vLLM engine): "So this is the sick corpus", said 13 dB below the
    sentences on either side, of which Silero heard nothing, lay between "Has never been surpassed.", a short segment
    whose context read that sentence alone, and "I have a cold", whose context reached back 1 s. The short segment
    before held back 4 s of audio after it (for speech the VAD did not hear beside it, which a window of one segment
    never uses) and decoded 2 s: the phrase was in no window (realtime/live/transcribe.py, `LONE_BEFORE_S`)."""
    engine = Untimed()
    engine.load()
    comp = random_compilation(clips(longest=40), tmp_path / "bench-22441.wav", 22441)
    alone = dict(zip((c.name for c in comp.clips), transcribe_clips(engine, [c.path for c in comp.clips], False),
                     strict=True))
    answer = transcribe_clips(engine, [comp.path], False)[0]
    assert not lost_speech(comp, alone, answer), answer


@pytest.mark.xdist_group("lost-speech")
@pytest.mark.parametrize("seed", [1, 2, 5, 11])
def test_the_compilations_that_lost_a_sentence_lose_none(engine, readings, tmp_path, seed):
    """Seed 1's text answer left out "And Mister John Dashwood had then leisure to consider ..." and seed 11's "Stuff
    it into you, his belly counselled him": the words of the next sentence were aligned across the skipped one
    (too few words for that much speech: realtime/live/coverage.py). Seed 2 opens with a falsetto phrase of which
    the VAD hears nothing at its threshold (the clip alone, it hears a window of it): faint speech, a segment of its
    own (realtime/live/vad.py, `Segmenter(faint=True)`)."""
    comp = script_compilation(seed, tmp_path / f"script-{seed}.wav")
    answer = transcribe_clips(engine, [comp.path], False)[0]
    assert not lost_speech(comp, readings["text"], answer), answer
