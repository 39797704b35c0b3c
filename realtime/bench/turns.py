"""`python -m realtime bench turns`: end of turn against plain silence timing, live, side by side in one run.

Every client plays the same real utterances (tests/data's read, short and spontaneous clips, 1.2 s apart; many have
pauses inside their sentences) in real time, to a launched app whose live sessions end a segment at a pause of the
VAD's minimum silence (`--end-of-turn silence`) or where the end-of-turn model finds the speaker finished (`high`,
`medium`, `low`: OpenAI's eagerness). Over WebRTC (N clients in step, 0.3 s apart) and over the Realtime WebSocket
(one client whose session asks for `server_vad` or `semantic_vad`). Per mode: final latency (end of an utterance
to its last word final at the client), utterances whose finals came in more than one piece (split: a line broken
at a pause inside it), finals that joined two utterances (merged), utterances never final, WER, and the app's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from ..config import MAX_WAIT_S
from .common import ROOT, _machine, write_outputs
from .peers import (
    CHUNK_S,
    SETTLE_S,
    Server,
    Trace,
    Utterance,
    _normalizer,
    _round,
    _utterances,
    play_ours,
    score,
    start,
)

PAUSE_S = (0.6, 1.5)
"""The pause a speaker makes inside each sentence: its length is drawn from this range."""
GAP_S = 1.2
"""The pause between sentences."""


def _inner_gap(audio: np.ndarray) -> tuple[int, int] | None:
    """The pause between two words nearest the middle of a clip (between a third and two thirds of it), as sample
    indices of its silence; None where the clip has none."""
    from ..config import VADConfig
    from ..live.vad import SegmentEnd, Segmenter

    seg = Segmenter(VADConfig(min_silence_ms=64, pad_before_ms=0, pad_after_ms=0))
    ends = [e for e in seg.feed(audio) + seg.flush() if isinstance(e, SegmentEnd)]
    gaps = [(int(a.end * SAMPLE_RATE), int(b.start * SAMPLE_RATE)) for a, b in itertools.pairwise(ends)]
    n = audio.size
    inside = [g for g in gaps if n / 3 <= g[0] <= 2 * n / 3 and g[1] > g[0]]
    return min(inside, key=lambda g: abs(g[0] - n / 2)) if inside else None


def paused_sentences(manifest: Path, seconds: float, out: Path, seed: int = 41) -> tuple[np.ndarray, list[Utterance],
                                                                                            str]:
    """Real clips of the manifest (read, short, spontaneous, up to 12 s) with a pause between two words near their
    middle stretched to a length drawn from `PAUSE_S` (its own room tone, repeated), `GAP_S` apart: a speaker who
    stops mid-sentence, as the issue's users do. Clips without such a pause are left out."""
    import random

    from .corpus import read_manifest

    rng = random.Random(seed)
    parts = [np.zeros(SAMPLE_RATE // 2, np.float32)]
    utts, t, total = [], 0.5, 0.0
    for clip in read_manifest(manifest, {"short", "read", "spontaneous"}, longest=12.0):
        audio = decode_file(clip.path)
        gap = _inner_gap(audio)
        if gap is None or total + clip.duration > seconds:
            continue
        a, b = gap
        tone = audio[a:b]
        need = int(rng.uniform(*PAUSE_S) * SAMPLE_RATE) - (b - a)
        filler = np.resize(tone, max(0, need)) if tone.size else np.zeros(max(0, need), np.float32)
        spoken = np.concatenate([audio[:b], filler, audio[b:]])
        utts.append(Utterance(t, t + spoken.size / SAMPLE_RATE, clip.text))
        parts += [spoken, np.zeros(int(GAP_S * SAMPLE_RATE), np.float32)]
        t += spoken.size / SAMPLE_RATE + GAP_S
        total += clip.duration
    import soundfile as sf

    joined = np.concatenate(parts)
    sf.write(str(out / "turns-speech.wav"), joined, SAMPLE_RATE, subtype="PCM_16")
    return joined, utts, (f"{len(utts)} real utterances ({total:.0f} s of speech), each with a pause of "
                          f"{PAUSE_S[0]:g} to {PAUSE_S[1]:g} s stretched between two words near its middle, "
                          f"{GAP_S:g} s apart (seed {seed})")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("turns", help="end of turn (the end-of-turn model) against silence timing, live")
    p.add_argument("--modes", default="silence,high,medium", help="comma-separated --end-of-turn values")
    p.add_argument("--clients", default="1,8", help="WebRTC clients in step, per round")
    p.add_argument("--audio", default=str(ROOT / "tests" / "data" / "manifest.tsv"))
    p.add_argument("--seconds", type=float, default=90.0, help="speech taken from the manifest (s)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--as-recorded", action="store_true",
                   help="the clips as they are (bench peers' input), no pause stretched inside them")
    p.add_argument("--seed", type=int, default=41, help="draws the stretched pauses' lengths")
    p.add_argument("--out", default="bench-out")


def tail_s(mode: str) -> float:
    """Silence each client plays after the recording: a pause the mode closes on its own."""
    return MAX_WAIT_S.get(mode, 0.4) + 1.0  # type: ignore[call-overload]


async def play_realtime(url: str, audio: np.ndarray, mode: str) -> Trace:
    """One openai-style Realtime transcription session over the WebSocket, audio paced in real time: finals are the
    completed items, in the order of their commits; shown text adds the open items' deltas."""
    import soxr
    import websockets

    turn: dict[str, Any] = {"type": "server_vad"} if mode == "silence" else {"type": "semantic_vad", "eagerness": mode}
    trace = Trace()
    padded = np.concatenate([audio, np.zeros(int(tail_s(mode) * SAMPLE_RATE), np.float32)])
    pcm = (np.clip(soxr.resample(padded, SAMPLE_RATE, 24000), -1, 1) * 32767).astype("<i2").tobytes()
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    order: list[str] = []
    finals: dict[str, str] = {}
    deltas: dict[str, str] = {}
    try:
        async with websockets.connect(ws_url, max_size=None) as ws:
            await ws.recv()
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "transcription", "audio": {"input": {"turn_detection": turn}}}}))
            while (reply := json.loads(await ws.recv()))["type"] != "session.updated":
                if reply["type"] == "error":
                    raise RuntimeError(f"session.update refused: {reply['error']}")
            t0 = time.monotonic()

            async def send() -> None:
                step = int(24000 * CHUNK_S) * 2
                for i, at in enumerate(range(0, len(pcm), step)):
                    delay = t0 + i * CHUNK_S - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(pcm[at:at + step]).decode()}))

            async def receive() -> None:
                async for message in ws:
                    e = json.loads(message)
                    kind, item = e["type"], e.get("item_id", "")
                    if kind == "input_audio_buffer.committed":
                        order.append(item)
                        continue
                    if kind == "conversation.item.input_audio_transcription.delta":
                        deltas[item] = deltas.get(item, "") + e["delta"]
                    elif kind in ("conversation.item.input_audio_transcription.completed",
                                  "conversation.item.input_audio_transcription.failed"):
                        finals[item] = e.get("transcript") or ""
                        deltas.pop(item, None)
                    else:
                        continue
                    final = " ".join(finals[i] for i in order if i in finals)
                    shown = " ".join(finals.get(i, deltas.get(i, "")) for i in order)
                    trace.add(time.monotonic() - t0, final, shown)

            reader = asyncio.create_task(receive())
            await send()
            try:
                await asyncio.wait_for(asyncio.shield(reader), SETTLE_S)
            except TimeoutError:
                reader.cancel()
    except Exception as exc:  # a refused or broken session is a failed client, reported as such
        trace.error = f"{type(exc).__name__}: {exc}"
    return trace


