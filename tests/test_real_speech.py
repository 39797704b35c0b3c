"""Accuracy on recordings of people (tests/data), compared in the same run with faster-whisper's own `transcribe`
on the same weights (`beam_size=1, vad_filter=True`): file paths, the HTTP API, live sessions over WebRTC,
quiet voices, repetition loops, and noise that must give no text.

Margins are stated per test; the figures of each run are printed (`pytest -s`) for the README.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from realtime.audio import SAMPLE_RATE
from realtime.bench.client import stream_file
from realtime.config import WINDOW_S
from realtime.engines import TranscribeOptions
from realtime.engines.embedded import EmbeddedEngine
from realtime.live.transcribe import transcribe_file

from conftest import ROOT, App, launch, stop
from real_speech import (
    Clip,
    base_clips,
    clips,
    compilation,
    corpus_wer,
    faster_whisper_texts,
    long_recording,
    loops,
    lost_runs,
    matched_starts,
    norm_word,
    quiet_copy,
    wer,
)

FILE_MARGIN = 0.02
"""How far a file path's corpus WER may lie above faster-whisper's: the measured gaps (README) are about a point,
and retries sample at temperatures above zero, so runs and CPUs differ by a few words. The code before the
real-speech work was 9 to 20 points behind."""
FEW_WORDS = 3
"""The same allowance for a single short file, in words: a retry's sampled reading of one word ("ill-disposed" read
as "old-sposed") costs two, and which draws a retry gets depends on what the engine's threads sampled before."""
LIVE_MARGIN = 0.015
TEXT_MARGIN = 0.005
"""How far the text formats' WER may lie above the timed formats' on a long recording (issue 26: half a point)."""


def ours(engine: EmbeddedEngine, items: list[Clip], timestamps: bool) -> list[str]:
    async def run() -> list[str]:
        texts = []
        for clip in items:
            entries = await transcribe_file(clip.path, engine, options=TranscribeOptions(timestamps=timestamps),
                                            window_s=WINDOW_S)
            texts.append(" ".join(e.text for e in entries if e.text))
        return texts

    return asyncio.run(run())


def report(name: str, refs: list[str], **hyps: list[str]) -> dict[str, float]:
    figures = {k: corpus_wer(refs, v) for k, v in hyps.items()}
    print(f"\n{name}: " + ", ".join(f"{k} WER {100 * w:.2f} % ({len(loops(hyps[k]))} loops, "
                                     f"{sum(not h for h in hyps[k])} empty)" for k, w in figures.items()))
    return figures


@pytest.fixture(scope="module")
def real() -> list[Clip]:
    return clips()


def check_against(refs: list[str], fw: list[str], *paths: list[str], margin: float = FILE_MARGIN,
                  empty_allowed: int = 0) -> None:
    fw_wer = corpus_wer(refs, fw)
    for hyps in paths:
        assert corpus_wer(refs, hyps) <= fw_wer + margin
        assert not loops(hyps), loops(hyps)
        empty = [r for r, h, f in zip(refs, hyps, fw, strict=True) if not h.strip() and f.strip()]
        assert len(empty) <= empty_allowed, f"no text where faster-whisper has some: {empty}"


@pytest.mark.xdist_group("real-speech-files")
@pytest.mark.timeout(1200)  # every clip twice, beside the long recordings of the pool and remote groups
def test_file_paths_on_real_speech_tiny_en(engine, real, fw_tiny):
    """Text answers (windows, no timestamps) and timed ones (srt, vtt, verbose_json: Whisper's timestamps)."""
    refs, fw = [c.text for c in real], [fw_tiny[c.name] for c in real]
    text, timed = ours(engine, real, False), ours(engine, real, True)
    report("tiny.en int8, one file per clip", refs, faster_whisper=fw, text=text, timed=timed)
    check_against(refs, fw, text, timed)


@pytest.mark.xdist_group("real-speech-files")
@pytest.mark.timeout(1500)  # base float32 at nice 10: a busy machine starved it past 600 s once
def test_file_path_on_real_speech_multilingual_base(base_ct2, fw_base):
    engine = EmbeddedEngine(model=base_ct2, compute_type="float32", language="en")
    engine.load()
    picked = base_clips()
    refs, fw = [c.text for c in picked], [fw_base[c.name] for c in picked]
    text = ours(engine, picked, False)
    report("base float32, one file per clip", refs, faster_whisper=fw, text=text)
    check_against(refs, fw, text)


