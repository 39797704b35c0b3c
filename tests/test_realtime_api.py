"""OpenAI's Realtime API (`/v1/realtime`, transcription sessions) against the launched app, with the official openai
SDK's realtime client and real recordings (tests/data).

Where a test is about accuracy or the protocol, its audio is appended as fast as the server reads it: the server's
VAD and its finals follow the stream's own time, not the clock, and a WebSocket session may send faster than real
time, as OpenAI's may. The WebRTC call and the browser play theirs in real time, as a microphone does. Accuracy is
judged against the embedded engine's file reading of the same clips (conftest `readings`: the same tiny.en on the
path the app's /v1/audio/transcriptions takes, computed once per run), or against the app's own file
transcription of audio the test altered (μ-law). Latencies of the real-time call are printed (`pytest -s`) and
never asserted.

The tests share the keyed app (tests/live_apps.py); the time limit's test runs on the limited app and the engine
failure's on the remote app, in those apps' groups.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile as sf
import soxr
import websockets
from live_apps import KEY, LIMIT
from live_peer import Peer
from openai import AsyncOpenAI

from realtime.audio import SAMPLE_RATE, decode_file, wav_bytes
from realtime.web.realtime_api.protocol import ALAW, LOGPROBS, ULAW, remainder

from conftest import App, launch, stop
from real_speech import DATA, Clip, clips, compilation, corpus_wer, loops, lost_runs

pytest_plugins = ["live_apps"]

WER_MARGIN = 0.03
"""How far the live completed transcripts' corpus WER may lie above the file reading of the same clips (the
issue's 3 points)."""
TRANSPORT_MARGIN = 0.2
"""The real-time WebRTC calls test the transport: the speech arrives whole (a lost utterance of three costs a
third). Their words are measured at code speed (tests/test_real_speech.py `test_live_on_real_speech`); in real
time beside a loaded machine a client on the same cores once lost two words of one utterance."""
G711_MARGIN = 0.09
"""The same for 8 kHz mu-law, over 49 words: on band-limited audio tiny.en misreads up to three words in a live cut
that the file's window gets right ("ill-disposed young" as "old-sposed" or "old supposed"), and a leading word that
the first partials lacked ("And Mr. John") cannot be put in front of deltas already sent: four words. Measured:
6.1 % live against 0 % for the file on an AVX2 machine, 8.2 % against 0 % on an AVX-512 one (the int8 kernels
differ)."""
CHUNK_S = 0.02
"""One append in real time (a microphone's 20 ms)."""
FAST_CHUNK_S = 0.1
"""One append when the audio goes as fast as the server reads it."""
SETTLE_S = 300.0
RESAMPLER_HOLDS_S = 0.05  # the end of a stream that the 24 kHz input's resampler keeps back from the session
"""The longest wait for a session's last items: reached only when something is wrong."""
PICKED = ["timit-LDC93S1.flac", "ljspeech-LJ050-0131.flac", "librivox-sense-and-sensibility-01-0890.flac",
          "speechbrain-spk1_snt1.flac", "librispeech-1089-134691-0001.flac", "ami-ES2011a-headset0-41s.flac"]
PICKED_G711 = ["librivox-sense-and-sensibility-01-0880.flac", "ljspeech-LJ001-0004.flac",
               "librivox-sense-and-sensibility-01-0870.flac", "librispeech-1089-134691-0000.flac"]
PICKED_MANUAL = ["speechbrain-spk1_snt3.flac", "librispeech-61-70968-0000.flac"]
PICKED_WEBRTC = ["speechbrain-spk1_snt4.flac", "librivox-sense-and-sensibility-01-0930.flac",
                 "ljspeech-LJ001-0006.flac"]
DELTAS_CLIP = "librispeech-1089-134691-0001.flac"
"""5.4 s of read speech: several partials while it is spoken."""


# -- G.711 encoders (ITU-T G.711 as in the reference C code), numpy only
def ulaw_encode(x: np.ndarray) -> bytes:
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int32) >> 2
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    pcm = np.minimum(np.abs(pcm), 8159) + 0x21
    seg = np.searchsorted(np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]), pcm)
    return (((seg << 4) | ((pcm >> (seg + 1)) & 0xF)) ^ mask).astype(np.uint8).tobytes()


def alaw_encode(x: np.ndarray) -> bytes:
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int32) >> 3
    mask = np.where(pcm >= 0, 0xD5, 0x55)
    pcm = np.where(pcm >= 0, pcm, -pcm - 1)
    seg = np.searchsorted(np.array([0x1F, 0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF]), pcm)
    low = np.where(seg < 2, (pcm >> 1) & 0xF, (pcm >> np.maximum(seg, 1)) & 0xF)
    val = np.where(seg >= 8, 0x7F, (np.minimum(seg, 7) << 4) | low)
    return (val ^ mask).astype(np.uint8).tobytes()


