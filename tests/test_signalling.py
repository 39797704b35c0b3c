"""Signalling that refuses bad input, and health split into liveness and readiness, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from live_apps import PER_MINUTE
from live_peer import Peer

from realtime.audio import SAMPLE_RATE, wav_bytes
from realtime.bench.client import _make_track
from realtime.web.ice import use_loopback_only

from conftest import ROOT, App, free_port, stop

pytest_plugins = ["live_apps"]


async def _offer_sdp(audio: bool = True) -> str:
    """A real aiortc offer: a data channel, with (or without) an audio track."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    use_loopback_only()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    try:
        pc.createDataChannel("text")
        if audio:
            pc.addTrack(_make_track(np.zeros(16000, dtype=np.float32), 0.0))
        await pc.setLocalDescription(await pc.createOffer())
        return pc.localDescription.sdp
    finally:
        await pc.close()


def _post(app: App, body: dict | bytes) -> httpx.Response:
    url = f"{app.url}/webrtc/offer"
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=30)
    return httpx.post(url, json=body, timeout=30)


def _openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and error["message"]
    return error


def test_garbage_sdp_is_refused_with_400(app):
    error = _openai_error(_post(app, {"sdp": "garbage", "type": "offer", "webrtc_id": uuid.uuid4().hex}), 400)
    assert error["code"] == "invalid_sdp" and error["param"] == "sdp"
    _openai_error(_post(app, b"{not json"), 400)


def test_oversized_offer_is_refused_with_413(app):
    big = b'{"sdp": "' + b"a" * 5_000_000 + b'", "type": "offer", "webrtc_id": "x"}'
    assert _openai_error(_post(app, big), 413)["code"] == "offer_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap holds while reading
        yield big[:1000]
        yield big[1000:]

    r = httpx.post(f"{app.url}/webrtc/offer", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=30)
    assert _openai_error(r, 413)["code"] == "offer_too_large"


def test_offer_without_audio_is_refused_and_a_real_one_is_answered(app):
    """An offer without an audio section is refused (400, OpenAI's error shape); a real one is answered with one
    (and connects: hung up, it leaves the worker's app no open connection)."""
    no_audio = asyncio.run(_offer_sdp(audio=False))
    error = _openai_error(_post(app, {"sdp": no_audio, "type": "offer", "webrtc_id": uuid.uuid4().hex}), 400)
    assert "m=audio" in error["message"]

    async def answered() -> str:
        async with Peer(app.url, np.zeros(SAMPLE_RATE, np.float32), stall_at=0.0, read_events=False) as peer:
            await peer.connected()
            return peer.pc.remoteDescription.sdp

    assert "m=audio" in asyncio.run(answered())


def test_health_live_and_ready(app):
    assert httpx.get(f"{app.url}/health/live").status_code == 200
    r = httpx.get(f"{app.url}/health/ready")
    assert r.status_code == 200 and r.json()["ready"] is True


