"""Write test audio in other containers and codecs with PyAV (no ffmpeg binary needed)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

FORMATS = {  # suffix: (container format, codec, sample rate, channels)
    "flac": ("flac", "flac", 44100, 2),
    "mp3": ("mp3", "libmp3lame", 44100, 2),
    "ogg": ("ogg", "libopus", 48000, 1),
    "webm": ("webm", "libopus", 48000, 2),
    "m4a": ("mp4", "aac", 22050, 1),
}


def write(path: Path, audio16k: np.ndarray, suffix: str) -> Path:
    fmt, codec, rate, channels = FORMATS[suffix]
    resampled = np.interp(np.arange(0, audio16k.size, 16000 / rate), np.arange(audio16k.size), audio16k)
    pcm = np.repeat(resampled[None, :], channels, axis=0).astype(np.float32)
    out = path.with_suffix("." + suffix)
    with av.open(str(out), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.layout = "stereo" if channels == 2 else "mono"
        layout = stream.layout.name
        frame_size = 960 if codec == "libopus" else 1024
        sample_fmt = stream.codec_context.format.name
        for i in range(0, pcm.shape[1], frame_size):
            chunk = pcm[:, i : i + frame_size]
            if chunk.shape[1] < frame_size and codec in ("libopus", "aac"):
                chunk = np.pad(chunk, ((0, 0), (0, frame_size - chunk.shape[1])))
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout=layout)
            frame.sample_rate = rate
            frame.pts = i
            frame.time_base = Fraction(1, rate)
            if sample_fmt != "fltp":
                frame = av.AudioResampler(format=sample_fmt, layout=layout, rate=rate).resample(frame)[0]
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out
