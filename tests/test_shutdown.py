"""SIGTERM on the launched app: new sessions refused, closed segments' finals delivered, spooled uploads removed,
then the process exits."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import soundfile as sf

from realtime.audio import decode_file
from realtime.bench.client import stream_file

from conftest import launch, stop
from speech import SENTENCES, compose


def test_sigterm_delivers_closed_segments_then_exits(tmp_path, speech_dir):
    app = launch(tmp_path)
    speech = compose(speech_dir / "shutdown.wav", SENTENCES[:3], gaps=[1.2, 1.2], tail=0.5)
    first_final = threading.Event()
    refused: list[httpx.Response] = []

    def on_event(event: dict) -> None:
        if event["type"] == "final" and not first_final.is_set():
            first_final.set()
            app.proc.send_signal(signal.SIGTERM)
            try:  # an offer after SIGTERM is refused while the app drains
                refused.append(httpx.post(f"{app.url}/webrtc/offer", json={
                    "sdp": "v=0", "type": "offer", "webrtc_id": uuid.uuid4().hex}, timeout=10))
            except httpx.HTTPError:
                pass

    try:
        result = asyncio.run(stream_file(app.url, speech.path, ice_loopback=True, on_event=on_event,
                                         settle_timeout=20))
        try:
            code = app.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the app did not exit after SIGTERM") from None
    finally:
        stop(app)
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled once it has stopped
    events = result.events
    assert first_final.is_set()
    closed = [e for e in events if e["type"] == "closed"]
    assert closed and closed[0]["reason"] == "shutdown", events[-5:]
    assert not [e for e in events if e["type"] == "error"]
    for r in refused:
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    log = app.log.read_text()
    assert "drained: 0 finals left undelivered" in log, log[-2000:]


def test_sigterm_removes_spooled_uploads(tmp_path, speech_dir):
    """Uploads being received, transcribed and streamed when SIGTERM comes: their spool files are all gone when the
    process has exited (the spool is the app's TMPDIR)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    app = launch(tmp_path, env={"TMPDIR": str(spool)})
    speech = compose(speech_dir / "shutdown-upload.wav", SENTENCES[:4], gaps=[1.0, 1.0, 1.0])
    audio = decode_file(speech.path)
    long = tmp_path / "long.wav"
    sf.write(long, np.concatenate([audio] * 5), 16000, subtype="PCM_16")  # about 70 s: seconds to transcribe
    data = long.read_bytes()
    outcomes: dict[str, str] = {}

    def slowly() -> Iterator[bytes]:  # an upload still arriving
        for i in range(0, len(data), 32768):
            yield data[i : i + 32768]
            time.sleep(0.25)

    def post(name: str, **kw: Any) -> None:
        try:
            r = httpx.post(f"{app.url}/v1/audio/transcriptions", timeout=60, **kw)
            outcomes[name] = str(r.status_code)
        except httpx.HTTPError as exc:
            outcomes[name] = type(exc).__name__

    def spooled() -> list[Path]:
        return sorted(spool.glob("realtime-api-*/upload*"))

    clients = [
        threading.Thread(target=post, args=("receiving",),
                         kwargs={"content": slowly(), "headers": {"content-type": "audio/wav"}}),
        threading.Thread(target=post, args=("transcribing",), kwargs={"files": {"file": ("a.wav", data)}}),
        threading.Thread(target=post, args=("streaming",), kwargs={"files": {"file": ("b.wav", data)},
                                                                   "data": {"stream": "true"}}),
    ]
    try:
        for t in clients:
            t.start()
        deadline = time.monotonic() + 30
        while len(spooled()) < 3 or sum(p.stat().st_size == len(data) for p in spooled()) < 2:
            assert time.monotonic() < deadline, f"the uploads did not spool: {spooled()} {outcomes}"
            time.sleep(0.1)
        assert not outcomes, f"an upload ended before SIGTERM: {outcomes}"
        app.proc.send_signal(signal.SIGTERM)
        code = app.proc.wait(60)
        for t in clients:
            t.join(60)
    finally:
        stop(app)
    assert code in (0, -signal.SIGTERM)
    assert len(outcomes) == 3, outcomes
    assert not list(spool.glob("realtime-api-*")), f"left behind: {list(spool.rglob('*'))}"
