"""Each session's audio kept beside its transcript (`--keep-audio`): Ogg Opus, written as it arrives (an upload's
once it is transcribed).

The file grows by a page at a time, a fraction of a second each, so a process killed mid-session leaves its audio
up to about that moment, decodable. Files are named by a hash of the session id (ids come from clients). Encoding
runs on a thread of its own.
"""

from __future__ import annotations

import hashlib
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE

log = logging.getLogger(__name__)

CHUNK_S = 0.25
"""Audio handed to the encoder at a time, and the Ogg page's length."""
BUFFER_BYTES = 1024
"""What the muxer holds before it writes (a quarter of a second of Opus)."""
LAG_S = 2 * CHUNK_S + 0.1
"""How far the file may be behind the audio heard: a chunk gathering, a page filling, the encoder's look-ahead."""


def audio_path(folder: Path, session_id: str) -> Path:
    return folder / f"{hashlib.sha256(session_id.encode()).hexdigest()[:32]}.ogg"


class _File:
    """One session's Ogg Opus file, open while the session lasts."""

    def __init__(self, path: Path) -> None:
        import av

        path.parent.mkdir(parents=True, exist_ok=True)
        self._sink = open(path, "wb", buffering=0)
        self._out: Any = av.open(self._sink, "w", format="ogg", buffer_size=BUFFER_BYTES,
                                 options={"page_duration": str(int(CHUNK_S * 1_000_000))})
        self._stream: Any = self._out.add_stream("libopus", rate=SAMPLE_RATE, layout="mono")

    def write(self, samples: np.ndarray | None) -> None:
        import av

        if samples is not None:
            frame = av.AudioFrame.from_ndarray(samples.astype(np.float32)[None, :], format="flt", layout="mono")
            frame.sample_rate = SAMPLE_RATE
        for packet in self._stream.encode(frame if samples is not None else None):
            self._out.mux(packet)

    def close(self) -> None:
        try:
            self.write(None)
            self._out.close()
        finally:
            self._sink.close()


class AudioKeeper:
    """The audio of live sessions into `folder`, one file each."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="history-audio")
        self._files: dict[str, _File] = {}
        self._buffers: dict[str, list[np.ndarray]] = {}

    def path(self, session_id: str) -> Path:
        return audio_path(self.folder, session_id)

    def listen(self, session_id: str) -> Any:
        """The callback that takes the session's audio (16 kHz mono float32), as it arrives."""
        self._buffers[session_id] = []

        def heard(samples: np.ndarray) -> None:
            buffer = self._buffers.get(session_id)
            if buffer is None:
                return
            buffer.append(samples)
            if sum(b.size for b in buffer) >= CHUNK_S * SAMPLE_RATE:
                chunk = np.concatenate(buffer)
                buffer.clear()
                self._pool.submit(self._write, session_id, chunk)

        return heard

    def _write(self, session_id: str, chunk: np.ndarray | None) -> None:
        try:
            file = self._files.get(session_id)
            if file is None and chunk is not None:
                file = self._files[session_id] = _File(self.path(session_id))
            if file is None:
                return
            if chunk is not None:
                file.write(chunk)
            else:
                self._files.pop(session_id, None)
                file.close()
        except Exception:  # a full disk: the transcript goes on without its audio
            log.exception("the audio of session %s could not be kept", session_id)

    def keep_file(self, session_id: str, path: Path) -> None:
        """A recording's audio (an upload) kept as a session's: decoded now, encoded on the keeper's thread."""
        from ..audio import AudioDecodeError, decode_file

        try:
            audio = decode_file(path)
        except (AudioDecodeError, OSError) as exc:
            log.warning("the audio of session %s could not be kept: %s", session_id, exc)
            return
        step = int(CHUNK_S * SAMPLE_RATE) * 40
        for start in range(0, audio.size, step):
            self._pool.submit(self._write, session_id, audio[start:start + step])
        self._pool.submit(self._write, session_id, None)

    def end(self, session_id: str) -> None:
        buffer = self._buffers.pop(session_id, None)
        if buffer:
            self._pool.submit(self._write, session_id, np.concatenate(buffer))
        self._pool.submit(self._write, session_id, None)

    def forget(self, session_id: str) -> None:
        """Delete a session's audio (its transcript was deleted)."""
        self._pool.submit(lambda: self.path(session_id).unlink(missing_ok=True))

    def close(self) -> None:
        for session_id in list(self._buffers):
            self.end(session_id)
        self._pool.shutdown(wait=True)
