"""The benchmark commands run end to end on a short input and write their JSON, table and chart.

These prove the commands work; the figures the docs quote come from the commands themselves, run at full size
(docs/performance.md gives each command)."""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys

import pytest

from realtime.bench.stream import _stream_speech

from conftest import ROOT


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "realtime", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


def test_bench_file_compares_the_pipelines_in_one_run(tmp_path):
    """Every pipeline but vLLM's (a vLLM start of its own; the engine is tested in tests/test_vllm.py) on a short
    synthesized recording: a row each, side by side with faster-whisper's."""
    out = bench("file", "--minutes", "0.2", "--runs", "1", "--only", "realtime,faster-whisper batched,transformers",
                "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "bench-file.json").read_text())
    names = [r["name"] for r in doc["results"]]
    for prefix in ("realtime text", "realtime timed", "faster-whisper (", "faster-whisper batched", "transformers"):
        assert any(n.startswith(prefix) for n in names), names
    assert not any(n.startswith("vllm") for n in names), "--only leaves vLLM out"
    for r in doc["results"]:
        assert r["rtfx"] > 0 and r["wer"] <= 0.3 and r["loops"] == 0, r
    base = next(r for r in doc["results"] if r["name"].startswith("faster-whisper ("))
    assert base["vs_faster_whisper"] == 1.0
    assert (tmp_path / "bench-file.md").read_text().count("|") > 20
    assert (tmp_path / "bench-file.png").stat().st_size > 1000


@pytest.mark.fast
def test_stream_clients_of_a_manifest_pause_at_times_of_their_own_unless_asked_for_the_same_order(tmp_path):
    args = argparse.Namespace(audio=str(ROOT / "tests" / "data" / "manifest.tsv"), text=None, seconds=30.0)
    own, what = _stream_speech(args, tmp_path, 4)
    assert "order of its own" in what and len(own) == 4
    assert all(sorted(c.name for c in comp.clips) == sorted(c.name for c in own[0].clips) for comp in own)
    assert len({tuple(end for _, end in comp.spans) for comp in own}) == 4, "two clients pause together"
    same, what = _stream_speech(argparse.Namespace(**{**vars(args), "order": "same"}), tmp_path, 4)
    assert "same order" in what and all(comp is same[0] for comp in same)
    assert [c.name for c in same[0].clips] == [c.name for c in own[0].clips]


def test_bench_stream_reports_latency_and_idle_cpu(app, tmp_path):
    """One client against the worker's app (idle while this test runs), with a short idle sample."""
    out = bench("stream", "--clients", "1", "--idle-seconds", "2", "--url", app.url, "--pid", str(app.proc.pid),
                "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "bench-stream.json").read_text())
    row = doc["results"][0]
    assert row["clients"] == 1 and row["lost_segments"] == 0 and row["failed_clients"] == 0 and row["loops"] == 0
    assert 0 < row["final_p50"] <= row["final_p95"] <= row["final_max"]
    assert 0 < row["server_final_p95"] and row["client_cpu_cores"] > 0
    assert row["first_partial_p50"] > 0 and row["wer"] <= 0.3
    assert doc["idle"]["idle_session_core_pct"] >= 0
    assert (tmp_path / "bench-stream.png").stat().st_size > 1000


def test_bench_soak_samples_memory_fds_and_latency(app, tmp_path):
    """A short soak (the command's rounds, samples and verdicts; the hour-long one is the benchmark): 2 clients of
    10 s of real speech from tests/data, a round every 20 s for 45 s, against the worker's app."""
    out = bench("soak", "--minutes", "0.75", "--clients", "2", "--seconds", "10", "--period-s", "20",
                "--sample-s", "4", "--url", app.url, "--pid", str(app.proc.pid), "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "bench-soak.json").read_text())
    s = doc["summary"]
    assert doc["clients"] == 2 and doc["minutes"] == 0.75 and "real utterances" in doc["input"]
    assert s["lost_segments"] == 0 and s["failed_rounds"] == 0 and s["errors"] == 0, s
    assert s["rounds"] >= 4 and s["finals"] >= 8 and s["wer"] <= 0.3
    for client in (0, 1):  # rounds keep to their 20 s schedule, not back to back after 10 s of audio (a round may
        # start late on a busy machine: the first once began 0.7 s after its slot, the next on time)
        starts = [r["start_s"] for r in doc["rounds"] if r["client"] == client]
        assert len(starts) >= 2 and all(b - a >= 15 for a, b in itertools.pairwise(starts)), starts
    assert len(doc["samples"]) >= 8 and all({"minute", "rss_mb", "fds", "final_p95", "load"} <= set(x)
                                             for x in doc["samples"])
    assert 100 < s["rss_after_warmup_mb"] and s["rss_end_mb"] and s["rss_growth_after_warmup_pct"] is not None
    assert s["fds_after_warmup"] > 10 and s["fds_end"] > 10 and s["fds_slope_per_min"] is not None
    assert 0 < s["final_p95_first_tenth"] and 0 < s["final_p95_last_tenth"] and s["final_p95_ratio"] > 0
    assert set(s["verdict"]) == {"rss_growth_under_5_pct", "fds_flat", "nothing_lost", "last_tenth_p95_within_20_pct"}
    assert s["verdict"]["nothing_lost"]
    assert "RSS growth" in (tmp_path / "bench-soak.md").read_text()
    assert (tmp_path / "bench-soak.png").stat().st_size > 1000


def test_bench_pool_report_says_each_scaling_against_the_step_it_came_in(tmp_path):
    """The pool benchmark's report, written again from its JSON (`--report`): replica changes placed in the
    load steps, the replica count at each step's end, the embedded engine's row beside the pool's."""
    step = {"final_p50": 0.7, "final_p95": 1.2, "wer": 0.08, "lost_segments": 0, "failed_clients": 0}
    doc = {"kind": "pool", "machine": "2 CPU cores", "input": "speech", "autoscale": "1:3",
           "target_ongoing_requests": 2.0, "replicas": [[17.1, 1], [147.9, 2], [212.5, 3], [261.8, 1]],
           "load": [23.7, 239.1, 262.1],
           "steps": [{"clients": n, "start_s": a, "end_s": b, **step}
                     for n, a, b in [(1, 23.7, 74.7), (2, 74.7, 125.7), (4, 125.7, 177.3), (8, 177.3, 239.1)]],
           "embedded": [{"clients": 8, **step, "final_p95": 1.9}], "summary": {"lost_segments": 0, "back_down": True}}
    (tmp_path / "in.json").write_text(json.dumps(doc))
    subprocess.run([sys.executable, "-m", "realtime", "bench", "pool", "--report", str(tmp_path / "in.json"),
                    "--out", str(tmp_path)], cwd=ROOT, check=True, capture_output=True)
    table = (tmp_path / "bench-pool.md").read_text()
    assert "1 to 2 replicas 22.2 s into the 4-client step; 2 to 3 replicas 35.2 s into the 8-client step; " \
           "3 to 1 replicas 22.7 s after the load stopped" in table
    rows = [r for r in table.splitlines() if r.startswith("| 4 ") or r.startswith("| 8 ")]
    assert [c.strip() for c in rows[0].split("|")[1:-1]] == ["4", "2", "0.7 / 1.2", "8.0 %", "0", "", "", ""]
    assert rows[1].startswith("| 8 | 3 | 0.7 / 1.2 |") and "0.7 / 1.9" in rows[1]
    assert (tmp_path / "bench-pool.png").stat().st_size > 0


@pytest.mark.fast
def test_peers_score_stamps_each_utterance_from_the_servers_own_text():
    """`bench peers` scores every server the same way: from what its client was shown over time, per utterance."""
    from realtime.bench.peers import Utterance, score

    utts = [Utterance(0.5, 2.0, "Hello there, my friend."), Utterance(3.2, 5.0, "How are you today?"),
            Utterance(6.2, 8.0, "See you tomorrow.")]
    first = "Hello there my friend."
    snaps = [(1.0, "", "Hello"), (2.3, first, first), (3.6, first, f"{first} How"),
             (5.8, f"{first} How are you today?", f"{first} How are you today?"),
             (6.9, f"{first} How are you today?", f"{first} How are you today? See you")]
    s = score(snaps, utts)
    assert s.final_s == [0.3, 0.8, None]  # the third was shown but never final
    assert s.shown_s == [0.5, 0.4, 0.7]
    # a word the server rewrites is final only when its last version arrives
    rewritten = [*snaps[:2], (4.0, "Hello there my friends.", "Hello there my friends.")]
    assert score(rewritten, utts[:1]).final_s == [2.0]
    # a misheard word still pairs with its utterance; an utterance with nothing said of it is never final
    misheard = [(2.5, "Hello there my fiend.", "Hello there my fiend.")]
    assert score(misheard, utts[:2]).final_s == [0.5, None]
    # `bench turns`: an utterance finalised in two pieces is split; one final holding two utterances merged them
    split = [(1.5, "Hello there", "Hello there"), (2.3, first, first), (5.8, f"{first} How are you today?",
                                                                        f"{first} How are you today?")]
    assert (score(split, utts[:2]).pieces, score(split, utts[:2]).merged) == ([2, 1], 0)
    both = [(5.8, f"{first} How are you today?", f"{first} How are you today?")]
    assert (score(both, utts[:2]).pieces, score(both, utts[:2]).merged) == ([1, 1], 1)


@pytest.mark.fast
def test_peer_clients_keep_what_each_server_calls_final(monkeypatch):
    """The peers' protocols, against scripted servers on loopback: WhisperLive's completed segments are kept by
    start time when they scroll out of the last few it sends; WhisperLiveKit's committed lines are final and its
    buffer tentative."""
    import asyncio

    import numpy as np
    from websockets.asyncio.server import serve

    from realtime.bench import peers

    monkeypatch.setattr(peers, "TAIL_S", 0.0)

    async def whisperlive(ws):
        options = json.loads(await ws.recv())
        assert options["use_vad"] and options["language"] == "en"
        await ws.send(json.dumps({"uid": options["uid"], "message": "SERVER_READY", "backend": "faster_whisper"}))
        seg = lambda s, text, done: {"start": f"{s:.3f}", "end": f"{s + 1:.3f}", "text": text, "completed": done}  # noqa: E731
        await ws.recv()
        await ws.send(json.dumps({"segments": [seg(0, " One.", True), seg(1, " Two", False)]}))
        await ws.send(json.dumps({"segments": [seg(1, " Two.", True), seg(2, " Three", False)]}))
        async for msg in ws:
            if msg == b"END_OF_AUDIO":
                break

    async def whisperlivekit(ws):
        await ws.send(json.dumps({"type": "config", "useAudioWorklet": True, "mode": "full"}))
        await ws.recv()
        await ws.send(json.dumps({"lines": [{"text": "One"}], "buffer_transcription": "two"}))
        await ws.send(json.dumps({"lines": [{"text": "One two."}], "buffer_transcription": ""}))
        async for msg in ws:
            if msg == b"":
                await ws.send(json.dumps({"type": "ready_to_stop"}))

    async def run(handler, play):
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await play(port, np.zeros(8000, np.float32))

    wl = asyncio.run(run(whisperlive, lambda port, audio: peers.play_whisperlive(port, audio, "tiny.en")))
    assert wl.error is None
    assert [s[1:] for s in wl.snapshots] == [("One.", "One. Two"), ("One. Two.", "One. Two. Three")]
    wlk = asyncio.run(run(whisperlivekit, peers.play_whisperlivekit))
    assert wlk.error is None
    assert [s[1:] for s in wlk.snapshots] == [("One", "One two"), ("One two.", "One two.")]


@pytest.mark.fast
def test_bench_random_fails_when_any_path_of_the_app_lost_speech_but_not_for_faster_whisper():
    """`bench file --random N --served --only http` runs no in-process pipeline: a loss in a served path (seed 5045's
    verbose_json) must still fail the command; faster-whisper's losses are the comparison, not a failure."""
    from realtime.bench.compilations import lost_anywhere

    def doc(**lost: int) -> dict:
        return {"results": [{"name": name, "lost_runs": n, "errors": []} for name, n in lost.items()]}

    assert lost_anywhere(doc(**{"faster-whisper (sequential, VAD)": 3, "HTTP json": 0, "HTTP verbose_json": 1}))
    assert lost_anywhere(doc(**{"realtime text (json, text)": 1}))
    assert not lost_anywhere(doc(**{"faster-whisper (sequential, VAD)": 18, "HTTP json": 0,
                                    "remote engine to another instance (json)": 0}))
    refused = doc(**{"HTTP json": 0})
    refused["results"][0]["errors"] = [{"seed": 22421, "error": "HTTPStatusError: 500"}]
    assert lost_anywhere(refused), "an error is not speech lost silently, but the run has not shown nothing lost"


@pytest.mark.fast
def test_bench_requests_wait_out_the_apps_back_pressure_as_the_openai_sdk_does(tmp_path):
    """With `--jobs 2` a served path's request may come while the other lane's remote engine holds all the app's
    `--api-max-requests` (seed 22421 of a 200-compilation run): the app answers 503 with Retry-After, which a client
    is to wait out, and the run must not count that compilation as lost."""
    from endpoints import FakeEndpoint, segment_audio

    from realtime.audio import wav_bytes
    from realtime.bench.common import post_file

    endpoint = FakeEndpoint()
    endpoint.script.extend(["busy:0", "busy:0", "ok"])
    clip = tmp_path / "clip.wav"
    clip.write_bytes(wav_bytes(segment_audio(7)))
    try:
        assert post_file(endpoint.port, clip, response_format="json").json() == {"text": "segment 7"}
    finally:
        endpoint.close()
    assert [e["behaviour"] for e in endpoint.requests()] == ["busy:0", "busy:0", "ok"]


@pytest.mark.fast
def test_bench_random_gives_no_rtfx_where_pipelines_ran_side_by_side(tmp_path):
    """With `--jobs 2` each pipeline's time holds the other lane's work, so the table must not pass it off as RTFx."""
    from realtime.bench.compilations import _document

    rows = {"HTTP json": {"name": "HTTP json", "wall_s": 10.0, "lost": [], "texts": ["one two"], "errors": []}}
    alone, _ = _document(rows, ["one two"], [7], 100.0, tmp_path / "m.tsv", "tiny.en", "int8")
    side, table = _document(rows, ["one two"], [7], 100.0, tmp_path / "m.tsv", "tiny.en", "int8", jobs=2)
    assert alone["results"][0]["rtfx"] == 10.0 and alone["jobs"] == 1
    assert side["results"][0]["rtfx"] is None and side["jobs"] == 2
    assert "| HTTP json | 0 | 0 | 0 | 0.0 % | – |" in table and "side by side" in table