def encode(audio16k: np.ndarray, fmt: str) -> tuple[int, bytes]:
    if fmt == "audio/pcm":
        x = soxr.resample(audio16k, SAMPLE_RATE, 24000)
        return 24000, (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
    x = soxr.resample(audio16k, SAMPLE_RATE, 8000)
    return 8000, (ulaw_encode(x) if fmt == "audio/pcmu" else alaw_encode(x))


@pytest.mark.fast
def test_g711_tables_decode_what_the_reference_encoder_wrote():
    t = np.linspace(0, 1, 8000, endpoint=False)
    x = (0.5 * np.sin(2 * np.pi * 440 * t) * np.linspace(0.01, 1, t.size)).astype(np.float32)
    for table, enc in ((ULAW, ulaw_encode), (ALAW, alaw_encode)):
        y = table[np.frombuffer(enc(x), dtype=np.uint8)]
        snr = 10 * np.log10(np.sum(x ** 2) / np.sum((x - y) ** 2))
        assert snr > 30, snr  # G.711 gives about 38 dB on a full-scale tone
    assert ULAW[0xFF] == 0 and abs(ALAW[0xD5]) < 1e-3


@pytest.mark.fast
def test_remainder_never_takes_words_back():
    assert remainder([], "Hello there.") == ["Hello", "there."]
    assert remainder(["And", "so", "my"], "And so, my fellow Americans") == ["fellow", "Americans"]
    assert remainder(["She", "had", "your"], "She had her dark suit") == ["dark", "suit"]
    assert remainder(["a", "b"], "a b") == []


@pytest.mark.fast
def test_the_final_s_rest_goes_out_with_its_tokens_after_deltas_already_sent():
    """Issue 41: with log-probabilities asked, the words of the final past those the partials' deltas sent go out as
    a last delta with their own tokens, and the completed transcript has every word (a rest given its tokens by
    their place in the final, not in the words sent, was held back: the transcript lost the sentence's end)."""
    import types

    from realtime.config import Settings
    from realtime.engines.types import TokenLogprob
    from realtime.live.events import FinalEvent, PartialEvent, SpeechStarted
    from realtime.web.realtime_api.connection import RealtimeConnection
    from realtime.web.realtime_api.protocol import Config

    def tokens(*pieces: str) -> tuple[TokenLogprob, ...]:
        return tuple(TokenLogprob(p, -0.1 * (k + 1), tuple(p.encode())) for k, p in enumerate(pieces))

    async def send_text(text: str) -> None:
        return None

    conn = RealtimeConnection(types.SimpleNamespace(settings=Settings()), Config(include=[LOGPROBS]), 0,  # type: ignore[arg-type]
                              send_text)
    heard = tokens(" Hello", " there", " friend")
    conn.on_event(SpeechStarted(0, 0.0))
    conn.on_event(PartialEvent(0, 0.0, 1.0, "Hello there", "friend", logprobs=tuple((t,) for t in heard)))
    conn.on_event(FinalEvent(0, 0.0, 2.0, "Hello there, my friend.", 0.1,
                             logprobs=tokens(" Hello", " there", ",", " my", " friend", ".")))
    sent = []
    while not conn.outbox.empty():
        sent.append(conn.outbox.get_nowait())
    deltas = [e for e in sent if e["type"].endswith(".delta")]
    completed = next(e for e in sent if e["type"].endswith(".completed"))
    assert [d["delta"] for d in deltas] == ["Hello there", " my friend."], deltas
    assert [t["token"] for t in deltas[1]["logprobs"]] == [" my", " friend", "."]
    assert completed["transcript"] == "Hello there my friend."
    assert completed["logprobs"] == [t for d in deltas for t in d["logprobs"]]


# -- the SDK and the events
def sdk(app: App, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{app.url}/v1", api_key=key, max_retries=0)


class Recorder:
    """Every server event with its arrival time (monotonic), read in the background."""

    def __init__(self, conn: Any) -> None:
        self.events: list[tuple[float, Any]] = []
        self._changed = asyncio.Event()
        self.task = asyncio.create_task(self._run(conn))

    async def _run(self, conn: Any) -> None:
        async for event in conn:
            self.events.append((time.monotonic(), event))
            self._changed.set()

    def of(self, kind: str) -> list[Any]:
        return [e for _, e in self.events if e.type == kind]

    async def until(self, done: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            if left <= 0 or self.task.done():
                raise AssertionError(f"timed out; events: {[e.type for _, e in self.events]}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(left, 1.0))
            except TimeoutError:
                pass

    async def next(self, kind: str, after: int, timeout: float = 30.0) -> Any:
        await self.until(lambda: any(e.type == kind for _, e in self.events[after:]), timeout)
        return next(e for _, e in self.events[after:] if e.type == kind)

    async def read_up_to_here(self, conn: Any) -> None:
        """Until the server has read every event sent before: a session.update that changes nothing is answered
        in order, after the appends before it."""
        n = len(self.of("session.updated"))
        await conn.session.update(session={"type": "transcription"})
        await self.until(lambda: len(self.of("session.updated")) > n, SETTLE_S)

    def items_done(self, reaching: float = 0.0) -> bool:
        """Every item the server VAD opened has been stopped and completed (or failed), and one stopped at `reaching`
        seconds of the audio or later (say its last utterance's start: the server may still be reading audio that a
        real-time client has sent, and an item it has not opened yet has nothing to wait for)."""
        started = len(self.of("input_audio_buffer.speech_started"))
        ended = len(self.of("conversation.item.input_audio_transcription.completed")) + len(
            self.of("conversation.item.input_audio_transcription.failed"))
        stops = [e.audio_end_ms / 1000 for e in self.of("input_audio_buffer.speech_stopped")]
        return started >= 1 and len(stops) == started == ended and max(stops) >= reaching


async def append(conn: Any, audio16k: np.ndarray, fmt: str = "audio/pcm", realtime: bool = False) -> float:
    """Append the audio as fast as the server reads it, or in real time (20 ms a chunk); returns the monotonic time
    at which stream time 0 was sent."""
    rate, data = encode(audio16k, fmt)
    width = 2 if fmt == "audio/pcm" else 1
    step = int((CHUNK_S if realtime else FAST_CHUNK_S) * rate) * width
    t0 = time.monotonic()
    for k in range(0, len(data), step):
        await conn.input_audio_buffer.append(audio=base64.b64encode(data[k:k + step]).decode())
        if realtime:
            await asyncio.sleep(max(0.0, t0 + (k + step) / width / rate - time.monotonic()))
    return t0


def pick(names: list[str]) -> list[Clip]:
    by_name = {c.name: c for c in clips()}
    return [by_name[n] for n in names]


def file_texts(app: App, paths: list[Path]) -> list[str]:
    """The app's own file transcription (same engine) of each file: for audio the test made (the shared reading
    covers the clips as they are)."""
    out = []
    for path in paths:
        r = httpx.post(f"{app.url}/v1/audio/transcriptions", headers={"Authorization": f"Bearer {KEY}"},
                       files={"file": (path.name, path.read_bytes())}, timeout=SETTLE_S)
        assert r.status_code == 200, r.text
        out.append(r.json()["text"])
    return out


def margin(refs: list[str]) -> float:
    """WER_MARGIN, or one word where the references are too short for 3 points to hold one."""
    from whisper_normalizer.english import EnglishTextNormalizer

    words = sum(len(EnglishTextNormalizer()(r).split()) for r in refs)
    return max(WER_MARGIN, 1.01 / words)


def spelled(logprobs: list[Any]) -> str:
    """The text the tokens of a Realtime event's `logprobs` spell, spaces between words as one."""
    return " ".join(bytes(b for t in logprobs for b in t.bytes).decode().split())


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), 100 * q)) if values else float("nan")


def check_items(rec: Recorder) -> dict[str, dict[str, Any]]:
    """Per item: the events in order, deltas append-only and adding up to the completed transcript."""
    assert rec.events[0][1].type == "session.created"
    session = rec.events[0][1].session
    assert session.type == "transcription" and session.id.startswith("sess_")
    items: dict[str, dict[str, Any]] = {}
    previous = None
    for t, e in rec.events:
        if e.type == "input_audio_buffer.speech_started":
            assert e.item_id not in items
            items[e.item_id] = {"started": t, "start_ms": e.audio_start_ms, "deltas": [], "first_delta": None}
        elif e.type == "input_audio_buffer.speech_stopped":
            assert "stopped" not in items[e.item_id]
            items[e.item_id].update(stopped=t, end_ms=e.audio_end_ms)
        elif e.type == "input_audio_buffer.committed":
            item = items.setdefault(e.item_id, {"deltas": [], "first_delta": None})
            assert "committed" not in item and "completed" not in item
            assert e.previous_item_id == previous, "previous_item_id is the item committed before"
            previous = e.item_id
            item["committed"] = t
        elif e.type == "conversation.item.input_audio_transcription.delta":
            item = items[e.item_id]
            assert "completed" not in item, "a delta after its item completed"
            item["deltas"].append(e.delta)
            item["first_delta"] = item["first_delta"] or t
        elif e.type == "conversation.item.input_audio_transcription.completed":
            item = items[e.item_id]
            assert "committed" in item, "completed before committed"
            item.update(completed=t, transcript=e.transcript)
            assert "".join(item["deltas"]) == e.transcript, (item["deltas"], e.transcript)
            assert e.usage.type == "duration" and e.usage.seconds > 0
            assert e.event_id.startswith("event_") and e.content_index == 0
    ids = [e.event_id for _, e in rec.events]
    assert len(set(ids)) == len(ids), "event ids are unique"
    return items


async def live_session(app: App, audio: np.ndarray, fmt: str, vad: dict[str, Any] | None = None,
                       start: asyncio.Event | None = None, include: list[str] | None = None,
                       noise_reduction: str | None = None) -> Recorder:
    """A server-VAD session: the audio appended as fast as the server reads it (after `start`, where given), then
    every item's completion."""
    async with sdk(app).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        rec = Recorder(conn)
        await rec.until(lambda: bool(rec.events))
        audio_input: dict[str, Any] = {"format": {"type": fmt, **({"rate": 24000} if fmt == "audio/pcm" else {})},
                                       "transcription": {"model": "whisper-1", "language": "en"},
                                       "noise_reduction": {"type": noise_reduction} if noise_reduction else None}
        if vad is not None:
            audio_input["turn_detection"] = vad
        await conn.session.update(session={"type": "transcription", "audio": {"input": audio_input},
                                           **({"include": include} if include else {})})
        updated = await rec.next("session.updated", 0)
        assert updated.session.audio.input.format.type == fmt
        if start is not None:
            await start.wait()
        await append(conn, audio, fmt)
        await rec.read_up_to_here(conn)
        await rec.until(rec.items_done, SETTLE_S)
        await conn.close()
    rec.task.cancel()
    return rec


async def refused_input(app: App, audio_input: dict[str, Any]) -> Any:
    """The `error` (its `error` object) that a fresh session answers a `session.update` of these `audio.input`
    settings with."""
    async with sdk(app).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        rec = Recorder(conn)
        await rec.until(lambda: bool(rec.events))
        await conn.send_raw(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
            "input": audio_input}}}))
        error = await rec.next("error", 0)
        await conn.close()
    rec.task.cancel()
    return error.error


