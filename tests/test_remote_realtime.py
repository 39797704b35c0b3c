"""The remote engine with `--remote-realtime`: a front end (the CPU side) sends live segments over the back app's
Realtime API WebSocket (`/v1/realtime`, another instance of this app with the real embedded tiny.en) and shows its
deltas as they come. Real speech from tests/data, real sockets on 127.0.0.1, nothing mocked. The front end's live
session runs in this process, fed at the speed the code allows (tests/remote_live.py); the readings it is compared
with are computed once per run (conftest.py `readings`, tests/remote_live.py `embedded_live`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_live import embedded_live, front_settings, live_recording, stream
from test_stream import check_events

from realtime.audio import decode_file
from realtime.config import parse_settings
from realtime.engines import EngineError, TranscribeOptions, create_engine
from realtime.engines.endpoints import parse_endpoint
from realtime.engines.remote import RemoteEngine
from realtime.live.service import TranscriptionService
from realtime.live.transcribe import transcribe_file

from conftest import App, launch, stop
from real_speech import DATA, SEVERAL, clips, corpus_wer

KEY = "sekret"
LIVE = list(SEVERAL)
"""About 26 s of real read speech (four clips, and segments at their pauses): tests/remote_live.py's recording."""
MARGIN = 0.05
"""How much worse than the back's own file transcription, or the embedded engine's live reading, the front's live
finals may be (WER, absolute)."""


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


def test_engine_streams_a_clip_over_the_backs_realtime_api(back, readings):
    """One clip over the back's Realtime API: the deltas join to the final, within 5 points of the embedded
    engine's file reading of the clip (the back's own file path); a wrong key is refused."""
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
    file_text = readings["text"]["jfk.flac"]
    assert deltas and "".join(deltas).strip() == final
    assert corpus_wer([file_text], [final]) <= 0.05, (final, file_text)
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


def test_a_live_front_streams_to_a_back_over_realtime(back, engine, shared, readings, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture):
    """A live session on a front end with `--remote-realtime --remote-fallback` (tests/remote_live.py: in this
    process, fed four people's read speech through the WebRTC audio path at the speed the code allows, each partial
    awaited): its partials and finals go over the back's Realtime API, deltas reach the session as they come
    (streamed partials), and its finals are
    within 5 points of the back's own file reading of each clip (the embedded engine's, `readings`) and of the
    embedded engine's live reading of the same recording. Then the back goes away: requests fail to connect, are
    retried, the circuit opens, and the fallback (the front's own embedded engine) answers a file."""
    comp = live_recording(tmp_path / "live.wav")
    assert [c.name for c in comp.clips] == LIVE
    direct_text = embedded_live(shared, engine, tmp_path)
    service = TranscriptionService(front_settings(
        "--remote-url", f"{back.url}/v1/audio/transcriptions", "--remote-token", KEY, "--remote-realtime",
        "--remote-fallback", "--remote-retries", "2"))
    short = DATA / "speechbrain-spk1_snt3.flac"

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any], str, dict[str, Any]]:
        await service.start()
        try:
            health = service.health()
            assert health["engine"] == "remote" and health["realtime"] is True and health["in_use"] == "remote"
            events = await stream(service, comp.path, await_partials=True)
            live = service.health()
            # the back goes away: a file's packed windows are asked with timestamps, over HTTP
            # (realtime/live/coverage.py); the live requests before went over the realtime API
            await asyncio.to_thread(stop, back)
            entries = await transcribe_file(short, service.file_worker(), options=TranscribeOptions(),
                                            window_s=service.settings.file_window_s)
            for _ in range(50):
                if service.health()["in_use"] == "fallback":
                    break
                await asyncio.sleep(0.2)
            return events, live, " ".join(e.text for e in entries if e.text), service.health()
        finally:
            await service.stop()

    with caplog.at_level(logging.INFO, logger="realtime.engines.remote"):
        events, health, fallback_text, down = asyncio.run(scenario())
    finals = check_events(events)
    assert len(finals) >= len(LIVE), [f["text"] for f in finals]  # the VAD also cuts at pauses in a clip
    streamed = [e for e in events if e["type"] == "partial" and e.get("streaming")]
    assert streamed, "no deltas reached the session through the realtime backend"
    front_text = " ".join(f["text"] for f in finals)
    back_text = " ".join(readings["text"][c.name] for c in comp.clips)
    front_wer, back_wer = corpus_wer([comp.text], [front_text]), corpus_wer([comp.text], [back_text])
    direct_wer = corpus_wer([comp.text], [direct_text])
    print(f"\nWER front (live, via the back's /v1/realtime) {front_wer:.3f}, back (file, per clip) {back_wer:.3f}, "
          f"embedded (live) {direct_wer:.3f}; {len(finals)} finals, {len(streamed)} streamed partials, "
          f"{health['realtime_requests']} realtime requests\nfront: {front_text}\nback:  {back_text}")
    assert front_wer <= back_wer + MARGIN, (front_text, back_text)
    assert front_wer <= direct_wer + MARGIN, (front_text, direct_text)
    assert health["fallback_requests"] == 0 and health["realtime_requests"] >= len(LIVE)
    opened = back.log.read_text().count("opened (intent=transcription")
    assert opened >= health["realtime_requests"], "the back did not see the realtime sessions"

    short_text = next(c.text for c in clips() if c.name == short.name)
    assert corpus_wer([short_text], [fallback_text]) <= 0.2
    assert down["in_use"] == "fallback" and down["fallback_requests"] >= 1
    assert not down["endpoints"][0]["healthy"]
    assert "failed: ConnectError" in caplog.text and "using the fallback engine" in caplog.text
