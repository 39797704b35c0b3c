"""With --api-key, live transcripts need the key or the session's own token; over real WebRTC on loopback, on the
keyed app (tests/live_apps.py, in its group). Without a key the id is enough: tests/test_stream.py, on its one
stream."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
from live_apps import KEY
from live_peer import Peer

from realtime.audio import SAMPLE_RATE, decode_file

from speech import SENTENCES, compose, wer

pytest_plugins = ["live_apps"]
pytestmark = pytest.mark.xdist_group("test_realtime_api")


def _unauthorized(r: httpx.Response) -> None:
    assert r.status_code == 401, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "code", "param"} and r.headers["WWW-Authenticate"] == "Bearer"


def test_transcript_needs_the_key_or_the_sessions_token(keyed_app, speech_dir):
    """The offer's answer hands its poster the session's token; the transcript and its events open with the token or
    the key, not without, with a wrong token or a wrong key; an offer that reuses the id gets no token."""
    speech = compose(speech_dir / "keyed.wav", SENTENCES[:1], tail=0.5)

    async def stream() -> Peer:
        async with Peer(keyed_app.url, decode_file(speech.path)) as peer:
            await peer.finished(1, reaching=speech.spans[0][0])
            return peer

    result = asyncio.run(stream())
    assert result.token, "the offer's answer hands its poster the session's token"
    finals = [e for e in result.events if e["type"] == "final"]
    assert len(finals) == 1, "the client read the event stream with its token"
    base = f"{keyed_app.url}/transcript/{result.webrtc_id}"
    _unauthorized(httpx.get(f"{base}.txt"))
    _unauthorized(httpx.get(f"{base}.txt", params={"token": "0" * 32}))
    _unauthorized(httpx.get(f"{base}.txt", headers={"Authorization": "Bearer wrong"}))
    _unauthorized(httpx.get(f"{base}/events"))
    r = httpx.get(f"{base}.txt", params={"token": result.token})
    assert r.status_code == 200 and wer(speech.text, r.text) <= 0.2
    assert httpx.get(f"{base}.srt", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200

    # an offer that reuses the finished session's id is answered, but not handed that session's token
    async def reuse() -> str | None:
        async with Peer(keyed_app.url, np.zeros(SAMPLE_RATE, np.float32), stall_at=0.0, read_events=False,
                        webrtc_id=result.webrtc_id) as again:
            await again.connected()  # then its hang-up frees the app's slot at once
            return again.token

    assert asyncio.run(reuse()) is None


def test_the_pages_links_carry_the_token_only_with_a_key():
    from realtime.config import Settings
    from realtime.live.service import TranscriptionService
    from realtime.web.access import session_token
    from realtime.web.ui import render_status

    keyed_links = render_status(TranscriptionService(Settings(api_key=KEY)), "abc123", None)
    assert f"transcript/abc123.txt?token={session_token('abc123')}" in keyed_links
    assert "token=" not in render_status(TranscriptionService(Settings()), "abc123", None)
