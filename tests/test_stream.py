"""End to end over real WebRTC: aiortc clients against the app launched as users launch it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from realtime.bench.client import StreamError, stream_file

from conftest import ROOT, launch, stop
from speech import SENTENCES, compose, wer


def check_events(events: list[dict]) -> list[dict]:
    """Partials come before their segment's final, every segment ends final; returns the finals."""
    finals = [e for e in events if e["type"] == "final"]
    assert not [e for e in events if e["type"] == "error"]
    segments = {e["segment"] for e in events}
    assert segments == {e["segment"] for e in finals}, "a segment ended without a final"
    for f in finals:
        i = events.index(f)
        assert not [e for e in events[i:] if e["type"] == "partial" and e["segment"] == f["segment"]]
    return finals


def test_live_transcription_over_webrtc(app, speech_dir):
    speech = compose(speech_dir / "live.wav", SENTENCES[:3], gaps=[1.2, 1.2], tail=0.5)
    result = asyncio.run(stream_file(app.url, speech.path, ice_loopback=True))
    finals = check_events(result.events)
    assert len(finals) == 3
    partial_segments = {e["segment"] for e in result.events if e["type"] == "partial"}
    assert len(partial_segments) >= 2, "partials must arrive while people speak"
    for f in finals:
        first = next(e for e in result.events if e["segment"] == f["segment"])
        assert first["t"] <= f["t"]
    assert wer(speech.text, " ".join(f["text"] for f in finals)) <= 0.15
    for f, (_, t1) in zip(finals, speech.spans, strict=True):
        assert abs(f["audio_end"] - t1) < 0.6  # server's clock follows the file's within WebRTC start-up slack
    s = result.summary
    assert s["finals"] == 3 and s["final_latency_p50"] is not None and s["final_latency_p50"] > 0

    # the transcript stays downloadable after the session closed
    txt = httpx.get(f"{app.url}/transcript/{result.webrtc_id}.txt").text
    assert wer(speech.text, txt) <= 0.15
    srt = httpx.get(f"{app.url}/transcript/{result.webrtc_id}.srt").text
    assert srt.startswith("1\n00:00:")


def test_two_clients_each_get_their_own_transcript(app, speech_dir):
    a = compose(speech_dir / "a.wav", SENTENCES[3:5], gaps=[1.2])
    b = compose(speech_dir / "b.wav", SENTENCES[5:7], gaps=[1.0])

    async def both():
        return await asyncio.gather(stream_file(app.url, a.path, ice_loopback=True),
                                    stream_file(app.url, b.path, ice_loopback=True))

    ra, rb = asyncio.run(both())
    text_a = " ".join(e["text"] for e in check_events(ra.events))
    text_b = " ".join(e["text"] for e in check_events(rb.events))
    assert wer(a.text, text_a) <= 0.2 and wer(b.text, text_b) <= 0.2
    assert wer(b.text, text_a) > 0.7 and wer(a.text, text_b) > 0.7, "transcripts were mixed"


def test_stream_command_prints_json_lines_and_summary(app, speech_dir):
    speech = compose(speech_dir / "cmd.wav", SENTENCES[7:8])
    out = subprocess.run([sys.executable, "-m", "realtime", "stream", app.url, str(speech.path), "--ice-loopback"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    events, summary = lines[:-1], lines[-1]["summary"]
    assert [e["type"] for e in events][:1] == ["speech_started"], "a segment is announced before its partials"
    assert [e["type"] for e in events].count("speech_stopped") == 1
    texts = [e for e in events if e["type"] in ("partial", "final")]
    assert texts and all(set(e) >= {"type", "text", "segment", "t", "audio_end"} for e in texts)
    assert events[-1]["type"] == "final"
    assert summary["segments"] == summary["finals"] == 1
    assert set(summary) == {"segments", "finals", "final_latency_p50", "final_latency_p95",
                            "first_partial_latency_p50"}
    assert wer(speech.text, events[-1]["text"]) <= 0.2


def test_routes_reject_bad_requests(app):
    assert httpx.get(f"{app.url}/transcript/nope/events").status_code == 404
    assert httpx.get(f"{app.url}/transcript/nope.txt").status_code == 404
    r = httpx.post(f"{app.url}/webrtc/offer", content=b"not json")
    assert r.status_code == 400 and "error" in r.json()
    assert httpx.post(f"{app.url}/webrtc/offer", json={"sdp": "x"}).status_code == 422
    health = app.health()
    assert health["ready"] and health["engine"] == "embedded" and "tiny.en" in health["model"]


def test_concurrency_limit_refuses_clearly_then_admits(tmp_path, speech_dir):
    app = launch(tmp_path, "--concurrency-limit", "1")
    try:
        long = compose(speech_dir / "long.wav", SENTENCES[:2], gaps=[1.0])
        short = compose(speech_dir / "short.wav", SENTENCES[2:3])

        async def scenario():
            first = asyncio.create_task(stream_file(app.url, long.path, ice_loopback=True))
            await asyncio.sleep(2.0)
            with pytest.raises(StreamError, match="concurrency_limit_reached"):
                await stream_file(app.url, short.path, ice_loopback=True)
            await first
            for _ in range(50):  # the server frees the slot once the first connection has closed
                if app.health()["sessions"] == 0:
                    break
                await asyncio.sleep(0.2)
            return await stream_file(app.url, short.path, ice_loopback=True)

        later = asyncio.run(scenario())
        assert wer(short.text, later.summary["text"]) <= 0.2
    finally:
        stop(app)
