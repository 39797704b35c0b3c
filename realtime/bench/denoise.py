"""`python -m realtime bench denoise`: what a Realtime session's `noise_reduction` does to WER, and what it costs.

Real clips of the manifest (`--conditions`, up to 15 s each), in groups of `--per` joined with pauses of `--pause`
seconds (a person saying a few sentences), each group clean and with real noise added all through at the given
signal-to-noise ratios (the noise: a meeting room's recording without its speech, `tests/data/speakers`' EN2001b
with the reference's speech cut out, looped; the ratio is of the group's and the noise's RMS over the group),
streamed over the Realtime API of one launched app with `noise_reduction` off, `near_field` and `far_field` (the VAD
hears the denoised audio, the engine the audio as it came). Pooled WER of each group's completed transcripts per
condition and setting, in one run. Beside them, in process, the engine on each clip of the groups alone, cut from
the group as it was sent and from its denoised copy (`near_field`): why the engine does not get the denoised audio.
The denoiser's cost is measured in process: CPU seconds per audio second, fed 20 ms at a time as a live session
feeds it, and the time to open one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from .common import ROOT, _machine, write_outputs
from .corpus import compilation, corpus_wer, read_manifest

NOISE = ROOT / "tests/data/speakers/ami-EN2001b-0-30s.flac"
NOISE_MARGIN_S = 0.5
"""The noise bed leaves out this much around each stretch of speech its reference marks."""
SETTINGS: tuple[str | None, ...] = (None, "near_field", "far_field")
ENGINE_PLAIN = "engine alone, each clip as sent (in process)"
ENGINE_HEARS = "engine alone, each clip denoised (near_field, in process)"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("denoise", help="Realtime sessions' noise_reduction: WER on clean and noisy real clips, and "
                                       "the denoiser's cost")
    p.add_argument("--audio", default="tests/data/manifest.tsv")
    p.add_argument("--clips", type=int, default=48, help="clips of the manifest (the first of --conditions, up to 15 s "
                                                         "each)")
    p.add_argument("--conditions", default="read,short", help="the manifest's conditions to take clips from")
    p.add_argument("--per", type=int, default=3, help="clips per recording")
    p.add_argument("--pause", type=float, default=1.2, help="seconds between a recording's clips")
    p.add_argument("--snr", type=float, action="append", default=None, help="signal-to-noise ratio in dB (repeat; "
                                                                            "default 10, 5 and 0)")
    p.add_argument("--out", default="bench-out")


def noise_bed(path: Path = NOISE) -> np.ndarray:
    """The recording's audio without the speech its RTTM marks (and `NOISE_MARGIN_S` around it)."""
    from .speakers import read_rttm

    audio = decode_file(path)
    keep = np.ones(audio.size, dtype=bool)
    for start, end, _ in read_rttm(path.with_suffix(".rttm")):
        keep[max(0, int((start - NOISE_MARGIN_S) * SAMPLE_RATE)):int((end + NOISE_MARGIN_S) * SAMPLE_RATE)] = False
    return audio[keep]


def noisy(clip: np.ndarray, noise: np.ndarray, snr_db: float, offset: int = 0) -> np.ndarray:
    """`clip` with the noise (looped from `offset`) added `snr_db` below it (RMS over the clip)."""
    bed = np.resize(np.roll(noise, -offset), clip.size)
    gain = np.sqrt(np.mean(clip ** 2) / max(float(np.mean(bed ** 2)), 1e-12)) / 10 ** (snr_db / 20)
    mixed = clip + gain * bed
    return (mixed / max(1.0, float(np.abs(mixed).max()) / 0.99)).astype(np.float32)


