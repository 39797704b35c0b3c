"""`python -m realtime bench stream`: live latency with N concurrent WebRTC clients playing speech in real time to a
launched app (final and first-partial latency, WER, lost segments, the app's and the clients' CPU).
"""


from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE
from .common import ROOT, _cpu_seconds, _machine, free_port, write_outputs
from .synth import MORE_SENTENCES, SENTENCES, Speech, compose, wer


def _launch(limit: int, *extra: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """The app on a free loopback port (the embedded engine unless `extra` says otherwise), once it reports ready;
    returns it and its port. Its output goes to `log`. A port that another process took between choosing it and
    the app's bind (benchmarks run beside other jobs) is tried again with a new one."""
    for _ in range(3):
        port = free_port()
        proc = _start(port, limit, extra, log)
        if proc is not None:
            return proc, port
    raise RuntimeError(f"no free port for the app after 3 tries (see {log})")


def _start(port: int, limit: int, extra: tuple[str, ...], log: Path) -> subprocess.Popen[bytes] | None:
    import httpx

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--ice-loopback",
                                 "--concurrency-limit", str(limit), "--log-level", "WARNING", *extra],
                                cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("ready"):
                if not _listens(proc.pid, port):  # another process answers on this port
                    proc.kill()
                    proc.wait()
                    return None
                return proc
        except (httpx.HTTPError, ValueError):
            pass
        if proc.poll() is not None:
            text = log.read_text(errors="replace")
            if "address already in use" in text.lower():
                return None
            raise RuntimeError(f"the app exited during start-up ({log}):\n{text[-2000:]}")
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"the app did not become ready (see {log})")


def _listens(pid: int, port: int) -> bool:
    """Whether `pid` (or its child) holds the listening socket on `port`: Linux's socket tables, else assumed."""
    try:
        inodes = {line.split()[9] for name in ("/proc/net/tcp", "/proc/net/tcp6")
                  for line in Path(name).read_text().splitlines()[1:]
                  if line.split()[1].endswith(f":{port:04X}") and line.split()[3] == "0A"}
        held = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    except OSError:
        return True
    return any(f"socket:[{inode}]" in held for inode in inodes)


def _client_speech(out: Path, i: int) -> Speech:
    pool = SENTENCES + MORE_SENTENCES
    texts = [pool[(5 * i + k) % len(pool)] for k in range(5)]
    return compose(out / f"client-{i}.wav", texts, gaps=[1.2, 1.6, 1.0, 1.4], lead=0.5, tail=0.5)


async def _stream_round(url: str, speeches: list[Speech]) -> list[Any]:
    from .client import stream_file

    async def one(i: int, s: Speech) -> Any:
        await asyncio.sleep(0.3 * i)
        return await stream_file(url, s.path, ice_loopback=True, settle_timeout=20)

    return await asyncio.gather(*(one(i, s) for i, s in enumerate(speeches)), return_exceptions=True)


def _partial_intervals(events: list[dict[str, Any]]) -> list[float]:
    by_segment: dict[int, list[float]] = {}
    for e in events:
        if e["type"] == "partial":
            by_segment.setdefault(e["segment"], []).append(e["t"])
    return [b - a for ts in by_segment.values() for a, b in itertools.pairwise(ts)]


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def _idle_cpu(url: str, pid: int, seconds: float = 10.0) -> dict[str, float]:
    """CPU of the app with no session, then with one connected client sending silence."""
    from .client import stream_file

    c0, t0 = _cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    baseline = (_cpu_seconds(pid) - c0) / (time.monotonic() - t0)

    async def idle() -> float:
        task = asyncio.create_task(stream_file(url, audio=np.zeros(int(SAMPLE_RATE * (seconds + 6)), np.float32),
                                               ice_loopback=True, tail_seconds=0.0, settle_timeout=1))
        await asyncio.sleep(4)
        c1, t1 = _cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(seconds)
        used = (_cpu_seconds(pid) - c1) / (time.monotonic() - t1)
        await task
        return used

    connected = asyncio.run(idle())
    return {"no_session_core_pct": round(100 * baseline, 2), "idle_session_core_pct": round(100 * connected, 2),
            "idle_session_extra_core_pct": round(100 * (connected - baseline), 2)}


