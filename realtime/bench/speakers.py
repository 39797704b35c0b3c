"""`bench speakers`: diarization error rate on recordings with RTTM references: what a user gets (the HTTP API's
`diarized_json` segments and its srt cues with `diarize=true`, from a launched app) beside the speaker layer's own
turns, offline (the whole file clustered: on the speech the file path's speaker model hears, faint speech included,
and on the live VAD's segments) and live (each window labelled as it is heard), and a floor (everything one
speaker); the speaker count of each, and the cost per second.

The scorer follows the standard definition (NIST md-eval, pyannote.metrics): a 10 ms grid; no scoring within
`COLLAR_S` of a reference boundary; per frame, missed speech max(0, reference - hypothesis speakers), false alarm
max(0, hypothesis - reference), confusion min(reference, hypothesis) - correct under the best one-to-one mapping
of speakers; the error divided by the reference speaker time. `skip_overlap` leaves out frames where the reference
has two or more speakers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..audio import SAMPLE_RATE, decode_file, iter_file
from ..live.vad import SegmentEnd, Segmenter, VADConfig
from ..speakers import Diarizer, LiveSpeakers, Turn
from .common import ROOT

MANIFEST = ROOT / "tests" / "data" / "manifest.tsv"
COLLAR_S = 0.25
FRAME_S = 0.01
ALONE_S = 2.0
"""A voice that speaks this long with no one else talking says a sentence alone: the speaker count is also scored
against the reference's voices that do (a voice heard only over others, or for a word or two, gives the clustering
no window of its own to find it by)."""
Labelled = tuple[float, float, str]


def read_rttm(path: str | Path) -> list[Labelled]:
    out = []
    for line in Path(path).read_text().splitlines():
        f = line.split()
        if f and f[0] == "SPEAKER":
            out.append((float(f[3]), float(f[3]) + float(f[4]), f[7]))
    return out


def alone_s(reference: Sequence[Labelled], speaker: str) -> float:
    """How long `speaker` speaks in `reference` with no other speaker talking."""
    end = max((b for _, b, _ in reference), default=0.0)
    speakers = sorted({w for *_, w in reference} | {speaker})
    grid = _grid(reference, speakers, round(end / FRAME_S) + 1)
    me = speakers.index(speaker)
    return float((grid[me] & (grid.sum(0) == 1)).sum() * FRAME_S)


def _grid(turns: Sequence[Labelled], speakers: list[str], frames: int) -> np.ndarray:
    grid = np.zeros((len(speakers), frames), dtype=bool)
    for start, end, who in turns:
        grid[speakers.index(who), round(start / FRAME_S):round(end / FRAME_S)] = True
    return grid


@dataclass
class Score:
    der: float
    missed: float
    false_alarm: float
    confusion: float
    scored_s: float


def der(reference: Sequence[Labelled], hypothesis: Sequence[Labelled], collar: float = COLLAR_S,
        skip_overlap: bool = False) -> Score:
    from scipy.optimize import linear_sum_assignment

    end = max([e for _, e, _ in [*reference, *hypothesis]] + [0.0])
    frames = int(np.ceil(end / FRAME_S)) + 1
    ref_names = sorted({w for *_, w in reference})
    hyp_names = sorted({w for *_, w in hypothesis})
    ref = _grid(reference, ref_names, frames)
    hyp = _grid(hypothesis, hyp_names, frames)
    scored = np.ones(frames, dtype=bool)
    c = round(collar / FRAME_S)
    for start, stop, _ in reference:
        for t in (start, stop):
            i = round(t / FRAME_S)
            scored[max(0, i - c):i + c] = False
    n_ref = ref.sum(0)
    if skip_overlap:
        scored &= n_ref <= 1
    ref, hyp, n_ref = ref[:, scored], hyp[:, scored], n_ref[scored]
    n_hyp = hyp.sum(0)
    overlap = ref.astype(np.int64) @ hyp.T.astype(np.int64)
    rows, cols = linear_sum_assignment(-overlap) if overlap.size else ([], [])
    correct = np.zeros(ref.shape[1], dtype=np.int64)
    for r, h in zip(rows, cols, strict=True):
        correct += ref[r] & hyp[h]
    missed = np.maximum(0, n_ref - n_hyp).sum()
    false_alarm = np.maximum(0, n_hyp - n_ref).sum()
    confusion = (np.minimum(n_ref, n_hyp) - correct).sum()
    total = max(int(n_ref.sum()), 1)
    return Score((missed + false_alarm + confusion) / total, missed / total, false_alarm / total,
                 confusion / total, total * FRAME_S)


def vad_segments(path: str | Path) -> list[SegmentEnd]:
    """The VAD's speech segments of a file, as the app cuts them."""
    segmenter = Segmenter(VADConfig())
    out = [e for chunk in iter_file(path) for e in segmenter.feed(chunk) if isinstance(e, SegmentEnd)]
    return out + [e for e in segmenter.flush() if isinstance(e, SegmentEnd)]


