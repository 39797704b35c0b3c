"""The engine pool under live load: `python -m realtime bench pool`.

Starts an autoscaled pool (`python -m realtime pool --autoscale MIN:MAX`) and a front end (the app with the
remote engine pointed at it), then raises the live load step by step (1, 2, 4, 8 WebRTC clients playing real
speech in real time, each step a round of `bench stream`), and stays idle until the pool is back to MIN
replicas. It records the replica count as the pool reports it and the clients over time, each step's latency,
WER and losses, and, with `--beside-embedded`, the same steps against an app on the embedded engine, in the
same run. Writes bench-pool.json, .md and .png (replicas and clients over time).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .common import ROOT, _machine, free_port, write_outputs
from .stream import _launch, _percent, _round_row, _stream_round, _stream_speech

_REPLICAS = re.compile(r"^replicas: (\d+) at")


class _Pool:
    """The pool's process; a thread reads its output and notes each replica count it prints, with the time."""

    def __init__(self, autoscale: str, target: float, t0: float, log: Path, cpu_threads: int | None = 1) -> None:
        self.port = free_port()
        self.t0 = t0
        self.counts: list[tuple[float, int]] = []
        self.ready = threading.Event()
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "realtime", "pool", "--autoscale", autoscale, "--target-ongoing-requests",
             str(target), *(["--cpu-threads", str(cpu_threads)] if cpu_threads else []), "--port", str(self.port),
             "--log-level", "WARNING"],
            cwd=ROOT, env={**_env(), "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def route(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/audio/transcriptions"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            if line.startswith("pool ready"):
                self.ready.set()
            elif m := _REPLICAS.match(line):
                self.counts.append((round(time.monotonic() - self.t0, 1), int(m.group(1))))

    def now(self) -> int | None:
        return self.counts[-1][1] if self.counts else None

    def wait(self, replicas: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.now() == replicas:
                return True
            time.sleep(0.5)
        return False

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("REALTIME_", "RAY_"))}


def _steps(url: str, speeches: list[Any], clients: list[int], t0: float) -> list[dict[str, Any]]:
    steps = []
    for n in clients:
        start = time.monotonic() - t0
        results = asyncio.run(_stream_round(url, speeches[:n]))
        row = {"clients": n, "start_s": round(start, 1), "end_s": round(time.monotonic() - t0, 1),
               **_round_row(speeches[:n], results)}
        print(row, file=sys.stderr, flush=True)
        steps.append(row)
    return steps


