"""End of turn: whether a speaker who has paused has finished, judged from the audio.

`TurnModel` runs Pipecat's Smart Turn v3.2 (an int8 ONNX classifier on a Whisper-tiny encoder, BSD-2), whose weights
ship inside the `pipecat-ai` wheel: the file is read from the installed distribution, and nothing of Pipecat is
imported. It reads the last `WINDOW_S` of a turn's audio, ending at the pause, and gives the probability that the
turn is complete. One model serves every session.

A session's `TurnConfig` (realtime/config.py) holds OpenAI's `semantic_vad` eagerness: how long a pause the model
judged incomplete is waited through before the segment closes anyway.
"""

from __future__ import annotations

import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE
from .vad import WINDOW, one_thread_session

DISTRIBUTION = "pipecat-ai"
MODEL_FILE = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
WINDOW_S = 8
"""Seconds of audio the model reads (zeros before a shorter turn)."""
LEAD_S = 0.064
"""A pause is judged this long before it reaches the turn's `judge_after_ms`, on its audio drawn out to that length
(`drawn_out`), so that the verdict is there when the pause is: the model's call takes about as long."""


@functools.cache
def model_path() -> Path | None:
    """The Smart Turn ONNX file inside the installed `pipecat-ai` distribution, or None."""
    try:
        path = Path(str(metadata.distribution(DISTRIBUTION).locate_file(MODEL_FILE)))
    except metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def available() -> bool:
    return model_path() is not None


def drawn_out(audio: np.ndarray, pause_s: float, to_s: float, window: int = WINDOW) -> np.ndarray:
    """A turn's `audio`, whose pause has lasted `pause_s`, as it would be once the pause lasts `to_s`: its last
    `window` samples (the pause's own sound: a VAD window) repeated to that length."""
    need = round((to_s - pause_s) * SAMPLE_RATE)
    if need <= 0 or audio.size == 0:
        return audio
    return np.concatenate([audio, np.resize(audio[-window:], need)])


class TurnModel:
    """Smart Turn v3.2 on onnxruntime, one thread a call."""

    _shared: TurnModel | None = None
    _lock = threading.Lock()

    def __init__(self, path: Path | None = None) -> None:
        from faster_whisper.feature_extractor import FeatureExtractor

        path = path or model_path()
        if path is None:
            raise RuntimeError(f"end of turn needs the {DISTRIBUTION} package (pip install {DISTRIBUTION})")
        self._session = one_thread_session(path)
        self._features = FeatureExtractor(feature_size=80)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="end-of-turn")
        """The thread the sessions' judgements run on, one after another."""

    @classmethod
    def shared(cls) -> TurnModel:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def complete(self, audio: np.ndarray) -> float:
        """The probability that the turn whose 16 kHz audio ends with `audio` is complete."""
        n = WINDOW_S * SAMPLE_RATE
        x = np.asarray(audio[-n:], dtype=np.float32)
        if x.size < n:
            x = np.concatenate([np.zeros(n - x.size, dtype=np.float32), x])
        x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)  # as the model's Whisper feature extractor normalises
        features = self._features(x, padding=0)[np.newaxis].astype(np.float32)
        out = self._session.run(None, {"input_features": features})[0]
        return float(np.asarray(out).reshape(-1)[0])
