"""Speaker labels: the scorer and the labelling rule (fast), the speaker model on real voices, and `diarized_json`
with named speakers through the openai SDK against the app launched as users launch it.

The conversation is built from real recordings of four people (tests/data: LibriSpeech 1089 and 1272, LJSpeech,
LibriVox's Sense and Sensibility reader), taking turns with pauses; its reference turns are known by construction.
Where four voices over ten turns are the point (the speaker model, a live session, `diarized_json` with named
speakers) the whole conversation is used; the other formats and the command line take the same four voices in six
shorter turns (tests/short_conversation.py). The HTTP API is the worker's default app (conftest `app`). The real
meetings with their own RTTM references (tests/data/speakers) are scored as `python -m realtime bench speakers`
scores them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import html
import io
import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from openai import OpenAI
from short_conversation import build_turns, short_conversation, trimmed

from realtime.audio import SAMPLE_RATE, decode_file, iter_file
from realtime.bench.conversations import random_conversation, voices
from realtime.bench.corpus import read_manifest
from realtime.bench.speakers import ALONE_S, alone_s, bench_speakers, der, padded, read_rttm, srt_cues, vad_segments
from realtime.config import Settings, VADConfig
from realtime.engines.types import Word
from realtime.live import coverage, labels
from realtime.live import transcript as fmt
from realtime.live.service import TranscriptionService
from realtime.live.transcribe import Window
from realtime.live.transcript import Entry
from realtime.live.vad import SegmentEnd, Segmenter
from realtime.speakers import Diarization, LiveSpeakers, Turn, speaker_windows
from realtime.web import ui

from conftest import ROOT, App
from live_feed import feed
from real_speech import DATA, PAUSE_S, TURNS, VOICES, Conversation, build_conversation

REFERENCE_CLIP = {"lj": 3, "s1089": 3, "austen": 3}
"""Clips the conversation does not use: each speaker's reference for `known_speaker_references[]`."""


def voice(name: str, i: int) -> np.ndarray:
    return decode_file(DATA / f"{VOICES[name][i]}.flac")


LABELLED_S = 300.0
"""How long the speaker labels of a live session may take after its last final: reached only when something is
wrong (the speaker model's thread runs at a lower priority, so a busy machine delays it most)."""


@pytest.fixture(scope="module")
def conversation(tmp_path_factory: pytest.TempPathFactory) -> Conversation:
    """The four voices in ten turns (tests/real_speech.py `build_conversation`)."""
    return build_conversation(tmp_path_factory.mktemp("speakers") / "conversation.flac")


@pytest.fixture(scope="module")
def short(tmp_path_factory: pytest.TempPathFactory) -> Conversation:
    """The four voices in six shorter turns (tests/short_conversation.py)."""
    return short_conversation(tmp_path_factory.mktemp("speakers-short") / "short.flac")


def voice_of(conversation: Conversation, start: float, end: float) -> str:
    """The voice that speaks most of [start, end] in `conversation`."""
    return max(conversation.turns, key=lambda t: min(t[1], end) - max(t[0], start))[2]


