"""`python -m realtime bench soak`: N clients stream real speech for M minutes: RSS, open file descriptors, latency
and losses over time.
"""


from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from .common import ROOT, _machine, _rss_mb, write_outputs
from .stream import _launch, _lost, _pct, _percent
from .synth import wer


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (x, y) points, per unit of x."""
    if len(points) < 2:
        return None
    xs, ys = np.array([x for x, _ in points]), np.array([y for _, y in points])
    if float(np.ptp(xs)) == 0:
        return None
    return float(np.polyfit(xs, ys, 1)[0])


def _soak_speech(args: argparse.Namespace, out: Path) -> tuple[Path, list[str], list[tuple[float, float]], str]:
    """(recording, reference texts, utterance spans, description): a compilation of the real clips of
    tests/data (or the manifest given), or one recording with its text (no spans: a segment without its final
    is what counts as lost then)."""
    if args.audio and not args.audio.endswith(".tsv"):
        reference = Path(args.text).read_text().strip() if args.text else ""
        return Path(args.audio), [reference] if reference else [], [], Path(args.audio).name
    from .corpus import compilation, read_manifest

    manifest = Path(args.audio) if args.audio else ROOT / "tests" / "data" / "manifest.tsv"
    picked, total = [], 0.0
    for clip in read_manifest(manifest, {"short", "read", "spontaneous"}, longest=12.0):
        if total + clip.duration <= args.seconds:
            picked.append(clip)
            total += clip.duration
    comp = compilation(picked, out / "soak-speech.wav")
    return comp.path, comp.texts, comp.spans, f"{len(picked)} real utterances ({total:.0f} s of speech, 1.2 s pauses)"


async def _soak_clients(url: str, path: Path, clients: int, seconds: float, on_round: Any,
                        finals: list[tuple[float, float]], period: float | None = None) -> None:
    """`clients` clients, each streaming the recording again and again (in real time) until `seconds` are over.

    Rounds start on a fixed schedule, one a period (by default a minute, or the recording's length and 10 s if
    longer), each client a little after the one before: the load keeps one shape for the whole run, so its first and
    last minutes compare. (A client that started its next round as soon as the last one ended drifted against the
    others: once their speech lined up, every utterance shared the engine with three others for the rest of
    the run.) A round that overruns its slot is followed at the next one."""
    from .client import stream_file

    duration = decode_file(path).size / SAMPLE_RATE
    period = period or max(60.0, duration + 10.0)
    start = time.monotonic()
    deadline = start + seconds

    def record(event: dict[str, Any]) -> None:
        if event["type"] == "final":
            finals.append((time.monotonic(), event["t"] - event["audio_end"]))

    async def client(i: int) -> None:
        offset = i * min(1.5, duration / max(1, clients))  # spread over the recording
        slot = 0
        while (at := start + offset + slot * period) < deadline:
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            t0 = time.monotonic()
            try:
                result: Any = await stream_file(url, path, ice_loopback=True, settle_timeout=30, on_event=record)
            except Exception as exc:  # a refused or broken stream: every utterance of the round is lost
                result = exc
            on_round(i, t0, result)
            slot = max(slot + 1, int((time.monotonic() - start - offset) // period) + 1)

    await asyncio.gather(*(client(i) for i in range(clients)))


def bench_soak(args: argparse.Namespace) -> dict[str, Any]:
    """N clients stream real speech for M minutes; RSS, open fds and latency sampled along the way."""
    import threading

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path, texts, spans, what = _soak_speech(args, out)
    seconds = args.minutes * 60
    interval = args.sample_s or min(60.0, seconds / 10)
    warmup = args.warmup_minutes if args.warmup_minutes is not None else min(5.0, args.minutes / 4)
    proc = None
    if args.url:
        url, pid = args.url.rstrip("/"), args.pid
    else:
        proc, port = _launch(args.clients + 2, log=out / "app.log")
        url, pid = f"http://127.0.0.1:{port}", proc.pid
    rounds: list[dict[str, Any]] = []
    finals: list[tuple[float, float]] = []
    samples: list[dict[str, Any]] = []
    reference = " ".join(texts)
    t_start = time.monotonic()

    def on_round(client: int, t0: float, result: Any) -> None:
        if isinstance(result, BaseException):
            rounds.append({"client": client, "start_s": round(t0 - t_start, 1), "failed": str(result)[:200],
                           "lost": len(spans) or 1, "text": ""})
            return
        fin = [e for e in result.events if e["type"] == "final"]
        rounds.append({"client": client, "start_s": round(t0 - t_start, 1), "finals": len(fin),
                       "errors": sum(e["type"] == "error" for e in result.events),
                       "lost": _lost(result.events, spans),
                       "text": " ".join(e["text"] for e in fin)})

    stop = threading.Event()

    def sample() -> None:
        """A row per interval; RSS is read every few seconds and the row takes the median of the interval's
        readings (one reading would fall by chance inside or outside an engine batch)."""
        done, readings = 0, []
        step = min(5.0, interval)
        next_row = time.monotonic()
        while True:
            now = time.monotonic()
            if pid:
                with contextlib.suppress(OSError):
                    readings.append(_rss_mb(pid))
            if now >= next_row:
                next_row += interval
                recent = [lat for t, lat in finals[done:]]
                done = len(finals)
                row: dict[str, Any] = {"minute": round((now - t_start) / 60, 2), "finals": len(recent),
                                       "final_p95": _pct(recent, 95), "load": round(os.getloadavg()[0], 2),
                                       "lost": sum(r["lost"] for r in rounds)}
                if pid and readings:
                    with contextlib.suppress(OSError):
                        row.update(rss_mb=round(statistics.median(readings), 1), rss_min_mb=round(min(readings), 1),
                                   rss_max_mb=round(max(readings), 1), fds=_fds(pid))
                readings = []
                samples.append(row)
                print(json.dumps({"sample": row}), file=sys.stderr, flush=True)
            if stop.wait(step):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        asyncio.run(_soak_clients(url, path, args.clients, seconds, on_round, finals, args.period_s))
    finally:
        stop.set()
        sampler.join(5)
        if proc is not None:
            proc.terminate()
            proc.wait(15)
    elapsed = time.monotonic() - t_start
    after = [s for s in samples if s["minute"] >= warmup and "rss_mb" in s]
    base, last = (after[0], samples[-1]) if after and "rss_mb" in samples[-1] else (None, None)
    latencies = [lat for _, lat in sorted(finals)]
    tenth = max(1, len(latencies) // 10)
    first_p95, last_p95 = _pct(latencies[:tenth], 95), _pct(latencies[-tenth:], 95)
    hyps = [r["text"] for r in rounds if "failed" not in r]
    summary = {
        "rounds": len(rounds), "failed_rounds": sum("failed" in r for r in rounds),
        "finals": len(latencies), "lost_segments": sum(r["lost"] for r in rounds),
        "errors": sum(r.get("errors", 0) for r in rounds),
        "wer": round(wer(" ".join([reference] * len(hyps)), " ".join(hyps)), 4) if reference and hyps else None,
        "distinct_transcripts": len(set(hyps)),
        "rss_start_mb": samples[0].get("rss_mb") if samples else None,
        "rss_after_warmup_mb": base["rss_mb"] if base else None, "rss_end_mb": last["rss_mb"] if last else None,
        "rss_growth_after_warmup_pct": round(100 * (last["rss_mb"] - base["rss_mb"]) / base["rss_mb"], 2)
        if base and last else None,
        "rss_slope_mb_per_min": round(v, 3) if (v := _slope([(s["minute"], s["rss_mb"]) for s in after])) is not None
        else None,
        "fds_start": samples[0].get("fds") if samples else None, "fds_after_warmup": base["fds"] if base else None,
        "fds_end": last["fds"] if last else None, "fds_max": max((s["fds"] for s in samples if "fds" in s),
                                                                  default=None),
        "fds_slope_per_min": round(v, 3) if (v := _slope([(s["minute"], s["fds"]) for s in after])) is not None
        else None,
        "final_p95_first_tenth": first_p95, "final_p95_last_tenth": last_p95,
        "final_p95_ratio": round(last_p95 / first_p95, 3) if first_p95 and last_p95 else None,
        "final_p95": _pct(latencies, 95), "load_mean": round(statistics.mean(s["load"] for s in samples), 2)
        if samples else None,
    }
    summary["verdict"] = {
        "rss_growth_under_5_pct": summary["rss_growth_after_warmup_pct"] is not None
        and summary["rss_growth_after_warmup_pct"] < 5,
        "fds_flat": summary["fds_after_warmup"] is not None and summary["fds_end"] is not None
        and summary["fds_end"] - summary["fds_after_warmup"] <= 2 * args.clients,
        "nothing_lost": summary["lost_segments"] == 0 and summary["failed_rounds"] == 0,
        "last_tenth_p95_within_20_pct": summary["final_p95_ratio"] is not None and summary["final_p95_ratio"] <= 1.2,
    }
    doc = {"kind": "soak", "machine": _machine(), "engine": "embedded tiny.en int8" if proc is not None else url,
           "input": what, "minutes": args.minutes, "elapsed_min": round(elapsed / 60, 2), "clients": args.clients,
           "warmup_minutes": warmup, "sample_s": interval, "summary": summary, "samples": samples, "rounds": rounds}
    v = summary["verdict"]
    table = (f"Soak: {args.clients} clients streaming {what} in real time over WebRTC on loopback, again and again "
             f"for {args.minutes:g} min ({elapsed / 60:.1f} min with the last rounds), {_machine()}, mean load "
             f"{summary['load_mean']}; warm-up {warmup:g} min.\n\n"
             "| rounds | finals | lost | errors | WER | RSS start / after warm-up / end (MB) | RSS growth | "
             "fds after warm-up / end / max | final p95 first / last tenth (s) |\n"
             "|---|---|---|---|---|---|---|---|---|\n"
             f"| {summary['rounds']} | {summary['finals']} | {summary['lost_segments']} | {summary['errors']} | "
             f"{_percent(summary['wer'])} | {summary['rss_start_mb']} / {summary['rss_after_warmup_mb']} / "
             f"{summary['rss_end_mb']} | {summary['rss_growth_after_warmup_pct']} % | {summary['fds_after_warmup']} / "
             f"{summary['fds_end']} / {summary['fds_max']} | {first_p95} / {last_p95} |\n\n"
             + ", ".join(f"{k.replace('_', ' ')}: {'yes' if ok else 'NO'}" for k, ok in v.items()) + "\n")

    def chart(p: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
        xs = [s["minute"] for s in samples]
        for ax, key, label in zip(axes, ("rss_mb", "fds", "final_p95"), ("server RSS (MB)", "open fds",
                                                                           "final p95 (s)"), strict=True):
            ax.plot(xs, [s.get(key) if s.get(key) is not None else np.nan for s in samples], marker=".")
            ax.set_ylabel(label)
            ax.axvline(warmup, color="grey", linestyle="--", linewidth=0.8)
        axes[-1].set_xlabel("minutes")
        axes[0].set_title(f"Soak, {args.clients} clients, {_machine()}")
        fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)

    write_outputs(out, "soak", doc, table, chart)
    return doc
