"""SIGTERM on the launched app: new sessions refused, closed segments' finals delivered, spooled uploads removed,
then the process exits.

One shutdown, read by both tests (`drained`). The app runs the remote engine on a fake endpoint (tests/endpoints.py)
that answers one request at a time (--remote-max-in-flight 1), so the test decides what is in flight when the
signal comes instead of hoping: the endpoint holds the first window of an upload, which keeps a live segment's
final (queued behind it on the one worker) undelivered; a second upload waits behind them and a third is still
arriving (its client holds the second half of its body). After SIGTERM the app refuses an offer while it drains;
then the endpoint lets the held window go, the final is decoded and delivered, and the session gets `closed`. The
uploads' later windows get slow answers, so they are still being transcribed when the app exits.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
from endpoints import FakeEndpoint
from live_peer import SETTLE_S, Peer

from realtime.audio import SAMPLE_RATE, decode_file

from conftest import App, launch, stop
from speech import SENTENCES, compose

WINDOW_MIN_S = 6.0
"""Requests at least this long (an upload's packed windows) take the endpoint's script; a live sentence's final
and partial are shorter and are answered at once."""


@dataclass
class Shutdown:
    app: App
    peer: Peer
    refused: httpx.Response
    code: int | None
    spool: Path
    outcomes: dict[str, str]
    """How each upload ended: its status, or the error its client got."""
    at_signal: tuple[list[Path], dict[str, str]]
    """The spooled uploads and the uploads that had ended when the signal was sent."""


def _until(done: Any, what: str, timeout: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory, speech_dir: Path) -> Iterator[Shutdown]:
    tmp = tmp_path_factory.mktemp("shutdown")
    spool = tmp / "spool"
    spool.mkdir()
    endpoint = FakeEndpoint()
    endpoint.script_min_seconds = WINDOW_MIN_S
    endpoint.script.extend(["hold"] + ["slow:120"] * 50)
    app = launch(tmp, "--engine", "remote", "--remote-url", f"{endpoint.url}/v1/audio/transcriptions",
                 "--remote-max-in-flight", "1", "--partial-interval", "60", "--partial-interval-max", "60",
                 env={"TMPDIR": str(spool)})
    upload = compose(speech_dir / "shutdown-upload.wav", SENTENCES[:4], gaps=[1.0, 1.0, 1.0])
    long = tmp / "long.wav"
    sf.write(long, np.concatenate([decode_file(upload.path)] * 5), SAMPLE_RATE, subtype="PCM_16")  # about 70 s
    data = long.read_bytes()
    live = compose(speech_dir / "shutdown.wav", SENTENCES[:1], tail=0.5)
    outcomes: dict[str, str] = {}
    rest = threading.Event()

    def held_back() -> Iterator[bytes]:
        """An upload still arriving: the second half of its body waits until the signal has been sent."""
        half = len(data) // 2
        yield data[:half]
        rest.wait(SETTLE_S)
        yield data[half:]

    def post(name: str, **kw: Any) -> None:
        try:
            r = httpx.post(f"{app.url}/v1/audio/transcriptions", timeout=SETTLE_S, **kw)
            outcomes[name] = str(r.status_code)
        except httpx.HTTPError as exc:
            outcomes[name] = type(exc).__name__

    def spooled() -> list[Path]:
        return sorted(spool.glob("realtime-api-*/upload*"))

    clients = [
        threading.Thread(target=post, args=("transcribing",), kwargs={"files": {"file": ("a.wav", data)}}),
        threading.Thread(target=post, args=("streaming",), kwargs={"files": {"file": ("b.wav", data)},
                                                                   "data": {"stream": "true"}}),
        threading.Thread(target=post, args=("receiving",),
                         kwargs={"content": held_back(), "headers": {"content-type": "audio/wav"}}),
    ]
    try:
        for t in clients:
            t.start()
        _until(lambda: len(spooled()) == 3 and sum(p.stat().st_size == len(data) for p in spooled()) == 2,
               "the uploads to spool")
        _until(lambda: any(r["behaviour"] == "hold" for r in endpoint.requests()), "an upload's window to be held")

        at_signal: tuple[list[Path], dict[str, str]] = ([], {})

        async def stream() -> tuple[Peer, httpx.Response]:
            nonlocal at_signal
            async with Peer(app.url, decode_file(live.path), tail=3.0) as peer:
                # the sentence's segment has closed; its final waits behind the held window
                await peer.until(lambda ev: any(e["type"] == "speech_stopped" for e in ev))
                assert not [e for e in peer.events if e["type"] in ("final", "error")], peer.summary()
                at_signal = spooled(), dict(outcomes)
                app.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(_until, lambda: "SIGTERM: draining" in app.log.read_text(), "the drain")
                async with httpx.AsyncClient(timeout=30) as http:
                    refused = await http.post(f"{app.url}/webrtc/offer", json={
                        "sdp": "v=0", "type": "offer", "webrtc_id": uuid.uuid4().hex})
                endpoint.release()
                await peer.until(lambda ev: any(e["type"] == "closed" for e in ev))
                return peer, refused

        peer, refused = asyncio.run(stream())
        try:
            code = app.proc.wait(SETTLE_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("the app did not exit after SIGTERM") from None
        rest.set()
        for t in clients:
            t.join(SETTLE_S)
        yield Shutdown(app, peer, refused, code, spool, outcomes, at_signal)
    finally:
        rest.set()
        stop(app)
        endpoint.close()


def test_sigterm_delivers_closed_segments_then_exits(drained):
    """SIGTERM while a closed segment's final is still in the engine: new offers get 503 shutting_down while the app
    drains, the final is delivered, then the session's `closed` event (reason shutdown), and the process exits by
    the signal with nothing left undelivered."""
    assert drained.code in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled once it has stopped
    events = drained.peer.events
    closed = [e for e in events if e["type"] == "closed"]
    assert closed and closed[0]["reason"] == "shutdown", events[-5:]
    finals = [e for e in events if e["type"] == "final"]
    assert finals and events.index(finals[0]) < events.index(closed[0]), "the closed segment's final, then closed"
    assert not [e for e in events if e["type"] == "error"]
    r = drained.refused
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
    log = drained.app.log.read_text()
    assert "drained: 0 finals left undelivered" in log, log[-2000:]


def test_sigterm_removes_spooled_uploads(drained):
    """Uploads being received, transcribed and streamed when SIGTERM comes: none had ended before it, each gets an
    answer or a closed connection, and their spool files are all gone when the process has exited (the spool is the
    app's TMPDIR)."""
    spooled, ended = drained.at_signal
    assert len(spooled) == 3 and not ended, f"an upload not spooled or already over at the signal: {ended}"
    assert len(drained.outcomes) == 3, drained.outcomes
    assert not list(drained.spool.glob("realtime-api-*")), f"left behind: {list(drained.spool.rglob('*'))}"