@pytest.mark.xdist_group("real-speech-files")
@pytest.mark.parametrize("timestamps", [False, True], ids=["text", "timed"])
def test_a_voice_the_vad_hears_only_in_part_is_transcribed_whole(engine, fw_tiny, timestamps):
    """Silero hears a few windows in the middle of a falsetto phrase (mfa-falsetto2): decoded alone, that
    fraction of a second gave tiny.en three of nine words and base nothing; with the recording around it, the
    phrase, its timed entry over the speech."""
    clip = next(c for c in clips() if c.name == "mfa-falsetto2.flac")
    entries = asyncio.run(transcribe_file(clip.path, engine, options=TranscribeOptions(timestamps=timestamps),
                                          window_s=WINDOW_S))
    text = " ".join(e.text for e in entries if e.text)
    print(f"\n{clip.name}: {text!r}; faster-whisper {fw_tiny[clip.name]!r}")
    assert wer(clip.text, text) <= wer(clip.text, fw_tiny[clip.name]) + 0.12, text  # a word of nine
    if timestamps:
        assert entries[0].start <= 1.5 and entries[-1].end >= 2.5, entries


@pytest.mark.xdist_group("real-speech-files")
def test_a_file_of_several_speakers_keeps_every_speaker(engine, tmp_path):
    """Four recordings one after another: packed into one window and decoded without timestamps, tiny.en
    ended its text after JFK's sentence and dropped the other speakers (WER 66 %); such a window is decoded
    again. Text and timed answers against faster-whisper on the same file."""
    by_name = {c.name: c for c in clips()}
    comp = compilation([by_name[n] for n in ("jfk.flac", "librivox-sense-and-sensibility-01-0870.flac",
                                             "librivox-sense-and-sensibility-01-0890.flac",
                                             "speechbrain-spk1_snt1.flac")], tmp_path / "speakers.wav")
    ref = " ".join(comp.texts)
    whole = Clip(comp.path, ref, "read", comp.spans[-1][1], "several")
    fw = list(faster_whisper_texts(engine.model_ref, "int8", [whole]).values())
    got = {name: ours(engine, [whole], timestamps)[0] for name, timestamps in (("text", False), ("timed", True))}
    report("four speakers in one file", [ref], faster_whisper=fw, **{k: [v] for k, v in got.items()})
    margin = FEW_WORDS / len(ref.split())  # one file of 65 words: FILE_MARGIN would be a single word
    for name, text in got.items():
        assert wer(ref, text) <= wer(ref, fw[0]) + margin, (name, text)
        assert "dashwood" in text.lower() and "small dog" in text.lower(), (name, text)


@pytest.mark.xdist_group("real-speech-files")
def test_a_long_recording_loses_no_sentence_in_any_format(engine, fw_tiny, tmp_path):
    """The whole set joined into one 9.5-minute file: packed windows decoded without timestamps once skipped a
    37-word stretch here (13.5 % WER against the timed formats' 11.6 %). Each window's segments are accounted for
    (realtime/live/coverage.py): the text formats within half a point of the timed ones, no stretch of 5 or more
    reference words that the timed formats transcribe missing from the text, and no worse than faster-whisper's
    `transcribe` on the same file."""
    comp = long_recording(tmp_path / "long.wav")
    whole = Clip(comp.path, comp.text, "long", comp.spans[-1][1], "many")
    text, timed = ours(engine, [whole], False)[0], ours(engine, [whole], True)[0]
    fw = faster_whisper_texts(engine.model_ref, "int8", [whole])[whole.name]
    figures = report(f"{comp.spans[-1][1] / 60:.1f} minutes, {len(comp.clips)} recordings joined", [comp.text],
                     faster_whisper=[fw], text=[text], timed=[timed])
    lost = {name: lost_runs(comp.text, hyp) for name, hyp in (("text", text), ("timed", timed), ("fw", fw))}
    print(f"stretches of 5+ words lost: { {k: [len(r.split()) for r in v] for k, v in lost.items()} }")
    assert figures["text"] <= figures["timed"] + TEXT_MARGIN
    assert figures["text"] <= figures["faster_whisper"]
    assert not [run for run in lost["text"] if run not in lost["timed"]], lost
    assert not loops([text, timed])


