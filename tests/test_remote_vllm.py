"""The remote engine against vLLM's own OpenAI-compatible server (`vllm serve`), run from .venv-vllm on CPU.

One server for the module, on 127.0.0.1, serving the multilingual Whisper base converted from its CTranslate2
package (vLLM's server always writes the multilingual decoder prompt, so an English-only checkpoint would not
do). Nothing is mocked: the engine learns the served model name from /v1/models, sends real speech, reads
vLLM's JSON and SSE replies; `python -m realtime transcribe --engine remote` goes through it as users run it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from realtime.audio import decode_file
from realtime.engines import EngineError, TranscribeOptions, Transcription
from realtime.engines.convert import cached_checkpoint
from realtime.engines.remote import RemoteEngine
from realtime.live.worker import Job, Worker

from conftest import BASE, ROOT, free_port, gone
from speech import SENTENCES, compose, wer

T = TypeVar("T")
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
START_TIMEOUT_S = 480  # about a minute on 2 idle cores; CI machines are shared (pytest-timeout: 600 s)
EN = TranscribeOptions(language="en")


@dataclass
class Server:
    url: str
    model: str
    """The name vLLM serves the checkpoint under (the only `model` field it accepts)."""
    proc: subprocess.Popen[bytes]
    log: Path
    startup_s: float


@pytest.fixture(scope="module")
def vllm_server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    checkpoint = cached_checkpoint(BASE, cache_dir)
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
           "--max-model-len", "448", "--max-num-seqs", "4", "--max-num-batched-tokens", "6000",
           "--kv-cache-memory-bytes", str(512 << 20), "--limit-mm-per-prompt", '{"audio": 1}',
           "--disable-log-stats", "--uvicorn-log-level", "warning"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1"}
    t0 = time.monotonic()
    # its own process group: vLLM's EngineCore and worker processes go with it at the end
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        model = _wait_ready(proc, url, log)
        server = Server(url, model, proc, log, time.monotonic() - t0)
        print(f"vLLM server ready in {server.startup_s:.0f} s, serving {model}")
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        if not gone(proc.pid, wait=30):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        assert gone(proc.pid), "vLLM's processes outlived the server"


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> str:
    """Wait until /health answers 200, then return the served model name from /v1/models."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vLLM's server not ready after {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


def run(coro: Coroutine[Any, Any, T]) -> T:  # one event loop per test: the engine's client lives in it
    return asyncio.run(coro)


async def started(server: Server, **kw: Any) -> RemoteEngine:
    engine = RemoteEngine(f"{server.url}/v1/audio/transcriptions", **kw)
    await engine.start()
    return engine


def test_served_model_name_learned_and_accepted(vllm_server, speech_dir):
    """The remote engine learns the name vLLM serves the model under and every kind of request it sends is accepted
    (language given or detected, timestamps, translation, a prompt it leaves out); a name the server does not serve
    is refused with the server's reason, not retried."""
    speech = compose(speech_dir / "rv-two.wav", SENTENCES[1:3], gaps=1.0)
    audio = decode_file(speech.path)

    async def scenario() -> tuple[dict[str, Any], list[Transcription]]:
        engine = await started(vllm_server)
        try:
            results = list(await asyncio.gather(  # at once: the server batches them
                engine.transcribe(audio, EN),
                engine.transcribe(audio, TranscribeOptions()),  # no language: the server detects it
                engine.transcribe(audio, TranscribeOptions(language="en", timestamps=True)),
                engine.transcribe(audio, TranscribeOptions(task="translate")),  # /v1/audio/translations
                # vLLM's server writes <|prev|> before a prompt (vllm#53206) and Whisper then loops on a word:
                # the engine does not send it the prompt
                engine.transcribe(audio, TranscribeOptions(language="en", prompt="Breakfast at home.")),
            ))
            return engine.describe(), results
        finally:
            await engine.close()

    info, results = run(scenario())
    endpoint = info["endpoints"][0]
    assert endpoint["model"] == vllm_server.model and vllm_server.model in info["model"]
    assert info["ready"] and endpoint["requests"] == len(results) and endpoint["errors"] == 0
    for result in results:
        assert wer(speech.text, result.text) <= 0.2, result.text
    timed = results[2]
    assert timed.language == "en" and timed.segments and timed.segments[-1].end >= 5.0

    async def wrong_name() -> None:  # a name the server does not serve: refused with its reason, not retried
        engine = await started(vllm_server, model="whisper-1")
        try:
            await engine.transcribe(audio, EN)
        finally:
            await engine.close()

    with pytest.raises(EngineError, match=r"rejected the segment.*404.*whisper-1"):
        run(wrong_name())