def per_clip(items: dict[str, dict[str, Any]], spans: list[tuple[float, float]]) -> list[str]:
    """Each item's transcript belongs to the clip its speech ended in (or the nearest)."""
    out: list[list[str]] = [[] for _ in spans]
    for item in sorted(items.values(), key=lambda i: i["end_ms"]):
        end = item["end_ms"] / 1000
        k = min(range(len(spans)), key=lambda k: abs(end - min(max(end, spans[k][0]), spans[k][1])))
        if item["transcript"]:
            out[k].append(item["transcript"])
    return [" ".join(t) for t in out]


def latencies(items: dict[str, dict[str, Any]], t0: float, prefix_ms: int) -> tuple[list[float], list[float]]:
    """End of speech to completed, and start of speech to the first delta (as the page's figures are taken)."""
    done = [i["completed"] - (t0 + i["end_ms"] / 1000) for i in items.values()]
    first = [i["first_delta"] - (t0 + (i["start_ms"] + prefix_ms) / 1000) for i in items.values() if i["first_delta"]]
    return done, first


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


def ws_url(app: App) -> str:
    return app.url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"


async def first_event(url: str, **kw: Any) -> dict[str, Any]:
    async with websockets.connect(url, **kw) as ws:
        return json.loads(await asyncio.wait_for(ws.recv(), 10))


def no_sessions(app: App, timeout: float = 60.0) -> None:
    """Until the app has no live session (it notices a closed connection a moment after the client)."""
    deadline = time.monotonic() + timeout
    while app.health()["sessions"]:
        assert time.monotonic() < deadline, f"sessions left open: {app.health()}"
        time.sleep(0.1)


# -- real speech, server VAD
def test_live_pcm24k_real_speech(keyed_app, readings, tmp_path):
    """Six real utterances with pauses, 24 kHz PCM16 appended faster than real time: per utterance speech_started,
    speech_stopped, committed, deltas then completed; completed text within WER_MARGIN of the file reading of the
    same clips. The session asks for log-probabilities (issue 41): each delta's tokens spell its words, and the
    completed event's are the deltas' in order, which spell its transcript. Then its kept audio is transcribed
    again (`transcribed_again`)."""
    picked = pick(PICKED)
    comp = compilation(picked, tmp_path / "live.wav")
    rec = run(live_session(keyed_app, decode_file(comp.path), "audio/pcm", include=[LOGPROBS]))
    items = check_items(rec)
    sent: dict[str, list[Any]] = {}
    for e in rec.of("conversation.item.input_audio_transcription.delta"):
        assert e.logprobs and spelled(e.logprobs) == e.delta.strip(), e
        sent.setdefault(e.item_id, []).extend(e.logprobs)
    for e in rec.of("conversation.item.input_audio_transcription.completed"):
        assert e.logprobs == sent.get(e.item_id, []) and spelled(e.logprobs) == e.transcript, e
        assert all(t.logprob <= 0.0 for t in e.logprobs)
    assert all({"started", "stopped", "committed", "completed"} <= set(i) for i in items.values())
    ended = {min(range(len(comp.spans)), key=lambda k: abs(i["end_ms"] / 1000 - comp.spans[k][1]))
             for i in items.values()}
    assert len(items) >= len(picked) and ended == set(range(len(picked))), "an utterance without its own item"
    live = per_clip(items, comp.spans)
    refs = comp.texts
    files = [readings["text"][c.name] for c in picked]
    live_wer, file_wer = corpus_wer(refs, live), corpus_wer(refs, files)
    print(f"\nrealtime API, {len(picked)} utterances, 24 kHz PCM: live WER {100 * live_wer:.2f} %, file WER "
          f"{100 * file_wer:.2f} % ({len(items)} items)")
    for r, h, f in zip(refs, live, files, strict=True):
        print(f"  ref: {r}\n  live: {h}\n  file: {f}")
    assert live_wer <= file_wer + WER_MARGIN
    assert not loops(live)
    transcribed_again(keyed_app, rec.of("session.created")[0].session.id, " ".join(refs))


def test_noise_reduction_denoises_what_the_vad_hears(keyed_app, tmp_path):
    """Issue 41: a session asking for `noise_reduction` runs the denoiser over all the audio it is sent (the app's
    /metrics count it) for its VAD, while the engine reads the audio as it came (tests/test_denoise.py): real read
    clips under a meeting room's noise at the speech's own level (0 dB) give an item per utterance at least, each
    completed. Its WER beside noise reduction off is `bench denoise`'s (on three clips it moves by several points
    from run to run either way). An unknown type is refused, naming its field."""
    from test_metrics import scrape

    from realtime.bench.denoise import noise_bed, noisy

    picked = pick(PICKED[:3])
    comp = compilation(picked, tmp_path / "noisy.wav")
    audio = noisy(decode_file(comp.path), noise_bed(), 0.0)
    before = scrape(keyed_app.url).get(("realtime_denoised_audio_seconds_total", ()), 0.0)
    cleaned = check_items(run(live_session(keyed_app, audio, "audio/pcm", noise_reduction="near_field")))
    seconds = audio.size / SAMPLE_RATE
    deadline = time.monotonic() + 30
    while True:  # the session's close, which hands on what the denoiser still holds, may come after its items
        denoised = scrape(keyed_app.url)[("realtime_denoised_audio_seconds_total", ())] - before
        if denoised >= seconds - RESAMPLER_HOLDS_S or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    with_nr = per_clip(cleaned, comp.spans)
    print(f"\nnoise at 0 dB: WER {100 * corpus_wer(comp.texts, with_nr):.1f} % with noise_reduction "
          f"({len(cleaned)} items); {denoised:.1f} s denoised of {seconds:.1f} s")
    assert seconds - RESAMPLER_HOLDS_S <= denoised <= seconds
    assert len(cleaned) >= len(picked) and all("completed" in i for i in cleaned.values())

    error = run(refused_input(keyed_app, {"noise_reduction": {"type": "studio"}}))
    assert (error.code, error.param) == ("invalid_value", "session.audio.input.noise_reduction.type"), error


