"""The remote engine with `--remote-realtime`: a front app (the CPU side) sends live segments over the back app's
Realtime API WebSocket (`/v1/realtime`, another instance of this app with the real embedded tiny.en) and shows its
deltas as they come. Real speech from tests/data, real sockets on 127.0.0.1, nothing mocked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_stream import check_events

from realtime.audio import decode_file
from realtime.bench.client import stream_file
from realtime.config import parse_settings
from realtime.engines import EngineError, TranscribeOptions, create_engine
from realtime.engines.endpoints import parse_endpoint
from realtime.engines.remote import RemoteEngine

from conftest import App, launch, stop
from real_speech import DATA, clips, compilation, corpus_wer

KEY = "sekret"
LIVE = ["jfk.flac", "librivox-sense-and-sensibility-01-0870.flac", "librivox-sense-and-sensibility-01-0890.flac",
        "speechbrain-spk1_snt1.flac"]
"""About 26 s of real read speech (four clips, and segments at their pauses)."""
MARGIN = 0.05
"""How much worse than the back's own file transcription the front's live finals may be (WER, absolute)."""


@pytest.fixture(scope="module")
def back(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    app = launch(tmp_path_factory.mktemp("back"), "--api-key", KEY)
    yield app
    stop(app)


@pytest.mark.fast
def test_realtime_url_follows_the_scheme():
    assert parse_endpoint("http://gpu:7860/v1/audio/transcriptions").realtime_url == (
        "ws://gpu:7860/v1/realtime?intent=transcription")
    assert parse_endpoint("https://box.example/app/v1").realtime_url == (
        "wss://box.example/app/v1/realtime?intent=transcription")
    settings = parse_settings(["--engine", "remote", "--remote-url", "http://127.0.0.1:9", "--remote-realtime"])
    engine = create_engine(settings)
    assert isinstance(engine, RemoteEngine) and engine.realtime and engine.streaming
    assert engine.describe()["realtime"] is True


def test_engine_streams_a_clip_over_the_backs_realtime_api(back):
    audio = decode_file(DATA / "jfk.flac")

    async def scenario() -> tuple[list[str], str, dict]:
        engine = RemoteEngine([f"{back.url}/v1/audio/transcriptions"], token=KEY, realtime=True)
        await engine.start()
        try:
            deltas = [d async for d in engine.transcribe_stream(audio, TranscribeOptions(language="en"))]
            final = await engine.transcribe(audio, TranscribeOptions())
            return deltas, final.text, engine.describe()
        finally:
            await engine.close()

    deltas, final, described = asyncio.run(scenario())
    r = httpx.post(f"{back.url}/v1/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                   files={"file": ("jfk.flac", (DATA / "jfk.flac").read_bytes())}, timeout=60)
    assert r.status_code == 200
    assert deltas and "".join(deltas).strip() == final
    assert corpus_wer([r.json()["text"]], [final]) <= 0.05, (final, r.json()["text"])
    assert described["realtime_requests"] == 2 and described["endpoints"][0]["errors"] == 0

    async def wrong_key() -> None:
        engine = RemoteEngine([back.url], token="wrong", realtime=True)
        await engine.start()
        try:
            await engine.transcribe(audio, TranscribeOptions())
        finally:
            await engine.close()

    with pytest.raises(EngineError, match="refused the token"):
        asyncio.run(wrong_key())


def test_live_webrtc_front_streams_to_a_back_over_realtime(back, tmp_path: Path):
    chosen = {c.name: c for c in clips()}
    comp = compilation([chosen[n] for n in LIVE], tmp_path / "live.wav")
    front = launch(tmp_path, "--engine", "remote", "--remote-url", f"{back.url}/v1/audio/transcriptions",
                   "--remote-token", KEY, "--remote-realtime", "--remote-fallback", "--remote-retries", "2")
    try:
        health = front.health()
        assert health["engine"] == "remote" and health["realtime"] is True and health["in_use"] == "remote"
        result = asyncio.run(stream_file(front.url, comp.path, ice_loopback=True))
        finals = check_events(result.events)
        assert len(finals) >= len(LIVE), [f["text"] for f in finals]  # the VAD also cuts at pauses in a clip
        streamed = [e for e in result.events if e["type"] == "partial" and e.get("streaming")]
        assert streamed, "no deltas reached the page through the realtime backend"
        front_text = " ".join(f["text"] for f in finals)

        # the back's own file transcription of the same clips, one request each (one upload of the whole
        # compilation gets only its first clip's text from tiny.en's one 30 s window)
        back_texts = []
        for clip in comp.clips:
            r = httpx.post(f"{back.url}/v1/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                           files={"file": (clip.name, clip.path.read_bytes())}, timeout=120)
            assert r.status_code == 200
            back_texts.append(r.json()["text"])
        back_text = " ".join(back_texts)
        front_wer, back_wer = corpus_wer([comp.text], [front_text]), corpus_wer([comp.text], [back_text])
        print(f"\nWER front (live, via the back's /v1/realtime) {front_wer:.3f}, back (file, per clip) "
              f"{back_wer:.3f}; {len(finals)} finals, {len(streamed)} streamed partials, "
              f"{front.health()['realtime_requests']} realtime requests\nfront: {front_text}\nback:  {back_text}")
        assert front_wer <= back_wer + MARGIN, (front_text, back_text)
        # and the back's own page, the same audio streamed to it directly: the front should match it
        direct = check_events(asyncio.run(stream_file(back.url, comp.path, ice_loopback=True)).events)
        direct_wer = corpus_wer([comp.text], [" ".join(f["text"] for f in direct)])
        print(f"WER back (live page, direct) {direct_wer:.3f}, {len(direct)} finals")
        assert front_wer <= direct_wer + MARGIN

        health = front.health()
        assert health["fallback_requests"] == 0 and health["realtime_requests"] >= len(LIVE)
        opened = back.log.read_text().count("opened (intent=transcription")
        assert opened >= health["realtime_requests"], "the back did not see the realtime sessions"

        # the back goes away: requests fail to connect, are retried, the circuit opens, and the fallback (the
        # front's own embedded engine) answers. A file's packed windows are asked with timestamps, over HTTP
        # (realtime/live/coverage.py); the live requests before went over the realtime API
        stop(back)
        short = DATA / "speechbrain-spk1_snt3.flac"
        r = httpx.post(f"{front.url}/v1/audio/transcriptions", files={"file": ("a.flac", short.read_bytes())},
                       timeout=120)
        assert r.status_code == 200 and corpus_wer([chosen[short.name].text], [r.json()["text"]]) <= 0.2
        for _ in range(50):
            health = front.health()
            if health["in_use"] == "fallback":
                break
            time.sleep(0.2)
        assert health["in_use"] == "fallback" and health["fallback_requests"] >= 1
        assert not health["endpoints"][0]["healthy"]
        log = front.log.read_text()
        assert "failed: ConnectError" in log and "using the fallback engine" in log
    finally:
        stop(front)