def data_url(audio: np.ndarray) -> str:
    buf = io.BytesIO()
    sf.write(buf, audio, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


# -- fast: the scorer, the windows, the labelling rule, the formats --------------------------------------------


@pytest.mark.fast
def test_the_scorer_counts_miss_false_alarm_and_confusion_outside_the_collar():
    reference = [(0.0, 10.0, "a"), (10.0, 20.0, "b")]
    assert der(reference, [(0.0, 10.0, "x"), (10.0, 20.0, "y")]).der == 0
    swapped = der(reference, [(0.0, 20.0, "x")])  # b's 10 s (less the collar) are confused
    assert swapped.confusion == pytest.approx(9.75 / 19.5, abs=0.01) and swapped.missed == 0
    missed = der(reference, [(0.0, 10.0, "x")])
    assert missed.missed == pytest.approx(9.75 / 19.5, abs=0.01) and missed.confusion == 0
    extra = der(reference, [(0.0, 10.0, "x"), (10.0, 20.0, "y"), (30.0, 35.0, "y")])
    assert extra.false_alarm == pytest.approx(5 / 19.5, abs=0.01)
    overlapped = [(0.0, 10.0, "a"), (5.0, 10.0, "b")]
    assert der(overlapped, [(0.0, 10.0, "x")]).missed > 0.3
    assert der(overlapped, [(0.0, 10.0, "x")], skip_overlap=True).der == 0
    # what a voice says with no one else talking: b only ever speaks over a
    assert alone_s(overlapped, "a") == pytest.approx(5.0) and alone_s(overlapped, "b") == 0.0


@pytest.mark.fast
def test_the_scorer_reads_rttm(tmp_path):
    path = tmp_path / "a.rttm"
    path.write_text("SPEAKER a 1 0.50 2.00 <NA> <NA> spk1 <NA> <NA>\nSPEAKER a 1 3.0 1.5 <NA> <NA> spk2 <NA> <NA>\n")
    assert read_rttm(path) == [(0.5, 2.5, "spk1"), (3.0, 4.5, "spk2")]
    assert Diarization([Turn(0.5, 2.5, 0)], np.zeros((1, 2))).rttm("a").split()[:8] == \
        ["SPEAKER", "a", "1", "0.500", "2.000", "<NA>", "<NA>", "A"]


@pytest.mark.fast
def test_a_constructed_conversation_is_real_voices_taking_turns_where_its_reference_says(tmp_path):
    """`bench speakers --conversations`: two or three of the manifest's voices take turns of their clips' phrases.
    The reference holds speech where the audio is loud and nothing where it is quiet, names the drawn voices, has
    gaps between turns and some overlap over a few seeds, and the same seed writes the same recording."""
    by_voice = voices(read_manifest(DATA / "manifest.tsv"))
    assert len(by_voice) >= 5 and all(sum(c.duration for c in cs) >= 10 for cs in by_voice.values())
    overlaps = 0
    for seed in (7, 8, 9):
        talk = random_conversation(by_voice, tmp_path / f"c{seed}.flac", seed)
        audio = decode_file(talk.path)
        written = read_rttm(talk.path.with_suffix(".rttm"))
        assert [(round(a, 3), round(b, 3), w) for a, b, w in written] == talk.reference
        assert {w for *_, w in talk.reference} == set(talk.voices) and len(talk.voices) in (2, 3)
        grid = np.zeros(audio.size // 160, bool)
        for a, b, _ in talk.reference:
            grid[round(a * 100):round(b * 100)] = True
        level = 10 * np.log10(np.mean(audio[:grid.size * 160].reshape(-1, 160) ** 2, axis=1) + 1e-12)
        assert np.median(level[grid]) > np.percentile(level[~grid], 90) + 6, seed
        turns = [t for t in talk.reference if all(t[2] != u[2] or t == u for u in talk.reference
                                                  if u[0] < t[0] < u[1])]
        overlaps += any(a < b0 and w != w0 for (_, b0, w0), (a, _, w) in itertools.pairwise(turns))
        assert talk.reference[-1][1] < audio.size / SAMPLE_RATE
    again = random_conversation(by_voice, tmp_path / "again.flac", 9)
    assert again.reference == talk.reference and np.array_equal(decode_file(again.path), audio)
    assert overlaps >= 1


@pytest.mark.fast
def test_windows_cover_the_speech_and_nothing_else():
    assert speaker_windows([(0.0, 0.3)]) == []
    assert speaker_windows([(1.0, 2.0)]) == [(1.0, 2.0)]
    windows = speaker_windows([(0.0, 4.0), (10.0, 10.2)])
    assert windows[0] == (0.0, 1.5) and windows[-1] == (2.5, 4.0)
    assert all(0 <= a < b <= 4.0 and b - a == pytest.approx(1.5) for a, b in windows)
    assert all(b2 - b1 <= 0.75 + 1e-9 for (_, b1), (_, b2) in itertools.pairwise(windows))


@pytest.mark.fast
def test_an_entry_spoken_by_two_is_cut_at_the_change_and_words_follow_their_turns():
    diarization = Diarization([Turn(0.0, 2.0, 0), Turn(2.0, 4.0, 1)], np.zeros((2, 2)), names={1: "Bob"})
    words = (Word(0.2, 0.6, " Hello", 1.0), Word(0.7, 1.5, " there.", 1.0), Word(2.3, 2.8, " Hi", 1.0),
             Word(2.9, 3.5, " Alice.", 1.0))
    entries = labels.label([Entry(0, 0.2, 3.5, "Hello there. Hi Alice.", words=words),
                            Entry(1, 5.0, 6.0, "Bye.")], diarization)
    assert [(e.speaker, e.text, e.start, e.end) for e in entries] == [
        ("A", "Hello there.", 0.0, 2.0), ("Bob", "Hi Alice.", 2.0, 4.0), ("Bob", "Bye.", 5.0, 6.0)]
    assert [s["speaker"] for s in labels.diarized_segments(entries)] == ["A", "Bob", "Bob"]
    assert "\nA: Hello there.\n" in fmt.to_srt(entries) and "<v Bob>Hi Alice." in fmt.to_vtt(entries)
    assert '"speaker": "Bob"' in fmt.to_json(entries)


@pytest.mark.fast
def test_a_labelled_entry_is_timed_by_the_speech_of_its_words_and_never_spans_silence():
    """Issue 39: a Whisper piece from 4.5 s to 29.4 s over four short replies and the silence between them was one
    segment of 25 s. Each run of words is its own entry, from the start of the speech (turn) its first word is in to
    the end of the one its last word is in; a word aligned over the silence after its speech is cut to it."""
    turns = [Turn(4.4, 5.5, 0), Turn(11.8, 12.6, 0), Turn(27.3, 29.0, 0)]
    diarization = Diarization(turns, np.zeros((1, 2)))
    words = (Word(4.6, 4.9, " No.", 1.0), Word(5.0, 5.3, " No.", 1.0), Word(12.0, 12.4, " Yeah.", 1.0),
             Word(27.5, 27.8, " To", 1.0), Word(27.8, 28.0, " take", 1.0), Word(28.0, 28.3, " notes", 1.0),
             Word(28.3, 28.8, " today.", 1.0))
    entries = labels.label([Entry(0, 4.5, 29.4, "No. No. Yeah. To take notes today.", words=words)], diarization)
    assert [(e.text, e.start, e.end) for e in entries] == [
        ("No. No.", 4.4, 5.5), ("Yeah.", 11.8, 12.6), ("To take notes today.", 27.3, 29.0)]
    stretched = (Word(7.0, 10.9, " a", 1.0), Word(10.9, 15.6, " link.", 1.0), Word(16.1, 16.6, " Yes.", 1.0))
    two = Diarization([Turn(6.9, 11.8, 0), Turn(15.4, 16.5, 1)], np.zeros((2, 2)))
    cut = labels.label([Entry(0, 6.9, 16.6, "a link. Yes.", words=stretched)], two)
    assert [(e.speaker, e.text, e.start, e.end) for e in cut] == [("A", "a link.", 6.9, 11.8),
                                                                   ("B", "Yes.", 15.4, 16.5)]
    assert cut[0].words[-1].end == 11.8, "the word ends with its speech"
    one = labels.label([Entry(0, 0.0, 9.0, "No, no.", words=words[:2])], diarization)
    assert [(e.text, e.start, e.end) for e in one] == [("No, no.", 4.4, 5.5)], "a single run keeps its text"


@pytest.mark.fast
def test_the_speaker_model_hears_the_vad_s_speech_not_a_window_s_context():
    """A short segment packed with the recording after it (speech the VAD did not hear) gave the speaker model 6 s
    of that recording as speech: turns over it, and false alarm wherever the words were. Only each segment's speech
    with the VAD's padding is windowed."""
    audio = np.zeros(9 * SAMPLE_RATE, np.float32)
    window = Window(0, 10.2, 21.5, audio, False, 10.0, ((0.0, 10.0), (3.0, 20.0)),
                    speech=((0.2, 2.8), (3.5, 4.5)))
    spans = labels.speech_spans(window, VADConfig(pad_before_ms=200, pad_after_ms=200))
    assert spans == [pytest.approx((10.0, 13.0)), pytest.approx((20.3, 21.7))]
    assert labels.speech_spans(window) == spans, "the app's default padding"


# -- the speaker model on real voices ----------------------------------------------------------------------------


def _voices(similarity: float, spread: float, turns: list[int], per_turn: int = 12) -> np.ndarray:
    """Unit embeddings of speakers taking turns: speaker 0 and every other speaker `similarity` alike (their
    centres), each window scattered by `spread` around its speaker's centre."""
    rng = np.random.default_rng(7)
    basis = np.linalg.qr(rng.normal(size=(192, max(turns) + 1)))[0].T
    centres = [basis[0]] + [similarity * basis[0] + np.sqrt(1 - similarity ** 2) * b for b in basis[1:]]
    x = np.concatenate([centres[t] + rng.normal(size=(per_turn, 192)) * spread for t in turns])
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.fast
def test_a_recording_s_speakers_are_found_however_alike_its_voices_are():
    from realtime.speakers.cluster import ONLINE_COSINE, cluster

    for turns in ([0, 1, 0, 1], [0, 1, 2, 0, 2, 1]):
        close = _voices(0.8, 0.045, turns)  # two voices on one telephone line: windows of different speakers
        s = close @ close.T
        assert s[:12, 12:24].mean() > ONLINE_COSINE  # more alike than the similarity that opens a speaker live
        labels = cluster(close)
        assert labels.tolist() == [x for t in turns for x in [sorted(set(turns), key=turns.index).index(t)] * 12]
    assert set(cluster(_voices(0.8, 0.045, [0, 0, 0, 0])).tolist()) == {0}  # one voice stays one speaker


@pytest.fixture(scope="module")
def diarizer():
    from realtime.speakers import Diarizer

    return Diarizer()


def test_four_real_voices_taking_turns_are_told_apart_offline_and_live(diarizer, conversation):
    audio = decode_file(conversation.path)
    speech = [(a, b) for a, b, _ in conversation.turns]
    offline = diarizer.file(audio, speech)
    live = LiveSpeakers(diarizer.embedder)
    for a, b in speech:
        live.add(audio[round(a * SAMPLE_RATE):round(b * SAMPLE_RATE)], a)
    online = live.online(speech)
    floor = der(conversation.turns, [(a, b, "0") for a, b in speech])
    for found in (offline, online):
        score = der(conversation.turns, [(t.start, t.end, str(t.speaker)) for t in found.turns])
        assert len(found.centroids) == 4, found.turns
        assert score.confusion < 0.05 < floor.confusion, score


def test_two_and_three_of_the_real_voices_are_counted_right(diarizer, tmp_path):
    """Issue 39, the speaker count: two and three of the four real voices (constructed conversations: each voice's
    clips in turn, with pauses), cut by the VAD, clustered as a file is: the count is exact and each voice keeps
    one label. Two sentences each, under 10 s of speech per voice: the case where a voice that says a sentence or
    two must still be a speaker. (Every pair and every three pass; two of them keep the suite's time.)"""
    for group in [("s1272", "austen"), ("lj", "s1089", "austen")]:
        talk = build_turns(tmp_path / f"{'-'.join(group)}.flac", [(who, i) for i in (0, 1) for who in group])
        found = diarizer.file(decode_file(talk.path), [padded(e) for e in vad_segments(talk.path)])
        assert len(found.centroids) == len(group), (group, found.turns)
        said: dict[str, set[int]] = {}
        for turn in found.turns:
            said.setdefault(voice_of(talk, turn.start, turn.end), set()).add(turn.speaker)
        assert all(len(v) == 1 for v in said.values()) and len(said) == len(group), (group, found.turns)


CONVERSATIONS = (100, 4)
"""(first seed, count) of the constructed conversations `bench speakers` scores here beside the meetings (one
exact count is wrong among them: seed 103's three voices are found as four)."""


def test_real_meetings_and_conversations_offline_and_live_beat_the_one_speaker_floor(diarizer, tmp_path):
    """The AMI excerpts (tests/data/speakers): DER without overlapped speech, pooled over the files, within the
    issue's bounds (offline 15 %, live 22 %) give or take a margin for the CPU's floating point, and each well
    under the floor of everything one speaker, which shares the same missed speech. Offline, the count is exact on
    four of the seven recordings of two or three voices (three when a cluster needed four windows: EN2003a's
    three people, who say 3 to 8 s each, were one), and on five of them against the voices that say a sentence
    alone (`ALONE_S`): the voices it misses speak 1.1 s or less with no one else talking, too little for a window of
    their own. On constructed conversations of two or three real voices (`--conversations`), the count is exact on
    at least two thirds, false alarm stays under 3 % and DER under a third of the floor."""
    first, n = CONVERSATIONS
    doc = bench_speakers(argparse.Namespace(dir=str(DATA / "speakers"), out=str(tmp_path), layer_only=True,
                                            conversations=n, seed=first, manifest=str(DATA / "manifest.tsv")))
    summary = doc["summary"]
    assert summary["files"] >= 13 and summary["minutes"] >= 6
    assert summary["offline_no_overlap"] <= 17 and summary["live_no_overlap"] <= 22, summary
    assert summary["offline_no_overlap"] <= summary["one_no_overlap"] - 5, summary
    assert summary["live_no_overlap"] <= summary["one_no_overlap"] - 5, summary
    assert summary["offline"] < summary["one"] and summary["live"] < summary["one"], summary
    meetings = [r for r in doc["files"] if r["set"] == "meetings"]
    few = [r for r in meetings if r["speakers"] <= 3]  # a voice that says a sentence is a speaker
    assert sum(r["found_offline"] == r["speakers"] for r in few) >= 4, [(r["file"], r["found_offline"]) for r in few]
    assert sum(r["found_offline"] == r["speakers_alone"] for r in few) >= 5, \
        [(r["file"], r["found_offline"], r["speakers_alone"], ALONE_S) for r in few]
    talks = summary["sets"]["conversations"]
    assert talks["files"] == n and {r["speakers"] for r in doc["files"][-n:]} <= {2, 3}
    assert 3 * talks["count_offline"]["exact"] >= 2 * n, talks
    assert talks["false_alarm_offline"] < 3 and talks["offline_no_overlap"] < talks["one_no_overlap"] / 3, talks
    blocks = 3 * (2 + (2 + 3) + 1)  # meetings, conversations, all: a heading, a table, a blank line
    assert (tmp_path / "bench-speakers.md").read_text().count("\n") == blocks + (2 + summary["files"] + n)


def test_a_live_session_labels_each_final_and_keeps_a_voice_s_label(engine, conversation):
    """In process, the conversation fed through the WebRTC audio path at the speed the code allows
    (tests/live_feed.py) to a session with speaker labels: every final is labelled (in its final event, or by a
    `speaker` event after it), one label per voice, and a rename reaches the transcript and its downloads."""
    service = TranscriptionService(Settings(diarize=True), engine=engine)
    events: list[dict] = []

    def labelled() -> bool:
        finals = {e["segment"] for e in events if e["type"] == "final"}
        named = {e["segment"] for e in events if e["type"] == "final" and e.get("speaker")}
        return finals <= named | {e["segment"] for e in events if e["type"] == "speaker"}

    async def scenario():
        await service.start()
        session = service.open_session("s", lambda e: events.append(e.as_dict()))
        try:
            await feed(session, decode_file(conversation.path))
            await until(labelled, LABELLED_S, "a final never got its speaker")
            renamed = service.rename_speaker("s", "Speaker 1", "Linda")
            snapshot = service.snapshot("s")
        finally:
            service.close_session("s")
            await service.worker.stop()  # not service.stop(): the engine is the test session's
        return renamed, snapshot

    renamed, snapshot = asyncio.run(scenario())
    finals = [e for e in events if e["type"] == "final"]
    label = {e["segment"]: e["speaker"] for e in finals if "speaker" in e}
    for e in events:
        if e["type"] == "speaker":
            label[e["segment"]] = e["speaker"]
    assert len(finals) >= len(TURNS) and set(label) >= {f["segment"] for f in finals}
    voices = {f["segment"]: voice_of(conversation, f["start"], f["audio_end"]) for f in finals}
    by_voice: dict[str, set[str]] = {}
    for seg, who in voices.items():
        by_voice.setdefault(who, set()).add(label[seg])
    assert all(len(v) == 1 for v in by_voice.values()), by_voice
    assert len({next(iter(v)) for v in by_voice.values()}) == 4, by_voice
    assert renamed and label[finals[0]["segment"]] == "Linda"  # the rename reached the events too
    assert snapshot.entries[0].speaker == "Linda" and "Linda: " in fmt.to_text(snapshot.entries)


def test_a_live_line_is_cut_where_the_speaker_changes_inside_a_segment(engine):
    """Issue 39, live: two real voices, each heard alone first, then one after the other with 0.15 s between them,
    a pause too short for the VAD to end the segment. The final of that segment becomes two lines, the first
    voice's words and then the second's, each with the label its voice has elsewhere in the session, in the
    transcript the page renders; the segment's `speaker` event carries both turns. Nothing is lost on the way:
    decoded once, that segment read the first sentence and stopped, and "For a full hour he had paced up and down,
    waiting" was missing from the live transcript (the final is decoded again when its words leave its speech
    bare, `TranscriptionSession._stopped_short`)."""
    pause = np.zeros(round(0.8 * SAMPLE_RATE), np.float32)
    joined = [trimmed(voice("lj", 3)), np.zeros(round(0.15 * SAMPLE_RATE), np.float32), trimmed(voice("s1089", 3))]
    change = sum(a.size for a in [voice("lj", 0), pause, voice("s1089", 0), pause, *joined[:2]]) / SAMPLE_RATE
    audio = np.concatenate([voice("lj", 0), pause, voice("s1089", 0), pause, *joined, pause])
    segmenter = Segmenter(VADConfig())
    cut = [e for e in segmenter.feed(audio) + segmenter.flush() if isinstance(e, SegmentEnd)]
    assert any(e.start < change - 1 and e.end > change + 1 for e in cut), [(e.start, e.end) for e in cut]

    service = TranscriptionService(Settings(diarize=True), engine=engine)
    events: list[dict] = []

    def labelled() -> bool:
        finals = {e["segment"] for e in events if e["type"] == "final"}
        return len(finals) >= 3 and finals <= {e["segment"] for e in events if e["type"] == "speaker"} | {
            e["segment"] for e in events if e["type"] == "final" and e.get("speaker")}

    async def scenario():
        await service.start()
        session = service.open_session("s", lambda e: events.append(e.as_dict()))
        try:
            await feed(session, audio)
            await until(labelled, LABELLED_S, "a final never got its speaker")
            await asyncio.sleep(1.0)  # a later window of the last segment may still revise its turns
            return service.snapshot("s")
        finally:
            service.close_session("s")
            await service.worker.stop()  # not service.stop(): the engine is the test session's

    snapshot = asyncio.run(scenario())
    finals = [e for e in events if e["type"] == "final"]
    mixed = next(f["segment"] for f in finals if f["start"] < change - 1 < change + 1 < f["audio_end"])
    first = {e.speaker for e in snapshot.entries if e.end < change - 2 and e.start < 10}
    lines = [e for e in snapshot.entries if e.segment == mixed]
    said = " ".join(e.text for e in lines).lower()
    assert "printed book" in said and "full hour he had paced" in said, lines
    assert len(lines) >= 2 and len({e.speaker for e in lines}) == 2, lines
    assert lines[0].speaker in first and lines[0].end <= change + 0.5 <= lines[-1].end, lines
    assert any(len(e.get("turns", [])) > 1 for e in events if e["type"] == "speaker" and e["segment"] == mixed)
    page = ui.render_transcript(snapshot)
    assert all(html.escape(e.text) in page for e in lines), page
    assert page.index(html.escape(lines[0].text)) < page.index(html.escape(lines[-1].text))


# -- the HTTP API ------------------------------------------------------------------------------------------------


def test_diarized_json_names_known_speakers_through_the_openai_sdk(app, conversation):
    client = OpenAI(base_url=app.url + "/v1", api_key="unused")
    references = {who: voice(who, i)[: 8 * SAMPLE_RATE] for who, i in REFERENCE_CLIP.items()}
    with conversation.path.open("rb") as f:
        doc = client.audio.transcriptions.create(
            model="whisper", file=f, response_format="diarized_json",
            known_speaker_names=list(references), known_speaker_references=[data_url(a) for a in references.values()])
    assert doc.task == "transcribe" and doc.duration == pytest.approx(conversation.turns[-1][1] + PAUSE_S, abs=0.1)
    said: dict[str, str] = {}
    for seg in doc.segments:
        assert seg.type == "transcript.text.segment" and seg.start < seg.end and seg.text
        truth = voice_of(conversation, seg.start, seg.end)
        said.setdefault(truth, seg.speaker)
        assert seg.speaker == said[truth], (seg, truth)
    # the three with references carry their names; the fourth is a letter
    assert {k: v for k, v in said.items() if k in references} == {k: k for k in references}
    assert said["s1272"] not in references and len(said["s1272"]) == 1
    assert doc.text == " ".join(s.text for s in doc.segments)


def test_srt_vtt_and_verbose_json_carry_speakers_when_asked(app: App, short: Conversation) -> None:
    """`diarize=true` labels verbose_json's segments (a letter per voice, the same for all of a voice's
    segments), srt's cues ("A: ") and vtt's voice tags (`<v B>`); without it verbose_json has no speakers."""
    audio = short.path.read_bytes()

    def post(**fields: str) -> httpx.Response:
        r = httpx.post(app.url + "/v1/audio/transcriptions", files={"file": ("c.flac", audio, "audio/flac")},
                       data=fields, timeout=300)
        assert r.status_code == 200, r.text
        return r

    verbose = post(response_format="verbose_json", diarize="true").json()
    assert {s["speaker"] for s in verbose["segments"]} == {"A", "B", "C", "D"}
    said: dict[str, str] = {}
    for seg in verbose["segments"]:
        truth = voice_of(short, seg["start"], seg["end"])
        assert said.setdefault(truth, seg["speaker"]) == seg["speaker"], (seg, truth)
    srt = post(response_format="srt", diarize="true").text
    assert srt.count("\nA: ") >= 2
    assert all(text.partition(": ")[0] == said[voice_of(short, a, b)] for a, b, text in srt_cues(srt)), srt
    assert "<v B>" in post(response_format="vtt", diarize="true").text
    assert "speaker" not in str(post(response_format="verbose_json").json()["segments"])


def test_diarized_lines_hold_speech_and_every_path_cuts_them_where_the_speaker_changes(
        app: App, engine, short: Conversation, tmp_path: Path) -> None:
    """Issue 39, on a real meeting where one of Whisper's pieces holds four turns of two people ("Well actually just
    name it. Yeah, that's it. If you don't put in there, what's it username?").

    No `diarized_json` or `verbose_json` segment holds 1 s or more that neither the file path's VAD (faint speech
    included) heard as speech nor a word covers. A word covers at most a second of its time: alignment may stretch
    a last word over the pause after it, as in this meeting, whose segment ran 3.4 s into silence over "link.".

    One rule for every path: the `transcribe --diarize` command and the File tab give the lines of `diarized_json`,
    the same texts, the same speakers (letters there, "Speaker N" on the page) and the same times (the page shows
    tenths of a second). They labelled each piece whole, by the speaker of most of its span, before they asked for
    words. The same command run, given the short conversation too and `--speaker lj=FILE`, labels that file's
    lines by voice: the same label for all of a voice's lines, the named voice by its name, the three others by
    letters; `--speaker` without `--diarize` is refused."""
    path = DATA / "speakers" / "ami-ES2003b-0-30s.flac"
    segmenter = Segmenter(VADConfig(), faint=True)
    cut = [e for chunk in iter_file(path) for e in segmenter.feed(chunk)] + segmenter.flush()
    speech = [padded(e) for e in cut if isinstance(e, SegmentEnd)]

    def post(**fields: str) -> dict:
        r = httpx.post(app.url + "/v1/audio/transcriptions", data=fields, timeout=300,
                       files={"file": (path.name, path.read_bytes(), "audio/flac")})
        assert r.status_code == 200, r.text
        return r.json()

    verbose = post(response_format="verbose_json", diarize="true", **{"timestamp_granularities[]": "word"})
    api = [(s["start"], s["end"], s["speaker"], s["text"]) for s in post(response_format="diarized_json")["segments"]]
    assert len({s for _, _, s, _ in api}) == 2 and len(api) > 4, api  # the piece of four turns is cut
    heard = speech + [(w["start"], min(w["end"], w["start"] + 1.0)) for w in verbose["words"]]
    segments = [(s["start"], s["end"]) for s in verbose["segments"]] + [(a, b) for a, b, _, _ in api]
    for span in segments:
        assert coverage.longest_gap(span, heard, reach=0.0) < labels.TURN_PAUSE_S, (span, speech)

    reference = tmp_path / "lj.wav"
    sf.write(str(reference), voice("lj", REFERENCE_CLIP["lj"])[: 8 * SAMPLE_RATE], SAMPLE_RATE)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "realtime", "transcribe", *args], capture_output=True,
                              text=True, timeout=600, cwd=ROOT)

    both = cli("--diarize", "--speaker", f"lj={reference}", "--format", "json", str(path), str(short.path))
    assert both.returncode == 0, both.stderr
    meeting, conversation = _documents(both.stdout)
    lines = [(s["start"], s["end"], s["speaker"], s["text"]) for s in meeting["segments"]]
    assert [x[2:] for x in lines] == [x[2:] for x in api]
    assert [t for x in lines for t in x[:2]] == pytest.approx([t for x in api for t in x[:2]], abs=0.002)
    assert [s["id"] for s in meeting["segments"]] == list(range(len(lines)))
    said: dict[str, str] = {}
    for s in conversation["segments"]:
        truth = voice_of(short, s["start"], s["end"])
        said.setdefault(truth, s["speaker"])
        assert s["speaker"] == said[truth], (s, truth)
    assert said["lj"] == "lj" and len(set(said.values())) == 4, said  # the named voice, three letters
    assert all(len(v) == 1 for k, v in said.items() if k != "lj")
    bad = cli("--speaker", f"lj={reference}", str(short.path))
    assert bad.returncode == 2 and "--diarize" in bad.stderr

    async def file_tab() -> str:
        service = TranscriptionService(Settings(diarize=True), engine=engine)
        await service.start()
        try:
            return [text async for _, text, _ in ui.transcribe_upload(service, str(path))][-1]
        finally:
            await service.worker.stop()  # not service.stop(): the engine is the test session's

    page = re.findall(r'rt-time">(\d+):([\d.]+) → (\d+):([\d.]+)</span>.*?title="speaker">([^<]+)</span>'
                      r'<span class="rt-final">([^<]+)</span>', asyncio.run(file_tab()))
    assert [(who, html.unescape(text)) for *_, who, text in page] == [
        (f"Speaker {ord(s) - ord('A') + 1}", t) for _, _, s, t in api]
    shown = [t for a, b, c, d, _, _ in page for t in (60 * int(a) + float(b), 60 * int(c) + float(d))]
    assert shown == pytest.approx([t for x in api for t in x[:2]], abs=0.051)


