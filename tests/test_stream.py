"""End to end over real WebRTC: aiortc clients against the app launched as users launch it, in real time.

This is where the page's transport meets the clock: live accuracy is tested faster than real time through the same
Opus round trip (tests/live_feed.py). One stream of three sentences (`live`) is read by several tests: its events,
its transcript, the token it did not need, and /metrics around it. It waits a third of the way into each sentence
until the server has sent a partial of it (tests/live_peer.py `Gate`, the sentence's audio dripping meanwhile), so
that partials while people speak are there by construction, not by the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from live_apps import LIMIT
from live_peer import SETTLE_S, Gate, Peer, partial_of
from test_metrics import Metrics, scrape

from realtime.audio import SAMPLE_RATE, decode_file
from realtime.bench.client import StreamError, event_line, stream_file, summarize

from conftest import ROOT, App
from speech import SENTENCES, Speech, compose, wer

pytest_plugins = ["live_apps"]


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


@dataclass
class Live:
    speech: Speech
    peer: Peer
    before: Metrics
    after: Metrics


@pytest.fixture(scope="module")
def live(app: App, speech_dir) -> Live:
    """Three sentences streamed in real time to the worker's app, /metrics scraped just before and after."""
    speech = compose(speech_dir / "live.wav", SENTENCES[:3], gaps=[1.2, 1.2], tail=0.5)
    gates = [Gate(start + (end - start) / 3, partial_of(n), drip_s=0.1) for n, (start, end) in enumerate(speech.spans)]

    async def stream() -> Peer:
        async with Peer(app.url, decode_file(speech.path), gates=gates) as peer:
            await peer.finished(len(speech.texts), reaching=speech.spans[-1][0])
            return peer

    app.idle()  # the worker's app: a session another test left closing would move the counters too
    before = scrape(app.url)
    peer = asyncio.run(stream())
    return Live(speech, peer, before, scrape(app.url))


def test_live_transcription_over_webrtc(app, live):
    """Every sentence is a segment with partials while it is spoken and then its final, none after it; the finals
    read the sentences, end where the file's speech ends (the server's clock is the audio's), and the transcript
    stays downloadable after the session closed."""
    speech, events = live.speech, live.peer.events
    finals = check_events(events)
    assert len(finals) == 3
    partial_segments = {e["segment"] for e in events if e["type"] == "partial"}
    assert partial_segments == {0, 1, 2}, "partials must arrive while people speak"
    for f in finals:
        first = next(e for e in events if e["segment"] == f["segment"])
        assert first["t"] <= f["t"]
    assert wer(speech.text, " ".join(f["text"] for f in finals)) <= 0.15
    for f, (_, t1) in zip(finals, speech.spans, strict=True):
        assert abs(f["audio_end"] - t1) < 0.6  # server's clock follows the file's within WebRTC start-up slack
    s = summarize(events)
    assert s["finals"] == 3 and s["final_latency_p50"] is not None and s["final_latency_p50"] > 0

    # the transcript stays downloadable after the session closed
    txt = httpx.get(f"{app.url}/transcript/{live.peer.webrtc_id}.txt").text
    assert wer(speech.text, txt) <= 0.15
    srt = httpx.get(f"{app.url}/transcript/{live.peer.webrtc_id}.srt").text
    assert srt.startswith("1\n00:00:")


def test_without_a_key_the_id_is_enough(app, live):
    """Without --api-key the offer's answer carries no token, and the session's id alone opens its transcript."""
    assert live.peer.token is None
    assert httpx.get(f"{app.url}/transcript/{live.peer.webrtc_id}.txt").status_code == 200