def test_semantic_vad_waits_through_a_pause_inside_a_sentence_as_its_eagerness_says(keyed_app):
    """Issue 41: `semantic_vad` runs the end-of-turn model (tests/test_end_of_turn.py). A real sentence with a 3 s pause
    after "And so my fellow Americans, ask not": eagerness `low` (up to 8 s) keeps it one item, `high` (up to
    2 s) gives the pause's item up after 2 s. `session.updated` shows what was asked; an eagerness OpenAI does not
    have is refused, naming its field."""
    from test_end_of_turn import JFK_MID

    from realtime.live.end_of_turn import available

    if not available():
        pytest.skip("needs pipecat-ai's Smart Turn weights")
    jfk = decode_file(DATA / "jfk.flac")
    cut = int(JFK_MID * SAMPLE_RATE)
    audio = np.concatenate([jfk[:cut], np.zeros(2 * SAMPLE_RATE, np.float32), jfk[cut:],
                            np.zeros(9 * SAMPLE_RATE, np.float32)])  # every pause closes by itself at the end

    async def both() -> list[Recorder]:
        return list(await asyncio.gather(*(live_session(keyed_app, audio, "audio/pcm", vad={
            "type": "semantic_vad", "eagerness": e}) for e in ("low", "high"))))

    t0 = time.monotonic()
    low, high = run(both())
    print(f"\ntwo sessions in {time.monotonic() - t0:.1f} s")
    items = {}
    for rec, eagerness in ((low, "low"), (high, "high")):
        turn = rec.of("session.updated")[0].session.audio.input.turn_detection
        assert (turn.type, turn.eagerness) == ("semantic_vad", eagerness)
        items[eagerness] = sorted(check_items(rec).values(), key=lambda i: i["end_ms"])
        print(eagerness, [(i["end_ms"] / 1000, i["transcript"]) for i in items[eagerness]])
    at_pause = {e: [i for i in items[e] if abs(i["end_ms"] / 1000 - JFK_MID) < 0.4] for e in items}
    assert not at_pause["low"] and at_pause["high"]
    first = {e: items[e][0]["transcript"].lower() for e in items}
    assert "your country can do for you" in first["low"] and "ask what you can do" in first["low"]
    assert "americans" in first["high"] and "your country" not in first["high"]

    error = run(refused_input(keyed_app, {"turn_detection": {"type": "semantic_vad", "eagerness": "eventually"}}))
    assert (error.code, error.param) == ("invalid_value", "session.audio.input.turn_detection.eagerness"), error


def test_a_session_vocabulary_is_shown_and_a_bad_one_refused(keyed_app):
    """Issue 41: `audio.input.transcription.vocabulary` (our extension, a list of terms) is the session's from the next
    segment on (tests/test_api.py checks what a vocabulary does to real speech); `session.updated` shows it, and a
    list too long is refused, naming its field, the session keeping its own."""
    async def scenario() -> tuple[Any, Any, Any]:
        async with sdk(keyed_app).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            rec = Recorder(conn)
            await rec.until(lambda: bool(rec.events))
            await conn.send_raw(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"transcription": {"vocabulary": ["Abigail Claflin", "Abbie"]}}}}}))
            updated = await rec.next("session.updated", 0)
            n = len(rec.events)
            await conn.send_raw(json.dumps({"type": "session.update", "session": {"type": "transcription", "audio": {
                "input": {"transcription": {"vocabulary": [f"t{i}" for i in range(101)]}}}}}))
            error = await rec.next("error", n)
            n = len(rec.events)
            await rec.read_up_to_here(conn)
            kept = await rec.next("session.updated", n)
            await conn.close()
        rec.task.cancel()
        return updated, error, kept

    updated, error, kept = run(scenario())
    assert updated.session.audio.input.transcription.model_extra["vocabulary"] == ["Abigail Claflin", "Abbie"]
    assert (error.error.code, error.error.param) == ("invalid_value", "session.audio.input.transcription.vocabulary")
    assert kept.session.audio.input.transcription.model_extra["vocabulary"] == ["Abigail Claflin", "Abbie"]