def _stream_speech(args: argparse.Namespace, out: Path, n: int) -> tuple[list[Any], str]:
    """What each client plays: real utterances of a manifest joined with pauses, one recording with its text, or
    five synthesized sentences per client.

    From a manifest every client plays the same utterances; with `order` "own" (the default) each client after
    the first plays them in an order of its own, as independent speakers pause at different times, and with
    "same" all play them in the manifest's order, 0.3 s apart, so that every client's pause comes within a
    moment of the others' (the worst case for finals)."""
    if args.audio and args.audio.endswith(".tsv"):
        from .corpus import compilation, read_manifest

        picked, total = [], 0.0
        for clip in read_manifest(Path(args.audio), {"short", "read", "spontaneous"}, longest=12.0):
            if total + clip.duration <= args.seconds:
                picked.append(clip)
                total += clip.duration
        if getattr(args, "order", "own") == "same":
            comp = compilation(picked, out / "stream-real.wav")
            return [comp] * n, f"{len(picked)} real utterances ({total:.0f} s of speech) with 1.2 s pauses, " \
                               "every client in the same order"
        comps = []
        for i in range(n):
            order = list(picked)
            if i:
                random.Random(i).shuffle(order)
            comps.append(compilation(order, out / f"stream-real-{i}.wav"))
        return comps, f"{len(picked)} real utterances ({total:.0f} s of speech) with 1.2 s pauses, " \
                      "each client in an order of its own"
    if args.audio:
        reference = Path(args.text).read_text() if args.text else ""
        speech = Speech(Path(args.audio), [reference], [])
        return [speech] * n, Path(args.audio).name
    return [_client_speech(out, i) for i in range(n)], "5 synthesized sentences with pauses"


def _lost(events: list[dict[str, Any]], spans: list[tuple[float, float]]) -> int:
    """Utterances with no final text ending in them (or, without known spans, segments with no final)."""
    finals = [e for e in events if e["type"] == "final" and e["text"].strip()]
    if not spans:
        return len({e["segment"] for e in events} - {e["segment"] for e in events if e["type"] == "final"})
    return sum(not any(a - 0.3 <= e["audio_end"] <= b + 0.6 for e in finals) for a, b in spans)


def _round_row(speeches: list[Any], results: list[Any]) -> dict[str, Any]:
    """Latency, WER and losses of one round of live clients (`_stream_round`'s results, one per speech)."""
    from .corpus import loops

    finals_lat, server_lat, first, intervals, refs, hyps, lost, failed = [], [], [], [], [], [], 0, 0
    looped = 0
    for s, r in zip(speeches, results, strict=True):
        if isinstance(r, BaseException):
            failed += 1
            lost += len(s.texts)
            continue
        fin = [e for e in r.events if e["type"] == "final"]
        finals_lat += [e["t"] - e["audio_end"] for e in fin]
        server_lat += [e["latency"] for e in fin if e.get("latency") is not None]
        seen: set[int] = set()
        for e in r.events:
            if e["type"] == "partial" and e["segment"] not in seen:
                seen.add(e["segment"])
                first.append(e["t"] - e["start"])
        intervals += _partial_intervals(r.events)
        lost += _lost(r.events, s.spans)
        looped += len(loops([e["text"] for e in fin]))
        refs.append(s.text)
        hyps.append(" ".join(e["text"] for e in fin))
    return {
        "final_p50": _pct(finals_lat, 50), "final_p95": _pct(finals_lat, 95),
        "final_max": _pct(finals_lat, 100), "server_final_p95": _pct(server_lat, 95),
        "first_partial_p50": _pct(first, 50),
        "partial_interval_p50": _pct(intervals, 50),
        "wer": round(wer(" ".join(refs), " ".join(hyps)), 4) if any(refs) else None,
        "lost_segments": lost, "failed_clients": failed, "loops": looped,
    }


