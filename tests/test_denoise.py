"""The denoiser a Realtime session's `noise_reduction` runs (realtime/live/denoise.py), on real audio: its output keeps
step with its input, and the VAD hears it while segments carry the audio as it came."""

from __future__ import annotations

import numpy as np
import pytest

from realtime.audio import SAMPLE_RATE, decode_file
from realtime.bench.denoise import noise_bed, noisy
from realtime.live.denoise import FAR_FIELD_LIMIT_DB, Denoiser
from realtime.live.vad import SegmentEnd, Segmenter

from real_speech import DATA

pytestmark = pytest.mark.fast
FRAME = SAMPLE_RATE // 50


def through(d: Denoiser, audio: np.ndarray, flush_at: int | None = None) -> np.ndarray:
    out = []
    for i in range(0, audio.size, FRAME):
        out.append(d.process(audio[i:i + FRAME]))
        if flush_at is not None and i <= flush_at < i + FRAME:
            out.append(d.flush())
    out.append(d.flush())
    return np.concatenate(out)


def lag(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.size, b.size, 3 * SAMPLE_RATE)
    return int(np.argmax(np.correlate(a[:n], b[:n], mode="full"))) - (n - 1)


def db(x: np.ndarray) -> float:
    return 10 * float(np.log10(np.mean(x.astype(np.float64) ** 2)))


def test_the_denoised_stream_keeps_step_with_its_input_and_quiets_noise():
    """A real clip fed 20 ms at a time, flushed in the middle (a commit) and at the end: as many samples out as in,
    in step (no lag, before and after the flush). A meeting room's noise alone: `near_field` takes it down by more
    than `far_field` may (`FAR_FIELD_LIMIT_DB`)."""
    speech = decode_file(DATA / "jfk.flac")
    out = through(Denoiser(), speech, flush_at=4 * SAMPLE_RATE)
    assert out.size == speech.size
    assert lag(out, speech) == 0
    assert lag(out[5 * SAMPLE_RATE:], speech[5 * SAMPLE_RATE:]) == 0
    noise = noise_bed()[:8 * SAMPLE_RATE]
    near = db(noise) - db(through(Denoiser("near_field"), noise)[SAMPLE_RATE:])
    far = db(noise) - db(through(Denoiser("far_field"), noise)[SAMPLE_RATE:])
    assert near > FAR_FIELD_LIMIT_DB + 3 and far <= FAR_FIELD_LIMIT_DB + 1, (near, far)


def test_the_vad_hears_the_denoised_copy_and_segments_carry_the_audio():
    """Three real clips under noise at the speech's level: fed with its denoised copy as what Silero hears, the
    segmenter cuts where it cuts the denoised audio alone, and each segment's audio is the noisy input itself."""
    clips = [decode_file(DATA / n) for n in ("jfk.flac", "ljspeech-LJ001-0004.flac", "timit-LDC93S1.flac")]
    gap = np.zeros(SAMPLE_RATE, dtype=np.float32)
    audio = noisy(np.concatenate([gap, clips[0], gap, clips[1], gap, clips[2], gap]), noise_bed(), 0.0)
    heard = through(Denoiser(), audio)

    def ends(seg: Segmenter, feeds: list[tuple[np.ndarray, np.ndarray | None]]) -> list[SegmentEnd]:
        events = [e for a, h in feeds for e in seg.feed(a, h)] + seg.flush()
        return [e for e in events if isinstance(e, SegmentEnd)]

    chunks = range(0, audio.size, FRAME)
    both = ends(Segmenter(), [(audio[i:i + FRAME], heard[i:i + FRAME]) for i in chunks])
    alone = ends(Segmenter(), [(heard[i:i + FRAME], None) for i in chunks])
    assert both and [(e.start, e.end) for e in both] == [(e.start, e.end) for e in alone]
    for e in both:
        first = round(e.audio_start * SAMPLE_RATE)
        assert np.array_equal(e.audio, audio[first:first + e.audio.size])