def transcribed_again(app: App, sid: str, reference: str) -> None:
    """Issue 40: the session's audio was kept (`--keep-audio`); `POST /v1/transcripts/{id}/retranscribe` with the
    multilingual base replaces its live draft (tiny.en), which reads back as version 1, and the downloads give the
    new text, which loses no stretch of the reference (`lost_runs`); a model the app does not offer and a language
    the model does not speak are refused, the text unchanged. The
    WERs are printed, not compared: base reads random compilations of every condition better (`python -m realtime
    bench retranscribe`, docs/performance.md), but not these six clean clips (a TIMIT sentence it misreads)."""
    no_sessions(app)
    auth = {"Authorization": f"Bearer {KEY}"}
    draft = httpx.get(f"{app.url}/v1/transcripts/{sid}", headers=auth).json()
    assert draft["state"] == "ended" and draft["versions"] == [], draft
    r = httpx.post(f"{app.url}/v1/transcripts/{sid}/retranscribe", headers=auth, json={"model": "small.en"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_offered", r.text
    r = httpx.post(f"{app.url}/v1/transcripts/{sid}/retranscribe", headers=auth, json={"model": "base"}, timeout=600)
    assert r.status_code == 200, r.text
    again = r.json()
    assert again["replaced_version"] == 1 and again["model"].startswith("base"), again
    assert [v["version"] for v in again["versions"]] == [1] and again["versions"][0]["model"] == draft["model"]
    version = httpx.get(f"{app.url}/v1/transcripts/{sid}/versions/1", headers=auth).json()
    assert version["text"] == draft["text"] and version["segments"] == draft["segments"], version
    r = httpx.post(f"{app.url}/v1/transcripts/{sid}/retranscribe", headers=auth, json={"language": "xx"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_language", r.text
    now = httpx.get(f"{app.url}/v1/transcripts/{sid}", headers=auth).json()
    assert now["text"] == again["text"] and len(now["versions"]) == 1, now
    srt = httpx.get(f"{app.url}/transcript/{sid}.srt", headers=auth)
    assert srt.status_code == 200 and again["segments"][-1]["text"].strip() in srt.text.replace("\n", " ")
    draft_wer, new_wer = corpus_wer([reference], [draft["text"]]), corpus_wer([reference], [again["text"]])
    print(f"kept audio transcribed again: live draft (tiny.en) WER {100 * draft_wer:.2f} %, base "
          f"{100 * new_wer:.2f} %\n  draft: {draft['text']}\n  again: {again['text']}")
    assert not lost_runs(reference, again["text"]), lost_runs(reference, again["text"])


def test_deltas_flow_while_the_person_speaks(engine):
    """With server VAD the words two partials agree on go out as deltas while the person is still speaking, before
    the item's speech_stopped, and an item's deltas add up to its completed transcript. On the connection the
    WebSocket route serves (RealtimeConnection, in process, with the shared engine), on the stream's own clock, each
    partial answered before the next 20 ms of audio goes in: the moment does not hang on how busy the machine is."""
    from realtime.config import Settings
    from realtime.live.service import TranscriptionService
    from realtime.web.realtime_api.connection import RealtimeConnection
    from realtime.web.realtime_api.protocol import Config

    from live_feed import StreamClock, settled

    clip = pick([DELTAS_CLIP])[0]
    rate, pcm = encode(np.concatenate([decode_file(clip.path), np.zeros(SAMPLE_RATE, np.float32)]), "audio/pcm")
    step = int(CHUNK_S * rate) * 2
    settings = Settings()
    vad = settings.vad_config()
    config = Config(language="en", threshold=vad.threshold, prefix_padding_ms=vad.pad_before_ms,
                    silence_duration_ms=vad.min_silence_ms)  # as the route makes a session's

    async def go() -> list[dict[str, Any]]:
        service = TranscriptionService(settings, engine=engine)
        sent: list[dict[str, Any]] = []

        async def send_text(text: str) -> None:
            sent.append(json.loads(text))

        conn = RealtimeConnection(service, config, 0, send_text)
        conn.open()
        session = conn.session
        assert session is not None and service.worker is not None
        clock = StreamClock()
        session.clock = clock
        sender = asyncio.create_task(conn.sender())
        try:
            for k in range(0, len(pcm), step):
                clock.now = (k + step) / 2 / rate
                conn.receive(json.dumps({"type": "input_audio_buffer.append",
                                         "audio": base64.b64encode(pcm[k:k + step]).decode()}))
                while service.worker.has_partial(conn.id):
                    await asyncio.sleep(0.005)
                await asyncio.sleep(0)  # the partial's result reaches the connection before more audio
            await settled(session)
        finally:
            conn.close()
            conn.outbox.put_nowait(None)
            await sender
            await service.worker.stop()  # the engine is the shared one: stop only this service's worker
            service.idle_trim.cancel()
        return sent

    events = run(go())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "input_audio_buffer.speech_started", kinds
    stopped = {e["item_id"]: n for n, e in enumerate(events) if e["type"] == "input_audio_buffer.speech_stopped"}
    completed = {e["item_id"]: e["transcript"] for e in events
                 if e["type"] == "conversation.item.input_audio_transcription.completed"}
    assert stopped and set(completed) == set(stopped), kinds
    deltas = [(n, e) for n, e in enumerate(events) if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert any(n < stopped[e["item_id"]] for n, e in deltas), f"no delta while the person spoke: {kinds}"
    for item, transcript in completed.items():
        assert "".join(e["delta"] for _, e in deltas if e["item_id"] == item) == transcript
    print(f"\ndeltas while speaking: {sum(n < stopped[e['item_id']] for n, e in deltas)} of {len(deltas)}; "
          f"{' '.join(completed.values())}")


def test_live_g711_pcmu(keyed_app, tmp_path):
    """8 kHz μ-law (telephone) input: transcribed as well as the app transcribes the same μ-law audio as a file."""
    picked = pick(PICKED_G711)
    comp = compilation(picked, tmp_path / "g711.wav")
    audio = decode_file(comp.path)
    rec = run(live_session(keyed_app, audio, "audio/pcmu", vad={"type": "server_vad", "threshold": 0.5,
                                                                "prefix_padding_ms": 200, "silence_duration_ms": 500}))
    items = check_items(rec)
    updated = rec.of("session.updated")[0].session.audio.input.turn_detection
    assert (updated.prefix_padding_ms, updated.silence_duration_ms) == (200, 500)
    live = per_clip(items, comp.spans)
    paths = []
    for clip in picked:  # the same telephone audio, as files
        x = soxr.resample(decode_file(clip.path), SAMPLE_RATE, 8000)
        path = tmp_path / f"{clip.path.stem}-ulaw.wav"
        sf.write(str(path), ULAW[np.frombuffer(ulaw_encode(x), dtype=np.uint8)], 8000, subtype="PCM_16")
        paths.append(path)
    files = file_texts(keyed_app, paths)
    live_wer, file_wer = corpus_wer(comp.texts, live), corpus_wer(comp.texts, files)
    print(f"\nrealtime API, G.711 u-law 8 kHz: live WER {100 * live_wer:.2f} %, file WER {100 * file_wer:.2f} %")
    for r, h, f in zip(comp.texts, live, files, strict=True):
        print(f"  ref: {r}\n  live: {h}\n  file: {f}")
    assert live_wer <= file_wer + G711_MARGIN


def test_manual_commits_bad_events_and_the_session_goes_on(keyed_app, readings):
    """turn_detection null: no VAD events at all, each commit gives committed, delta, completed. Malformed,
    unknown, oversized and unsupported events get `error` (with the client's event_id) and the session carries
    on."""
    picked = pick(PICKED_MANUAL)

    async def go() -> tuple[Recorder, list[str]]:
        async with sdk(keyed_app).realtime.connect(extra_query={"intent": "transcription"}) as conn:
            rec = Recorder(conn)
            await rec.until(lambda: bool(rec.events))
            await conn.send_raw("{not json")
            await conn.send_raw(json.dumps({"type": "no.such.event", "event_id": "evt_unknown"}))
            await conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": "***"}))
            await conn.send_raw(json.dumps({"type": "response.create"}))
            await conn.send_raw(json.dumps({"type": "input_audio_buffer.append",
                                            "audio": "A" * (16 * 1024 * 1024 - 100)}))
            await conn.send_raw(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
            await conn.input_audio_buffer.commit()  # nothing appended yet
            await rec.until(lambda: len(rec.of("error")) >= 7)
            await conn.session.update(session={"type": "transcription", "audio": {"input": {
                "turn_detection": None, "transcription": {"prompt": "A short sentence."}}}})
            await rec.next("session.updated", 0)
            texts = []
            for clip in picked:
                n = len(rec.events)
                await append(conn, decode_file(clip.path))
                await conn.input_audio_buffer.commit()
                done = await rec.next("conversation.item.input_audio_transcription.completed", n, timeout=SETTLE_S)
                texts.append(done.transcript)
            await conn.input_audio_buffer.append(audio=base64.b64encode(b"\0" * 4800).decode())
            await conn.input_audio_buffer.clear()
            await rec.next("input_audio_buffer.cleared", 0)
            await conn.close()
        rec.task.cancel()
        return rec, texts

    rec, texts = run(go())
    assert not rec.of("input_audio_buffer.speech_started"), "no VAD events without turn detection"
    errors = [e.error for e in rec.of("error")]
    codes = [e.code for e in errors]
    assert codes[:7] == ["invalid_json", "invalid_value", "invalid_value", "unsupported_event", "event_too_large",
                         "unsupported_session_type", "input_audio_buffer_commit_empty"], codes
    assert errors[1].event_id == "evt_unknown" and errors[1].param == "type"
    assert all(e.type == "invalid_request_error" and e.message for e in errors)
    assert rec.of("session.updated")[0].session.audio.input.turn_detection is None
    items = check_items(rec)
    assert len(items) == len(picked) and all("completed" in i for i in items.values())
    files = [readings["text"][c.name] for c in picked]
    refs = [c.text for c in picked]
    print(f"\nrealtime API, manual commits: WER {100 * corpus_wer(refs, texts):.2f} %, file WER "
          f"{100 * corpus_wer(refs, files):.2f} %")
    assert corpus_wer(refs, texts) <= corpus_wer(refs, files) + margin(refs)


# -- keys, secrets and limits
def test_keys_wrong_refused_subprotocol_and_ephemeral_accepted(keyed_app):
    """A wrong key is refused with 401 before the WebSocket opens; the key is taken as a Bearer header or the
    browser's subprotocol (answered with "realtime", never the key); an ephemeral secret opens one session in its
    place, with its settings, and minting one needs the key."""
    async def go() -> None:
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with sdk(keyed_app, "wrong-key").realtime.connect(extra_query={"intent": "transcription"}) as conn:
                await conn.recv()
        assert refused.value.response.status_code == 401
        for protocols in (["realtime"], ["realtime", "openai-insecure-api-key.wrong"]):
            with pytest.raises(websockets.InvalidStatus):
                await first_event(ws_url(keyed_app), subprotocols=protocols)
        # the browser form of the key; the server answers with the "realtime" subprotocol, never the key
        async with websockets.connect(ws_url(keyed_app), subprotocols=["realtime", f"openai-insecure-api-key.{KEY}"]
                                      ) as ws:
            assert ws.subprotocol == "realtime"
            assert json.loads(await ws.recv())["type"] == "session.created"
        # an ephemeral secret: made with the key, accepted once in its place, and carrying its session settings
        r = httpx.post(f"{keyed_app.url}/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"},
                       json={"expires_after": {"anchor": "created_at", "seconds": 60}, "session": {
                           "type": "transcription", "audio": {"input": {"format": {"type": "audio/pcmu"}}}}})
        assert r.status_code == 200, r.text
        secret = r.json()["value"]
        assert secret.startswith("ek_") and r.json()["expires_at"] <= time.time() + 61
        created = await first_event(ws_url(keyed_app), subprotocols=["realtime", f"openai-insecure-api-key.{secret}"])
        assert created["session"]["audio"]["input"]["format"]["type"] == "audio/pcmu"
        with pytest.raises(websockets.InvalidStatus):
            await first_event(ws_url(keyed_app), additional_headers={"Authorization": f"Bearer {secret}"})
        assert httpx.post(f"{keyed_app.url}/v1/realtime/client_secrets", json={}).status_code == 401

    run(go())


def test_sessions_count_against_the_concurrency_limit(keyed_app):
    """Realtime sessions count against --concurrency-limit: one beyond it is refused with 503."""
    no_sessions(keyed_app)  # earlier tests' sessions, closed by their clients

    async def go() -> None:
        headers = {"Authorization": f"Bearer {KEY}"}
        held = [await websockets.connect(ws_url(keyed_app), additional_headers=headers) for _ in range(LIMIT)]
        try:
            for ws in held:
                assert json.loads(await ws.recv())["type"] == "session.created"
            assert keyed_app.health()["sessions"] == LIMIT
            with pytest.raises(websockets.InvalidStatus) as refused:
                await first_event(ws_url(keyed_app), additional_headers=headers)
            assert refused.value.response.status_code == 503
        finally:
            for ws in held:
                await ws.close()

    run(go())
    no_sessions(keyed_app)


@pytest.mark.xdist_group("test_signalling")
def test_the_session_time_limit_ends_a_realtime_session(limited_app):
    """The demo limits end realtime sessions as they end the page's: an `error` with the reason, then the close."""
    async def go() -> tuple[list[dict[str, Any]], int | None]:
        async with websockets.connect(ws_url(limited_app)) as ws:
            events = [json.loads(await asyncio.wait_for(ws.recv(), 10))]
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                              "audio": base64.b64encode(b"\0" * 9600).decode()}))
                    try:
                        events.append(json.loads(await asyncio.wait_for(ws.recv(), 0.2)))
                    except TimeoutError:
                        pass
            return events, ws.close_code

    events, code = run(go())
    assert events[0]["type"] == "session.created"
    assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "time_limit", events
    assert code == 1008
    assert limited_app.health()["sessions"] == 0


# -- WebRTC
def test_webrtc_call_with_an_ephemeral_secret(keyed_app, readings, tmp_path):
    """OpenAI's browser flow with aiortc as the browser: a client secret from the key, the SDP offer posted to
    /v1/realtime/calls with the secret, the audio on the media track and the events on the `oai-events` data
    channel; real speech in real time, completed text against the file reading of the same clips."""
    from types import SimpleNamespace

    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from realtime.bench.client import _make_track
    from realtime.web.ice import use_loopback_only

    use_loopback_only()
    picked = pick(PICKED_WEBRTC)
    comp = compilation(picked, tmp_path / "call.wav")
    audio = decode_file(comp.path)

    async def go() -> tuple[Recorder, float]:
        async with httpx.AsyncClient(base_url=keyed_app.url, timeout=30) as http:
            r = await http.post("/v1/realtime/calls", content="v=0\r\n", headers={"Content-Type": "application/sdp"})
            assert r.status_code == 401, r.text
            r = await http.post("/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"}, json={
                "session": {"type": "transcription", "audio": {"input": {"transcription": {"language": "en"}}}}})
            secret = r.json()["value"]
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            channel = pc.createDataChannel("oai-events")
            queue: asyncio.Queue[Any] = asyncio.Queue()
            channel.on("message", lambda m: queue.put_nowait(json.loads(m, object_hook=lambda d: SimpleNamespace(**d))))

            async def incoming() -> Any:
                while True:
                    yield await queue.get()

            rec = Recorder(incoming())
            track = _make_track(audio, 1.5)
            pc.addTrack(track)
            try:
                await pc.setLocalDescription(await pc.createOffer())
                r = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                    headers={"Authorization": f"Bearer {secret}", "Content-Type": "application/sdp"})
                assert r.status_code == 201, r.text
                call = r.headers["location"].rsplit("/", 1)[1]
                await pc.setRemoteDescription(RTCSessionDescription(sdp=r.text, type="answer"))
                await rec.until(lambda: bool(rec.events), timeout=30)
                channel.send(json.dumps({"type": "no.such.event", "event_id": "evt_1"}))
                await rec.until(lambda: track.all_done.is_set() and rec.items_done(reaching=comp.spans[-1][0]),
                                timeout=SETTLE_S)
                r = await http.post(f"/v1/realtime/calls/{call}/hangup", headers={"Authorization": f"Bearer {KEY}"})
                assert r.status_code == 200
            finally:
                await pc.close()
                rec.task.cancel()
            assert track.t0 is not None
            return rec, track.t0

    rec, t0 = run(go())
    items = check_items(rec)
    assert [e.error.event_id for e in rec.of("error")] == ["evt_1"]
    live = per_clip(items, comp.spans)
    files = [readings["text"][c.name] for c in picked]
    live_wer, file_wer = corpus_wer(comp.texts, live), corpus_wer(comp.texts, files)
    done, first = latencies(items, t0, rec.events[0][1].session.audio.input.turn_detection.prefix_padding_ms)
    print(f"\nrealtime API over WebRTC, {len(picked)} utterances: live WER {100 * live_wer:.2f} %, file WER "
          f"{100 * file_wer:.2f} %; end of speech to completed p50 {percentile(done, 0.5):.3f} s, p95 "
          f"{percentile(done, 0.95):.3f} s; first delta p50 {percentile(first, 0.5):.3f} s")
    for r, h, f in zip(comp.texts, live, files, strict=True):
        print(f"  ref: {r}\n  live: {h}\n  file: {f}")
    assert live_wer <= file_wer + TRANSPORT_MARGIN
    no_sessions(keyed_app)  # hangup ends the session


