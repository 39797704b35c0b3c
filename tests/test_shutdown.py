"""SIGTERM on the launched app: new sessions refused, closed segments' finals delivered, then the process exits."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import uuid

import httpx

from realtime.client import stream_file

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