def test_ready_is_503_while_the_engines_endpoints_are_down(tmp_path: Path):
    down = f"http://127.0.0.1:{free_port()}/v1/audio/transcriptions"  # nothing listens there
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--ice-loopback",
                             "--engine", "remote", "--remote-url", down], cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"},
                            stdout=(tmp_path / "app.log").open("wb"), stderr=subprocess.STDOUT)
    a = App(f"http://127.0.0.1:{port}", proc, tmp_path / "app.log")
    try:
        for _ in range(300):  # live as soon as it serves, whatever the engine says
            assert proc.poll() is None, a.log.read_text()
            try:
                if httpx.get(f"{a.url}/health/live", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        assert httpx.get(f"{a.url}/health/live").status_code == 200
        r = httpx.get(f"{a.url}/health/ready")
        assert r.status_code == 503 and r.json()["ready"] is False and r.json()["reason"]
    finally:
        stop(a)


@pytest.mark.xdist_group("test_signalling")
def test_new_connections_per_client_are_capped(limited_app):
    """Over --max-new-connections-per-minute a client's offer gets 429 rate_limit_exceeded with Retry-After, counted
    in /health's refusals."""
    refused = httpx.get(f"{limited_app.url}/health").json()["signalling"]["refused"]
    sdp = asyncio.run(_offer_sdp())
    for _ in range(PER_MINUTE):
        r = _post(limited_app, {"sdp": sdp, "type": "offer", "webrtc_id": uuid.uuid4().hex})
        assert r.status_code == 200 and "sdp" in r.json()
    r = _post(limited_app, {"sdp": sdp, "type": "offer", "webrtc_id": uuid.uuid4().hex})
    error = _openai_error(r, 429)
    assert error["code"] == "rate_limit_exceeded" and int(r.headers["Retry-After"]) >= 1
    assert httpx.get(f"{limited_app.url}/health").json()["signalling"]["refused"] == refused + 1


@pytest.mark.fast
def test_the_limiter_forgets_clients_that_left():
    """The per-minute history is kept per client address: a public server sees endless addresses, so one that
    has not connected for a minute must leave nothing behind, while the caps still hold for one that has."""
    from realtime.web.signalling import ClientLimiter, OfferError

    limiter = ClientLimiter(max_open=0, max_per_minute=2)
    for i in range(100):
        limiter.admit(f"10.0.0.{i}", f"c{i}", live=(), now=0.0)
    limiter.admit("192.0.2.1", "a", live=(), now=1.0)
    limiter.admit("192.0.2.1", "b", live=(), now=2.0)
    with pytest.raises(OfferError):
        limiter.admit("192.0.2.1", "c", live=(), now=3.0)
    limiter.admit("192.0.2.2", "d", live=(), now=61.5)
    assert set(limiter._recent) == {"192.0.2.1", "192.0.2.2"}
    limiter.admit("192.0.2.1", "e", live=(), now=62.5)  # its first connection of the last minute has aged out


@pytest.mark.xdist_group("test_signalling")
def test_an_app_without_history_says_so_and_keeps_nothing(limited_app):
    """`--no-history`: the history's routes answer 404 history_off, `store=true` is refused before the upload is
    transcribed, /health says none, and nothing is written to the data folder."""
    r = httpx.get(f"{limited_app.url}/v1/transcripts")
    assert r.status_code == 404 and r.json()["error"]["code"] == "history_off", r.text
    silence = wav_bytes(np.zeros(SAMPLE_RATE, np.float32))
    r = httpx.post(f"{limited_app.url}/v1/audio/transcriptions", files={"file": ("a.wav", silence)},
                   data={"store": "true"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "history_off", r.text
    assert limited_app.health()["history"] is None
    data = limited_app.log.parent / "data"
    assert not data.exists() or not any(data.iterdir()), list(data.iterdir())



def test_the_server_hands_on_each_received_audio_frame_once_the_next_one_has_come():
    """Real aiortc peers on loopback, the receiver set up as the app sets up its own (`release_audio_promptly`): a
    sender that stops after `sent` frames of 20 ms leaves only the last two behind (the one whose end is known when the
    next starts, and one in the codec's path), not the five that aiortc's playout buffer holds back (`prefetch=4`):
    60 ms less between the end of speech and the VAD hearing it."""
    import fractions

    from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection
    from aiortc.mediastreams import MediaStreamError
    from av import AudioFrame

    from realtime.web.jitter import AUDIO_PREFETCH, release_audio_promptly

    release_audio_promptly()
    use_loopback_only()
    sent, rng = 40, np.random.default_rng(0)

    class Speech(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.i = 0

        async def recv(self) -> AudioFrame:
            if self.i >= sent:
                await asyncio.Event().wait()  # the speaker stops: no more packets
            await asyncio.sleep(0.02)
            frame = AudioFrame(format="s16", layout="mono", samples=320)
            frame.planes[0].update((rng.standard_normal(320) * 3000).astype(np.int16).tobytes())
            frame.sample_rate, frame.time_base = SAMPLE_RATE, fractions.Fraction(1, SAMPLE_RATE)
            frame.pts = self.i * 320
            self.i += 1
            return frame

    async def run() -> int:
        sender, receiver = (RTCPeerConnection(RTCConfiguration(iceServers=[])) for _ in range(2))
        got, enough, readers = [0], asyncio.Event(), []

        def on_track(track: MediaStreamTrack) -> None:
            async def read() -> None:
                with contextlib.suppress(MediaStreamError):
                    while True:
                        await track.recv()
                        got[0] += 1
                        if got[0] >= sent - AUDIO_PREFETCH - 1:
                            enough.set()

            readers.append(asyncio.ensure_future(read()))

        receiver.on("track", on_track)
        sender.addTrack(Speech())
        try:
            await sender.setLocalDescription(await sender.createOffer())
            await receiver.setRemoteDescription(sender.localDescription)
            await receiver.setLocalDescription(await receiver.createAnswer())
            await sender.setRemoteDescription(receiver.localDescription)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(enough.wait(), 60)
            await asyncio.sleep(0.2)  # nothing more comes
            return got[0]
        finally:
            await sender.close()
            await receiver.close()

    assert asyncio.run(run()) == sent - AUDIO_PREFETCH - 1
