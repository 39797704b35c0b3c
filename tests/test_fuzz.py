"""Property tests (hypothesis) for the pure parts, and the app's HTTP surface fuzzed with schemathesis.

- The segmenter (realtime/live/vad.py, the real Silero model on real recordings from tests/data) gives the same
  segments, to the sample, however the audio is cut into frames; fed at another sample rate through the live
  path's `FrameConverter`, in frames of any size, it finds the same utterances.
- LocalAgreement (realtime/live/stabilize.py) never takes a committed word back, commits only what two consecutive
  hypotheses agree on, and always shows the newest hypothesis after the committed words.
- schemathesis against the app's OpenAPI schema, with the OpenAI-compatible routes that the app keeps out of it
  (they parse their bodies themselves) described here as OpenAI documents them: no 5xx, and every error in
  OpenAI's shape.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from realtime.audio import SAMPLE_RATE, FrameConverter, decode_file
from realtime.live.stabilize import LocalAgreement, _key
from realtime.live.vad import WINDOW, Segmenter, SegmentStart, SileroVAD, VADConfig

from conftest import App
from real_speech import DATA

SLOW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- the segmenter
RECORDINGS = ["jfk.flac", "ami-ES2011a-headset0-41s.flac", "librivox-sense-and-sensibility-01-0870.flac",
              "cmu-cards-005.flac"]


@cache
def _clip(name: str) -> np.ndarray:
    return decode_file(DATA / name)


def _recording(names: tuple[str, ...], gaps: tuple[float, ...]) -> np.ndarray:
    parts = [np.zeros(SAMPLE_RATE // 4, np.float32)]
    for name, gap in zip(names, gaps, strict=True):
        parts += [_clip(name), np.zeros(int(gap * SAMPLE_RATE), np.float32)]
    return np.concatenate(parts)


def _segments(audio: np.ndarray, sizes: list[int], config: VADConfig) -> list[tuple[Any, ...]]:
    """Every event of a stream fed in frames of `sizes` (cycled), then flushed; ends with their audio's digest."""
    seg = Segmenter(config, SileroVAD.shared())
    events: list[Any] = []
    i = k = 0
    while i < audio.size:
        n = sizes[k % len(sizes)]
        events += seg.feed(audio[i : i + n])
        i, k = i + n, k + 1
    events += seg.flush()
    out: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e, SegmentStart):
            out.append(("start", e.segment, e.start))
        else:
            out.append(("end", e.segment, e.start, e.end, e.forced, e.audio_start, e.audio.size,
                        hash(e.audio.tobytes())))
    return out


@cache
def _reference(names: tuple[str, ...], gaps: tuple[float, ...], max_segment_s: float) -> list[tuple[Any, ...]]:
    return _segments(_recording(names, gaps), [WINDOW], VADConfig(max_segment_s=max_segment_s))


recordings = st.tuples(
    st.lists(st.sampled_from(RECORDINGS), min_size=1, max_size=3).map(tuple),
    st.sampled_from([0.3, 0.8, 1.5]),
).map(lambda t: (t[0], (t[1],) * len(t[0])))
frame_sizes = st.lists(st.one_of(st.integers(1, 40), st.integers(41, 2000), st.sampled_from([160, 320, 480, 512,
                                                                                              960, 4800, 16000])),
                       min_size=1, max_size=8)


@SLOW
@given(recordings, frame_sizes, st.sampled_from([15.0, 4.0]))
def test_segmenter_gives_the_same_segments_whatever_the_frame_size(recording, sizes, max_segment_s):
    names, gaps = recording
    reference = _reference(names, gaps, max_segment_s)
    assert [e for e in reference if e[0] == "end"], "the recording has speech"
    assert _segments(_recording(names, gaps), sizes, VADConfig(max_segment_s=max_segment_s)) == reference


RATE_CLIPS, RATE_GAPS = ("jfk.flac", "librivox-sense-and-sensibility-01-0870.flac"), (1.0, 1.0)


