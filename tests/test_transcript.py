"""The transcript's export formats (realtime/live/transcript.py): pure functions over entries."""

from __future__ import annotations

import json

import pytest

from realtime.engines.types import Word
from realtime.live.transcript import Entry, Partial, Transcript, cues, to_json, to_srt, to_text, to_vtt

pytestmark = pytest.mark.fast

WORDS = tuple(Word(1.0 + 0.5 * i, 1.4 + 0.5 * i, f" {w}", 0.9) for i, w in enumerate(
    "Ask not what your country can do for you".split()))
ENTRIES = [
    Entry(0, 1.0, 5.4, "Ask not what your country can do for you", words=WORDS, language="en"),
    Entry(1, 6.0, 7.0, "transcription failed: the endpoint timed out", kind="error"),
    Entry(2, 3661.5, 3663.25, "An hour later."),
    Entry(3, 3664.0, 3664.5, ""),
]


def test_text_has_one_line_per_final_and_leaves_out_errors_and_empty_entries():
    assert to_text(ENTRIES) == "Ask not what your country can do for you\nAn hour later."


def test_srt_and_vtt_timestamps_and_numbering():
    srt = to_srt(ENTRIES)
    assert srt == ("1\n00:00:01,000 --> 00:00:05,400\nAsk not what your country can do for you\n\n"
                   "2\n01:01:01,500 --> 01:01:03,250\nAn hour later.\n")
    vtt = to_vtt(ENTRIES)
    assert vtt.startswith("WEBVTT\n\n00:00:01.000 --> 00:00:05.400\n") and "01:01:01.500 --> 01:01:03.250" in vtt


def test_cues_are_cut_at_word_times_to_a_line_length():
    cut = cues(ENTRIES, max_chars=16)
    assert [c.text for c in cut] == ["Ask not what", "your country can", "do for you", "An hour later."]
    assert (cut[0].start, cut[0].end) == (1.0, 2.4) and (cut[1].start, cut[1].end) == (2.5, 3.9)
    assert all(len(c.text) <= 16 for c in cut)
    assert [c.text for c in cues(ENTRIES)] == [ENTRIES[0].text, ENTRIES[2].text], "no length, no cut"


def test_json_keeps_errors_languages_and_words():
    doc = json.loads(to_json(ENTRIES, duration=3665.0))
    assert doc["duration"] == 3665.0 and doc["text"] == "Ask not what your country can do for you An hour later."
    first, error = doc["segments"][:2]
    assert first["language"] == "en" and first["words"][0] == {"word": "Ask", "start": 1.0, "end": 1.4}
    assert error["error"] is True and "words" not in error and [s["id"] for s in doc["segments"]] == [0, 1, 2, 3]


def test_a_final_replaces_the_partial_of_its_segment_and_entries_stay_in_order():
    t = Transcript()
    t.partial = Partial(1, 6.0, 7.0, "an hour", "later")
    t.add(ENTRIES[2])
    t.add(ENTRIES[0])
    assert [e.segment for e in t.snapshot().entries] == [0, 2] and t.partial is None
    t.partial = Partial(4, 9.0, 9.5, "", "next")
    t.add(ENTRIES[1])
    assert t.partial is not None and t.partial.text == "next", "an earlier segment's final keeps a later partial"