def bench_pool(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        doc["summary"]["scaling"] = _scaling(doc["replicas"], doc["steps"], doc["load"][1])
        write_outputs(out, "pool", doc, _table(doc), lambda p: _chart(doc, p))
        return doc
    out.mkdir(parents=True, exist_ok=True)
    clients = [int(c) for c in args.clients.split(",")]
    speeches, what = _stream_speech(args, out, max(clients))
    lo = int(args.autoscale.split(":")[0])
    t0 = time.monotonic()
    pool = _Pool(args.autoscale, args.target_ongoing_requests, t0, out / "pool.log")
    front = None
    try:
        if not pool.ready.wait(300):
            raise RuntimeError(f"the pool did not start (see {out / 'pool.log'})")
        pool.wait(lo, 60)
        front, port = _launch(max(clients) + 2, "--engine", "remote", "--remote-url", pool.route,
                              log=out / "front.log")
        load_start = round(time.monotonic() - t0, 1)
        steps = _steps(f"http://127.0.0.1:{port}", speeches, clients, t0)
        load_end = round(time.monotonic() - t0, 1)
        back_down = pool.wait(lo, args.cooldown)
        idle_end = round(time.monotonic() - t0, 1)
    finally:
        if front is not None:
            front.terminate()
            front.wait(15)
        pool.stop()
    embedded: list[dict[str, Any]] = []
    if args.beside_embedded:
        app, port = _launch(max(clients) + 2, log=out / "embedded.log")
        try:
            embedded = _steps(f"http://127.0.0.1:{port}", speeches, clients, time.monotonic())
        finally:
            app.terminate()
            app.wait(15)
    lost = sum(s["lost_segments"] for s in steps)
    doc = {"kind": "pool", "machine": _machine(), "input": what, "autoscale": args.autoscale,
           "target_ongoing_requests": args.target_ongoing_requests, "replicas": pool.counts,
           "load": [load_start, load_end, idle_end], "steps": steps, "embedded": embedded,
           "summary": {"max_replicas": max((n for _, n in pool.counts), default=None),
                       "scaling": _scaling(pool.counts, steps, load_end), "back_down": back_down,
                       "lost_segments": lost, "failed_clients": sum(s["failed_clients"] for s in steps)}}
    write_outputs(out, "pool", doc, _table(doc), lambda p: _chart(doc, p))
    return doc


def _scaling(counts: list[tuple[float, int]], steps: list[dict[str, Any]], load_end: float) -> list[str]:
    """Each change of the replica count after the load started, said against the step it came in."""
    out = []
    for (_, before), (t, n) in itertools.pairwise(counts):
        step = next((s for s in steps if s["start_s"] <= t < s["end_s"]), None)
        if step is not None:
            out.append(f"{before} to {n} replicas {t - step['start_s']:.1f} s into the {step['clients']}-client step")
        elif t >= load_end:
            out.append(f"{before} to {n} replicas {t - load_end:.1f} s after the load stopped")
    return out


def _table(doc: dict[str, Any]) -> str:
    by_n = {r["clients"]: r for r in doc["embedded"]}

    def cells(r: dict[str, Any] | None) -> str:
        if r is None:
            return "| | | |"
        return f"| {r['final_p50']} / {r['final_p95']} | {_percent(r['wer'])} | {r['lost_segments']} |"

    lines = [f"| {s['clients']} | {_count_at(doc['replicas'], s['end_s'])} {cells(s)} "
             f"{cells(by_n.get(s['clients']))[1:]}" for s in doc["steps"]]
    return (f"The engine pool under live load, {doc['machine']}: a pool autoscaled {doc['autoscale']} (target "
            f"{doc['target_ongoing_requests']:g} ongoing requests per replica, one CTranslate2 thread each) behind "
            f"a front end (`--engine remote`), each client playing {doc['input']} in real time; "
            + ("beside an app on the embedded engine, same steps, same run. " if doc["embedded"] else "")
            + "Latency in seconds from the end of speech.\n\n"
            "| clients | replicas at the step's end | pool final p50 / p95 | pool WER | pool lost | "
            "embedded final p50 / p95 | embedded WER | embedded lost |\n|---|---|---|---|---|---|---|---|\n"
            + "\n".join(lines)
            + f"\n\nReplicas over time (s, count): {doc['replicas']}. "
            + "; ".join(doc["summary"]["scaling"]) + ".\n")


def _chart(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts, steps = doc["replicas"], doc["steps"]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    end = max(doc["load"][2], counts[-1][0] + 5 if counts else 0)
    if counts:
        ax.step([t for t, _ in counts] + [end], [n for _, n in counts] + [counts[-1][1]],
                where="post", label="replicas running", linewidth=2)
    cx, cy, last_end = [0.0], [0], 0.0
    for s in steps:
        if s["start_s"] > last_end + 1:  # a pause between steps: no clients
            cx.append(last_end)
            cy.append(0)
        last_end = s["end_s"]
        cx.append(s["start_s"])
        cy.append(s["clients"])
    if steps:
        cx.append(steps[-1]["end_s"])
        cy.append(0)
    cx.append(end)
    cy.append(0)
    ax.step(cx, cy, where="post", label="live clients", linestyle="--")
    ax.set_xlabel("seconds since the pool started")
    ax.set_ylabel("count")
    ax.set_title(f"Pool autoscaled {doc['autoscale']} under live clients, {doc['machine']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _count_at(counts: list[tuple[float, int]], t: float) -> int | None:
    now = None
    for at, n in counts:
        if at <= t:
            now = n
    return now


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pool", help="the autoscaled engine pool under 1 to 8 live clients: replicas over time")
    p.add_argument("--autoscale", default="1:3", help="the pool's MIN:MAX replicas")
    p.add_argument("--target-ongoing-requests", type=float, default=2.0)
    p.add_argument("--clients", default="1,2,4,8", help="live clients, one step each")
    p.add_argument("--audio", default=str(ROOT / "tests" / "data" / "manifest.tsv"),
                   help="what every client plays: a manifest (.tsv) or a recording (with --text)")
    p.add_argument("--text", help="the recording's reference transcript (a text file)")
    p.add_argument("--seconds", type=float, default=40.0, help="speech taken from a manifest (s): one step")
    p.add_argument("--cooldown", type=float, default=120.0, help="seconds to wait for the pool to scale back down")
    p.add_argument("--beside-embedded", action="store_true", help="the same steps against the embedded engine")
    p.add_argument("--report", metavar="JSON", help="only write the table and chart again from a bench-pool.json")
    p.add_argument("--out", default="bench-out")