def file_speech(path: str | Path) -> list[tuple[float, float]]:
    """The speech the file path's speaker model hears (the HTTP API's, the command line's, the File tab's): the
    segments it cuts (faint speech included) with the VAD's padding, packed as it packs them
    (`labels.speech_spans`)."""
    import asyncio

    from ..config import WINDOW_S
    from ..live.labels import speech_spans
    from ..live.transcribe import SegmentStream

    async def cut() -> list[tuple[float, float]]:
        spans: list[tuple[float, float]] = []
        async for end in SegmentStream(path, VADConfig(), window_s=WINDOW_S, max_queued=64):
            spans += speech_spans(end)
        return spans

    return asyncio.run(cut())


def padded(segment: SegmentEnd) -> tuple[float, float]:
    """A segment's span with the VAD's padding: the audio the engine hears, and what the speaker model windows."""
    return segment.audio_start, segment.audio_start + segment.audio.size / SAMPLE_RATE


def _labelled(turns: Sequence[Turn]) -> list[Labelled]:
    return [(t.start, t.end, str(t.speaker)) for t in turns]


def diarize_file(diarizer: Diarizer, path: str | Path, answers: dict[str, list[Labelled]] | None = None,
                 on_file_speech: bool = True) -> dict[str, object]:
    """One recording, offline and live, with the floor and the speaker counts (and the app's `answers`, if given;
    with `on_file_speech`, also offline on the speech the file path's speaker model hears)."""
    segments = vad_segments(path)
    speech = [padded(s) for s in segments]
    audio = decode_file(path)
    t0 = time.perf_counter()
    offline = diarizer.file(audio, speech)
    offline_s = time.perf_counter() - t0
    on_file = diarizer.file(audio, file_speech(path)) if on_file_speech else None
    live = LiveSpeakers(diarizer.embedder)
    t0 = time.perf_counter()
    for seg in segments:
        live.add(seg.audio, seg.audio_start)
    live_s = time.perf_counter() - t0
    online = live.online(speech)
    reference = read_rttm(Path(path).with_suffix(".rttm"))
    floor = [(a, b, "0") for a, b in speech]
    voices = {w for *_, w in reference}
    row: dict[str, object] = {"file": Path(path).stem, "seconds": round(audio.size / SAMPLE_RATE, 1),
                              "speakers": len(voices),
                              "speakers_alone": sum(alone_s(reference, w) >= ALONE_S for w in voices),
                              "found_offline": len(offline.centroids), "found_live": len(online.centroids)}
    hypotheses = {**(answers or {}), "offline": _labelled(offline.turns), "live": _labelled(online.turns),
                  "one": floor}
    if on_file is not None:
        row["found_file_vad"] = len(on_file.centroids)
        hypotheses["file_vad"] = _labelled(on_file.turns)
    for name, hyp in (answers or {}).items():
        row[f"found_{name}"] = len({w for *_, w in hyp})
    for name, hyp in hypotheses.items():
        row[name] = asdict(der(reference, hyp))
        row[f"{name}_no_overlap"] = asdict(der(reference, hyp, skip_overlap=True))
    row["offline_cost"] = offline_s / (audio.size / SAMPLE_RATE)
    row["live_cost"] = live_s / (audio.size / SAMPLE_RATE)
    return row


def srt_cues(srt: str) -> list[tuple[float, float, str]]:
    """An srt answer's cues: (start, end, text), the text's lines joined."""
    def seconds(stamp: str) -> float:
        h, m, sec = stamp.replace(",", ".").split(":")
        return int(h) * 3600 + int(m) * 60 + float(sec)

    out = []
    for block in srt.strip().split("\n\n") if srt.strip() else []:
        _, times, *text = block.splitlines()
        a, b = times.split(" --> ")
        out.append((seconds(a), seconds(b), " ".join(text)))
    return out