def _figures(traces: list[Trace], utts: list[Utterance]) -> dict[str, Any]:
    from .corpus import corpus_wer
    from .stream import _pct

    norm = _normalizer()
    finals: list[float] = []
    split = merged = lost = 0
    refs, hyps = [], []
    for tr in traces:
        s = score(tr.snapshots, utts, norm)
        finals += [x for x in s.final_s if x is not None]
        lost += sum(x is None for x in s.final_s)
        split += sum(n > 1 for n in s.pieces)
        merged += s.merged
        refs.append(" ".join(u.text for u in utts))
        hyps.append(s.final_text)
    return {"final_p50": _pct(finals, 50), "final_p95": _pct(finals, 95), "split": split, "merged": merged,
            "lost": lost, "utterances": len(utts) * len(traces), "wer": round(corpus_wer(refs, hyps), 4),
            "failed_clients": sum(t.error is not None for t in traces)}


def model_cost(audio: np.ndarray, calls: int = 40) -> dict[str, float]:
    """The end-of-turn model in this process: seconds to load it, and per call (median), wall and CPU, on one thread."""
    from ..live.end_of_turn import TurnModel

    t = time.perf_counter()
    model = TurnModel()
    load = time.perf_counter() - t
    walls, cpus = [], []
    for i in range(calls):
        end = (i + 1) * audio.size // (calls + 1)
        w, c = time.perf_counter(), time.thread_time()
        model.complete(audio[:end])
        walls.append(time.perf_counter() - w)
        cpus.append(time.thread_time() - c)
    return {"load_s": round(load, 3), "call_ms": round(1000 * statistics.median(walls), 1),
            "call_cpu_ms": round(1000 * statistics.median(cpus), 1)}


