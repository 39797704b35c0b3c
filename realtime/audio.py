"""Audio in: decoding files and converting live frames to 16 kHz mono float32.

Everything downstream of this module (VAD, engines) sees only 16 kHz mono float32 in [-1, 1].
"""

from __future__ import annotations

import io
import struct
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000


class AudioDecodeError(ValueError):
    """A file or upload that is not decodable audio (corrupt, empty, or another kind of file)."""


def to_float32(samples: np.ndarray) -> np.ndarray:
    """Integer or float PCM of any shape (channels first or last) to mono float32 in [-1, 1]."""
    a = np.asarray(samples)
    if a.dtype == np.int16:
        a = a.astype(np.float32) / 32768.0
    elif a.dtype == np.int32:
        a = a.astype(np.float32) / 2147483648.0
    elif a.dtype == np.uint8:
        a = (a.astype(np.float32) - 128.0) / 128.0
    else:
        a = a.astype(np.float32, copy=False)
    if a.ndim == 2:
        # fastrtc hands (channels, n); soundfile-style arrays are (n, channels)
        a = a.mean(axis=0) if a.shape[0] <= a.shape[1] else a.mean(axis=1)
    return a.astype(np.float32, copy=False)


class FrameConverter:
    """Converts live frames of any rate and layout to 16 kHz mono float32, keeping resampler state."""

    def __init__(self) -> None:
        self._rate: int | None = None
        self._resampler: object | None = None

    def __call__(self, sample_rate: int, samples: np.ndarray) -> np.ndarray:
        mono = to_float32(samples).reshape(-1)
        if sample_rate == SAMPLE_RATE:
            return mono
        if sample_rate != self._rate:
            import soxr

            self._rate = sample_rate
            self._resampler = soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32")
        return self._resampler.resample_chunk(mono)  # type: ignore[union-attr]


def iter_file(path: str | Path, chunk_seconds: float = 10.0) -> Iterator[np.ndarray]:
    """Decode an audio file as a stream of 16 kHz mono float32 chunks (bounded memory for long files)."""
    import av

    path = Path(path)
    if not path.exists():
        raise AudioDecodeError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise AudioDecodeError(f"{path}: file is empty")
    try:
        container = av.open(str(path))
    except Exception as exc:  # PyAV raises many error types for non-audio input
        raise AudioDecodeError(f"{path}: not a readable audio file ({_reason(exc)})") from exc
    with container:
        if not container.streams.audio:
            raise AudioDecodeError(f"{path}: contains no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunk_len = int(chunk_seconds * SAMPLE_RATE)
        pending: list[np.ndarray] = []
        pending_len = 0
        total = 0
        try:
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    data = out.to_ndarray().reshape(-1)
                    pending.append(data)
                    pending_len += data.size
                if pending_len >= chunk_len:
                    chunk = np.concatenate(pending)
                    total += chunk.size
                    yield chunk
                    pending, pending_len = [], 0
            for out in resampler.resample(None):
                pending.append(out.to_ndarray().reshape(-1))
        except AudioDecodeError:
            raise
        except Exception as exc:
            raise AudioDecodeError(f"{path}: corrupt audio ({_reason(exc)})") from exc
        if pending:
            chunk = np.concatenate(pending)
            total += chunk.size
            if chunk.size:
                yield chunk
        if total == 0:
            raise AudioDecodeError(f"{path}: no audio samples")


def decode_file(path: str | Path) -> np.ndarray:
    """Decode a whole audio file to 16 kHz mono float32."""
    return np.concatenate(list(iter_file(path)))


def wav_bytes(audio: np.ndarray, sample_rate: int = SAMPLE_RATE, exact: bool = False) -> bytes:
    """16-bit PCM mono WAV in memory; `exact`, 32-bit float samples as they are (WAVE_FORMAT_IEEE_FLOAT)."""
    if exact:
        data = np.ascontiguousarray(audio, dtype="<f4").tobytes()
        fmt = struct.pack("<HHIIHH", 3, 1, sample_rate, sample_rate * 4, 4, 32)
        fact = struct.pack("<I", audio.size)
        body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"fact" + struct.pack("<I", 4) + fact + \
            b"data" + struct.pack("<I", len(data)) + data
        return b"RIFF" + struct.pack("<I", len(body)) + body
    pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def _reason(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def quietest_frame(audio: np.ndarray, start: int, stop: int, frame: int = 320) -> int:
    """The first sample of the quietest `frame` samples (20 ms) of `audio` from `start` on, in whole frames up to
    `stop` (one frame at least); `start` where the audio holds less than that."""
    count = max(1, (stop - start) // frame)
    part = audio[start:start + count * frame].astype(np.float64)
    if part.size < count * frame:
        return start
    return start + int(np.argmin(np.square(part).reshape(count, frame).mean(axis=1))) * frame


def split_at_quiet(audio: np.ndarray, max_s: float = 30.0, search_s: float = 5.0) -> list[np.ndarray]:
    """Cut audio into pieces of at most `max_s`, each cut in the middle of the quietest 20 ms in the last
    `search_s` (`quietest_frame`)."""
    max_len, search, frame = int(max_s * SAMPLE_RATE), int(search_s * SAMPLE_RATE), 320
    pieces: list[np.ndarray] = []
    start = 0
    while audio.size - start > max_len:
        cut = quietest_frame(audio, start + max_len - search, start + max_len, frame) + frame // 2
        pieces.append(audio[start:cut])
        start = cut
    pieces.append(audio[start:])
    return pieces
