"""`python -m realtime bench retranscribe`: what a careful pass adds to a live draft.

One app launched with `--keep-audio`; N random compilations of a manifest's real clips (`corpus.random_compilation`,
seeds from `--seed` on) each streamed to it over the Realtime API (appended as fast as the server reads them: its
finals follow the stream's own time), then transcribed again from the kept audio (`POST
/v1/transcripts/{id}/retranscribe`) with `--retranscribe-model`. WER of the live draft and of the new text against
the manifest's texts, pooled over all the compilations, and the pass's RTFx (audio seconds per second of the pass).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from .common import _machine, write_outputs
from .corpus import corpus_wer, random_compilation, read_manifest

LONGEST_CLIP_S = 40.0
KEY = "bench-retranscribe"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("retranscribe", help="live draft against a retranscription of the kept audio: WER on "
                                            "random compilations of real clips")
    p.add_argument("--random", type=int, default=8, help="compilations")
    p.add_argument("--seed", type=int, default=None, help="the first compilation's seed (default: drawn, printed)")
    p.add_argument("--audio", default="tests/data/manifest.tsv")
    p.add_argument("--model", default="base", help="the retranscription's model (--retranscribe-model)")
    p.add_argument("--app-flag", action="append", default=[], help="more flags for the launched app (repeat)")
    p.add_argument("--out", default="bench-out")


async def live(url: str, audio: np.ndarray, session: dict[str, Any] | None = None,
               key: str | None = KEY) -> tuple[str, list[str]]:
    """Stream `audio` (16 kHz) over a Realtime transcription session (configured by `session`, a `session.update`'s
    object); once its items are done, the session's id and their transcripts in order."""
    import soxr
    import websockets

    pcm = (np.clip(soxr.resample(audio, SAMPLE_RATE, 24000), -1, 1) * 32767).astype("<i2").tobytes()
    ws_url = url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    async with websockets.connect(ws_url, additional_headers={"Authorization": f"Bearer {key}"} if key else {},
                                  max_size=None) as ws:
        created = json.loads(await ws.recv())
        session_id = created["session"]["id"]
        if session:
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", **session}}))
            while (reply := json.loads(await ws.recv()))["type"] != "session.updated":
                if reply["type"] == "error":
                    raise RuntimeError(f"session.update refused: {reply['error']}")
        step = 24000 // 10 * 2
        for i in range(0, len(pcm), step):
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(pcm[i:i + step]).decode()}))
        # a second of silence closes the last utterance; an update that changes nothing is answered once the
        # server has read all of it (every item started by then); then every started item must complete
        silence = base64.b64encode(bytes(48000)).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": silence}))
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        started, done, texts = [], set(), {}
        read = False
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not (read and set(started) <= done):
            try:
                event = json.loads(await asyncio.wait_for(ws.recv(), 5))
            except TimeoutError:
                continue
            if event["type"] == "session.updated":
                read = True
            elif event["type"] == "input_audio_buffer.committed":
                started.append(event["item_id"])
            elif event["type"] in ("conversation.item.input_audio_transcription.completed",
                                   "conversation.item.input_audio_transcription.failed"):
                done.add(event["item_id"])
                texts[event["item_id"]] = event.get("transcript") or ""
    return str(session_id), [texts.get(item, "") for item in started]


def _ended(url: str, session_id: str) -> dict[str, Any]:
    import httpx

    deadline = time.monotonic() + 60
    while True:
        doc = httpx.get(f"{url}/v1/transcripts/{session_id}", headers={"Authorization": f"Bearer {KEY}"}).json()
        if doc.get("state") == "ended" or time.monotonic() > deadline:
            return dict(doc)
        time.sleep(0.2)


def bench_retranscribe(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from .stream import _launch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clips = read_manifest(Path(args.audio), longest=LONGEST_CLIP_S)
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    print(f"seeds {seed}..{seed + args.random - 1}", file=sys.stderr, flush=True)
    data = Path(tempfile.mkdtemp(prefix="bench-retranscribe-"))
    proc, port = _launch(4, "--api-key", KEY, "--data-dir", str(data), "--keep-audio", "--retranscribe-model",
                         args.model, *args.app_flag, log=out / "retranscribe-app.log")
    url = f"http://127.0.0.1:{port}"
    rows, refs, drafts, passes, audio_s, pass_s = [], [], [], [], 0.0, 0.0
    try:
        for k in range(args.random):
            comp = random_compilation(clips, Path(data) / f"comp-{seed + k}.wav", seed + k)
            audio = decode_file(comp.path)
            session_id, _ = asyncio.run(live(url, audio))
            draft = _ended(url, session_id)
            t0 = time.perf_counter()
            r = httpx.post(f"{url}/v1/transcripts/{session_id}/retranscribe",
                           headers={"Authorization": f"Bearer {KEY}"}, json={"model": args.model}, timeout=1800)
            spent = time.perf_counter() - t0
            r.raise_for_status()
            again = r.json()
            reference = " ".join(comp.texts)
            row = {"seed": seed + k, "seconds": round(audio.size / SAMPLE_RATE, 1),
                   "draft_model": draft["model"], "model": again["model"],
                   "draft_wer": round(100 * corpus_wer([reference], [draft["text"]]), 2),
                   "wer": round(100 * corpus_wer([reference], [again["text"]]), 2), "pass_s": round(spent, 2)}
            print(row, file=sys.stderr, flush=True)
            rows.append(row | {"reference": reference, "draft": draft["text"], "again": again["text"]})
            refs.append(reference)
            drafts.append(draft["text"])
            passes.append(again["text"])
            audio_s += audio.size / SAMPLE_RATE
            pass_s += spent
    finally:
        proc.terminate()
        proc.wait(30)
    summary = {"compilations": len(rows), "audio_s": round(audio_s, 1),
               "draft_wer": round(100 * corpus_wer(refs, drafts), 2), "wer": round(100 * corpus_wer(refs, passes), 2),
               "median_wer_change": round(statistics.median(r["wer"] - r["draft_wer"] for r in rows), 2),
               "better": sum(r["wer"] < r["draft_wer"] for r in rows), "worse": sum(r["wer"] > r["draft_wer"]
                                                                                  for r in rows),
               "pass_rtfx": round(audio_s / pass_s, 1) if pass_s else None}
    doc = {"machine": _machine(), "seed": seed, "model": args.model, "app_flags": args.app_flag, "rows": rows,
           "summary": summary}
    table = ("| compilations | audio (s) | live draft WER | retranscribed WER | better / worse | pass RTFx |\n"
             "|---|---|---|---|---|---|\n"
             f"| {summary['compilations']} | {summary['audio_s']} | {summary['draft_wer']} % | {summary['wer']} % | "
             f"{summary['better']} / {summary['worse']} | {summary['pass_rtfx']} |\n")

    def chart(path: Path) -> None:
        from .common import _bar_chart

        _bar_chart(path, ["live draft", f"again ({args.model})"], [summary["draft_wer"], summary["wer"]],
                   "WER (%)", "Retranscription of kept audio")

    write_outputs(out, "retranscribe", doc, table, chart)
    return doc
