"""`python -m realtime transcribe` and `python app.py --help`, run as users run them."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest

from realtime.audio import decode_file
from realtime.config import Settings, env_name, parse_settings

from audio_files import FORMATS, write
from speech import SENTENCES, compose, wer

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "realtime", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def speech(speech_dir):
    return compose(speech_dir / "cli.wav", SENTENCES[:3], gaps=[1.0, 1.2])


def test_text_json_srt_vtt(speech):
    text = cli("transcribe", str(speech.path))
    assert text.returncode == 0, text.stderr
    assert wer(speech.text, text.stdout) <= 0.15
    assert len(text.stdout.strip().splitlines()) == 1  # text packs the segments into one window
    alone = cli("transcribe", str(speech.path), "--file-window-s", "0")
    # a synthetic sentence decoded without its neighbours: the int8 kernels of an Intel CPU with AMX read the first
    # as "But when the today is starting with the light freeze from the west" (0.17)
    assert len(alone.stdout.strip().splitlines()) == 3 and wer(speech.text, alone.stdout) <= 0.25

    # timed formats: the pieces Whisper's timestamps found in the packed window, in the file's time
    doc = json.loads(cli("transcribe", str(speech.path), "--format", "json").stdout)
    pieces = doc["segments"]
    assert 2 <= len(pieces) <= 4 and wer(speech.text, doc["text"]) <= 0.15
    assert abs(pieces[0]["start"] - speech.spans[0][0]) < 0.5 and abs(pieces[-1]["end"] - speech.spans[-1][1]) < 0.5
    assert all(p["start"] < p["end"] <= q["start"] for p, q in itertools.pairwise(pieces))
    for t0, t1 in speech.spans:  # every sentence's speech is inside some piece
        assert any(p["start"] - 0.5 <= (t0 + t1) / 2 <= p["end"] + 0.5 for p in pieces)

    srt = cli("transcribe", str(speech.path), "--format", "srt").stdout
    blocks = [b for b in srt.strip().split("\n\n") if b]
    assert len(blocks) == len(pieces)
    for i, block in enumerate(blocks, 1):
        lines = block.splitlines()
        assert lines[0] == str(i)
        assert re.fullmatch(r"\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}", lines[1])
        assert lines[2].strip()

    vtt = cli("transcribe", str(speech.path), "--format", "vtt").stdout
    assert vtt.startswith("WEBVTT\n\n")
    cues = re.findall(r"^(\d\d:\d\d:\d\d\.\d{3}) --> (\d\d:\d\d:\d\d\.\d{3})$", vtt, flags=re.M)
    assert len(cues) == len(pieces) and all(a < b for a, b in cues)


def test_other_formats_rates_and_channels_and_several_files(speech, tmp_path):
    """Every container and codec of audio_files.FORMATS (22.05 to 48 kHz, mono and stereo) in one command, each
    file's text under its own header."""
    audio = decode_file(speech.path)
    paths = [write(tmp_path / "speech", audio, suffix) for suffix in sorted(FORMATS)]
    other = compose(tmp_path / "other.wav", SENTENCES[5:6])
    result = cli("transcribe", *map(str, paths), str(other.path))
    assert result.returncode == 0, result.stderr
    parts = result.stdout.split("==> ")[1:]
    assert [part.split(" <==", 1)[0] for part in parts] == [*map(str, paths), str(other.path)]
    texts = [part.split("<==", 1)[1] for part in parts]
    for path, text in zip(paths, texts, strict=False):
        assert wer(speech.text, text) <= 0.2, (path.name, text)
    assert wer(other.text, texts[-1]) <= 0.2


BAD = ("empty", "garbage", "text-as-mp3", "truncated-wav", "missing")


def test_bad_files_fail_cleanly(tmp_path, speech):
    """Each file that cannot be read is one line on stderr that names it, and the command goes on to the next."""
    paths = []
    for kind in BAD:
        path = tmp_path / {"text-as-mp3": "notes.mp3"}.get(kind, f"{kind}.wav")
        if kind == "empty":
            path.write_bytes(b"")
        elif kind == "garbage":
            path.write_bytes(bytes(range(256)) * 40)
        elif kind == "text-as-mp3":
            path.write_text("this is not audio\n" * 100)
        elif kind == "truncated-wav":
            path.write_bytes(speech.path.read_bytes()[:30])
        paths.append(path)
    result = cli("transcribe", *map(str, paths), str(speech.path))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == len(BAD), result.stderr
    for path, line in zip(paths, lines, strict=True):
        assert line.startswith("error: ") and str(path) in line, (path, line)
    assert "Traceback" not in result.stderr
    assert wer(speech.text, result.stdout.split(f"==> {speech.path} <==")[1]) <= 0.15, "the good file after them"


def test_app_help_lists_every_setting():
    result = subprocess.run([sys.executable, "app.py", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for name in Settings.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in result.stdout
        assert env_name(name) in result.stdout


@pytest.mark.fast
def test_environment_and_flags():
    import os

    os.environ["REALTIME_PORT"] = "9123"
    os.environ["REALTIME_ICE_LOOPBACK"] = "true"
    try:
        s = parse_settings([])
        assert (s.port, s.ice_loopback, s.concurrency_limit, s.host) == (9123, True, 16, "127.0.0.1")
        s = parse_settings(["--port", "9000", "--no-ice-loopback", "--vad-min-silence-ms", "300"])
        assert (s.port, s.ice_loopback, s.vad_config().min_silence_ms) == (9000, False, 300)
    finally:
        del os.environ["REALTIME_PORT"], os.environ["REALTIME_ICE_LOOPBACK"]
    with pytest.raises(ValueError):
        parse_settings(["--vad-threshold", "0.2", "--vad-neg-threshold", "0.6"])


@pytest.mark.skipif(__import__("shutil").which("nvidia-smi") is not None, reason="this host has an NVIDIA GPU")
def test_the_gpu_check_says_there_is_no_gpu_and_fails():
    out = cli("bench", "gpu")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "needs an NVIDIA GPU" in out.stderr and "--allow-cpu" in out.stderr