@pytest.mark.xdist_group("test_faults")
def test_an_engine_failure_is_a_failed_item_and_the_session_goes_on(remote_app):
    """The remote engine against an endpoint that answers 500 to both attempts of one request: that commit's item
    gets `.failed`, the next one `.completed`."""
    from endpoints import segment_audio

    app, endpoint = remote_app
    healthy(app)
    endpoint.script_min_seconds = 0.0
    endpoint.script.extend(["500", "500"])  # the request and its one retry (--remote-retries 1)
    try:
        async def go() -> Recorder:
            async with sdk(app, "no-key-needed").realtime.connect() as conn:
                rec = Recorder(conn)
                await conn.session.update(session={"type": "transcription", "include": [LOGPROBS]})
                await rec.next("error", 0)
                await conn.session.update(session={"type": "transcription",
                                                   "audio": {"input": {"turn_detection": None}}})
                await rec.next("session.updated", 0)
                for n in (1, 2):
                    at = len(rec.events)
                    await append(conn, segment_audio(n, 0.6))
                    await conn.input_audio_buffer.commit()
                    await rec.until(lambda at=at: any(e.type.startswith("conversation.item.input_audio_transcription.")
                                                      and e.type != "conversation.item.input_audio_transcription.delta"
                                                      for _, e in rec.events[at:]), timeout=SETTLE_S)
                await conn.close()
            rec.task.cancel()
            return rec

        rec = run(go())
    finally:
        endpoint.script.clear()
    failed = rec.of("conversation.item.input_audio_transcription.failed")
    completed = rec.of("conversation.item.input_audio_transcription.completed")
    refused = rec.of("error")[0].error  # issue 41: an engine without log-probabilities says so, never sends none
    assert refused.code == "unsupported_logprobs" and refused.param == "session.include", refused
    assert not completed[0].logprobs
    r = httpx.post(f"{app.url}/v1/audio/transcriptions", data={"include[]": "logprobs"},
                   files={"file": ("s.wav", wav_bytes(segment_audio(1, 0.6)), "audio/wav")}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == "logprobs_unsupported", r.text
    assert len(failed) == 1 and len(completed) == 1
    committed = [e.item_id for e in rec.of("input_audio_buffer.committed")]
    assert [failed[0].item_id, completed[0].item_id] == committed
    assert failed[0].error.type == "server_error" and failed[0].error.message
    # the fake endpoint reads a segment id from the audio's first sample ("segment N"); the stream resampler's
    # delay carries the previous clip's level into it, so only the form is checked
    assert completed[0].transcript.startswith("segment ")


def healthy(app: App) -> None:
    """Until the remote engine's endpoint is healthy (a circuit that earlier failures opened is closed again)."""
    deadline = time.monotonic() + 60
    while not app.health()["endpoints"][0]["healthy"]:
        assert time.monotonic() < deadline, f"the endpoint stays unhealthy: {app.health()['endpoints']}"
        time.sleep(0.1)


def test_openai_browser_example_in_headless_chromium(tmp_path):
    """OpenAI's browser flow in Chromium (tests/realtime_browser_check.py, in a loopback-only network namespace):
    client secret, microphone track, `oai-events` data channel, offer to /v1/realtime/calls; real speech from the
    fake microphone comes back as deltas and completed transcripts, over loopback ICE only."""
    import os
    import shutil
    import subprocess
    import sys
    from types import SimpleNamespace

    from conftest import ROOT

    for tool in ("/usr/bin/chromium", "unshare", "ip"):
        assert shutil.which(tool), f"{tool} is required (apt-get install chromium util-linux iproute2)"
    picked = pick(PICKED_WEBRTC[:2])
    comp = compilation(picked, tmp_path / "mic.wav", lead=1.0, tail=2.0)
    out = tmp_path / "browser.json"
    check = [sys.executable, str(ROOT / "tests" / "realtime_browser_check.py"), "--wav", str(comp.path),
             "--out", str(out), "--key", KEY, "--expect", comp.text, "--max-wer", str(BROWSER_WER)]
    proc = subprocess.run(["unshare", "--net", "bash", "-c", 'ip link set lo up && exec "$@"', "netns", *check],
                          cwd=ROOT, capture_output=True, text=True, timeout=SETTLE_S + 120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and out.exists(), f"browser check failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    r = json.loads(out.read_text())
    rec = Recorder.__new__(Recorder)
    rec.events = [(t, json.loads(json.dumps(e), object_hook=lambda d: SimpleNamespace(**d))) for t, e in r["events"]]
    items = check_items(rec)
    assert items and all("completed" in i for i in items.values()), r["app_log"]
    text = " ".join(i["transcript"] for i in items.values() if i.get("transcript"))
    print(f"\nChromium, OpenAI's browser example: {len(items)} items, heard: {text}; ICE pairs {r['ice_pairs']}")
    assert corpus_wer([comp.text], [text]) <= BROWSER_WER, text
    assert any(i["deltas"] for i in items.values())
    assert r["ice_pairs"] and all(a in ("127.0.0.1", "::1") for pair in r["ice_pairs"] for a in pair), r["ice_pairs"]
    outside = [u for u in r["requests"] if not u.startswith(("http://127.0.0.1", "data:", "blob:"))]
    assert not outside, outside


BROWSER_WER = 0.25
"""The browser's completed transcripts against the reference text: Chromium's fake microphone, Opus, and no file
reading to compare with in the network namespace."""


def test_a_realtime_session_and_a_page_session_share_the_engine(keyed_app, readings, tmp_path):
    """A Realtime API session and a page session (WebRTC, /webrtc/offer) at the same time on the one engine (the
    realtime audio goes in once the page's speech has started): each gets its own speech back, as well as the file
    reading of its clips."""
    ours_clips, page_clips = pick(PICKED_MANUAL), pick(PICKED_G711[:2])
    ours = compilation(ours_clips, tmp_path / "ours.wav")
    page = compilation(page_clips, tmp_path / "page.wav")

    async def both() -> tuple[Recorder, Peer]:
        speaking = asyncio.Event()
        peer = Peer(keyed_app.url, decode_file(page.path))

        async def page_session() -> Peer:
            async with peer:
                await peer.until(lambda ev: any(e["type"] == "speech_started" for e in ev))
                speaking.set()
                await peer.finished(len(page_clips), reaching=page.spans[-1][0])
            return peer

        return await asyncio.gather(live_session(keyed_app, decode_file(ours.path), "audio/pcm", start=speaking),
                                    page_session())

    rec, peer = run(both())
    items = check_items(rec)
    live = per_clip(items, ours.spans)
    page_text = " ".join(e["text"] for e in peer.events if e["type"] == "final")
    files = [readings["text"][c.name] for c in ours_clips + page_clips]
    live_wer, file_wer = corpus_wer(ours.texts, live), corpus_wer(ours.texts, files[:2])
    page_wer, page_file_wer = corpus_wer([page.text], [page_text]), corpus_wer([page.text], [" ".join(files[2:])])
    print(f"\nrealtime session beside a page session: realtime WER {100 * live_wer:.2f} % (file {100 * file_wer:.2f} "
          f"%), page WER {100 * page_wer:.2f} % (file {100 * page_file_wer:.2f} %)")
    assert live_wer <= file_wer + TRANSPORT_MARGIN
    assert page_wer <= page_file_wer + TRANSPORT_MARGIN
    no_sessions(keyed_app)


def test_the_beta_transcription_session_update_is_understood(keyed_app):
    """Older clients send the beta API's `transcription_session.update`: it is mapped onto the session and answered
    with `transcription_session.updated` in the beta shape."""
    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with websockets.connect(ws_url(keyed_app), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            created = json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "transcription_session.update", "session": {
                "input_audio_format": "g711_ulaw", "input_audio_transcription": {"model": "whisper-1",
                                                                                 "language": "en"},
                "turn_detection": None, "input_audio_noise_reduction": {"type": "far_field"}}}))
            return created, json.loads(await asyncio.wait_for(ws.recv(), 10))

    created, updated = run(go())
    assert created["type"] == "session.created"
    assert updated["type"] == "transcription_session.updated", updated
    s = updated["session"]
    assert (s["input_audio_format"], s["turn_detection"], s["input_audio_transcription"]["language"]) == (
        "g711_ulaw", None, "en")
    assert s["id"] == created["session"]["id"]


