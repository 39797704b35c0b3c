"""The engine pool (realtime/pool): `python -m realtime pool` on a real local Ray cluster kept on loopback, two
replicas of the embedded engine, real recordings over real HTTP, and an app whose remote engine is the pool
streaming a live WebRTC session, with a replica killed in the middle of one."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_stream import check_events

from realtime.bench.client import stream_file
from realtime.bench.corpus import Compilation
from realtime.config import Settings
from realtime.engines import TranscribeOptions
from realtime.live import transcript as fmt
from realtime.live.transcribe import transcribe_file

from conftest import ROOT, SPACE_VARIABLES, App, free_port, gone, launch, stop
from real_speech import clips, compilation, corpus_wer, long_recording, lost_runs

REPLICAS = 2
MAX_REPLICAS = 3
"""The shared pool autoscales between these: the other tests' load stays under one more replica's threshold."""


@dataclass
class Pool:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def route(self) -> str:
        return f"{self.url}/v1/audio/transcriptions"

    def counts(self) -> list[tuple[int, float]]:
        """(running replicas, seconds since the pool started) each time the count changed, from the pool's log."""
        return [(int(n), float(t)) for n, t in re.findall(r"^replicas: (\d+) at ([\d.]+) s$",
                                                          self.log.read_text(errors="replace"), re.M)]

    def health(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def replicas(self, want: int = REPLICAS, timeout: float = 60) -> dict[int, dict[str, Any]]:
        """The replicas answering /health (by process id), asked until `want` distinct ones have answered."""
        seen: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < want and time.monotonic() < deadline:
            try:
                h = self.health()
                seen[h["pid"]] = h
            except (httpx.HTTPError, ValueError, KeyError):
                time.sleep(0.2)
        return seen


def _env() -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("REALTIME_", "GRADIO_", "RAY_"))
                 and k not in SPACE_VARIABLES}
    return {**inherited, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    port = free_port()
    log = tmp_path_factory.mktemp("pool") / "pool.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime", "pool", "--autoscale", f"{REPLICAS}:{MAX_REPLICAS}",
         "--target-ongoing-requests", "3", "--cpu-threads", "1", "--port", str(port)],
        cwd=ROOT, env=_env(), stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    p = Pool(f"http://127.0.0.1:{port}", proc, log)
    deadline = time.monotonic() + 240
    while "pool ready" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"pool did not start:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)
    yield p
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    assert gone(proc.pid, wait=30), "Ray processes of the pool are left behind"


@pytest.fixture(scope="module")
def front(pool: Pool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    """The app as a front end: WebRTC and VAD here, every segment sent to the pool."""
    app = launch(tmp_path_factory.mktemp("front"), "--engine", "remote", "--remote-url", pool.route)
    yield app
    stop(app)


@pytest.fixture(scope="module")
def live_speech(tmp_path_factory: pytest.TempPathFactory) -> Compilation:
    chosen = [c for c in clips({"read"}, longest=9)][:3]
    return compilation(chosen, tmp_path_factory.mktemp("pool-live") / "live.wav", gap=1.5)


def _post(url: str, path: Path, **fields: str) -> httpx.Response:
    return httpx.post(url, files={"file": (path.name, path.read_bytes())}, data=fields, timeout=900)


def test_serve_config_builder_takes_the_commands_options():
    from realtime.pool import app

    fixed = app({"replicas": "3", "cpu_threads": "1"})._bound_deployment
    assert fixed.num_replicas == 3 and fixed.ray_actor_options["num_cpus"] == 1.0
    scaled = app({"autoscale": "1:4", "target_ongoing_requests": "5", "engine": "vllm"})._bound_deployment
    config = scaled._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests) == (1, 4, 5.0)
    assert scaled.ray_actor_options["num_gpus"] == 1.0, "a vLLM replica holds a GPU"
    with pytest.raises(ValueError, match="unknown pool arguments: nonsense"):
        app({"replicas": "2", "nonsense": "1"})


def test_pool_runs_on_loopback_with_two_replicas(pool: Pool):
    replicas = pool.replicas()
    assert len(replicas) == REPLICAS and len(set(replicas)) == REPLICAS
    for h in replicas.values():
        assert h["ready"] and h["engine"] == "embedded" and h["cpu_threads"] == 1 and h["node_ip"] == "127.0.0.1"
    # every Ray process of the pool stays on loopback: node address, and no connection to another address
    out = subprocess.run(["ss", "-Htnp", "state", "established"], capture_output=True, text=True).stdout
    pids = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _group(p) == pool.proc.pid}
    outside = [line for line in out.splitlines() if any(f"pid={pid}," in line for pid in pids)
               and not all(_loopback(addr) for addr in line.split()[2:4])]
    assert len(pids) > REPLICAS and not outside, outside