def _median(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rows[0]:
        vals = [r[key] for r in rows if r[key] is not None]
        out[key] = round(statistics.median(vals), 3) if vals else None
    return out


def bench_turns(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    clients = [int(c) for c in args.clients.split(",")]
    if args.as_recorded:
        audio, utts, what = _utterances(Path(args.audio), args.seconds, out)
    else:
        audio, utts, what = paused_sentences(Path(args.audio), args.seconds, out, args.seed)
    warm = out / "turns-warmup.wav"
    import soundfile as sf

    sf.write(str(warm), audio[: 5 * SAMPLE_RATE], SAMPLE_RATE, subtype="PCM_16")
    cost = model_cost(audio)
    print(json.dumps({"model": cost}), file=sys.stderr, flush=True)
    per: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    servers: dict[str, Server] = {}
    try:
        for mode in modes:
            servers[mode] = start("realtime", max(clients), out, warm, ["--end-of-turn", mode])
            asyncio.run(servers[mode].play(audio[: 5 * SAMPLE_RATE]))  # a first session warms the engine
        for run in range(args.runs):
            for mode in modes:  # the modes take turns, so that a slower spell of the machine is shared out
                server = servers[mode]
                url = server.metrics_url.removesuffix("/metrics") if server.metrics_url else ""
                for n in clients:
                    server.play = lambda a, u=url, m=mode: play_ours(u, a, tail_s(m))
                    traces, cores, _, _ = _round(server, audio, n)
                    row = {**_figures(traces, utts), "app_cores_per_client": round(cores / n, 3)}
                    per.setdefault((mode, "webrtc", n), []).append(row)
                    print(json.dumps({"run": run, "mode": mode, "transport": "webrtc", "clients": n, **row}),
                          file=sys.stderr, flush=True)
                trace = asyncio.run(play_realtime(url, audio, mode))
                row = _figures([trace], utts)
                per.setdefault((mode, "realtime", 1), []).append(row)
                print(json.dumps({"run": run, "mode": mode, "transport": "realtime", "clients": 1, **row}),
                      file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    results = [{"mode": m, "transport": t, "clients": n, **_median(rows), "runs": rows}
               for (m, t, n), rows in per.items()]
    doc = {"kind": "turns", "machine": _machine(), "weights": "tiny.en (CTranslate2 int8, bundled)", "input": what,
           "runs": args.runs, "model": cost, "results": results}
    write_outputs(out, "turns", doc, _table(doc), lambda p: None)
    return doc


def _table(doc: dict[str, Any]) -> str:
    head = (f"End of turn against silence timing: {doc['machine']}, {doc['weights']}; every client plays "
            f"{doc['input']} in real time; medians of {doc['runs']} run(s). Final: end of an utterance to its last "
            "word final at the client; split: utterances finalised in more than one piece; merged: finals holding "
            "two utterances; lost: utterances never final.\n\n"
            "| transport | clients | end of turn | final p50 | final p95 | split | merged | lost | WER | "
            "app CPU per client |\n|---|---|---|---|---|---|---|---|---|---|\n")
    m = doc["model"]
    foot = (f"\nThe end-of-turn model: {m['load_s']:.2f} s to load, {m['call_ms']:.0f} ms a call "
            f"({m['call_cpu_ms']:.0f} ms of CPU, one thread), one call per pause that lasts 160 ms.\n")
    rows = sorted(doc["results"], key=lambda r: (r["transport"] != "webrtc", r["clients"], r["mode"]))
    lines = []
    for r in rows:
        cpu = r.get("app_cores_per_client")
        lines.append(f"| {r['transport']} | {r['clients']} | {r['mode']} | {r['final_p50']:.2f} s | "
                     f"{r['final_p95']:.2f} s | {r['split']:g} of {r['utterances']:g} | {r['merged']:g} | "
                     f"{r['lost']:g} | {100 * r['wer']:.1f} % | {'-' if cpu is None else f'{cpu:.3f}'} |")
    return head + "\n".join(lines) + "\n" + foot
