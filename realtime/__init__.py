"""Real-time speech transcription: browser microphone over WebRTC, Silero VAD, Whisper engines.

The public API: `Settings`, `TranscriptionService`, the engine interface (`Engine`, `TranscribeOptions`,
`Transcription`), `Segmenter` / `VADConfig` for streaming VAD, and `stream_file` for a WebRTC client.
"""

from .config import Settings
from .engines import Engine, EngineError, TranscribeOptions, Transcription, create_engine
from .vad import SegmentEnd, Segmenter, SegmentStart, VADConfig

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "EngineError",
    "SegmentEnd",
    "SegmentStart",
    "Segmenter",
    "Settings",
    "TranscribeOptions",
    "Transcription",
    "VADConfig",
    "__version__",
    "create_engine",
]