def srt_turns(srt: str) -> list[Labelled]:
    """An srt answer's cues with their speakers ("A: ..." starts a labelled cue)."""
    return [(a, b, text.partition(": ")[0]) for a, b, text in srt_cues(srt)]


def served_answers(files: Sequence[Path], out: Path) -> dict[str, dict[str, list[Labelled]]]:
    """Each file's `diarized_json` segments and srt cues (`diarize=true`) from a launched app's HTTP API."""
    from .common import post_file
    from .stream import _launch

    app, port = _launch(2, log=out / "speakers-app.log")
    answers: dict[str, dict[str, list[Labelled]]] = {}
    try:
        for path in files:
            doc = post_file(port, path, response_format="diarized_json").json()
            answers[path.stem] = {
                "api": [(s["start"], s["end"], s["speaker"]) for s in doc["segments"]],
                "srt": srt_turns(post_file(port, path, response_format="srt", diarize="true").text)}
    finally:
        app.terminate()
        app.wait(30)
    return answers


def pooled(rows: Sequence[dict], key: str, rate: str = "der") -> float:
    """A set's DER (or another of its `Score`'s rates): errors summed over files divided by the reference time
    summed over files."""
    total = sum(r[key]["scored_s"] for r in rows)
    return sum(r[key][rate] * r[key]["scored_s"] for r in rows) / max(total, 1e-9)


KINDS = ("api", "srt", "file_vad", "offline", "live", "one")
"""The hypotheses scored: `diarized_json`, srt with speakers, the layer's turns offline on the speech the file path's
speaker model hears (`file_speech`: what the API's labels go by) and on the live VAD's segments, live, one speaker."""
NAMES = {"api": "API diarized_json", "srt": "API srt (diarize=true)",
         "file_vad": "speaker layer, offline, on the file path's speech", "offline": "speaker layer, offline",
         "live": "speaker layer, live", "one": "everything one speaker"}


def _count(rows: Sequence[dict], kind: str, against: str = "speakers") -> dict[str, int]:
    """How many recordings' counts are exact, one off and more, against the reference's voices (`against`:
    "speakers", or "speakers_alone", those that speak `ALONE_S` alone)."""
    off = [abs(r[f"found_{kind}"] - r[against]) for r in rows]
    return {"exact": sum(d == 0 for d in off), "one_off": sum(d == 1 for d in off), "more": sum(d > 1 for d in off)}


SETS = ("meetings", "conversations", "all")
"""The summaries: the recordings of `--dir` (real meetings), the constructed conversations (`--conversations`), and
both."""


def summarize(rows: Sequence[dict], kinds: Sequence[str]) -> dict[str, object]:
    """A set's pooled DER (with and without overlapped speech) of each kind, false alarm and speaker counts."""
    summary: dict[str, object] = {k: round(100 * pooled(rows, k), 1) for kind in kinds
                                  for k in (kind, f"{kind}_no_overlap")}
    for kind in kinds[:-1]:
        summary[f"count_{kind}"] = _count(rows, kind)
        summary[f"count_alone_{kind}"] = _count(rows, kind, "speakers_alone")
        few = [r for r in rows if r["speakers"] <= 3]
        summary[f"count_few_{kind}"] = f"{sum(r[f'found_{kind}'] == r['speakers'] for r in few)} of {len(few)}"
        summary[f"false_alarm_{kind}"] = round(100 * pooled(rows, f"{kind}_no_overlap", "false_alarm"), 1)
    summary["files"] = len(rows)
    summary["minutes"] = round(sum(r["seconds"] for r in rows) / 60, 1)
    return summary


def _table(summary: dict, kinds: Sequence[str]) -> list[str]:
    lines = ["| | DER | without overlapped speech | false alarm | speaker count exact / one off / more | the same, "
             f"against the voices that speak {ALONE_S:.0f} s alone | exact, two or three voices |",
             "|---|---|---|---|---|---|---|"]

    def counted(key: str) -> str:
        count = summary.get(key)
        return f"{count['exact']} / {count['one_off']} / {count['more']}" if isinstance(count, dict) else ""

    for kind in kinds:
        alarm = f"{summary[f'false_alarm_{kind}']} %" if f"false_alarm_{kind}" in summary else ""
        lines.append(f"| {NAMES[kind]} | {summary[kind]} % | {summary[f'{kind}_no_overlap']} % | {alarm} | "
                     f"{counted(f'count_{kind}')} | {counted(f'count_alone_{kind}')} | "
                     f"{summary.get(f'count_few_{kind}', '')} |")
    return lines


