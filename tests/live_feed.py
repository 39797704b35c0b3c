"""A live session fed at the speed the code allows, its audio on the path a browser's takes.

Live finals depend on stream time, not on the wall clock: the VAD closes a segment after so much silence *in the
stream*. So a test of live accuracy need not play its recording in real time. `feed` sends the audio through the
Opus round trip of WebRTC (aiortc's own encoder and decoder, 48 kHz stereo, 20 ms packets), resamples it as fastrtc
hands frames to the app's handler, converts it with the handler's `FrameConverter`, and feeds the session as fast
as that allows, on a clock that is the stream's own time (the partial schedule counts stream seconds). The
transport itself is tested elsewhere over real WebRTC in real time (tests/test_stream.py).
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from realtime.audio import SAMPLE_RATE, FrameConverter
from realtime.live.session import TranscriptionSession

FRAME = 320
"""20 ms at 16 kHz: the frames the test clients (and browsers) send."""
SETTLE_S = 300.0
"""How long the last finals may take after the audio ends: reached only when something is wrong."""


def opus_round_trip(audio: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(sample rate, samples) as the app's handler receives `audio` (16 kHz float32) sent over WebRTC."""
    import av
    from aiortc.codecs.opus import OpusDecoder, OpusEncoder
    from aiortc.jitterbuffer import JitterFrame

    encoder, decoder = OpusEncoder(), OpusDecoder()
    resampler: Any = None
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    pcm = np.pad(pcm, (0, -pcm.size % FRAME))
    for start in range(0, pcm.size, FRAME):
        frame = av.AudioFrame.from_ndarray(pcm[start:start + FRAME].reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = start
        frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
        payloads, timestamp = encoder.encode(frame)
        for payload in payloads:
            for decoded in decoder.decode(JitterFrame(data=payload, timestamp=timestamp)):
                if resampler is None:  # fastrtc's StreamHandler.resample, to the handler's 16 kHz mono
                    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE,
                                                  frame_size=decoded.samples)
                for out in resampler.resample(decoded):
                    yield out.sample_rate, out.to_ndarray()


class StreamClock:
    """The session's clock: seconds of audio fed so far."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def feed(session: TranscriptionSession, audio: np.ndarray, *, opus: bool = True, tail_s: float = 2.0,
               await_partials: bool = False) -> None:
    """Feed `audio` and `tail_s` of silence to `session` as the WebRTC handler would, as fast as the code allows
    (the event loop gets a turn after every frame, so the worker keeps taking jobs), then wait until every segment
    the VAD opened has its final or error. With `await_partials` no audio is fed while a partial is on its way,
    so that its answer (and a streaming engine's deltas) lands while its segment is open, as it does for someone
    who goes on speaking; fed faster, a segment closes before its partials come back."""
    clock = StreamClock()
    session.clock = clock
    convert = FrameConverter()
    padded = np.concatenate([audio.astype(np.float32), np.zeros(int(tail_s * SAMPLE_RATE), np.float32)])
    frames = opus_round_trip(padded) if opus else ((SAMPLE_RATE, padded[i:i + FRAME])
                                                   for i in range(0, padded.size, FRAME))
    for rate, samples in frames:
        chunk = convert(rate, samples)
        clock.now += chunk.size / SAMPLE_RATE
        session.feed(chunk)
        await asyncio.sleep(0)
        while await_partials and session.worker.has_partial(session.id):
            await asyncio.sleep(0.005)
    await settled(session)


async def settled(session: TranscriptionSession, timeout: float = SETTLE_S) -> None:
    """Until no segment is open and no final is pending."""
    deadline = time.monotonic() + timeout
    while session.segmenter.announced or session.pending_finals:
        assert time.monotonic() < deadline, "a segment never got its final"
        await asyncio.sleep(0.05)
