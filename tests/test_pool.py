"""The engine pool (realtime/pool): `python -m realtime pool` on a real local Ray cluster kept on loopback (one per
run), two replicas of the embedded engine, real recordings over real HTTP, an app whose remote engine is the pool,
and a live session whose engine is the pool, with the replica that holds one of its finals killed.

The pool's readings are compared with the embedded engine's, computed once per run (conftest.py `readings`,
`long_reading`; tests/remote_live.py `embedded_live`)."""

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
from endpoints import FakeEndpoint, HeldUpload
from remote_live import embedded_live, finals_text, front_settings, live_recording, stream

from realtime.live.service import TranscriptionService

from conftest import ROOT, SPACE_VARIABLES, free_port, gone, launch, recorded, stop
from real_speech import DATA, clips, corpus_wer, several_speakers, wer

REPLICAS = 2
MAX_REPLICAS = 3
"""The shared pool autoscales between these."""
TARGET = 4
"""Requests in flight per replica that the autoscaler aims at: the other tests stay at or under it (4 uploads at
once, a front end's 8 windows in flight over 2 replicas); the autoscaling test holds more."""


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
        return httpx.get(f"{self.url}/health", timeout=60).json()

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

    def holder(self, timeout: float = 120) -> int:
        """The process id of a replica that reports a transcription request in progress, asked from four clients
        at once (Serve's proxy sends a lone /health to the replica with the fewest requests, not the busy one)."""
        deadline = time.monotonic() + timeout
        found: list[int] = []

        def ask() -> None:
            while not found and time.monotonic() < deadline:
                try:
                    h = self.health()
                except (httpx.HTTPError, ValueError):
                    continue
                if h.get("requests", 0) >= 1:
                    found.append(h["pid"])

        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda _: ask(), range(4)))
        assert found, "no replica reported the request"
        return found[0]

    def wait_for_count(self, count: int, since: int, timeout: float) -> bool:
        """Until the pool's log reports `count` running replicas after its first `since` reports."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(n == count for n, _ in self.counts()[since:]):
                return True
            time.sleep(0.5)
        return False


def _env() -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith(("REALTIME_", "GRADIO_", "RAY_"))
                 and k not in SPACE_VARIABLES}
    return {**inherited, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """The run's one pool (its one Ray cluster): autoscaled 2:3, a replica added after 1 s above the target and
    removed after 2 s below it (the autoscaling test's waits; Serve's own delays otherwise)."""
    port = free_port()
    log = tmp_path_factory.mktemp("pool") / "pool.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime", "pool", "--autoscale", f"{REPLICAS}:{MAX_REPLICAS}",
         "--target-ongoing-requests", str(TARGET), "--upscale-delay", "1", "--downscale-delay", "2",
         "--cpu-threads", "1", "--port", str(port)],
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


def _post(url: str, path: Path, **fields: str) -> httpx.Response:
    return httpx.post(url, files={"file": (path.name, path.read_bytes())}, data=fields, timeout=900)


@pytest.mark.fast
def test_a_local_ray_start_that_times_out_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray gives a new node's raylet a fixed 30 s to register, which a busy machine can miss: the pool starts its
    local node again (up to three tries), after stopping what the failed start left; other errors are raised."""
    import types

    from realtime import pool as pool_module

    calls: list[str] = []
    failures = iter([Exception("The current node timed out during startup."), None])

    def init(**kwargs: Any) -> None:
        calls.append("init")
        failure = next(failures)
        if failure is not None:
            raise failure

    for name in ("RAY_USAGE_STATS_ENABLED", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_worker_niceness"):
        monkeypatch.setenv(name, os.environ.get(name, "0"))  # start_ray's defaults, undone after the test
    fake = types.SimpleNamespace(init=init, shutdown=lambda: calls.append("shutdown"))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(pool_module, "_stop_children", lambda: calls.append("stop"))
    pool_module.start_ray(None, 1, 0)
    assert calls == ["init", "shutdown", "stop", "init"]

    fake.init = lambda **kwargs: (_ for _ in ()).throw(ValueError("bad argument"))
    with pytest.raises(ValueError):
        pool_module.start_ray(None, 1, 0)
    fake.init = lambda **kwargs: (_ for _ in ()).throw(Exception("The current node timed out during startup."))
    calls.clear()
    with pytest.raises(Exception, match="timed out"):
        pool_module.start_ray(None, 1, 0)
    assert calls.count("stop") == pool_module.RAY_START_ATTEMPTS - 1


@pytest.mark.fast
def test_what_a_failed_ray_start_left_is_stopped() -> None:
    """`_stop_children` (the retry's clean-up) kills every process below the pool's, grandchildren too."""
    script = ("import subprocess, sys\n"
              "subprocess.Popen(['sh', '-c', 'sleep 300 & exec sleep 300'])\n"
              "import time; time.sleep(0.5)\n"
              "from realtime.pool import _descendants, _stop_children\n"
              "before = _descendants(__import__('os').getpid())\n"
              "_stop_children()\n"
              "print(len(before), len(_descendants(__import__('os').getpid())))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "0"], out.stdout


def test_serve_config_builder_takes_the_commands_options():
    from realtime.pool import app

    fixed = app({"replicas": "3", "cpu_threads": "1"})._bound_deployment
    assert fixed.num_replicas == 3 and fixed.ray_actor_options["num_cpus"] == 1.0
    scaled = app({"autoscale": "1:4", "target_ongoing_requests": "5", "engine": "vllm", "upscale_delay_s": "1",
                  "downscale_delay_s": "2"})._bound_deployment
    config = scaled._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas, config.target_ongoing_requests) == (1, 4, 5.0)
    assert (config.upscale_delay_s, config.downscale_delay_s) == (1.0, 2.0)
    assert scaled.ray_actor_options["num_gpus"] == 1.0, "a vLLM replica holds a GPU"
    with pytest.raises(ValueError, match="unknown pool arguments: nonsense"):
        app({"replicas": "2", "nonsense": "1"})


def test_pool_runs_on_loopback_with_two_replicas(pool: Pool):
    replicas = pool.replicas()
    assert len(replicas) == REPLICAS and len(set(replicas)) == REPLICAS
    for h in replicas.values():
        assert h["ready"] and h["engine"] == "embedded" and h["cpu_threads"] == 1 and h["node_ip"] == "127.0.0.1"
        assert h["requests"] == 0, "no transcription request in progress"
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
    models = httpx.get(f"{pool.url}/v1/models", timeout=60).json()
    assert models["data"][0]["id"] == "tiny.en (bundled)"


def test_a_live_session_through_the_pool_loses_no_final_when_the_replica_decoding_one_dies(
        pool: Pool, engine: Any, shared: Path, tmp_path: Path):
    """A live session whose engine is the pool (tests/remote_live.py: a front end in this process, fed real speech
    through the WebRTC audio path at the speed the code allows), through a proxy that holds a final of the session
    half-uploaded while its other requests wait at the proxy's gate: the one replica that reports a request in
    progress holds that final, and is killed with SIGKILL; once Serve counts it gone, the proxy lets everything
    go on. The final's upload fails (Serve's proxy answers 500 for a replica that died), the remote engine sends
    it again, the live replica decodes it, and Serve starts a replica in the dead one's place. Every segment ends
    final; the live WER through the pool at most a point above the embedded engine's live reading of the same
    recording."""
    before = pool.replicas()
    assert len(before) == REPLICAS
    comp = live_recording(tmp_path / "live.wav")
    reference = embedded_live(shared, engine, tmp_path)
    proxy = FakeEndpoint(upstream=pool.url)
    # a final, not a partial: partials come only at the start of each segment here (a long partial interval) and
    # are shorter than 2 s; finals are whole segments
    proxy.script_min_seconds = 2.0
    proxy.script.append("hold-mid")
    killed: list[int] = []
    failed: list[BaseException] = []
    over = threading.Event()

    def kill_the_holder() -> None:
        try:
            while not proxy.holding.wait(0.2):
                assert not over.is_set(), "no final reached the proxy"
            proxy.gate()
            proxy.wait_forwarding(1)  # the held final is the only request at the pool
            victim = pool.holder()
            assert victim in before, (victim, sorted(before))
            since = len(pool.counts())
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            # Serve counts the replica gone before anything is sent on: its proxy routes no retry to the dead one
            assert pool.wait_for_count(REPLICAS - 1, since, 120), f"Serve did not see the kill: {pool.counts()}"
        except BaseException as exc:  # raised again in the test's thread
            failed.append(exc)
        finally:
            proxy.release()
            proxy.open_gate()

    service = TranscriptionService(front_settings("--remote-url", f"{proxy.url}/v1/audio/transcriptions",
                                                  "--partial-interval", "60", "--partial-interval-max", "60"))

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        await service.start()
        try:
            return await stream(service, comp.path), service.engine.describe()
        finally:
            await service.stop()

    killer = threading.Thread(target=kill_the_holder)
    killer.start()
    try:
        events, described = asyncio.run(scenario())
    finally:
        over.set()
        killer.join(180)
        proxy.close()
    if failed:
        raise failed[0]
    assert killed, "no replica was killed"
    log = proxy.requests()
    held = next(e for e in log if e["behaviour"] == "hold-mid")
    assert held.get("forwarded") != 200, "the killed replica did not hold the final"
    again = [e.get("forwarded") for e in log if e["digest"] == held["digest"] and e is not held]
    assert again.count(200) == 1, f"the final was not sent again and decoded once: {again}"
    print(f"\nkilled replica {killed[0]}; the held final's attempts after it: {again}; the front end's view of the "
          f"pool: {described['endpoints']}")

    text = finals_text(events)
    assert len([e for e in events if e["type"] == "final"]) >= len(comp.clips), "every clip must give a final"
    wer_pool, wer_embedded = corpus_wer([comp.text], [text]), corpus_wer([comp.text], [reference])
    print(f"live WER: through the pool {wer_pool:.2%}, embedded engine {wer_embedded:.2%}")
    assert wer_pool <= wer_embedded + 0.01

    deadline = time.monotonic() + 180
    after: dict[int, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        after = pool.replicas(timeout=5)
        if len(after) == REPLICAS and killed[0] not in after:
            break
        time.sleep(0.5)
    assert killed[0] not in after and len(after) == REPLICAS, f"Serve did not replace the replica: {sorted(after)}"


def test_load_scales_the_pool_up_and_back_down(pool: Pool):
    """Requests in flight above `--target-ongoing-requests` per replica add a replica, and once they are over the
    pool goes back to its minimum. The load is uploads held half-sent (tests/endpoints.py `HeldUpload`): each is a
    request in flight at the pool, as Serve's autoscaler counts them, and costs no decoding."""
    deadline = time.monotonic() + 180
    while pool.counts()[-1][0] != REPLICAS and time.monotonic() < deadline:  # a replaced replica still starting
        time.sleep(0.5)
    assert pool.counts()[-1][0] == REPLICAS
    seen = len(pool.counts())
    audio = (DATA / "jfk.flac").read_bytes()
    t0 = time.monotonic()
    held = [HeldUpload(pool.route, audio) for _ in range(REPLICAS * TARGET + 1)]
    try:
        for upload in held:
            assert upload.sent.wait(60)
        scaled_up = pool.wait_for_count(MAX_REPLICAS, seen, 180)
        up_s = time.monotonic() - t0
    finally:
        for upload in held:
            upload.release()
    assert scaled_up, f"no replica added under load: {pool.counts()}"
    seen, t1 = len(pool.counts()), time.monotonic()
    assert pool.wait_for_count(REPLICAS, seen, 180), f"the pool did not scale back down: {pool.counts()}"
    print(f"\nreplica added {up_s:.1f} s after the load started, removed {time.monotonic() - t1:.1f} s after it "
          f"stopped; replicas over time (count, s since the pool started): {pool.counts()}")


POOL_CLIPS = 16
SEVERAL_MARGIN_WORDS = 3  # tests/test_real_speech.py's margin on the same file


def test_api_through_the_pool_matches_the_embedded_engine(pool: Pool, readings: dict[str, dict[str, str]]):
    """A sample of the real clips of 15 s or less (every condition), uploaded to the pool four at once (so both
    replicas take requests and each one's worker batches them): the corpus WER within a point of the embedded
    engine's reading of the same clips, one file each. The pool's text path on every clip is the long recording's
    (below)."""
    short = clips(longest=15)
    chosen = short[:: max(1, len(short) // POOL_CLIPS)][:POOL_CLIPS]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        answers = list(ex.map(lambda c: _post(pool.route, c.path), chosen))
    pool_s = time.monotonic() - t0
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers if r.status_code != 200]
    pooled = [r.json()["text"] for r in answers]
    references = [c.text for c in chosen]
    wer_pool = corpus_wer(references, pooled)
    wer_local = corpus_wer(references, [readings["text"][c.name] for c in chosen])
    print(f"\nWER over {len(chosen)} clips: pool {wer_pool:.2%} in {pool_s:.1f} s, embedded {wer_local:.2%}")
    assert abs(wer_pool - wer_local) <= 0.01
    served = pool.replicas()
    assert len(served) == REPLICAS and all(h["queue"]["done"] > 0 for h in served.values()), \
        "both replicas must have transcribed"


def test_a_file_through_a_front_end_whose_engine_is_the_pool_keeps_every_speaker(
        pool: Pool, shared: Path, tmp_path: Path):
    """Four people's recordings in one file (the packed window that once kept only the first speaker) to a front
    end (`python app.py --engine remote`) whose remote engine is the pool: the front end's coverage check
    (realtime/live/coverage.py) over a replica's decode keeps every speaker, and the text is within a few words of
    faster-whisper's on the same file. The long recording goes through another instance (tests/test_remote.py);
    the pool's figure on it is a benchmark (docs/performance.md)."""
    comp = several_speakers(tmp_path / "several.wav")  # the name its reference is recorded under
    # the read timeout a deadline that only a fault reaches (a replica decodes the windows it holds as one batch)
    front = launch(tmp_path, "--engine", "remote", "--remote-url", pool.route, "--remote-timeout", "600")
    try:
        health = front.health()
        assert health["engine"] == "remote" and health["ready"] and "tiny.en" in health["model"]
        r = _post(f"{front.url}/v1/audio/transcriptions", comp.path)
    finally:
        stop(front)
    assert r.status_code == 200, r.text
    text, fw = r.json()["text"], recorded(shared, "fw-several")[comp.path.name]
    print(f"\nfour speakers through the pool: WER {100 * wer(comp.text, text):.2f} %, faster-whisper "
          f"{100 * wer(comp.text, fw):.2f} %")
    assert "dashwood" in text.lower() and "small dog" in text.lower(), text
    assert wer(comp.text, text) <= wer(comp.text, fw) + SEVERAL_MARGIN_WORDS / len(comp.text.split()), text