def denoised(audio: np.ndarray, field: str = "near_field") -> np.ndarray:
    """`audio` through a denoiser of its own, 20 ms at a time."""
    from ..live.denoise import Denoiser

    d = Denoiser(field)  # type: ignore[arg-type]
    out = [d.process(audio[i:i + SAMPLE_RATE // 50]) for i in range(0, audio.size, SAMPLE_RATE // 50)]
    out.append(d.flush())
    d.close()
    return np.concatenate(out)


def denoiser_cost(audio: np.ndarray) -> dict[str, float]:
    """CPU seconds per audio second of one stream fed 20 ms at a time, and the seconds to open a denoiser."""
    from ..live.denoise import Denoiser

    t0 = time.perf_counter()
    d = Denoiser()
    opened = time.perf_counter() - t0
    c0 = time.thread_time()
    for i in range(0, audio.size, SAMPLE_RATE // 50):
        d.process(audio[i:i + SAMPLE_RATE // 50])
    d.flush()
    spent = time.thread_time() - c0
    d.close()
    return {"cpu_per_audio_s": round(spent / (audio.size / SAMPLE_RATE), 4), "open_s": round(opened, 3)}


def bench_denoise(args: argparse.Namespace) -> dict[str, Any]:
    from ..engines import TranscribeOptions
    from ..engines.embedded import EmbeddedEngine
    from .retranscribe import live
    from .stream import _launch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clips = read_manifest(Path(args.audio), set(args.conditions.split(",")), longest=15.0)[:args.clips]
    groups = [compilation(clips[i:i + args.per], out / f"denoise-{i // args.per}.wav", gap=args.pause)
              for i in range(0, len(clips), args.per)]
    noise = noise_bed()
    ratios = args.snr or [10.0, 5.0, 0.0]
    conditions: list[tuple[str, float | None]] = [("clean", None), *((f"{r:g} dB SNR", r) for r in ratios)]
    proc, port = _launch(4, "--no-history", log=out / "denoise-app.log")
    url = f"http://127.0.0.1:{port}"
    results: dict[tuple[str, str], list[str]] = {}
    audio_s = 0.0
    engine = EmbeddedEngine(language="en")
    engine.load()
    try:
        for name, ratio in conditions:
            inputs = [decode_file(g.path) if ratio is None else noisy(decode_file(g.path), noise, ratio, 7919 * k)
                      for k, g in enumerate(groups)]
            for column, heard in ((ENGINE_PLAIN, inputs), (ENGINE_HEARS, [denoised(a) for a in inputs])):
                results[(name, column)] = [
                    " ".join(engine.transcribe_sync(a[int(start * SAMPLE_RATE):int(end * SAMPLE_RATE)],
                                                    TranscribeOptions()).text for start, end in g.spans)
                    for a, g in zip(heard, groups, strict=True)]
            for setting in SETTINGS:
                session = {"audio": {"input": {"noise_reduction": {"type": setting} if setting else None}}}
                texts = [" ".join(asyncio.run(live(url, a, session, key=None))[1]) for a in inputs]
                results[(name, setting or "off")] = texts
                audio_s += sum(a.size for a in inputs) / SAMPLE_RATE
                wer = 100 * corpus_wer([" ".join(g.texts) for g in groups], texts)
                print(f"{name}, noise_reduction {setting or 'off'}: WER {wer:.1f} %", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    refs = [" ".join(g.texts) for g in groups]
    rows = [{"condition": name, "noise_reduction": setting, "wer": round(100 * corpus_wer(refs, texts), 2),
             "texts": texts} for (name, setting), texts in results.items()]
    cost = denoiser_cost(np.concatenate([decode_file(c.path) for c in clips]))
    doc = {"machine": _machine(), "clips": [c.path.name for c in clips], "noise": str(NOISE), "rows": rows,
           "cost": cost, "audio_s": round(audio_s, 1)}
    columns = [s or "off" for s in SETTINGS] + [ENGINE_PLAIN, ENGINE_HEARS]
    header = "| | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns) + "\n"
    lines = [f"| {name} | " + " | ".join(f"{100 * corpus_wer(refs, results[(name, c)]):.1f} %" for c in columns)
             + " |" for name, _ in conditions]
    table = (f"WER of {len(clips)} real clips ({args.conditions}) in {len(groups)} recordings ({args.pause:g} s "
             "pauses) streamed over the Realtime API, by noise_reduction\n\n" + header
             + "\n".join(lines) + f"\n\nDenoiser: {cost['cpu_per_audio_s']} CPU seconds per audio second (one "
             f"stream, 20 ms at a time), {cost['open_s']} s to open one.\n")
    def chart(path: Path) -> None:
        from .common import _bar_chart

        worst = conditions[-1][0]
        _bar_chart(path, [s or "off" for s in SETTINGS], [next(r["wer"] for r in rows if r["condition"] == worst
                                                               and r["noise_reduction"] == (s or "off"))
                                                          for s in SETTINGS], "WER (%)", f"noise_reduction, {worst}")

    write_outputs(out, "denoise", doc, table, chart)
    return doc