def test_a_language_the_model_lacks_is_an_error_and_the_session_keeps_its_own(keyed_app):
    """tiny.en is English-only: a session.update (and the beta form) naming 'de' gets an `error` with code
    unsupported_language and the param's path, and the session keeps 'en'; a client secret asking for it is a 400."""
    from openai.types.realtime import RealtimeErrorEvent

    def language(code: str) -> dict[str, Any]:
        return {"type": "transcription", "audio": {"input": {"transcription": {"language": code}}}}

    async def go() -> list[dict[str, Any]]:
        async with websockets.connect(ws_url(keyed_app), additional_headers={"Authorization": f"Bearer {KEY}"}) as ws:
            answers = [json.loads(await ws.recv())]
            for event in ({"type": "session.update", "session": language("en")},
                          {"type": "session.update", "session": language("de"), "event_id": "evt_de"},
                          {"type": "transcription_session.update",
                           "session": {"input_audio_transcription": {"model": "whisper-1", "language": "de"}}},
                          {"type": "session.update", "session": {"type": "transcription", "audio": {"input": {
                              "transcription": {"prompt": "A short sentence."}}}}},
                          {"type": "session.update", "session": {"type": "transcription",
                                                                 "include": ["item.input_audio_transcription.all"]}}):
                await ws.send(json.dumps(event))
                answers.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
            return answers

    created, english, german, beta, after, include = run(go())
    assert include["type"] == "error" and include["error"]["code"] == "invalid_value", include
    assert include["error"]["param"] == "session.include"
    assert created["type"] == "session.created" and english["type"] == "session.updated"
    refused = RealtimeErrorEvent.model_validate(german)
    assert refused.type == "error", german
    assert refused.error.code == "unsupported_language" and refused.error.type == "invalid_request_error"
    assert refused.error.param == "session.audio.input.transcription.language"
    assert refused.error.event_id == "evt_de" and "English-only" in refused.error.message
    assert beta["type"] == "error" and beta["error"]["code"] == "unsupported_language", beta
    assert beta["error"]["param"] == "session.input_audio_transcription.language"
    assert after["type"] == "session.updated", after
    assert after["session"]["audio"]["input"]["transcription"]["language"] == "en", "the session kept its language"
    r = httpx.post(f"{keyed_app.url}/v1/realtime/client_secrets", headers={"Authorization": f"Bearer {KEY}"},
                   json={"session": language("de")})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "unsupported_language"
    assert r.json()["error"]["param"] == "session.audio.input.transcription.language"