def bench_stream(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clients = [int(c) for c in args.clients.split(",")]
    speeches, what = _stream_speech(args, out, max(clients))
    proc = None
    if args.url:
        url, pid = args.url.rstrip("/"), args.pid
    else:
        proc, port = _launch(max(clients), log=out / "app.log")
        url, pid = f"http://127.0.0.1:{port}", proc.pid
    rows = []
    try:
        idle = _idle_cpu(url, pid, args.idle_seconds) if pid else {}
        for n in clients:
            per_run = []
            for _ in range(args.runs):
                c0, t0, own0 = (_cpu_seconds(pid) if pid else 0.0), time.monotonic(), _cpu_seconds(os.getpid())
                results = asyncio.run(_stream_round(url, speeches[:n]))
                wall = time.monotonic() - t0
                cores = ((_cpu_seconds(pid) - c0) / wall) if pid else None
                client_cores = (_cpu_seconds(os.getpid()) - own0) / wall
                per_run.append({**_round_row(speeches[:n], results),
                                "cpu_cores": round(cores, 2) if cores is not None else None,
                                "client_cpu_cores": round(client_cores, 2)})
            row: dict[str, Any] = {"clients": n}
            for key in per_run[0]:
                vals = [r[key] for r in per_run if r[key] is not None]
                row[key] = (max(vals) if key in ("lost_segments", "failed_clients", "loops") else
                            round(statistics.median(vals), 3)) if vals else None
            row["real_time"] = bool(row["lost_segments"] == 0 and row["final_p95"] is not None
                                    and row["final_p95"] <= 2.0)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(15)
    best = max((r["clients"] for r in rows if r["real_time"]), default=0)
    doc = {"kind": "stream", "machine": _machine(), "engine": "embedded tiny.en int8", "input": what,
           "runs": args.runs, "idle": idle, "results": rows, "max_real_time_clients": best}
    lines = [f"| {r['clients']} | {r['final_p50']} | {r['final_p95']} | {r['final_max']} | {r['server_final_p95']} | "
             f"{r['first_partial_p50']} | {r['partial_interval_p50']} | {_percent(r['wer'])} | "
             f"{r['lost_segments']} | {r['loops']} | {r['cpu_cores']} | {r['client_cpu_cores']} |" for r in rows]
    table = (f"Live transcription over WebRTC on loopback, {_machine()}, embedded tiny.en int8; each client plays "
             f"{what} in real time; median of {args.runs} run(s). Latencies in seconds: final = "
             "end of speech (as the client played it) to final text at the client; server p95 = the same measured "
             "in the app, from the audio's arrival to the final; first partial = start of speech to first partial. "
             "CPU cores: the app's and the clients' (all clients run in the benchmark's process, on the same "
             "cores).\n\n"
             "| clients | final p50 | final p95 | final max | server p95 | first partial p50 | partial interval | "
             "WER | lost | loops | app CPU cores | client CPU cores |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
             + "\n".join(lines) +
             f"\n\nLargest number of clients in real time (final p95 <= 2 s, nothing lost): **{best}**.\n")
    if idle:
        table += (f"\nIdle connected session: {idle['idle_session_extra_core_pct']} % of one core "
                  f"(app with no session: {idle['no_session_core_pct']} %).\n")

    def chart(p: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [r["clients"] for r in rows]
        for key, label in (("final_p50", "final p50"), ("final_p95", "final p95"),
                           ("first_partial_p50", "first partial p50")):
            ax.plot(xs, [r[key] for r in rows], marker="o", label=label)
        ax.axhline(2.0, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("seconds")
        ax.set_title(f"Live latency, embedded tiny.en int8, {_machine()}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)

    write_outputs(out, "stream", doc, table, chart)
    return doc
