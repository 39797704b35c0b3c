"""`/metrics` of the launched app after a real live session, parsed by Prometheus' own text parser."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from realtime.bench.client import stream_file

from speech import SENTENCES, compose


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(f"{url}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_metrics_follow_a_live_session(app, speech_dir):
    before = scrape(app.url)
    speech = compose(speech_dir / "metrics.wav", SENTENCES[:2], gaps=[1.2], tail=0.5)
    result = asyncio.run(stream_file(app.url, speech.path, ice_loopback=True))
    finals = [e for e in result.events if e["type"] == "final"]
    assert len(finals) == 2
    after = scrape(app.url)

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


def test_api_upload_is_counted(app, speech_dir):
    speech = compose(speech_dir / "metrics-api.wav", SENTENCES[2:3])
    before = scrape(app.url)
    data = speech.path.read_bytes()
    r = httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": ("a.wav", data, "audio/wav")},
                   data={"model": "whisper-1"}, timeout=120)
    assert r.status_code == 200, r.text
    after = scrape(app.url)
    key = ("realtime_http_requests_total", (("method", "POST"), ("route", "/v1/audio/transcriptions"),
                                            ("status", "200")))
    assert after[key] - before.get(key, 0) == 1
    assert after[("realtime_api_upload_bytes_total", ())] - before[("realtime_api_upload_bytes_total", ())] \
        >= len(data)
    assert after[("realtime_file_jobs_total", ())] > before[("realtime_file_jobs_total", ())]
    file_audio = after[("realtime_audio_seconds_total", (("lane", "file"),))] - \
        before[("realtime_audio_seconds_total", (("lane", "file"),))]
    assert 0.5 * speech.duration <= file_audio <= speech.duration + 1.0, (file_audio, speech.duration)