def _at_rate(rate: int, frames: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """The recording at `rate` as 16-bit frames of `frames` samples (cycled, as WebRTC frames carry it) through
    the live path's FrameConverter, then segmented; the segment ends."""
    import soxr

    native = soxr.resample(_recording(RATE_CLIPS, RATE_GAPS), SAMPLE_RATE, rate)
    pcm16 = (np.clip(native, -1, 1) * 32767).astype(np.int16)
    convert = FrameConverter()
    chunks, i, k = [], 0, 0
    while i < pcm16.size:
        n = frames[k % len(frames)]
        chunks.append(convert(rate, pcm16[i : i + n].reshape(1, -1)))
        i, k = i + n, k + 1
    return [e for e in _segments(np.concatenate(chunks), [WINDOW], VADConfig()) if e[0] == "end"]


_at_rate_in_20ms = cache(lambda rate: _at_rate(rate, (rate // 50,)))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([8000, 24000, 44100, 48000]), st.lists(st.integers(20, 3000), min_size=1, max_size=6))
def test_segmenter_finds_the_same_speech_at_any_input_rate(rate, sizes):
    """Live frames of another rate (browsers send 48 kHz, telephones 8 kHz) go through the live path's
    FrameConverter in frames of any size: at one rate the segments are the same whatever the frame size; across
    rates the same stretches of speech are found, each within two windows of where it is at 16 kHz (a pause
    right at the threshold may split one in two, never lose or add speech)."""
    got = _at_rate(rate, tuple(sizes))
    assert [e[:6] for e in got] == [e[:6] for e in _at_rate_in_20ms(rate)], "the frame size changed the segments"
    reference = [e for e in _reference(RATE_CLIPS, RATE_GAPS, 15.0) if e[0] == "end"]
    tol = 2 * WINDOW / SAMPLE_RATE + (0.1 if rate == 8000 else 0.0)  # 8 kHz loses the upper band
    for r in reference:
        over = [g for g in got if g[2] < r[3] + tol and g[3] > r[2] - tol]
        assert over, f"speech at {r[2]}-{r[3]} s not found at {rate} Hz: {got}"
        assert abs(over[0][2] - r[2]) <= tol and abs(over[-1][3] - r[3]) <= tol, (rate, over, r)
    for g in got:
        assert any(r[2] - tol <= g[2] and g[3] <= r[3] + tol for r in reference), f"extra speech {g[:4]} at {rate}"


# ---------------------------------------------------------------- LocalAgreement
VOCABULARY = ["the", "cat", "sat", "on", "mat", "and", "then", "it", "ran", "away", "The", "Cat,", "sat.", "ran!"]


@st.composite
def hypothesis_runs(draw: st.DrawFn) -> list[str]:
    """Successive hypotheses of one growing segment, as Whisper gives them: mostly the previous one extended,
    sometimes a word changed, inserted or dropped (anywhere, the committed part included), recased or
    re-punctuated, or a different reading altogether."""
    words = draw(st.lists(st.sampled_from(VOCABULARY), max_size=4))
    runs = [" ".join(words)]
    for _ in range(draw(st.integers(1, 14))):
        op = draw(st.sampled_from(["extend", "extend", "extend", "same", "change", "insert", "drop", "case",
                                   "fresh", "empty"]))
        words = list(words)
        if op == "extend":
            words += draw(st.lists(st.sampled_from(VOCABULARY), min_size=1, max_size=3))
        elif op == "change" and words:
            words[draw(st.integers(0, len(words) - 1))] = draw(st.sampled_from(VOCABULARY))
        elif op == "insert":
            words.insert(draw(st.integers(0, len(words))), draw(st.sampled_from(VOCABULARY)))
        elif op == "drop" and words:
            del words[draw(st.integers(0, len(words) - 1))]
        elif op == "case" and words:
            i = draw(st.integers(0, len(words) - 1))
            words[i] = words[i].upper() if draw(st.booleans()) else words[i] + ","
        elif op == "fresh":
            words = draw(st.lists(st.sampled_from(VOCABULARY), max_size=8))
        elif op == "empty":
            words = []
        runs.append(" ".join(words))
    return runs


@pytest.mark.fast
@settings(max_examples=600, deadline=None)
@given(hypothesis_runs())
def test_local_agreement_never_takes_committed_words_back(runs):
    agreement = LocalAgreement()
    committed: list[str] = []
    previous: list[str] = []
    for text in runs:
        hyp = agreement.update(text)
        now = hyp.committed.split()
        assert now[: len(committed)] == committed, f"committed words taken back: {committed} -> {now}"
        words = text.split()
        new = now[len(committed):]
        if new:  # only words that the last two hypotheses agree on, at those positions, in the newest spelling
            assert words[len(committed) : len(now)] == new
            assert [_key(w) for w in previous[len(committed) : len(now)]] == [_key(w) for w in new]
        assert hyp.tentative.split() == words[len(now):]
        assert hyp.text == " ".join(now + words[len(now):])
        assert agreement.committed == hyp.committed
        committed, previous = now, words


# ---------------------------------------------------------------- the HTTP surface, fuzzed
def _multipart(fields: dict[str, Any]) -> dict[str, Any]:
    return {"required": ["file"], "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"], "properties": {"file": {"type": "string", "format": "binary"},
                                                               **fields}}}}}


