"""The file path (realtime/live/transcribe.py) with the real engine: packing segments into windows, chunked encoding,
the recording around a lone short segment."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

from realtime.audio import SAMPLE_RATE, decode_file
from realtime.config import WINDOW_S, VADConfig
from realtime.engines import TranscribeOptions
from realtime.engines import embedded as embedded_module
from realtime.live.labels import speech_spans
from realtime.live.transcribe import (
    CONTEXT_AFTER_S,
    CONTEXT_BEFORE_S,
    CONTEXT_SPEECH_S,
    SegmentStream,
    _Packer,
    _Surroundings,
    transcribe_file,
)
from realtime.live.vad import SegmentEnd, SegmentStart

from real_speech import clips, compilation
from speech import long_recording, wer


@pytest.fixture(scope="module")
def recording(speech_dir):
    return long_recording(speech_dir / "three-minutes.wav", minutes=3)


@pytest.fixture(scope="module")
def per_segment(engine, recording) -> list:
    """The recording transcribed one VAD segment at a time (no packing), read by the tests below."""
    return asyncio.run(transcribe_file(recording.path, engine))


def test_windows_pack_segments_and_cut_errors(engine, recording, per_segment):
    windows = asyncio.run(transcribe_file(recording.path, engine, window_s=WINDOW_S))
    seg_wer = wer(recording.text, " ".join(e.text for e in per_segment))
    win_wer = wer(recording.text, " ".join(e.text for e in windows))
    print(f"\n{len(per_segment)} segments WER {seg_wer:.3f}; {len(windows)} windows WER {win_wer:.3f}")
    assert len(windows) * 3 <= len(per_segment)
    assert [e.segment for e in windows] == list(range(len(windows)))
    assert all(a.end <= b.start for a, b in itertools.pairwise(windows))
    assert windows[0].start == per_segment[0].start and windows[-1].end == per_segment[-1].end
    # neighbouring sentences give Whisper context: fewer errors, and nothing dropped. Which segments share a batch
    # depends on timing and int8 rounding on the batch, so the figures move by about a point between runs
    # (here: segments 9.9-11.2 %, windows 8.4-9.9 %); the margin stays below that gap
    assert win_wer <= seg_wer - 0.005, (seg_wer, win_wer)
    assert win_wer <= 0.11


def test_window_never_exceeds_its_length(engine, recording, per_segment):
    windows = asyncio.run(transcribe_file(recording.path, engine, window_s=9.0))
    assert len(per_segment) > len(windows) > len(per_segment) // 3
    # a window holds whole segments: its span starts and ends on segment boundaries
    starts, ends = {e.start for e in per_segment}, {e.end for e in per_segment}
    assert all(w.start in starts and w.end in ends for w in windows)


def test_a_full_window_ends_at_its_longest_pause_not_inside_a_phrase():
    """Seed 8848 of `bench file --random`: a window filled up inside a phrase of a speaker with a cold (two segments
    0.7 s apart, after a 5 s pause), and the next window, which began without the phrase's start, read "I have a cold
    so I probably sound quite" as "I also apply something". A full window ends at the longest pause between its
    segments once it holds `CUT_SHARE` of its length; the segments after it start the next window."""
    def segment(start: float, end: float) -> SegmentEnd:
        audio = np.zeros(round((end - start + 0.4) * SAMPLE_RATE), np.float32)
        return SegmentEnd(0, start, end, audio, False, start - 0.2)

    def packed(speech: list[tuple[float, float]]) -> list[tuple[float, float]]:
        packer = _Packer(28.0)
        windows = [w for a, b in speech for w in packer.add(segment(a, b))] + packer.flush()
        return [(w.start, w.end) for w in windows]

    assert packed([(0.0, 8.0), (9.0, 17.0), (18.0, 24.0), (29.0, 29.5), (30.2, 32.0), (33.0, 36.0)]) == [
        (0.0, 24.0), (29.0, 36.0)]
    # under CUT_SHARE of the window before its longest pause: it ends where it is full
    assert packed([(0.0, 8.0), (9.0, 13.0), (18.0, 25.0), (26.0, 33.0), (34.0, 36.0)]) == [(0.0, 33.0), (34.0, 36.0)]


def test_chunked_encoding_matches_one_call(engine, recording, monkeypatch):
    """Long clips are encoded a few at a time (MAX_ENCODE_FRAMES); the text must equal one big encoder call."""
    from realtime.audio import decode_file

    audio = decode_file(recording.path)
    clips, first = [], 0
    for i, (_, end) in enumerate(recording.spans):  # whole sentences, up to 26 s a clip
        start = recording.spans[first][0] - 0.2
        if i + 1 == len(recording.spans) or recording.spans[i + 1][1] + 0.2 - start > 26:
            clips.append(audio[int(start * 16000):int((end + 0.2) * 16000)])
            first = i + 1
    clips = clips[:5]
    assert len(clips) == 5 and all(20 < c.size / 16000 <= 26 for c in clips)
    limit = embedded_module.MAX_ENCODE_FRAMES
    chunked = engine._run_batch(clips, [TranscribeOptions(temperature=0.0)] * len(clips))
    monkeypatch.setattr(embedded_module, "MAX_ENCODE_FRAMES", 10 ** 9)
    whole = engine._run_batch(clips, [TranscribeOptions(temperature=0.0)] * len(clips))
    # over a third of MAX_ENCODE_FRAMES each: at most 2 clips per encoder call, so the 3 clips of a worker's
    # half of the batch take two calls whose outputs are joined
    assert all(3 * r.extra["encoder_frames"] > limit for r in chunked)
    # batch shapes change int8 rounding a little, so the texts agree closely rather than exactly
    for a, b in zip(chunked, whole, strict=True):
        assert len(a.text.split()) > 30 and wer(b.text, a.text) <= 0.12, (b.text, a.text)
    assert wer(" ".join(r.text for r in whole), " ".join(r.text for r in chunked)) <= 0.05


@pytest.mark.fast
def test_a_lone_short_segment_carries_the_recording_around_it_up_to_the_next_speech(tmp_path):
    """A falsetto phrase of which the VAD hears a fraction of a second, then JFK 0.4 s later: the short segment's
    window holds the audio around it (the recording's own samples), cut where JFK's speech starts; JFK's long
    segments carry none."""
    by_name = {c.name: c for c in clips()}
    comp = compilation([by_name["mfa-falsetto2.flac"], by_name["jfk.flac"]], tmp_path / "two.wav", gap=0.4, lead=0.0)
    audio = decode_file(comp.path)

    async def windows() -> list:
        return [w async for w in SegmentStream(comp.path, window_s=1.0)]  # one segment a window

    got = asyncio.run(windows())
    short = [w for w in got if w.end - w.start < CONTEXT_SPEECH_S]
    assert short and short[0].start < comp.spans[0][1] and all(w.context is None for w in got if w not in short)
    w = short[0]
    first, at = round(w.context_start * SAMPLE_RATE), round(w.audio_start * SAMPLE_RATE)
    assert np.array_equal(w.context, audio[first:first + w.context.size])
    assert np.array_equal(w.context[at - first:at - first + w.audio.size], w.audio)
    assert w.context_start == pytest.approx(max(0.0, w.audio_start - CONTEXT_BEFORE_S), abs=1e-3)
    context_end = w.context_start + w.context.size / SAMPLE_RATE
    following = got[got.index(w) + 1]
    assert context_end <= following.audio_start + 1e-3, "the context ran into the next segment's audio"
    assert context_end >= min(following.audio_start,
                              w.audio_start + w.audio.size / SAMPLE_RATE + CONTEXT_AFTER_S) - 0.05
    long = next(w for w in got if w.context is None)
    assert w.heard is w.context and long.heard is long.audio
    # what the speaker model windows of it is its speech with the VAD's padding, not shifted by the context before it
    (a, b), = speech_spans(w, VADConfig(pad_before_ms=200, pad_after_ms=200))
    assert (a, b) == (pytest.approx(w.start - 0.2, abs=1e-3), pytest.approx(w.end + 0.2, abs=1e-3))


@pytest.mark.fast
def test_a_short_segments_context_waits_for_faint_speech_and_no_audio_goes_twice():
    """The long recording's `mfa-thoughts`, a short segment, then `mfa-falsetto2`, faint speech that is a segment
    only once it ends, after the short one's context had been read: that context held the phrase, and so did the
    faint segment, and the window read it twice. A short segment waits while speech that may yet be a segment
    lies in its context, which ends where the next segment's audio starts; the next one's starts there."""
    rate = SAMPLE_RATE
    audio = (0.1 * np.sin(np.arange(8 * rate) / 5)).astype(np.float32)  # loud throughout

    def segment(i: int, start: float, end: float) -> SegmentEnd:
        a = start - 0.2
        return SegmentEnd(i, start, end, audio[round(a * rate):round((end + 0.2) * rate)], False, a)

    around = _Surroundings(VADConfig())
    around.read(audio)
    around.events([SegmentStart(0, 1.0), segment(0, 1.0, 1.5)])
    assert around.ready(hold=round(2.5 * rate)) == [], "faint speech from 2.5 s may be a segment in its context"
    around.events([SegmentStart(1, 2.7), segment(1, 2.7, 3.2)])
    (first, one), (second, two) = around.ready()
    assert one is not None and two is not None and (first.segment, second.segment) == (0, 1)
    ends = [start + piece.size / rate for piece, start in (one.around, one.unheard) if piece is not None]
    assert max(ends) == pytest.approx(second.audio_start), "the first's context ends where the next one's audio starts"
    assert two.around[1] == pytest.approx(second.audio_start), "and the next one's starts there"
