"""Word timestamps: `timestamp_granularities[]=word` on the HTTP API, measured against faster-whisper's own word
alignment (`word_timestamps=True`) on the same weights and the same real recordings; engines without word
alignment refuse the request plainly, and so does the English-only model asked for another language.

Our words come through the whole file path (VAD cuts, segments packed into windows, times mapped back to the
file) of the worker's default app (conftest `app`), the reference from faster-whisper transcribing the whole file
at once, recorded (tests/references.py `fw-words`): the difference of the word starts is what our cutting and
mapping add.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from openai import OpenAI

from conftest import App, launch, recorded, stop
from real_speech import DATA, matched_starts, norm_word, word_clips

MAX_MEAN_START_DIFF_S = 0.2


def test_word_timestamps_match_faster_whispers_own(app: App, shared: Path) -> None:
    """Read, telephone (8 kHz), spontaneous and long (several windows) speech (tests/real_speech.py
    `word_clips`): our words are the text, in order, inside the file, and their starts are within
    MAX_MEAN_START_DIFF_S on average of faster-whisper's own word alignment of the whole file (recorded)."""
    fw_words = recorded(shared, "fw-words")
    client = OpenAI(base_url=f"{app.url}/v1", api_key="unused", max_retries=0, timeout=300)
    all_pairs: list[tuple[float, float]] = []
    for path in word_clips():
        name = path.name
        with open(path, "rb") as f:
            result = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="verbose_json",
                                                        timestamp_granularities=["word", "segment"])
        words = result.words or []
        assert words, name
        starts = [w.start for w in words]
        assert starts == sorted(starts) and all(0 <= w.start <= w.end <= result.duration + 0.01 for w in words)
        assert all(w.word == w.word.strip() and w.word for w in words)
        # the words are the text (Whisper's words do not always start at a space: "10001" may be "1" "0001")
        assert "".join(norm_word(w.word) for w in words) == "".join(norm_word(w) for w in result.text.split()), name
        assert result.segments and all(s.start <= s.end for s in result.segments)

        theirs = [(word, start) for word, start in fw_words[name]]
        pairs = matched_starts([(w.word, w.start) for w in words], theirs)
        assert len(pairs) >= 0.8 * min(len(words), len(theirs)), (name, result.text)
        mean = sum(abs(x - y) for x, y in pairs) / len(pairs)
        print(f"{name}: {len(words)} words, {len(pairs)} matched faster-whisper's, mean |start diff| {mean:.3f} s")
        all_pairs += pairs
    mean = sum(abs(x - y) for x, y in all_pairs) / len(all_pairs)
    print(f"all {len(word_clips())} clips: {len(all_pairs)} words, mean |start diff| {mean:.3f} s "
          f"(at most {MAX_MEAN_START_DIFF_S} s)")
    assert mean < MAX_MEAN_START_DIFF_S


def test_words_only_with_verbose_json_and_only_when_asked(app: App) -> None:
    jfk = (DATA / "jfk.flac").read_bytes()

    def post(**fields: str) -> httpx.Response:
        return httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": ("jfk.flac", jfk, "audio/flac")},
                          data=fields, timeout=300)

    plain = post(response_format="verbose_json").json()
    assert "words" not in plain and plain["segments"]
    r = post(response_format="srt", **{"timestamp_granularities[]": "word"})
    assert r.status_code == 422 and "verbose_json" in r.json()["error"]["message"]
    r = post(response_format="verbose_json", **{"timestamp_granularities[]": "syllable"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_timestamp_granularities"
    # the raw-body form takes the fields in the query string, repeated as clients repeat them
    r = httpx.post(f"{app.url}/v1/audio/transcriptions?response_format=verbose_json&timestamp_granularities[]=segment"
                   "&timestamp_granularities[]=word", content=jfk, headers={"Content-Type": "audio/flac"}, timeout=300)
    assert r.status_code == 200 and [norm_word(w["word"]) for w in r.json()["words"]][:3] == ["and", "so", "my"]


def test_an_engine_without_word_alignment_refuses_plainly(app: App, tmp_path: Path) -> None:
    """The remote engine (here in front of the worker's default app, a real endpoint on loopback) gets no words from
    endpoints: it says so instead of answering without them."""
    front = launch(tmp_path, "--engine", "remote", "--remote-url", f"{app.url}/v1")
    try:
        jfk = (DATA / "jfk.flac").read_bytes()
        r = httpx.post(f"{front.url}/v1/audio/transcriptions", files={"file": ("jfk.flac", jfk, "audio/flac")},
                       data={"response_format": "verbose_json", "timestamp_granularities[]": "word"}, timeout=300)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "word_timestamps_unsupported" and "remote engine cannot give word timestamps" in \
            err["message"]
        r = httpx.post(f"{front.url}/v1/audio/transcriptions", files={"file": ("jfk.flac", jfk, "audio/flac")},
                       data={"response_format": "verbose_json"}, timeout=300)
        assert r.status_code == 200 and "ask not what your country" in r.json()["text"].lower()
    finally:
        stop(front)


def test_an_english_only_model_refuses_other_languages(app: App) -> None:
    """The bundled tiny.en cannot transcribe German: asked to, it says so instead of answering in English."""
    jfk = (DATA / "jfk.flac").read_bytes()
    r = httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": ("jfk.flac", jfk, "audio/flac")},
                   data={"language": "de"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_language" and "English-only" in err["message"] and "'de'" in err["message"]
    r = httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": ("jfk.flac", jfk, "audio/flac")},
                   data={"language": "en", "response_format": "verbose_json"}, timeout=300)
    assert r.status_code == 200 and {s["language"] for s in r.json()["segments"]} == {"en"}


def test_subtitles_are_cut_at_word_times_to_a_line_length(app: App) -> None:
    """`max_line_chars` cuts srt and vtt cues at word boundaries, each cue timed by its words."""
    clip = (DATA / "jfk.flac").read_bytes()

    def cues(fmt: str, **fields: str) -> list[tuple[str, str]]:
        r = httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": ("jfk.flac", clip, "audio/flac")},
                       data={"response_format": fmt, **fields}, timeout=300)
        assert r.status_code == 200, r.text
        blocks = [b.splitlines() for b in r.text.split("\n\n") if "-->" in b]
        return [(next(line for line in b if "-->" in line), b[-1]) for b in blocks]

    whole, cut = cues("srt"), cues("srt", max_line_chars="32")
    assert len(cut) > len(whole) and max(len(t) for _, t in whole) > 32
    assert all(len(t) <= 32 or " " not in t for _, t in cut), cut
    assert " ".join(t for _, t in cut).split() == " ".join(t for _, t in whole).split()
    starts = [c.split(" --> ")[0] for c, _ in cut]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)
    vtt = cues("vtt", max_line_chars="32")
    assert [t for _, t in vtt] == [t for _, t in cut]
    r = httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": ("jfk.flac", clip, "audio/flac")},
                   data={"response_format": "json", "max_line_chars": "32"}, timeout=60)
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_max_line_chars"