def conversations(n: int, seed: int, out: Path, manifest: Path) -> list[Path]:
    """`n` constructed conversations (`conversations.random_conversation`, seeds `seed` on) of `manifest`'s voices,
    written with their RTTMs under `out`."""
    from .conversations import random_conversation, voices
    from .corpus import read_manifest

    out.mkdir(parents=True, exist_ok=True)
    by_voice = voices(read_manifest(manifest))
    return [random_conversation(by_voice, out / f"conversation-{s}.flac", s).path for s in range(seed, seed + n)]


def bench_speakers(args: argparse.Namespace) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meetings = sorted(Path(args.dir).glob("*.flac"))
    n = args.conversations
    seed = int(time.time()) % 100_000 if args.seed is None else args.seed
    talks = conversations(n, seed, out / "conversations", Path(args.manifest)) if n else []
    if talks:
        print(f"{n} constructed conversations, seeds {seed} to {seed + n - 1}", flush=True)
    files = meetings + talks
    answers = {} if args.layer_only else served_answers(files, out)
    kinds = KINDS[3:] if args.layer_only else KINDS  # the file path's speech is the API's: the full run's
    diarizer = Diarizer()
    rows = [diarize_file(diarizer, f, answers.get(f.stem), on_file_speech=not args.layer_only) for f in files]
    for row, f in zip(rows, files, strict=True):
        row["set"] = "conversations" if f in talks else "meetings"
    sets = {name: [r for r in rows if name == "all" or r["set"] == name] for name in SETS}
    by_set = {name: summarize(part, kinds) for name, part in sets.items() if part}
    summary: dict[str, object] = {**(by_set.get("meetings") or summarize([], kinds)), "sets": by_set}
    summary["seed"] = seed if talks else None
    summary["offline_cost_per_s"] = round(statistics.median(r["offline_cost"] for r in rows), 4)
    summary["live_cost_per_s"] = round(statistics.median(r["live_cost"] for r in rows), 4)
    doc = {"summary": summary, "files": rows}
    (out / "bench-speakers.json").write_text(json.dumps(doc, indent=1))
    lines: list[str] = []
    for name in SETS:
        if name in by_set and (name != "all" or len(by_set) == len(SETS)):
            part = by_set[name]
            lines += [f"{name} ({part['files']} recordings, {part['minutes']} min):", "", *_table(part, kinds), ""]
    found = [k for k in kinds if k not in ("srt", "one")]
    lines += [f"| file | s | speakers (alone {ALONE_S:.0f} s) | found: {' / '.join(found)} | "
              + " | ".join(f"{k} | no overlap" for k in kinds) + " |", "|---|---|---|---|" + "---|" * 2 * len(kinds)]
    for r in rows:
        counts = " / ".join(str(r[f"found_{k}"]) for k in found)
        lines.append(f"| {r['file']} | {r['seconds']} | {r['speakers']} ({r['speakers_alone']}) | {counts} "
                     + "".join(f"| {100 * r[k]['der']:.1f} % | {100 * r[f'{k}_no_overlap']['der']:.1f} % "
                               for k in kinds) + "|")
    table = "\n".join(lines)
    (out / "bench-speakers.md").write_text(table + "\n")
    print(table)
    print(f"false alarm without overlapped speech; cost per second of audio: offline "
          f"{summary['offline_cost_per_s'] * 1000:.0f} ms, live {summary['live_cost_per_s'] * 1000:.0f} ms")
    return doc


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("speakers", help="speaker labels: DER of the API's answers and of the speaker layer (offline "
                                        "and live) against RTTM references")
    p.add_argument("--dir", default="tests/data/speakers", help="FLAC files, each with an RTTM of the same name")
    p.add_argument("--layer-only", action="store_true",
                   help="the speaker layer's turns alone, without launching the app for the API's answers")
    p.add_argument("--conversations", type=int, default=8, metavar="N",
                   help="also N constructed conversations of two or three of --manifest's voices (turns of their "
                        "clips' phrases, with gaps and some overlap; 0 for none)")
    p.add_argument("--seed", type=int, help="the first conversation's seed (default: from the clock; printed)")
    p.add_argument("--manifest", default=str(MANIFEST), help="the clips the conversations are made of")
    p.add_argument("--out", default="bench-out")