def _group(proc: Path) -> int:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, ValueError, IndexError):
        return -1


def _loopback(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "::ffff:127.0.0.1") or host.startswith("::ffff:127.")


def test_api_through_the_pool_matches_the_embedded_engine(pool: Pool, engine):
    chosen = clips(longest=15)
    # several uploads at once, so both replicas take requests and each one's worker batches them
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        answers = list(ex.map(lambda c: _post(pool.route, c.path), chosen))
    pool_s = time.monotonic() - t0
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200]
    pooled = [r.json()["text"] for r in answers]

    settings = Settings()

    async def embedded() -> list[str]:
        out = []
        for c in chosen:
            entries = await transcribe_file(c.path, engine, settings.vad_config(), TranscribeOptions(),
                                            window_s=settings.file_window_s)
            out.append(fmt.to_text(entries))
        return out

    t0 = time.monotonic()
    local = asyncio.run(embedded())
    local_s = time.monotonic() - t0
    references = [c.text for c in chosen]
    wer_pool, wer_local = corpus_wer(references, pooled), corpus_wer(references, local)
    print(f"\nWER over {len(chosen)} clips: pool {wer_pool:.2%} in {pool_s:.1f} s, embedded {wer_local:.2%} in "
          f"{local_s:.1f} s")
    assert abs(wer_pool - wer_local) <= 0.01
    served = pool.replicas()
    assert len(served) == REPLICAS and all(h["queue"]["done"] > 0 for h in served.values()), \
        "both replicas must have transcribed"


