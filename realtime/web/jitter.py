"""How long the server's WebRTC peer holds received audio before handing it on.

aiortc keeps each received audio frame in its jitter buffer until four more frames have arrived behind it (Opus at
20 ms a packet), so that a listener's playout runs smooth through network jitter. Nothing here plays the
audio out: every frame held back is time added to the end of each utterance before the VAD hears it, and to every
final. `release_audio_promptly()` has the server's audio receivers hand on a frame as soon as the packet after it
has come (the least aiortc's buffer can do: it knows a frame is whole when the next one starts). Frames still come
out in order and whole; a lost or late packet holds the ones behind it as before; video receivers are untouched.
"""

from __future__ import annotations

AUDIO_PREFETCH = 1
"""Frames that must follow a received audio frame before it is handed on (aiortc's own: 4)."""

_patched = False


def release_audio_promptly() -> None:
    """From now on, audio receivers this process creates hand on each frame as soon as the next one arrives."""
    global _patched
    if _patched:
        return
    from aiortc import rtcrtpreceiver
    from aiortc.jitterbuffer import JitterBuffer

    class PromptJitterBuffer(JitterBuffer):
        def __init__(self, capacity: int, prefetch: int = 0, is_video: bool = False) -> None:
            super().__init__(capacity, prefetch if is_video else min(prefetch, AUDIO_PREFETCH), is_video)

    rtcrtpreceiver.JitterBuffer = PromptJitterBuffer  # type: ignore[misc]
    _patched = True
