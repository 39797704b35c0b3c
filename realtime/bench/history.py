"""`python -m realtime bench history`: what the history costs.

- Search: a script stores N sessions of real sentences (the reference texts of a manifest's clips) as live
  sessions write them, one final at a time; then listing the newest and searching a common word, a rare one and two
  words, each the median of several runs, on SQLite in a temporary folder (and on PostgreSQL with `--database-url`).
- Live: two apps launched side by side, one keeping its history and one with `--no-history`, the same clients of
  real speech streamed to each in turn (rounds alternating, the order swapped each run): final latency beside each
  other, medians of the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from .common import _machine, write_outputs


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("history", help="the history's cost: search over N stored sessions, and live final latency "
                                       "with the history on beside --no-history")
    p.add_argument("--sessions", type=int, default=1000, help="sessions the script stores")
    p.add_argument("--entries", type=int, default=40, help="finals per stored session")
    p.add_argument("--database-url", default="", help="also a PostgreSQL database (postgresql://...): the sessions "
                                                      "are added to it")
    p.add_argument("--audio", default="tests/data/manifest.tsv", help="a manifest of real clips: the sentences "
                                                                      "stored, and what the live clients play")
    p.add_argument("--clients", default="1,8", help="live clients per round, comma-separated")
    p.add_argument("--seconds", type=float, default=40.0, help="speech each live client plays (s)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--search-only", action="store_true", help="no live rounds")
    p.add_argument("--out", default="bench-out")


def _fill(store: Any, sentences: list[str], sessions: int, per_session: int, seed: int) -> float:
    """Store the sessions as live ones are written (a transaction per final); the median write of a final (ms)."""
    from ..live.transcript import Entry
    from ..store import SessionInfo

    rng = random.Random(seed)
    writes = []
    now = time.time()
    for i in range(sessions):
        sid = uuid.uuid4().hex[:12]
        store.begin(SessionInfo(sid, "webrtc", "embedded", "tiny.en", started_at=now - 86400 * 365 * rng.random()))
        t = 0.5
        for seg in range(per_session):
            text = rng.choice(sentences)
            duration = 0.4 * len(text.split())
            entry = Entry(seg, t, t + duration, text, speaker=f"Speaker {rng.randrange(3) + 1}")
            t0 = time.perf_counter()
            store.put(sid, seg, [entry])
            writes.append(time.perf_counter() - t0)
            t += duration + 1.2
        store.end(sid)
        if i % 200 == 199:
            print(f"  {i + 1} sessions stored", file=sys.stderr, flush=True)
    return 1000 * statistics.median(writes)


def _words(sentences: list[str]) -> tuple[str, str, str]:
    """A common word, a rare one (in about one sentence in a hundred or fewer) and a middling one."""
    counts = Counter(w.strip(".,;:!?\"'").lower() for s in sentences for w in set(s.split()))
    ranked = [w for w, _ in counts.most_common() if w.isalpha() and len(w) > 3]
    rare = next(w for w in ranked if counts[w] <= max(1, len(sentences) // 100))
    return ranked[0], rare, ranked[len(ranked) // 8]


def _search(store: Any, words: tuple[str, str, str], runs: int) -> dict[str, Any]:
    common, rare, middling = words
    queries = {"newest 20": None, f"common word ({common})": common, f"rare word ({rare})": rare,
               f"two words ({common} {middling})": f"{common} {middling}"}
    out = {}
    for name, q in queries.items():
        times, found = [], 0
        for _ in range(max(5, runs * 5)):
            t0 = time.perf_counter()
            found = len(store.sessions(q, limit=20))
            times.append(time.perf_counter() - t0)
        out[name] = {"ms": round(1000 * statistics.median(times), 2), "found": found}
    return out


def _live(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    from .stream import _launch, _round_row, _stream_round, _stream_speech

    clients = [int(c) for c in args.clients.split(",")]
    speeches, _ = _stream_speech(argparse.Namespace(audio=args.audio, seconds=args.seconds, order="own"), out,
                                 max(clients))
    data = Path(tempfile.mkdtemp(prefix="bench-history-"))
    apps = {}
    try:
        for name, extra in (("on", ("--data-dir", str(data))), ("off", ("--no-history",))):
            proc, port = _launch(max(clients), *extra, log=out / f"history-app-{name}.log")
            apps[name] = (proc, f"http://127.0.0.1:{port}")
        rows = []
        for n in clients:
            per: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
            for run in range(args.runs):
                for name in (("on", "off") if run % 2 == 0 else ("off", "on")):
                    results = asyncio.run(_stream_round(apps[name][1], speeches[:n]))
                    per[name].append(_round_row(speeches[:n], results))
            row: dict[str, Any] = {"clients": n}
            for name, runs in per.items():
                for key in ("final_p50", "final_p95"):
                    vals = [r[key] for r in runs if r[key] is not None]
                    row[f"{key}_{name}"] = round(statistics.median(vals), 3) if vals else None
                row[f"lost_{name}"] = max(r["lost_segments"] for r in runs)
            if row["final_p50_on"] is not None and row["final_p50_off"] is not None:
                row["p50_difference_ms"] = round(1000 * (row["final_p50_on"] - row["final_p50_off"]), 1)
            rows.append(row)
            print(row, file=sys.stderr, flush=True)
        return rows
    finally:
        for proc, _ in apps.values():
            proc.terminate()
            proc.wait(15)


def bench_history(args: argparse.Namespace) -> dict[str, Any]:
    from ..store import Store
    from ..store.database import url_for
    from .corpus import read_manifest

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sentences = sorted({c.text for c in read_manifest(Path(args.audio))})
    seed = random.randrange(1_000_000)
    words = _words(sentences)
    databases = {"SQLite": url_for(Path(tempfile.mkdtemp(prefix="bench-history-")))}
    if args.database_url:
        databases["PostgreSQL"] = args.database_url
    search = {}
    for name, url in databases.items():
        print(f"{name}: storing {args.sessions} sessions of {args.entries} finals (seed {seed})", file=sys.stderr)
        store = Store(url)
        write_ms = _fill(store, sentences, args.sessions, args.entries, seed)
        search[name] = {"write_final_ms": round(write_ms, 3), "queries": _search(store, words, args.runs)}
        store.close()
    live = [] if args.search_only else _live(args, out)
    doc = {"kind": "history", "machine": _machine(), "sessions": args.sessions, "entries": args.entries,
           "sentences": len(sentences), "seed": seed, "runs": args.runs, "search": search, "live": live}
    table = (f"The history on {_machine()}: {args.sessions} stored sessions of {args.entries} finals each (real "
             f"sentences from {Path(args.audio).name}, seed {seed}); each time is the median of "
             f"{max(5, args.runs * 5)} runs, in ms.\n\n| query | " + " | ".join(search) + " |\n|---|"
             + "---|" * len(search) + "\n")
    table += "| write of one final | " + " | ".join(f"{s['write_final_ms']}" for s in search.values()) + " |\n"
    for query in next(iter(search.values()))["queries"]:
        table += f"| {query} | " + " | ".join(f"{s['queries'][query]['ms']} ({s['queries'][query]['found']} found)"
                                              for s in search.values()) + " |\n"
    if live:
        table += (f"\nLive final latency (s) with the history on (SQLite) beside `--no-history`, two apps side by "
                  f"side, rounds alternating; each client plays {args.seconds:.0f} s of real utterances; median of "
                  f"{args.runs} runs.\n\n| clients | final p50 on | final p50 off | p50 difference (ms) | "
                  "final p95 on | final p95 off | lost on / off |\n|---|---|---|---|---|---|---|\n")
        for r in live:
            table += (f"| {r['clients']} | {r['final_p50_on']} | {r['final_p50_off']} | {r.get('p50_difference_ms')} "
                      f"| {r['final_p95_on']} | {r['final_p95_off']} | {r['lost_on']} / {r['lost_off']} |\n")
    write_outputs(out, "history", doc, table, lambda _: None)
    return doc