AUDIO_FIELDS = {
    "model": {"type": "string"},
    "language": {"type": "string"},
    "prompt": {"type": "string"},
    "response_format": {"type": "string", "enum": ["json", "text", "srt", "verbose_json", "vtt"]},
    "temperature": {"type": "number"},
    "stream": {"type": "boolean"},
    "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["word", "segment"]}},
}
OPENAI_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "code"]}}}
_ERRORS = {"4XX": {"description": "an error", "content": {"application/json": {"schema": OPENAI_ERROR}}},
           "default": {"description": "the result"}}


def _described(doc: dict[str, Any]) -> dict[str, Any]:
    """The app's schema, plus the routes it keeps out of it as OpenAI describes them, and the offer's body."""
    paths = doc.setdefault("paths", {})
    for route, fields in (("/v1/audio/transcriptions", AUDIO_FIELDS),
                          ("/api/v1/audio/transcriptions", AUDIO_FIELDS),
                          ("/v1/audio/translations", {k: v for k, v in AUDIO_FIELDS.items() if k != "language"})):
        paths[route] = {"post": {"operationId": route, "requestBody": _multipart(fields), "responses": _ERRORS}}
    paths["/v1/models"] = {"get": {"operationId": "models", "responses": {"200": {"description": "the model"}}}}
    offer = paths["/webrtc/offer"]["post"]
    offer["requestBody"] = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"sdp": {"type": "string"}, "type": {"type": "string"},
                                         "webrtc_id": {"type": "string"}}}}}}
    offer["responses"] = _ERRORS
    return doc


@pytest.fixture(scope="module")
def fuzzed(app: App) -> App:
    """The worker's default app (conftest.py): fuzzing must leave it serving."""
    return app


@pytest.fixture(scope="module")
def app_schema(fuzzed: App) -> Any:
    doc = httpx.get(f"{fuzzed.url}/openapi.json", timeout=60).json()
    schema = schemathesis.openapi.from_dict(_described(doc))
    schema.config.update(base_url=fuzzed.url)
    schema.config.generation.update(max_examples=40)
    return schema


@schemathesis.check
def openai_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx and 5xx that is JSON is OpenAI's `{"error": {"message", "type", "code"}}`."""
    if response.status_code < 400 or case.path == "/metrics":
        return None
    body = response.json()
    err = body.get("error") if isinstance(body, dict) else None
    if not (isinstance(err, dict) and {"message", "type", "code"} <= set(err) and err["message"]):
        raise AssertionError(f"{response.status_code} not in OpenAI's error shape: {response.text[:300]}")
    return True


@schemathesis.check
def no_server_error(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code >= 500:
        raise AssertionError(f"{case.method} {case.path} answered {response.status_code}: {response.text[:300]}")
    return True


fuzz = schemathesis.pytest.from_fixture("app_schema")


@fuzz.parametrize()
def test_the_http_surface_answers_no_5xx_and_openai_shaped_errors(case):
    response = case.call(timeout=60)
    case.validate_response(response, checks=[no_server_error, openai_error_shape])