def test_metrics_follow_a_live_session(live):
    """`/metrics`, parsed by Prometheus' own text parser, moves with the one live session: a session, its finals and
    their latencies, partials, the offer, the audio each lane heard and the engine's seconds per lane."""
    finals = [e for e in live.peer.events if e["type"] == "final"]
    assert len(finals) == 3
    before, after = live.before, live.after

    def moved(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    assert moved("realtime_sessions_total") == 1
    assert moved("realtime_finals_total") == len(finals)
    assert moved("realtime_final_latency_seconds_count") == len(finals)
    assert moved("realtime_final_latency_seconds_sum") > 0
    assert moved("realtime_first_partial_latency_seconds_count") >= 1
    assert moved("realtime_engine_batch_size_count") >= len(finals)
    assert moved("realtime_http_requests_total",
                 (("method", "POST"), ("route", "/webrtc/offer"), ("status", "200"))) == 1
    assert after[("realtime_queue_depth", (("lane", "finals"),))] >= 0
    assert after[("realtime_ready", ())] == 1
    # real-time factor: the finals' audio (each segment with its padding) beside the engine's busy seconds
    heard = moved("realtime_audio_seconds_total", (("lane", "final"),))
    spoken = sum(f["audio_end"] - f["start"] for f in finals)
    assert spoken <= heard <= spoken + 2.0 * len(finals), (heard, spoken)
    assert moved("realtime_audio_seconds_total", (("lane", "partial"),)) > 0
    assert 0 < after[("realtime_real_time_factor", ())] < 5
    # the engine's time per lane: every batch's seconds counted once, in its lane
    lanes = {lane: moved("realtime_engine_seconds_total", (("lane", lane),)) for lane in ("final", "partial", "file")}
    assert lanes["final"] > 0 and lanes["partial"] > 0 and lanes["file"] == 0
    assert sum(lanes.values()) == pytest.approx(moved("realtime_engine_batch_seconds_sum"))
    assert after[("realtime_engine_restarts_total", ())] == 0  # the embedded engine runs no process to restart


def test_two_clients_each_get_their_own_transcript(app, speech_dir):
    """Two clients streaming at once each get their own sentences back, not the other's."""
    a = compose(speech_dir / "a.wav", SENTENCES[3:5], gaps=[1.2])
    b = compose(speech_dir / "b.wav", SENTENCES[5:7], gaps=[1.0])

    async def both() -> list[Peer]:
        return list(await asyncio.gather(heard(app, a), heard(app, b)))

    pa, pb = asyncio.run(both())
    text_a = " ".join(e["text"] for e in check_events(pa.events))
    text_b = " ".join(e["text"] for e in check_events(pb.events))
    assert wer(a.text, text_a) <= 0.2 and wer(b.text, text_b) <= 0.2
    assert wer(b.text, text_a) > 0.7 and wer(a.text, text_b) > 0.7, "transcripts were mixed"


async def heard(app: App, speech: Speech) -> Peer:
    """A client that streams `speech` in real time until each of its sentences has been heard and answered."""
    async with Peer(app.url, decode_file(speech.path)) as peer:
        await peer.finished(len(speech.texts), reaching=speech.spans[-1][0])
        return peer


def test_stream_command_prints_json_lines_and_summary(app, speech_dir):
    """`python -m realtime stream` prints each event as a JSON line (the segment announced before its partials, then
    its final) and a summary last."""
    speech = compose(speech_dir / "cmd.wav", SENTENCES[7:8])
    out = subprocess.run([sys.executable, "-m", "realtime", "stream", app.url, str(speech.path), "--ice-loopback"],
                         cwd=ROOT, capture_output=True, text=True, timeout=SETTLE_S)
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


@pytest.mark.fast
def test_the_stream_command_prints_each_event_whole():
    """A speaker event reached the terminal without its speaker or turns: the command kept five keys of each event."""
    event = {"type": "speaker", "segment": 3, "speaker": "B", "turns": [{"start": 1.0, "end": 2.5, "speaker": "A"},
                                                                        {"start": 2.5, "end": 4.0, "speaker": "B"}]}
    assert json.loads(event_line(event)) == event
    assert json.loads(event_line({"type": "final", "text": "Très bien.", "segment": 0})) == {
        "type": "final", "text": "Très bien.", "segment": 0}


def test_routes_reject_bad_requests(app):
    """Unknown sessions are 404, a body that is not JSON 400, an offer without its fields 422; /health says ready."""
    assert httpx.get(f"{app.url}/transcript/nope/events").status_code == 404
    assert httpx.get(f"{app.url}/transcript/nope.txt").status_code == 404
    r = httpx.post(f"{app.url}/webrtc/offer", content=b"not json")
    assert r.status_code == 400 and "error" in r.json()
    assert httpx.post(f"{app.url}/webrtc/offer", json={"sdp": "x"}).status_code == 422
    health = app.health()
    assert health["ready"] and health["engine"] == "embedded" and "tiny.en" in health["model"]


async def _connections(app: App, ready: Any, timeout: float = 60.0) -> None:
    """Until `ready(open WebRTC connections)` (the server notices a hang-up a moment after the client)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not ready(app.health()["limits"]["connections"]):
        assert loop.time() < deadline, app.health()["limits"]
        await asyncio.sleep(0.1)


@pytest.mark.xdist_group("test_realtime_api")
def test_concurrency_limit_refuses_clearly_then_admits(keyed_app, speech_dir):
    """With --concurrency-limit connections open (clients that send nothing yet), the next stream is refused with
    concurrency_limit_reached; once one of them hangs up, a stream is admitted and transcribed."""
    short = compose(speech_dir / "short.wav", SENTENCES[2:3])
    quiet = np.zeros(SAMPLE_RATE, np.float32)

    async def scenario() -> Any:
        async with AsyncExitStack() as stack:
            holders = [await stack.enter_async_context(Peer(keyed_app.url, quiet, stall_at=0.0, read_events=False))
                       for _ in range(LIMIT)]
            for holder in holders:
                await holder.connected()
            await _connections(keyed_app, lambda n: n == LIMIT)
            with pytest.raises(StreamError, match="concurrency_limit_reached"):
                await stream_file(keyed_app.url, short.path, ice_loopback=True)
            await holders[0].pc.close()
            await _connections(keyed_app, lambda n: n < LIMIT)
            return await heard(keyed_app, short)

    later = asyncio.run(scenario())
    assert wer(short.text, " ".join(e["text"] for e in check_events(later.events))) <= 0.2