def test_sse_deltas_stream_as_partials_and_join_to_the_final(vllm_server, speech_dir):
    """vLLM's Server-Sent Events give a delta per token; joined they are the plain answer, and a live partial shows
    them as they come."""
    speech = compose(speech_dir / "rv-stream.wav", SENTENCES[4:6], gaps=0.8)
    audio = decode_file(speech.path)

    async def scenario() -> tuple[list[str], list[str], Transcription, Transcription]:
        plain = await started(vllm_server)
        streaming = await started(vllm_server, stream=True)
        worker = Worker(streaming, batch_size=2)
        worker.start()
        try:
            whole = await plain.transcribe(audio, EN)
            deltas = [d async for d in streaming.transcribe_stream(audio, EN)]
            seen: list[str] = []  # what the page shows while a partial decodes
            job = Job("s", 0, audio, "partial", TranscribeOptions(language="en", partial=True), on_text=seen.append)
            partial = await worker.submit(job)
            return deltas, seen, partial, whole
        finally:
            await worker.stop()
            await streaming.close()
            await plain.close()

    deltas, seen, partial, whole = run(scenario())
    assert wer(speech.text, whole.text) <= 0.2, whole.text
    assert len(deltas) >= 10, "vLLM streams a delta per token"
    assert "".join(deltas).strip() == whole.text
    assert len(seen) >= 10 and all(b.startswith(a) for a, b in itertools.pairwise(seen))
    assert seen[-1] == partial.text == whole.text


def test_audio_over_30_s_and_segments_at_once(vllm_server, speech_dir):
    """Audio over 30 s comes back whole (the server splits it), and segments sent at once come back each with its
    own text."""
    long = compose(speech_dir / "rv-long.wav", SENTENCES[1:8], gaps=1.5)
    long_audio = decode_file(long.path)
    assert long_audio.size > 31 * 16000  # over Whisper's 30 s window: vLLM's server splits it
    texts = [SENTENCES[2], SENTENCES[4], SENTENCES[5]]
    clips = [decode_file(compose(speech_dir / f"rv-batch-{i}.wav", [t]).path) for i, t in enumerate(texts)]

    async def scenario() -> tuple[Transcription, float, list[Transcription | BaseException]]:
        engine = await started(vllm_server)
        try:
            t0 = time.perf_counter()
            result = await engine.transcribe(long_audio, EN)
            seconds = time.perf_counter() - t0
            return result, seconds, await engine.transcribe_batch(clips, [EN] * len(clips))
        finally:
            await engine.close()

    result, seconds, batch = run(scenario())
    print(f"{long_audio.size / 16000:.1f} s of audio in {seconds:.1f} s (RTFx {long_audio.size / 16000 / seconds:.1f}),"
          f" WER {wer(long.text, result.text):.3f}")
    assert wer(long.text, result.text) <= 0.25, result.text
    assert "store" in result.text.lower()[-30:], "the end of the audio was dropped"
    for text, got in zip(texts, batch, strict=True):
        assert isinstance(got, Transcription), got
        assert wer(text, got.text) <= 0.25, (text, got.text)
        assert all(wer(other, got.text) > 0.7 for other in texts if other != text), "transcripts were mixed"


def test_transcribe_command_through_the_vllm_server(vllm_server, speech_dir):
    """`python -m realtime transcribe --engine remote` against `vllm serve`, as users run it."""
    speech = compose(speech_dir / "rv-cli.wav", SENTENCES[5:8], gaps=1.2)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "realtime", "transcribe", "--engine", "remote", "--remote-url",
                          f"{vllm_server.url}/v1/audio/transcriptions", str(speech.path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert wer(speech.text, out.stdout) <= 0.2, out.stdout
    assert len([line for line in out.stdout.splitlines() if line.strip()]) == 1  # the 3 segments packed into one window