def test_per_client_caps_on_the_realtime_routes(tmp_path):
    """The page's per-client caps on the Realtime API: over --max-connections-per-client the WebSocket is refused
    before it is accepted with 429 (Retry-After, OpenAI's error shape), and so is a call; another client is not held
    back; closing a WebSocket or hanging up a call frees its slot; over --max-new-connections-per-minute a client
    gets 429 rate_limit_exceeded, and minting client secrets has that cap of its own. Clients are told apart by
    the trusted X-Forwarded-For header (every request comes from loopback)."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    from realtime.web.ice import use_loopback_only

    use_loopback_only()
    app = launch(tmp_path, "--max-connections-per-client", "2", "--max-new-connections-per-minute", "3",
                 "--client-ip-header", "X-Forwarded-For")

    def client(n: int) -> dict[str, str]:
        return {"X-Forwarded-For": f"198.51.100.{n}, 10.0.0.1"}

    async def refusal(headers: dict[str, str]) -> Any:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await first_event(ws_url(app), additional_headers=headers)
        return refused.value.response

    async def admitted(headers: dict[str, str]) -> Any:
        """A WebSocket of this client once its freed slot is taken (the server notices a close a moment later)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                ws = await websockets.connect(ws_url(app), additional_headers=headers)
            except websockets.InvalidStatus as exc:
                assert json.loads(exc.response.body)["error"]["code"] == "too_many_connections"
                assert time.monotonic() < deadline, "the closed session's slot was not freed"
                await asyncio.sleep(0.1)
                continue
            assert json.loads(await ws.recv())["type"] == "session.created"
            return ws

    async def go() -> None:
        async with httpx.AsyncClient(base_url=app.url, timeout=30) as http:
            held = [await admitted(client(1)) for _ in range(2)]
            over = await refusal(client(1))
            body = json.loads(over.body)
            assert over.status_code == 429 and over.headers["Retry-After"] == "5", over.body
            assert body["error"]["code"] == "too_many_connections" and body["error"]["type"] == "rate_limit_error"
            assert body["error"]["message"] and "param" in body["error"]
            r = await http.post("/v1/realtime/calls", content="v=0\r\n",
                                headers={**client(1), "Content-Type": "application/sdp"})
            assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_connections", r.text
            assert (await first_event(ws_url(app), additional_headers=client(2)))["type"] == "session.created"
            await held.pop(0).close()
            held.append(await admitted(client(1)))  # the third new connection of this client in the minute
            for ws in held:
                await ws.close()
            deadline = time.monotonic() + 60
            while (over := await refusal(client(1))).status_code == 429 and json.loads(over.body)["error"][
                    "code"] == "too_many_connections" and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # until the closed slots are freed: then the minute's cap answers
            assert over.status_code == 429 and json.loads(over.body)["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(over.headers["Retry-After"]) <= 61

            # a call holds a slot until it is hung up
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            try:
                pc.addTransceiver("audio", direction="sendonly")
                pc.createDataChannel("oai-events")
                await pc.setLocalDescription(await pc.createOffer())
                r = await http.post("/v1/realtime/calls", content=pc.localDescription.sdp,
                                    headers={**client(3), "Content-Type": "application/sdp"})
                assert r.status_code == 201, r.text
                ws = await admitted(client(3))
                assert (await refusal(client(3))).status_code == 429
                call = r.headers["location"].rsplit("/", 1)[1]
                assert (await http.post(f"/v1/realtime/calls/{call}/hangup")).status_code == 200
                await (await admitted(client(3))).close()
                await ws.close()
            finally:
                await pc.close()

            # client secrets: the per-minute cap, counted apart from the sessions
            codes = [(await http.post("/v1/realtime/client_secrets", json={}, headers=client(4))) for _ in range(4)]
            assert [r.status_code for r in codes] == [200, 200, 200, 429], [r.text for r in codes]
            assert codes[-1].json()["error"]["code"] == "rate_limit_exceeded" and codes[-1].headers["Retry-After"]
            assert (await first_event(ws_url(app), additional_headers=client(4)))["type"] == "session.created"

    try:
        run(go())
    finally:
        stop(app)

