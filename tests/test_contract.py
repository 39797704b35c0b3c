"""Fast tier (`pytest -m fast`): the engine contract, the shared engine base, the worker and a session's event
order, with a deterministic engine and the session's own clock instead of wall-clock playback.

Real parts where they are cheap: the real Silero VAD and a real recording from tests/data. No browser, no
vLLM, no espeak, no Whisper weights; the whole file runs in seconds.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import numpy as np
import pytest
from fake_engine import ScriptedEngine, describe_clip

from realtime.audio import SAMPLE_RATE, decode_file
from realtime.config import Settings
from realtime.engines import Engine, EngineError, TranscribeOptions, Transcription
from realtime.live.events import ErrorEvent, FinalEvent, PartialEvent, SpeechStarted, SpeechStopped
from realtime.live.session import TranscriptionSession
from realtime.live.vad import SileroVAD
from realtime.live.worker import Job, Worker

from real_speech import DATA

pytestmark = pytest.mark.fast
PACKAGE = Path(__file__).resolve().parent.parent / "realtime"
FINAL = TranscribeOptions()
PARTIAL = TranscribeOptions(partial=True)


def tone(seconds: float, peak: float) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    return (peak * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


# -- the package's shape (its import graph: tests/test_layout.py)


def test_no_module_probes_an_engine_for_capabilities():
    """What an engine can do is declared by the contract; nothing asks with getattr/hasattr at run time."""
    probes = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and "engine" in ast.unparse(node.args[0]).lower()):
                probes.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not probes, probes


def test_every_registered_engine_declares_the_contract():
    from realtime.engines.embedded import EmbeddedEngine
    from realtime.engines.remote import RemoteEngine
    from realtime.engines.vllm import VllmEngine

    engines = [EmbeddedEngine(), RemoteEngine("http://127.0.0.1:9/v1", stream=True),
               VllmEngine.from_settings(Settings(engine="vllm", vllm_max_num_seqs=3)), ScriptedEngine()]
    for engine in engines:
        assert isinstance(engine, Engine), engine.name
        for flag in ("timestamps", "word_timestamps", "logprobs", "abortable", "streaming", "multilingual",
                     "translates", "ready"):
            assert isinstance(getattr(engine, flag), bool), (engine.name, flag)
        assert engine.languages and all(isinstance(code, str) for code in engine.languages), engine.name
        assert isinstance(engine.max_batch_size, int) and engine.max_batch_size >= 1
    embedded, remote, vllm, _ = engines
    assert (embedded.timestamps, embedded.streaming, embedded.translates, embedded.ready) == (True, False, False, False)
    assert (embedded.word_timestamps, remote.word_timestamps, vllm.word_timestamps) == (True, False, False)
    assert (embedded.logprobs, remote.logprobs, vllm.logprobs) == (True, False, True)
    assert not EmbeddedEngine(beam_size=5).logprobs, "CTranslate2 gives a decode's logits at beam size 1 only"
    assert embedded.languages == ("en",), "the bundled tiny.en is English-only"
    assert "de" in remote.languages and "de" in EmbeddedEngine(model="base").languages
    assert (remote.streaming, remote.translates, remote.ready) == (True, True, False)
    assert (vllm.abortable, vllm.streaming, vllm.max_batch_size, vllm.timestamps) == (True, True, 3, False)
    assert vllm.settings.max_num_seqs == 3, "the vLLM engine keeps its own settings, not the app's"


def test_what_a_model_can_do_is_declared_per_model():
    from realtime.engines.base import WHISPER_LANGUAGES, unsupported_translation
    from realtime.engines.embedded import EmbeddedEngine
    from realtime.engines.vllm import VllmEngine

    def vllm(model: str) -> VllmEngine:
        return VllmEngine.from_settings(Settings(engine="vllm", model=model))

    for engine in (EmbeddedEngine(model="large-v3-turbo"), vllm("openai/whisper-large-v3-turbo")):
        # transcribes every language, but its fine-tuning on transcription alone took translation away
        assert engine.multilingual and not engine.translates and engine.languages == WHISPER_LANGUAGES
        why = unsupported_translation(engine)
        assert why is not None and "not trained to translate" in why, why
    for engine in (EmbeddedEngine(model="base"), vllm("openai/whisper-large-v3")):
        assert engine.multilingual and engine.translates and unsupported_translation(engine) is None
    for engine in (EmbeddedEngine(), vllm("openai/whisper-tiny.en")):
        assert not engine.multilingual and not engine.translates and engine.languages == ("en",)
        assert "English-only" in (unsupported_translation(engine) or "")


def test_the_remote_fallback_comes_from_the_registry_and_the_token_from_the_settings():
    from realtime.config import from_namespace, parse_settings  # noqa: F401  (parse_settings: the CLI path)
    from realtime.engines import create_engine
    from realtime.engines.embedded import EmbeddedEngine

    settings = Settings(engine="remote", remote_url="http://127.0.0.1:9/v1", remote_fallback=True, hf_token="hf_x")
    engine = create_engine(settings)
    assert isinstance(engine.fallback, EmbeddedEngine)  # type: ignore[attr-defined]
    assert engine.token == "hf_x"  # type: ignore[attr-defined]
    import argparse

    from realtime.config import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args([])
    assert from_namespace(ns, {"OPENAI_API_KEY": "sk-1"}).remote_token == "sk-1"
    both = from_namespace(ns, {"OPENAI_API_KEY": "sk-1", "HF_TOKEN": "hf_2"})
    assert (both.remote_token, both.hf_token) == ("", "hf_2"), "HF_TOKEN goes before OPENAI_API_KEY"


# -- the shared engine base


def test_digital_silence_is_answered_without_decoding():
    engine = ScriptedEngine()
    result = asyncio.run(engine.transcribe(np.zeros(SAMPLE_RATE, dtype=np.float32), FINAL))
    assert (result.text, result.duration, engine.started) == ("", 1.0, [])


def test_quiet_audio_reaches_the_model_raised_and_loud_audio_as_it_is():
    engine = ScriptedEngine()
    quiet, loud = asyncio.run(engine.transcribe_batch([tone(1, 0.005), tone(1, 0.5)], [FINAL, FINAL]))
    assert isinstance(quiet, Transcription) and isinstance(loud, Transcription)
    assert quiet.text == "clip 10 10" and loud.text == "clip 10 50"


def test_audio_over_a_whisper_window_is_cut_for_engines_without_long_form():
    audio = np.concatenate([tone(25, 0.5), tone(1, 0.001) * 0, tone(40, 0.5)])
    cut = ScriptedEngine()
    result = asyncio.run(cut.transcribe(audio, FINAL))
    assert len(cut.started) == 3 and all(int(h.split()[1]) <= 300 for h, _ in cut.started)
    assert [s.text for s in result.segments] == [h for h, _ in cut.started]
    assert result.segments[0].start == 0.0 and result.segments[-1].end == pytest.approx(66.0)
    assert all(a.end == pytest.approx(b.start) for a, b in zip(result.segments, result.segments[1:], strict=False))
    whole = ScriptedEngine(long_form=True)
    assert asyncio.run(whole.transcribe(audio, FINAL)).text == "clip 660 50"


def test_a_batch_reports_errors_per_clip():
    engine = ScriptedEngine(fail_longer_than_s=2)
    ok, failed = asyncio.run(engine.transcribe_batch([tone(1, 0.5), tone(3, 0.5)], [FINAL, FINAL]))
    assert isinstance(ok, Transcription) and ok.text == "clip 10 50"
    assert isinstance(failed, EngineError)
    with pytest.raises(EngineError):
        asyncio.run(engine.transcribe(tone(3, 0.5), FINAL))


def test_the_stream_adapter_joins_pieces_and_skips_silent_ones():
    speech, silence = tone(20, 0.5), np.zeros(40 * SAMPLE_RATE, dtype=np.float32)
    audio = np.concatenate([speech, silence, tone(8, 0.5)])

    async def collect(engine: ScriptedEngine) -> list[str]:
        return [d async for d in engine.transcribe_stream(audio, FINAL)]

    streaming = ScriptedEngine(streaming=True)
    deltas = asyncio.run(collect(streaming))
    assert len(deltas) > 3, "a streaming engine gives several deltas"
    heard = [h for h, _ in streaming.started]
    assert len(heard) == 2, "the silent piece is not decoded"
    assert "".join(deltas).split() == " ".join(heard).split()
    one = ScriptedEngine()  # not streaming: the whole text of each piece in one delta
    assert len(asyncio.run(collect(one))) == 2


# -- the worker


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_the_worker_runs_finals_before_partials_and_coalesces_partials():
    async def scenario() -> tuple[list[str], int, bool]:
        engine = ScriptedEngine(max_batch_size=1)
        worker = Worker(engine, batch_size=1)
        worker.start()
        engine.hold()
        first = worker.submit(Job("a", 0, tone(1.0, 0.5), "partial", PARTIAL))
        await _settle()  # the first partial is decoding, held at the gate
        shed = worker.submit(Job("b", 0, tone(1.1, 0.5), "partial", PARTIAL))
        newer = worker.submit(Job("b", 0, tone(1.2, 0.5), "partial", PARTIAL))
        final = worker.submit(Job("a", 0, tone(1.3, 0.5), "final", FINAL))
        engine.release()
        await asyncio.gather(first, newer, final)
        await worker.stop()
        return [h for h, _ in engine.started], worker.stats.partials_shed, shed.cancelled()

    order, shed, cancelled = asyncio.run(scenario())
    assert order == ["clip 10 50", "clip 13 50", "clip 12 50"], "the final goes first; the older partial is dropped"
    assert shed == 1 and cancelled


def test_finals_that_wait_go_together_as_one_batch():
    async def scenario() -> list[int]:
        engine = ScriptedEngine(max_batch_size=4)
        worker = Worker(engine, batch_size=4)
        worker.start()
        engine.hold()
        futures = [worker.submit(Job("a", 0, tone(1.0, 0.5), "final", FINAL))]
        await _settle()
        futures += [worker.submit(Job(s, i, tone(1.0 + i / 10, 0.5), "final", FINAL)) for i, s in
                    enumerate("bcd", 1)]
        engine.release()
        await asyncio.gather(*futures)
        await worker.stop()
        return engine.batches

    assert asyncio.run(scenario()) == [1, 3]


def test_an_abortable_engine_stops_decoding_a_stale_partial():
    async def scenario() -> tuple[list[str], list[str], str]:
        engine = ScriptedEngine(abortable=True)
        worker = Worker(engine, batch_size=4)
        worker.start()
        engine.hold()
        stale = worker.submit(Job("a", 0, tone(1.0, 0.5), "partial", PARTIAL))
        await _settle()
        worker.drop_partial("a")  # the segment closed: its running partial is stale
        await _settle()
        engine.release()
        final = await worker.submit(Job("a", 0, tone(1.5, 0.5), "final", FINAL))
        await worker.stop()
        assert stale.cancelled()
        return engine.cancelled, engine.finished, final.text

    cancelled, finished, text = asyncio.run(scenario())
    assert cancelled == ["clip 10 50"] and finished == ["clip 15 50"] and text == "clip 15 50"


def test_a_streaming_engine_shows_the_text_so_far():
    async def scenario() -> tuple[list[str], str]:
        engine = ScriptedEngine(streaming=True)
        worker = Worker(engine, batch_size=2)
        worker.start()
        seen: list[str] = []
        result = await worker.submit(Job("a", 0, tone(2.0, 0.5), "partial", PARTIAL, on_text=seen.append))
        await worker.stop()
        return seen, result.text

    seen, text = asyncio.run(scenario())
    assert seen == ["clip", "clip 20", "clip 20 50"] and text == "clip 20 50"


def test_file_jobs_wait_for_live_finals_and_take_turns_with_partials():
    async def scenario() -> list[str]:
        engine = ScriptedEngine(max_batch_size=1)
        worker = Worker(engine, batch_size=1)
        worker.start()
        engine.hold()
        futures = [worker.submit(Job("a", 0, tone(1.0, 0.5), "final", FINAL))]
        await _settle()
        futures.append(worker.submit(Job("file", 0, tone(2.0, 0.5), "file", FINAL)))
        futures.append(worker.submit(Job("b", 0, tone(1.1, 0.5), "partial", PARTIAL)))
        futures.append(worker.submit(Job("file", 1, tone(2.1, 0.5), "file", FINAL)))
        futures.append(worker.submit(Job("c", 0, tone(1.2, 0.5), "final", FINAL)))
        engine.release()
        await asyncio.gather(*futures)
        await worker.stop()
        return [h for h, _ in engine.started]

    assert asyncio.run(scenario()) == ["clip 10 50", "clip 12 50", "clip 20 50", "clip 11 50", "clip 21 50"]


def test_a_file_is_transcribed_through_the_worker_and_a_closed_reader_leaves_nothing_queued():
    from realtime.live.transcribe import transcribe_file, transcribe_results

    async def scenario() -> tuple[list[str], int, int]:
        engine = ScriptedEngine(max_batch_size=2)
        worker = Worker(engine, batch_size=2)
        worker.start()
        entries = await transcribe_file(DATA / "jfk.flac", worker)
        done = worker.stats.files
        results = transcribe_results(DATA / "jfk.flac", worker, batch_size=1)
        await results.__anext__()
        await results.aclose()  # the client went away after the first segment
        left = worker.pending_files
        await worker.stop()
        return [e.text for e in entries], done, left

    texts, done, left = asyncio.run(scenario())
    assert len(texts) >= 2 and all(t.startswith("clip ") for t in texts) and done == len(texts)
    assert left == 0


# -- a session on its own clock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _play(audio: np.ndarray, engine: ScriptedEngine, partial_interval: float = 0.5
          ) -> tuple[list[object], list[float]]:
    """Feed `audio` in 20 ms frames, the session's clock advancing 20 ms a frame and the worker answering at
    once; returns the events and the clock times at which partials were asked for."""
    clock = Clock()
    events: list[object] = []
    asked: list[float] = []

    async def scenario() -> None:
        worker = Worker(engine, batch_size=engine.max_batch_size)
        worker.start()
        submit = worker.submit

        def spy(job: Job) -> asyncio.Future[Transcription]:
            if job.kind == "partial":
                asked.append(clock.now)
            return submit(job)

        worker.submit = spy  # type: ignore[method-assign]
        session = TranscriptionSession("s", worker, events.append, vad_model=SileroVAD.shared(),
                                       partial_interval=partial_interval, partial_interval_max=2.0, clock=clock)
        for i in range(0, audio.size, 320):
            session.feed(audio[i : i + 320])
            clock.now += 0.02
            await _settle()
        session.flush()
        await _settle()
        await worker.stop()

    asyncio.run(scenario())
    return events, asked


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return np.concatenate([decode_file(DATA / "jfk.flac"), np.zeros(SAMPLE_RATE, dtype=np.float32)])


def test_a_session_reports_each_segment_in_order_on_its_own_clock(jfk):
    events, asked = _play(jfk, ScriptedEngine())
    finals = [e for e in events if isinstance(e, FinalEvent)]
    assert len(finals) >= 2, "JFK's pauses make several segments"
    for final in finals:
        mine = [e for e in events if getattr(e, "segment", None) == final.segment]
        kinds = [type(e) for e in mine]
        assert kinds[0] is SpeechStarted and kinds[-1] is FinalEvent
        assert kinds.index(SpeechStopped) == len(kinds) - 2, "speech stopped, then its final, nothing after"
        partials = [e for e in mine if isinstance(e, PartialEvent)]
        assert partials and all(p.text.startswith(p.committed) for p in partials)
        assert final.text.startswith("clip ") and final.latency < 1.0
        assert final.as_dict()["type"] == "final" and final.as_dict()["audio_end"] == round(final.audio_end, 3)
    assert [f.segment for f in finals] == sorted(f.segment for f in finals)
    gaps = np.diff(asked)
    assert len(asked) >= 10 and gaps.min() >= 0.5 - 1e-6, "partials follow the session's clock, not the wall's"
    slower, asked_slower = _play(jfk, ScriptedEngine(), partial_interval=1.0)
    assert len(asked_slower) < len(asked) and np.diff(asked_slower).min() >= 1.0 - 1e-6
    assert [f.text for f in slower if isinstance(f, FinalEvent)] == [f.text for f in finals]


def test_a_segment_the_engine_fails_on_ends_as_an_error_event(jfk):
    events, _ = _play(jfk, ScriptedEngine(fail_longer_than_s=3.0))
    ends = [e for e in events if isinstance(e, FinalEvent | ErrorEvent)]
    stopped = [e for e in events if isinstance(e, SpeechStopped)]
    assert len(ends) == len(stopped), "every closed segment ends as a final or an error"
    errors = [e for e in ends if isinstance(e, ErrorEvent)]
    assert errors and all("scripted failure" in e.message for e in errors)
    assert describe_clip(np.ones(16000, dtype=np.float32)) == "clip 10 100"