@pytest.mark.xdist_group("real-speech-files")
def test_short_clips_do_not_loop_in_any_format(tmp_path):
    """The JFK clip (44.1 kHz stereo 24-bit) looped on its first segment: every format of the command now
    gives each sentence once."""
    jfk = next(c for c in clips() if c.name == "jfk.flac")
    for fmt in ("text", "json", "srt", "vtt"):
        out = subprocess.run([sys.executable, "-m", "realtime", "transcribe", "--format", fmt, str(jfk.path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        if fmt == "json":
            texts = [e["text"] for e in json.loads(out.stdout)["segments"]]
        elif fmt == "text":
            texts = [out.stdout]
        else:
            texts = [line for line in out.stdout.splitlines() if line and not line[0].isdigit()
                     and line != "WEBVTT" and "-->" not in line]
        assert not loops(texts), (fmt, texts)
        assert wer(jfk.text, " ".join(texts)) <= 0.1, (fmt, texts)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    app = launch(tmp_path_factory.mktemp("api-real"))
    yield app
    stop(app)


def test_http_api_on_real_speech(api, real, fw_tiny):
    """Both decoding paths over HTTP (text: packed windows; verbose_json: Whisper's timestamps, as srt and vtt, whose
    layout tests/test_api.py checks), clip by clip, against faster-whisper on the same clips."""
    short = [(c, fw_tiny[c.name]) for c in real if c.duration <= 12.0]
    refs, fw = [c.text for c, _ in short], [f for _, f in short]
    got: dict[str, list[str]] = {}
    for fmt in ("json", "verbose_json"):
        texts = []
        for clip, _ in short:
            r = httpx.post(f"{api.url}/v1/audio/transcriptions", data={"response_format": fmt},
                           files={"file": (clip.name, clip.path.read_bytes(), "audio/flac")}, timeout=120)
            assert r.status_code == 200, r.text
            texts.append(r.json()["text"])
        got[fmt] = texts
    report("HTTP API, tiny.en", refs, faster_whisper=fw, **got)
    check_against(refs, fw, *got.values())


@pytest.mark.xdist_group("real-speech-files")
def test_a_quiet_voice_is_transcribed(engine, tmp_path):
    """Peaks near -45 dBFS (RMS near -63): the VAD opens segments and Whisper hears the speech raised."""
    picked = [c for c in clips() if c.name in ("jfk.flac", "librispeech-1089-134686-0000.flac",
                                                "ljspeech-LJ001-0001.flac")]
    refs, loud, quiet = [], [], []
    for clip in picked:
        path = quiet_copy(clip, tmp_path / f"quiet-{clip.path.stem}.wav")
        audio, _ = sf.read(str(path), dtype="float32")
        assert 20 * np.log10(np.max(np.abs(audio))) < -44 and 20 * np.log10(np.sqrt(np.mean(audio ** 2))) < -55
        refs.append(clip.text)
        loud.append(" ".join(e.text for e in asyncio.run(transcribe_file(clip.path, engine, window_s=WINDOW_S))))
        quiet.append(" ".join(e.text for e in asyncio.run(transcribe_file(path, engine, window_s=WINDOW_S))))
    report("quiet copies", refs, loud=loud, quiet=quiet)
    assert all(quiet) and corpus_wer(refs, quiet) <= corpus_wer(refs, loud) + 0.03


@pytest.mark.xdist_group("real-speech-files")
def test_noise_and_silence_give_no_text(engine, tmp_path):
    rng = np.random.default_rng(7)
    t = np.arange(35 * SAMPLE_RATE) / SAMPLE_RATE
    audio = np.zeros(t.size, np.float32)
    audio[: 10 * SAMPLE_RATE] = 0.05 * rng.standard_normal(10 * SAMPLE_RATE)  # hiss
    audio[10 * SAMPLE_RATE: 20 * SAMPLE_RATE] = 0.2 * np.sin(2 * np.pi * 50 * t[: 10 * SAMPLE_RATE])  # mains hum
    audio[25 * SAMPLE_RATE: 35 * SAMPLE_RATE] = 0.01 * rng.standard_normal(10 * SAMPLE_RATE)  # quiet room
    path = tmp_path / "noise.wav"
    sf.write(str(path), audio, SAMPLE_RATE, subtype="PCM_16")
    for timestamps in (False, True):
        entries = asyncio.run(transcribe_file(path, engine, options=TranscribeOptions(timestamps=timestamps),
                                              window_s=WINDOW_S))
        assert not [e.text for e in entries if e.text], entries


@pytest.mark.xdist_group("real-speech-live")
def test_live_over_webrtc_on_real_speech(app, real, fw_tiny, tmp_path):
    """Three minutes of real utterances with pauses, played in real time: live finals against faster-whisper's
    transcript of each utterance as its own file; every segment ends final, none loops."""
    picked, total = [], 0.0
    for clip in real:
        fw = fw_tiny[clip.name]
        if clip.condition in ("short", "read", "spontaneous") and clip.duration <= 12 and total + clip.duration <= 180:
            picked.append((clip, fw))
            total += clip.duration
    comp = compilation([c for c, _ in picked], tmp_path / "real-live.wav")
    result = asyncio.run(stream_file(app.url, comp.path, ice_loopback=True))
    finals = [e for e in result.events if e["type"] == "final"]
    assert not [e for e in result.events if e["type"] == "error"]
    assert {e["segment"] for e in result.events} == {e["segment"] for e in finals}, "a segment ended without a final"
    per: list[list[str]] = [[] for _ in picked]
    for e in finals:  # each final belongs to the utterance its speech ended in
        k = min(range(len(picked)), key=lambda k: abs(e["audio_end"] - min(max(e["audio_end"], comp.spans[k][0]),
                                                                           comp.spans[k][1])))
        per[k].append(e["text"])
    live = [" ".join(p) for p in per]
    refs, fw = comp.texts, [f for _, f in picked]
    figures = report(f"live over WebRTC, {len(picked)} utterances, {total:.0f} s", refs, faster_whisper=fw, live=live)
    s = result.summary
    print(f"final latency p50 {s['final_latency_p50']} s, p95 {s['final_latency_p95']} s, "
          f"first partial p50 {s['first_partial_latency_p50']} s")
    assert figures["live"] <= figures["faster_whisper"] + LIVE_MARGIN
    assert not loops([e["text"] for e in finals])

    # each final's words in stream time, against faster-whisper's word alignment of the same recording
    worded = [e for e in finals if e["text"]]
    assert all(e.get("words") for e in worded)
    for e in worded:
        assert "".join(norm_word(w["word"]) for w in e["words"]) == "".join(norm_word(w) for w in e["text"].split())
        assert all(e["start"] - 1 <= w["start"] <= w["end"] <= e["audio_end"] + 1 for w in e["words"]), e
    from faster_whisper import WhisperModel

    from realtime.engines.embedded import resolve_model

    segments, _ = WhisperModel(resolve_model(None)[0], device="cpu", compute_type="int8", cpu_threads=2).transcribe(
        str(comp.path), beam_size=1, vad_filter=True, language="en", word_timestamps=True)
    pairs = matched_starts([(w["word"], w["start"]) for e in worded for w in e["words"]],
                           [(w.word, w.start) for s in segments for w in s.words or ()])
    mean = sum(abs(a - b) for a, b in pairs) / len(pairs)
    print(f"live word starts: {len(pairs)} words matched faster-whisper's, mean |start diff| {mean:.3f} s")
    assert len(pairs) >= 0.8 * sum(len(e["words"]) for e in worded)
    assert mean < 0.2

    # so the session's subtitles can be cut at word times to a line length
    srt = httpx.get(f"{app.url}/transcript/{result.webrtc_id}.srt", params={"max_line_chars": 32}, timeout=30)
    lines = [b.split("\n", 2)[2] for b in srt.text.strip().split("\n\n")]
    assert len(lines) > len(worded) and all(len(t) <= 32 or " " not in t for t in lines), lines
    bad = httpx.get(f"{app.url}/transcript/{result.webrtc_id}.txt", params={"max_line_chars": 32}, timeout=30)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_max_line_chars"


@pytest.mark.xdist_group("real-speech-live")
def test_live_quiet_voice(app, tmp_path):
    jfk = next(c for c in clips() if c.name == "jfk.flac")
    path = quiet_copy(jfk, tmp_path / "quiet-jfk.wav")
    result = asyncio.run(stream_file(app.url, Path(path), ice_loopback=True))
    text = " ".join(e["text"] for e in result.events if e["type"] == "final")
    assert wer(jfk.text, text) <= 0.15, text
