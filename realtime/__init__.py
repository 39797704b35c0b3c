"""Real-time speech transcription: browser microphone over WebRTC, Silero VAD, Whisper engines.

The public API: `Settings`, `TranscriptionService` and its live events (`realtime.live.events`), the engine
contract (`Engine`, `EngineBase`, `TranscribeOptions`, `Transcription`, `create_engine`, `register`),
`Segmenter` / `VADConfig` for streaming VAD, and `stream_file`, a WebRTC client.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import Settings
from .engines import (
    Engine,
    EngineBase,
    EngineError,
    EngineUnavailable,
    TranscribeOptions,
    Transcription,
    create_engine,
    register,
)
from .live.vad import SegmentEnd, Segmenter, SegmentStart, VADConfig

if TYPE_CHECKING:
    from .bench.client import stream_file
    from .live.service import TranscriptionService

__version__ = "0.1.0"

_LAZY = {"TranscriptionService": "service", "stream_file": "client"}
"""Exported names whose modules load heavier dependencies (the VAD model, aiortc) only when asked for."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Engine",
    "EngineBase",
    "EngineError",
    "EngineUnavailable",
    "SegmentEnd",
    "SegmentStart",
    "Segmenter",
    "Settings",
    "TranscribeOptions",
    "Transcription",
    "TranscriptionService",
    "VADConfig",
    "__version__",
    "create_engine",
    "register",
    "stream_file",
]
