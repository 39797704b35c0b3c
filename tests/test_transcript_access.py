"""With --api-key, live transcripts need the key or the session's own token; over real WebRTC on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from realtime.bench.client import stream_file

from conftest import App, launch, stop
from speech import SENTENCES, compose, wer

KEY = "sk-test-transcripts"


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    a = launch(tmp_path_factory.mktemp("keyed"), "--api-key", KEY)
    yield a
    stop(a)


def _unauthorized(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and r.headers["WWW-Authenticate"] == "Bearer"


def test_transcript_needs_the_key_or_the_sessions_token(keyed, speech_dir):
    speech = compose(speech_dir / "keyed.wav", SENTENCES[:1], tail=0.5)
    result = asyncio.run(stream_file(keyed.url, speech.path, ice_loopback=True))
    assert result.token, "the offer's answer hands its poster the session's token"
    finals = [e for e in result.events if e["type"] == "final"]
    assert len(finals) == 1, "the client read the event stream with its token"
    base = f"{keyed.url}/transcript/{result.webrtc_id}"
    _unauthorized(httpx.get(f"{base}.txt"))
    _unauthorized(httpx.get(f"{base}.txt", params={"token": "0" * 32}))
    _unauthorized(httpx.get(f"{base}.txt", headers={"Authorization": "Bearer wrong"}))
    _unauthorized(httpx.get(f"{base}/events"))
    r = httpx.get(f"{base}.txt", params={"token": result.token})
    assert r.status_code == 200 and wer(speech.text, r.text) <= 0.2
    assert httpx.get(f"{base}.srt", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200

    # an offer that reuses the finished session's id is not handed that session's token
    from test_signalling import _offer_sdp

    r = httpx.post(f"{keyed.url}/webrtc/offer", json={"sdp": asyncio.run(_offer_sdp()), "type": "offer",
                                                      "webrtc_id": result.webrtc_id}, timeout=30)
    assert "transcript_token" not in r.json()


def test_without_a_key_the_id_is_enough(app, speech_dir):
    speech = compose(speech_dir / "open.wav", SENTENCES[1:2], tail=0.5)
    result = asyncio.run(stream_file(app.url, speech.path, ice_loopback=True))
    assert result.token is None
    assert httpx.get(f"{app.url}/transcript/{result.webrtc_id}.txt").status_code == 200


def test_the_pages_links_carry_the_token_only_with_a_key():
    from realtime.config import Settings
    from realtime.live.service import TranscriptionService
    from realtime.web.access import session_token
    from realtime.web.ui import render_status

    keyed_links = render_status(TranscriptionService(Settings(api_key=KEY)), "abc123", None)
    assert f"transcript/abc123.txt?token={session_token('abc123')}" in keyed_links
    assert "token=" not in render_status(TranscriptionService(Settings()), "abc123", None)
