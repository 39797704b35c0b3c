"""`/metrics` of the launched app, parsed by Prometheus' own text parser: an API upload here; a live session in
tests/test_stream.py, around its one real-time stream."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from speech import SENTENCES, compose

Metrics = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Metrics:
    r = httpx.get(f"{url}/metrics", timeout=60)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def test_api_upload_is_counted(app, speech_dir):
    """An upload to /v1/audio/transcriptions: its request, its bytes, its file jobs and the audio of the file lane."""
    speech = compose(speech_dir / "metrics-api.wav", SENTENCES[2:3])
    before = scrape(app.url)
    data = speech.path.read_bytes()
    r = httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": ("a.wav", data, "audio/wav")},
                   data={"model": "whisper-1"}, timeout=300)
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