def _documents(out: str) -> list[dict]:
    """The JSON documents the command printed one after another (one per file)."""
    decoder, docs, rest = json.JSONDecoder(), [], out.strip()
    while rest:
        doc, end = decoder.raw_decode(rest)
        docs.append(doc)
        rest = rest[end:].strip()
    return docs


@pytest.mark.parametrize("fields, code", [
    ({"response_format": "json", "diarize": "true"}, "invalid_diarize"),
    ({"response_format": "diarized_json", "stream": "true"}, "invalid_stream"),
    ({"response_format": "verbose_json", "known_speaker_names[]": "a", "known_speaker_references[]": "data:,"},
     "invalid_known_speakers"),
    ({"response_format": "diarized_json", "known_speaker_names[]": "a"}, "invalid_known_speakers"),
    ({"response_format": "diarized_json", "known_speaker_names[]": "a", "known_speaker_references[]": "x"},
     "invalid_known_speakers"),
])
def test_bad_speaker_fields_get_422(app: App, short: Conversation, fields: dict[str, str], code: str) -> None:
    r = httpx.post(app.url + "/v1/audio/transcriptions", data=fields, timeout=60,
                   files={"file": ("c.flac", short.path.read_bytes(), "audio/flac")})
    assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text


def test_a_reference_that_is_not_a_short_clip_gets_400(app: App, short: Conversation) -> None:
    long_clip = data_url(np.zeros(15 * SAMPLE_RATE, np.float32))
    for url in (long_clip, "data:audio/wav;base64,bm90IGF1ZGlv"):
        r = httpx.post(app.url + "/v1/audio/transcriptions", timeout=120,
                       files={"file": ("c.flac", short.path.read_bytes(), "audio/flac")},
                       data={"response_format": "diarized_json", "known_speaker_names[]": "a",
                             "known_speaker_references[]": url})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_speaker_reference", r.text


async def until(condition: Callable[[], bool], timeout: float, why: str) -> None:
    """Wait (on the running loop) until `condition()`; `timeout` seconds without it fail with `why`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.05)
