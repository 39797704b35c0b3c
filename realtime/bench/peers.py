"""`python -m realtime bench peers`: this app and the open-source live servers (WhisperLive, WhisperLiveKit) side by
side: the same weights, the same real utterances played in real time, N clients of each, in one run.

Each peer runs in a virtual environment of its own (`.venv-peers/<name>`, made on first use from the package
registry), offline, bound to 127.0.0.1, on the bundled tiny.en CTranslate2 weights, with the same thread count as
the app. Every client records what its server shows over time as snapshots (the text the server calls final, and
final plus tentative text); `score` turns one client's snapshots into per-utterance figures against the known
start and end of each utterance, the same way for every server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from .common import ROOT, _bundled_model, _cpu_seconds, _machine, free_port, write_outputs

PEERS_DIR = ROOT / ".venv-peers"
CHUNK_S = 0.05
"""Audio per WebSocket message to a peer (our WebRTC client sends 20 ms frames)."""
TAIL_S = 2.0
"""Silence each client plays after the recording, as a speaker pausing, before it ends the stream."""
SETTLE_S = 20.0
"""How long a client waits for more text after it ended its stream."""
THREADS = "2"

ENVS: dict[str, list[list[str]]] = {
    # its full requirements pull PyAudio, openvino, openai-whisper and CUDA libraries its faster_whisper backend
    # does not use: the package without them, then what its server imports
    "whisperlive": [["--no-deps", "whisper-live==0.10.0"],
                    ["torch==2.13.0", "faster-whisper==1.2.0", "websockets", "fastapi", "uvicorn", "requests",
                     "python-multipart"]],
    "whisperlivekit": [["whisperlivekit==0.2.26"]],
}
IMPORTS = {"whisperlive": "whisper_live.server", "whisperlivekit": "whisperlivekit.basic_server"}

Snapshot = tuple[float, str, str]
"""(seconds since the client's first audio, the text its server calls final, final plus tentative text)."""


@dataclass
class Trace:
    snapshots: list[Snapshot] = field(default_factory=list)
    error: str | None = None

    def add(self, t: float, final: str, shown: str) -> None:
        if not self.snapshots or self.snapshots[-1][1:] != (final, shown):
            self.snapshots.append((t, final, shown))


@dataclass(frozen=True)
class Utterance:
    start: float
    end: float
    text: str


@dataclass
class Scores:
    """One client's figures: per utterance, end of speech to its last word final (None: never final) and start of
    speech to its first word shown; and the texts at the end."""

    final_s: list[float | None]
    shown_s: list[float | None]
    final_text: str
    shown_text: str
    pieces: list[int] = field(default_factory=list)
    """Per utterance, how many finals its final words came in (more than one: the utterance was split)."""
    merged: int = 0
    """Finals that hold words of two or more utterances."""


def _normalizer() -> Callable[[str], str]:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def _aligned(ref: list[str], hyp: list[str]) -> dict[int, int]:
    """Reference word index -> hypothesis word index, for words the alignment pairs (equal or substituted)."""
    import jiwer

    if not ref or not hyp:
        return {}
    pairs: dict[int, int] = {}
    for chunk in jiwer.process_words(" ".join(ref), " ".join(hyp)).alignments[0]:
        if chunk.type in ("equal", "substitute"):
            for k in range(chunk.ref_end_idx - chunk.ref_start_idx):
                pairs[chunk.ref_start_idx + k] = chunk.hyp_start_idx + k
    return pairs


def score(snapshots: Sequence[Snapshot], utterances: Sequence[Utterance],
          norm: Callable[[str], str] | None = None) -> Scores:
    """Per-utterance latencies from one client's snapshots.

    Each word of the final text is stamped with the time it first stood where it stands (a word the server
    rewrites is stamped again). The final text at the end is aligned with the reference: an utterance is final when
    the last of its reference words that the alignment pairs with a final word is there, and never final when none
    is. It is first shown at the first snapshot from its start whose shown text, aligned the same way, pairs a word
    with it."""
    norm = norm or _normalizer()
    bounds, ref = [], []
    for u in utterances:
        words = norm(u.text).split()
        bounds.append((len(ref), len(ref) + len(words)))
        ref += words
    words_final: list[str] = []
    stamps: list[float] = []
    last_final = None
    shown_changes: list[tuple[float, list[str]]] = []
    last_shown = None
    for t, final, shown in snapshots:
        if final != last_final:
            last_final = final
            now = norm(final).split()
            k = 0
            while k < min(len(now), len(words_final)) and now[k] == words_final[k]:
                k += 1
            words_final, stamps = now, stamps[:k] + [t] * (len(now) - k)
        if shown != last_shown:
            last_shown = shown
            shown_changes.append((t, norm(shown).split()))
    pairs = _aligned(ref, words_final)
    final_s: list[float | None] = []
    pieces: list[set[float]] = []
    for (r0, r1), u in zip(bounds, utterances, strict=True):
        hits = [stamps[pairs[r]] for r in range(r0, r1) if r in pairs]
        final_s.append(round(max(hits) - u.end, 3) if hits else None)
        pieces.append(set(hits))
    shared = [t for i, p in enumerate(pieces) for t in p if any(t in q for q in pieces[i + 1:])]
    shown_s: list[float | None] = []
    k = 0
    for (r0, r1), u in zip(bounds, utterances, strict=True):
        while k < len(shown_changes) and shown_changes[k][0] < u.start:
            k += 1
        found = None
        for t, words in shown_changes[k:]:
            if t > u.end + SETTLE_S:
                break
            if any(r0 <= r < r1 for r in _aligned(ref[:r1], words)):
                found = round(t - u.start, 3)
                break
        shown_s.append(found)
    return Scores(final_s, shown_s, last_final or "", last_shown or "", [len(p) for p in pieces], len(set(shared)))


# ---- clients: each plays `audio` in real time and returns what it was shown


async def _paced(audio: np.ndarray, send: Callable[[np.ndarray], Any], t0: float) -> None:
    step = int(CHUNK_S * SAMPLE_RATE)
    padded = np.concatenate([audio, np.zeros(int(TAIL_S * SAMPLE_RATE), np.float32)])
    for i, start in enumerate(range(0, padded.size, step)):
        delay = t0 + i * CHUNK_S - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(padded[start:start + step])


async def _play_and_settle(audio: np.ndarray, send: Callable[[np.ndarray], Any], receive: Awaitable[None], t0: float,
                           end: Callable[[], Awaitable[None]]) -> None:
    """A WebSocket peer's session: read its messages while the audio is played, end the stream, then read on for
    at most `SETTLE_S`."""
    reader = asyncio.create_task(receive)
    await _paced(audio, send, t0)
    await end()
    try:
        await asyncio.wait_for(reader, SETTLE_S)
    except TimeoutError:
        pass


async def play_ours(url: str, audio: np.ndarray, tail: float = TAIL_S) -> Trace:
    """Our WebRTC client (aiortc): finals are the `final` events, partials the open segments' latest text."""
    from .client import stream_file

    trace = Trace()
    finals: dict[int, str] = {}
    partials: dict[int, str] = {}

    def on_event(e: dict[str, Any]) -> None:
        if e["type"] == "partial":
            partials[e["segment"]] = e["text"]
        elif e["type"] in ("final", "error"):
            partials.pop(e["segment"], None)
            if e["type"] == "final":
                finals[e["segment"]] = e["text"]
        else:
            return
        final = " ".join(finals[s] for s in sorted(finals))
        shown = " ".join(({**partials, **finals})[s] for s in sorted({*finals, *partials}))
        trace.add(e["t"], final, shown)

    try:
        await stream_file(url, audio=audio, ice_loopback=True, tail_seconds=tail, settle_timeout=SETTLE_S,
                          on_event=on_event)
    except Exception as exc:  # a refused or broken stream is a failed client, reported as such
        trace.error = f"{type(exc).__name__}: {exc}"
    return trace


async def play_whisperlive(port: int, audio: np.ndarray, model: str) -> Trace:
    """WhisperLive's protocol: JSON options, SERVER_READY, float32 frames, END_OF_AUDIO. Completed segments are
    final (kept by start time, as the server sends only the last few); the rest are tentative."""
    from websockets.asyncio.client import connect

    trace = Trace()
    completed: dict[float, str] = {}
    try:
        async with connect(f"ws://127.0.0.1:{port}", max_size=None, open_timeout=60) as ws:
            await ws.send(json.dumps({"uid": uuid.uuid4().hex, "language": "en", "task": "transcribe",
                                      "model": model, "use_vad": True}))
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if msg.get("message") == "SERVER_READY":
                    break
                if msg.get("status") in ("WAIT", "ERROR"):
                    raise RuntimeError(f"WhisperLive refused the client: {msg}")
            t0 = time.monotonic()

            async def send(chunk: np.ndarray) -> None:
                await ws.send(chunk.astype(np.float32).tobytes())

            async def receive() -> None:
                async for raw in ws:
                    msg = json.loads(raw)
                    if "segments" not in msg:
                        continue
                    pending = []
                    for seg in msg["segments"]:
                        if seg.get("completed"):
                            completed[float(seg["start"])] = seg["text"].strip()
                        else:
                            pending.append(seg["text"].strip())
                    final = " ".join(completed[k] for k in sorted(completed))
                    trace.add(time.monotonic() - t0, final, " ".join([final, *pending]).strip())

            await _play_and_settle(audio, send, receive(), t0, lambda: ws.send(b"END_OF_AUDIO"))
    except Exception as exc:
        trace.error = f"{type(exc).__name__}: {exc}"
    return trace


async def play_whisperlivekit(port: int, audio: np.ndarray) -> Trace:
    """WhisperLiveKit's `/asr` with `--pcm-input`: 16-bit PCM in; committed `lines` are final, the
    `buffer_transcription` tentative; an empty message ends the stream and `ready_to_stop` answers it."""
    from websockets.asyncio.client import connect

    trace = Trace()
    try:
        async with connect(f"ws://127.0.0.1:{port}/asr", max_size=None, open_timeout=60) as ws:
            config = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if not config.get("useAudioWorklet"):
                raise RuntimeError("WhisperLiveKit was not started with --pcm-input")
            t0 = time.monotonic()

            async def send(chunk: np.ndarray) -> None:
                await ws.send((np.clip(chunk, -1, 1) * 32767).astype(np.int16).tobytes())

            async def receive() -> None:
                async for raw in ws:
                    msg = json.loads(raw)
                    if msg.get("type") == "ready_to_stop":
                        return
                    if "lines" not in msg:
                        continue
                    final = " ".join(line["text"].strip() for line in msg["lines"] if line.get("text"))
                    trace.add(time.monotonic() - t0, final,
                              " ".join([final, msg.get("buffer_transcription", "").strip()]).strip())

            await _play_and_settle(audio, send, receive(), t0, lambda: ws.send(b""))
    except Exception as exc:
        trace.error = f"{type(exc).__name__}: {exc}"
    return trace


# ---- servers


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(parent, []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += _cpu_seconds(p)
        except OSError:
            continue
        todo += children.get(p, [])
    return total


def ensure_env(name: str) -> Path:
    """The peer's Python, its environment made first where it does not import."""
    env = PEERS_DIR / name
    python = env / "bin" / "python"
    check = [str(python), "-c", f"import {IMPORTS[name]}"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"creating {env} (a few minutes, once)", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    for step in ENVS[name]:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *step], check=True)
    if subprocess.run(check, capture_output=True).returncode != 0:
        raise RuntimeError(f"{name}'s environment does not import {IMPORTS[name]}")
    return python


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": THREADS, "GRADIO_ANALYTICS_ENABLED": "False"}


def _wait_port(proc: subprocess.Popen[bytes], port: int, log: Path, seconds: float = 180.0) -> None:
    import socket

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited during start-up ({log}):\n{log.read_text(errors='replace')[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not listen on {port} within {seconds:.0f} s ({log})")


@dataclass
class Server:
    system: str
    proc: subprocess.Popen[bytes]
    play: Callable[[np.ndarray], Any]
    started_s: float
    metrics_url: str | None = None
    """This app's `/metrics`, read around each round for where its engine's time goes."""

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


WL_SCRIPT = """
import sys
from whisper_live.server import TranscriptionServer
port, model, clients, batch = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
TranscriptionServer().run("127.0.0.1", port=port, backend="faster_whisper", faster_whisper_custom_model_path=model,
                          single_model=True, max_clients=clients, enable_rest=False, metrics_port=0,
                          batch_enabled=batch)
"""


def start(system: str, clients: int, out: Path, warmup_wav: Path, app_args: Sequence[str] = ()) -> Server:
    """A server of `system` on a free loopback port, listening (`app_args`: more flags for this app)."""
    model = _bundled_model()
    log = out / f"{system}.log"
    t0 = time.monotonic()
    if system == "realtime":
        from .stream import _launch

        proc, port = _launch(clients, *app_args, log=log)
        url = f"http://127.0.0.1:{port}"
        return Server(system, proc, lambda a: play_ours(url, a), time.monotonic() - t0, f"{url}/metrics")
    port = free_port()
    with log.open("wb") as sink:
        if system.startswith("whisperlive-"):
            python = ensure_env("whisperlive")
            batch = "1" if system == "whisperlive-batch" else "0"
            proc = subprocess.Popen([str(python), "-c", WL_SCRIPT, str(port), model, str(clients + 1), batch],
                                    env=_env(), stdout=sink, stderr=subprocess.STDOUT, cwd=out)
            _wait_port(proc, port, log)
            return Server(system, proc, lambda a: play_whisperlive(port, a, model), time.monotonic() - t0)
        python = ensure_env("whisperlivekit")
        proc = subprocess.Popen([str(python.parent / "whisperlivekit-server"), "--host", "127.0.0.1", "--port",
                                 str(port), "--backend-policy", "localagreement", "--backend", "faster-whisper",
                                 "--model", "tiny.en", "--model_dir", model, "--lan", "en", "--pcm-input",
                                 "--warmup-file", str(warmup_wav)],
                                env=_env(), stdout=sink, stderr=subprocess.STDOUT, cwd=out)
    _wait_port(proc, port, log)
    return Server(system, proc, lambda a: play_whisperlivekit(port, a), time.monotonic() - t0)


SYSTEMS = {
    "realtime": "this app",
    "whisperlive-default": "WhisperLive 0.10.0 (beam 5)",
    "whisperlive-batch": "WhisperLive 0.10.0 (batch, beam 1)",
    "whisperlivekit": "WhisperLiveKit 0.2.26 (LocalAgreement)",
}


# ---- the benchmark


def _utterances(manifest: Path, seconds: float, out: Path) -> tuple[np.ndarray, list[Utterance], str]:
    from .corpus import compilation, read_manifest

    picked, total = [], 0.0
    for clip in read_manifest(manifest, {"short", "read", "spontaneous"}, longest=12.0):
        if total + clip.duration <= seconds:
            picked.append(clip)
            total += clip.duration
    comp = compilation(picked, out / "peers-speech.wav")
    utts = [Utterance(a, b, c.text) for (a, b), c in zip(comp.spans, comp.clips, strict=True)]
    return decode_file(comp.path), utts, f"{len(picked)} real utterances ({total:.0f} s of speech), 1.2 s pauses"


ENGINE_COUNTERS = ("realtime_finals_total", "realtime_partials_total", "realtime_partials_shed_total",
                   "realtime_engine_seconds_total")


def _counters(url: str | None) -> dict[str, float]:
    """This app's job and engine-time counters (per lane), from its `/metrics`."""
    if url is None:
        return {}
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10).text
    return {s.name + (f":{s.labels['lane']}" if "lane" in s.labels else ""): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name in ENGINE_COUNTERS}


def _engine_use(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, float | None]:
    """Where this app's engine time went in a round: seconds per final and per partial (a batch's seconds shared
    by its jobs), partials per final, partials replaced before they ran, and the share of the round the engine
    was busy (1: it never waited for work)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    finals, partials = d.get("realtime_finals_total", 0.0), d.get("realtime_partials_total", 0.0)
    final_s, partial_s = (d.get(f"realtime_engine_seconds_total:{lane}", 0.0) for lane in ("final", "partial"))
    return {"engine_s_per_final": round(final_s / finals, 3) if finals else None,
            "engine_s_per_partial": round(partial_s / partials, 3) if partials else None,
            "partials_per_final": round(partials / finals, 2) if finals else None,
            "partials_shed": d.get("realtime_partials_shed_total", 0.0),
            "engine_busy": round((final_s + partial_s) / wall, 2)}


def _round(server: Server, audio: np.ndarray, n: int) -> tuple[list[Trace], float, float, dict[str, Any]]:
    """`n` clients of one server playing `audio` in step (0.3 s apart); their traces, the server's CPU cores, this
    process's (the clients') and, for this app, where its engine's time went."""
    async def one(i: int) -> Trace:
        await asyncio.sleep(0.3 * i)
        return await server.play(audio)

    async def all_clients() -> list[Trace]:
        return list(await asyncio.gather(*(one(i) for i in range(n))))

    jobs0 = _counters(server.metrics_url)
    c0, own0, t0 = _tree_cpu(server.proc.pid), _cpu_seconds(os.getpid()), time.monotonic()
    traces = asyncio.run(all_clients())
    wall = time.monotonic() - t0
    cores, own = (_tree_cpu(server.proc.pid) - c0) / wall, (_cpu_seconds(os.getpid()) - own0) / wall
    engine = _engine_use(jobs0, _counters(server.metrics_url), wall) if server.metrics_url else {}
    return traces, cores, own, engine


def _row(traces: list[Trace], utts: list[Utterance]) -> dict[str, Any]:
    from .corpus import corpus_wer
    from .stream import _pct

    norm = _normalizer()
    finals, shown, refs, hyp_final, hyp_shown, done, failed = [], [], [], [], [], 0, 0
    for tr in traces:
        if tr.error:
            failed += 1
        s = score(tr.snapshots, utts, norm)
        finals += [x for x in s.final_s if x is not None]
        shown += [x for x in s.shown_s if x is not None]
        done += sum(x is not None for x in s.final_s)
        refs.append(" ".join(u.text for u in utts))
        hyp_final.append(s.final_text)
        hyp_shown.append(s.shown_text)
    return {"final_p50": _pct(finals, 50), "final_p95": _pct(finals, 95), "final_max": _pct(finals, 100),
            "shown_p50": _pct(shown, 50), "wer": round(corpus_wer(refs, hyp_final), 4),
            "wer_shown": round(corpus_wer(refs, hyp_shown), 4), "finalised": done,
            "utterances": len(utts) * len(traces), "failed_clients": failed}


def bench_peers(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clients = [int(c) for c in args.clients.split(",")]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown systems {unknown}; choose from {sorted(SYSTEMS)}")
    audio, utts, what = _utterances(Path(args.audio), args.seconds, out)
    first = utts[:3]
    cold_audio = audio[: int((first[-1].end + 1.0) * SAMPLE_RATE)]
    warm_wav = out / "peers-warmup.wav"
    import soundfile as sf

    sf.write(str(warm_wav), cold_audio, SAMPLE_RATE, subtype="PCM_16")
    results: list[dict[str, Any]] = []
    cold: dict[str, Any] = {}
    for system in systems:
        server = start(system, max(clients), out, warm_wav, args.app_args.split())
        try:
            # the first session after start-up: its first final against the next ones
            trace = asyncio.run(server.play(cold_audio))
            s = score(trace.snapshots, first)
            cold[system] = {"start_s": round(server.started_s, 1), "first_final_s": s.final_s[0],
                            "next_finals_s": s.final_s[1:], "error": trace.error}
            print(json.dumps({"system": system, "cold": cold[system]}), file=sys.stderr, flush=True)
            for n in clients:
                per_run = []
                for _ in range(args.runs):
                    traces, cores, client_cores, engine = _round(server, audio, n)
                    per_run.append({**_row(traces, utts), "server_cores": round(cores, 2),
                                    "client_cores": round(client_cores, 2), **engine})
                    errors = sorted({t.error for t in traces if t.error})
                    if errors:
                        print(json.dumps({"system": system, "clients": n, "errors": errors}), file=sys.stderr)
                row: dict[str, Any] = {"system": system, "label": SYSTEMS[system], "clients": n}
                for key in per_run[0]:
                    vals = [r[key] for r in per_run if r[key] is not None]
                    row[key] = (round(statistics.median(vals), 3) if key not in ("finalised", "utterances",
                                                                                  "failed_clients")
                                else (min(vals) if key == "finalised" else max(vals))) if vals else None
                row["runs"] = per_run
                results.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "runs"}), file=sys.stderr, flush=True)
        finally:
            server.stop()
    doc = {"kind": "peers", "machine": _machine(), "weights": "tiny.en (CTranslate2 int8, bundled)",
           "input": what, "runs": args.runs, "threads": int(THREADS), "cold": cold, "results": results}
    write_outputs(out, "peers", doc, _table(doc), lambda p: _chart(doc, p))
    return doc


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _table(doc: dict[str, Any]) -> str:
    head = (f"Live, side by side: {doc['machine']}, {doc['weights']} for every system, {doc['threads']} threads "
            f"each; every client plays {doc['input']} in real time, N clients in step (0.3 s apart); median of "
            f"{doc['runs']} run(s). Final: end of an utterance's speech to its last word final at the client; "
            "shown: start of speech to its first word on screen (final or tentative). WER of what each calls final "
            "(and of final plus tentative text at the end); finalised: utterances with a final word (fewest over "
            "the runs). CPU in cores: the server's, and the clients' (all in the benchmark's process).\n\n"
            "| clients | system | final p50 | final p95 | shown p50 | WER final | WER final + tentative | "
            "finalised | server CPU | clients' CPU |\n|---|---|---|---|---|---|---|---|---|---|\n")
    rows = [f"| {r['clients']} | {r['label']} | {_s(r['final_p50'])} | {_s(r['final_p95'])} | {_s(r['shown_p50'])} "
            f"| {100 * r['wer']:.1f} % | {100 * r['wer_shown']:.1f} % | {r['finalised']} of {r['utterances']} | "
            f"{r['server_cores']} | {r['client_cores']} |" for r in sorted(doc["results"], key=lambda r: r["clients"])]
    cold = ["", "The first session after start-up (start = launch to listening; then one client, the first three "
            "utterances; the first final against the next two):", "",
            "| system | start | first final | next finals |", "|---|---|---|---|"]
    for system, c in doc["cold"].items():
        nxt = ", ".join(_s(x) for x in c["next_finals_s"])
        cold.append(f"| {SYSTEMS[system]} | {c['start_s']} s | {_s(c['first_final_s'])} | {nxt} |")
    ours = [r for r in sorted(doc["results"], key=lambda r: r["clients"]) if r.get("engine_busy") is not None]
    engine = ["", "Where this app's engine time went (from its `/metrics`: the seconds of each lane's batches over the "
              "jobs it delivered, speculative finals that speech took back included; busy: the share of the round "
              "the engine was working):", "",
              "| clients | engine s per final | engine s per partial | partials per final | partials replaced "
              "before running | engine busy | server CPU |", "|---|---|---|---|---|---|---|"]
    engine += [f"| {r['clients']} | {r['engine_s_per_final']} | {r['engine_s_per_partial']} | "
               f"{r['partials_per_final']} | {r['partials_shed']} | {r['engine_busy']} | {r['server_cores']} |"
               for r in ours]
    return head + "\n".join(rows) + "\n" + "\n".join(cold) + "\n" + ("\n".join(engine) + "\n" if ours else "")


def _chart(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.8))
    for system in dict.fromkeys(r["system"] for r in doc["results"]):
        rows = [r for r in doc["results"] if r["system"] == system and r["final_p95"] is not None]
        ax.plot([r["clients"] for r in rows], [r["final_p95"] for r in rows], marker="o", label=SYSTEMS[system])
    ax.axhline(2.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent clients (in step)")
    ax.set_ylabel("final p95, seconds (log)")
    ax.set_title(f"End of speech to final text, tiny.en, {doc['machine']}")
    ax.set_xticks(sorted({r["clients"] for r in doc["results"]}))
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("peers", help="this app, WhisperLive and WhisperLiveKit side by side, live, N clients each")
    p.add_argument("--clients", default="1,4,8")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"comma-separated, from {', '.join(SYSTEMS)}")
    p.add_argument("--audio", default=str(ROOT / "tests" / "data" / "manifest.tsv"),
                   help="a manifest (.tsv) of real clips, joined with pauses")
    p.add_argument("--seconds", type=float, default=90.0, help="speech taken from the manifest (s)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--app-args", default="", help="more flags for this app, as one string (e.g. VAD settings)")
    p.add_argument("--out", default="bench-out")