def test_every_response_format_and_streaming_through_the_pool(pool: Pool):
    clip = next(c for c in clips() if c.name == "jfk.flac")
    assert "ask not what your country" in _post(pool.route, clip.path).json()["text"].lower()
    text = _post(pool.route, clip.path, response_format="text")
    assert text.headers["content-type"].startswith("text/plain") and "country" in text.text
    verbose = _post(pool.route, clip.path, response_format="verbose_json").json()
    assert verbose["segments"] and verbose["duration"] == pytest.approx(11.0, abs=0.1)
    assert 0 <= verbose["segments"][0]["start"] < verbose["segments"][-1]["end"] <= 11.1
    srt = _post(pool.route, clip.path, response_format="srt").text
    assert srt.startswith("1\n00:00:") and " --> " in srt
    vtt = _post(pool.route, clip.path, response_format="vtt")
    assert vtt.text.startswith("WEBVTT") and vtt.headers["content-type"].startswith("text/vtt")
    with httpx.stream("POST", pool.route, files={"file": (clip.path.name, clip.path.read_bytes())},
                      data={"stream": "true"}, timeout=120) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert '"transcript.text.delta"' in lines[0] and '"transcript.text.done"' in lines[-1]
    # the app's errors, in OpenAI's shape, come through Serve's proxy unchanged
    bad = _post(pool.route, clip.path, response_format="docx")
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_response_format"
    models = httpx.get(f"{pool.url}/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "tiny.en (bundled)"


def test_a_long_recording_through_the_pool_is_transcribed_as_the_embedded_engine_does(pool: Pool, front: App,
                                                                                     app: App, tmp_path: Path):
    """9.5 minutes of real speech (every clip of tests/data joined) to the front end, whose remote engine is the
    pool, and to an app on the embedded engine: at most a point above it, each packed window decoded whole by a
    replica and checked for coverage by the front end (realtime/live/coverage.py; the lost stretches are printed).
    A point, as for another instance (tests/test_remote.py): a window whose greedy decode is rejected is sampled,
    and the draws follow the order the windows reach the replicas."""
    comp = long_recording(tmp_path / "long.wav")
    texts = {}
    for name, target in (("pool", front), ("embedded", app)):
        r = _post(f"{target.url}/v1/audio/transcriptions", comp.path)
        assert r.status_code == 200, r.text
        texts[name] = r.json()["text"]
    figures = {k: corpus_wer([comp.text], [v]) for k, v in texts.items()}
    lost = {k: lost_runs(comp.text, v) for k, v in texts.items()}
    print(f"\nlong recording, WER: {', '.join(f'{k} {100 * v:.2f} %' for k, v in figures.items())}; stretches of 5+ "
          f"words lost: { {k: len(v) for k, v in lost.items()} }")
    assert figures["pool"] <= figures["embedded"] + 0.01  # no worse by more than a point (better is no loss)


def _check_live(live_speech: Compilation, events: list[dict[str, Any]]) -> str:
    finals = check_events(events)
    assert len(finals) >= len(live_speech.clips), "every clip must give at least one final"
    return " ".join(f["text"] for f in finals)


def test_live_webrtc_session_through_an_app_whose_engine_is_the_pool(front: App, app: App,
                                                                     live_speech: Compilation):
    """The same real speech streamed live to the front end (engine: the pool) and to an app on the embedded
    engine: the pool's WER at most a point above the embedded engine's."""
    health = front.health()
    assert health["engine"] == "remote" and health["ready"] and "tiny.en" in health["model"]
    result = asyncio.run(stream_file(front.url, live_speech.path, ice_loopback=True))
    text = _check_live(live_speech, result.events)
    assert result.summary["segments"] == result.summary["finals"]
    embedded = asyncio.run(stream_file(app.url, live_speech.path, ice_loopback=True))
    reference = [" ".join(c.text for c in live_speech.clips)]
    wer_pool = corpus_wer(reference, [text])
    wer_embedded = corpus_wer(reference, [_check_live(live_speech, embedded.events)])
    print(f"\nlive WER: through the pool {wer_pool:.2%}, embedded engine {wer_embedded:.2%}")
    assert wer_pool <= wer_embedded + 0.01


def test_a_replica_killed_mid_stream_is_replaced_and_no_final_is_lost(pool: Pool, front: App,
                                                                      live_speech: Compilation):
    before = pool.replicas()
    assert len(before) == REPLICAS
    victim = min(before)
    killed: list[float] = []

    def on_event(event: dict[str, Any]) -> None:
        # the moment a segment closes its final goes to the pool: kill a replica then
        if event["type"] == "speech_stopped" and not killed:
            os.kill(victim, signal.SIGKILL)
            killed.append(time.monotonic())

    result = asyncio.run(stream_file(front.url, live_speech.path, ice_loopback=True, on_event=on_event))
    assert killed, "no segment closed"
    print("\nfront end's view of the pool:", front.health()["endpoints"])
    text = _check_live(live_speech, result.events)
    assert result.summary["segments"] == result.summary["finals"], "a final was lost"
    assert corpus_wer([" ".join(c.text for c in live_speech.clips)], [text]) <= 0.2

    deadline = time.monotonic() + 90
    after: dict[int, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        after = pool.replicas(timeout=5)
        if len(after) == REPLICAS and victim not in after:
            break
        time.sleep(0.5)
    assert victim not in after and len(after) == REPLICAS, f"Serve did not replace the replica: {sorted(after)}"


def test_load_scales_the_pool_up_and_back_down(pool: Pool):
    deadline = time.monotonic() + 60
    while pool.counts()[-1][0] != REPLICAS and time.monotonic() < deadline:  # a replaced replica still starting
        time.sleep(0.5)
    assert pool.counts()[-1][0] == REPLICAS
    seen = len(pool.counts())
    clip = next(c for c in clips() if c.name == "jfk.flac")
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            assert _post(pool.route, clip.path).status_code == 200

    def wait_for(count: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(n == count for n, _ in pool.counts()[seen:]):
                return True
            time.sleep(0.5)
        return False

    t0 = time.monotonic()
    with ThreadPoolExecutor(12) as ex:
        clients = [ex.submit(load) for _ in range(12)]
        try:
            scaled_up = wait_for(MAX_REPLICAS, 120)
            up_s = time.monotonic() - t0
        finally:
            stop.set()
        for c in clients:
            c.result()
    assert scaled_up, f"no replica added under load: {pool.counts()}"
    seen, t1 = len(pool.counts()), time.monotonic()
    assert wait_for(REPLICAS, 120), f"the pool did not scale back down: {pool.counts()}"
    print(f"\nreplica added {up_s:.1f} s after the load started, removed {time.monotonic() - t1:.1f} s after it "
          f"stopped; replicas over time (count, s since the pool started): {pool.counts()}")
