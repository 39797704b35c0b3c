"""Streaming VAD on synthesized speech with known gaps (real Silero model)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from realtime.audio import decode_file
from realtime.vad import SegmentEnd, Segmenter, SegmentStart, VADConfig

from speech import SENTENCES, compose


def run(audio: np.ndarray, config: VADConfig | None = None, chunk: int = 320) -> list:
    seg = Segmenter(config)
    events = []
    for i in range(0, audio.size, chunk):
        events += seg.feed(audio[i : i + chunk])
    return events + seg.flush()


def test_segments_match_known_gaps(speech_dir):
    speech = compose(speech_dir / "gaps.wav", SENTENCES[:4], gaps=[0.8, 1.0, 1.5])
    events = run(decode_file(speech.path))
    ends = [e for e in events if isinstance(e, SegmentEnd)]
    starts = [e for e in events if isinstance(e, SegmentStart)]
    assert len(ends) == len(starts) == 4
    assert [e.segment for e in ends] == [0, 1, 2, 3]
    for end, (t0, t1) in zip(ends, speech.spans, strict=True):
        assert abs(end.start - t0) <= 0.2, (end.start, t0)
        assert abs(end.end - t1) <= 0.2, (end.end, t1)
        assert not end.forced
        # the audio handed on covers the speech plus padding
        assert end.audio.size / 16000 >= (t1 - t0)


def test_chunk_size_does_not_change_segments(speech_dir):
    speech = compose(speech_dir / "gaps2.wav", SENTENCES[4:6], gaps=[1.0])
    audio = decode_file(speech.path)
    a = [(e.start, e.end) for e in run(audio, chunk=320) if isinstance(e, SegmentEnd)]
    b = [(e.start, e.end) for e in run(audio, chunk=4801) if isinstance(e, SegmentEnd)]
    assert a == b and len(a) == 2


def test_speech_without_pauses_is_split_at_max_length(speech_dir):
    speech = compose(speech_dir / "monologue.wav", SENTENCES, gaps=0.1)
    audio = decode_file(speech.path)
    config = VADConfig(max_segment_s=6.0)
    ends = [e for e in run(audio, config) if isinstance(e, SegmentEnd)]
    total_speech = speech.spans[-1][1] - speech.spans[0][0]
    assert len(ends) >= int(total_speech // 6.0)
    forced = [e for e in ends if e.forced]
    assert forced, "a monologue longer than max_segment_s must be split"
    for e in ends:
        assert e.end - e.start <= 6.0 + 0.05
    # consecutive segments are contiguous: nothing of the speech is lost at a forced cut
    for a, b in itertools.pairwise(ends):
        if a.forced:
            assert b.start == pytest.approx(a.end, abs=1e-6)
    # cut at a quiet point: energy around each forced cut is well below the speech's typical energy
    frame = 512
    rms = np.sqrt(np.convolve(audio**2, np.ones(frame) / frame, mode="same"))
    speech_rms = np.median(rms[int(speech.spans[0][0] * 16000) : int(speech.spans[-1][1] * 16000)])
    for e in forced:
        assert rms[int(e.end * 16000)] < speech_rms, (e.end, rms[int(e.end * 16000)], speech_rms)


@pytest.mark.parametrize("kind", ["silence", "white-noise", "hum"])
def test_silence_and_noise_give_no_segment(kind):
    rng = np.random.default_rng(1)
    n = 16000 * 8
    audio = {
        "silence": np.zeros(n, dtype=np.float32),
        "white-noise": (0.05 * rng.standard_normal(n)).astype(np.float32),
        "hum": (0.2 * np.sin(2 * np.pi * 100 * np.arange(n) / 16000)).astype(np.float32),
    }[kind]
    assert run(audio) == []


def test_short_burst_is_dropped():
    rng = np.random.default_rng(2)
    audio = np.zeros(16000 * 3, dtype=np.float32)
    audio[16000 : 16000 + 1600] = 0.5 * rng.standard_normal(1600)  # a 100 ms click
    assert [e for e in run(audio) if isinstance(e, SegmentEnd)] == []


def test_invalid_config_is_refused():
    with pytest.raises(ValueError):
        VADConfig(threshold=0.3, neg_threshold=0.5)
    with pytest.raises(ValueError):
        VADConfig(max_segment_s=45)
