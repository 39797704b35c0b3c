"""The vLLM Whisper engine service: runs inside the vLLM virtual environment, serves the app over loopback.

The web app (`realtime.engines.vllm`) starts this file with the vLLM environment's interpreter as
`python realtime/engines/vllm_process/service.py --model DIR --config JSON` and supervises it. This module owns:

- resolving the engine configuration for the device it finds (`resolve_engine_args`, a pure function):
  bf16, fp8 KV cache on GPUs of compute capability 8.9 and up (FLASH_ATTN on 9.x, TRITON_ATTN elsewhere),
  CUDA graphs (`enforce_eager=False`; vLLM graphs the decode steps of encoder-decoder models,
  FULL_DECODE_ONLY), a token budget that encodes many 1500-token audio windows per step; on CPU (tests)
  float32, eager, a small KV cache;
- one `AsyncLLM` in this process (its EngineCore runs in a child process vLLM spawns);
- Whisper's decoder prompt, built as token ids: `<|startoftranscript|><|lang|><|task|><|notimestamps|>` for
  multilingual checkpoints, `<|startoftranscript|><|notimestamps|>` for English-only ones, earlier text
  after `<|startofprev|>`, and language detection (one constrained token) when no language is given;
- the HTTP routes: `GET /health`, `POST /v1/transcribe` (body: float32 little-endian 16 kHz mono PCM of at
  most 30 s; answer: NDJSON, one line per decoded token delta, then a final line) and
  `POST /v1/abort/{id}`. A client that disconnects aborts its request inside vLLM.

It imports only the standard library at module level (so the app's tests can check
`resolve_engine_args` without vLLM), and exits when the app that started it is gone.
"""

import argparse
import asyncio
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("realtime.engines.vllm_process")

SAMPLE_RATE = 16000
MAX_SECONDS = 30.0
WINDOW_TOKENS = 1500  # encoder positions of one 30 s window
MAX_MODEL_LEN = 448
MAX_PROMPT_TOKENS = 223
READY_MARK = "REALTIME_VLLM_READY"
SAMPLING_SEED = 0


@dataclass(frozen=True)
class Device:
    kind: str  # "cuda" or "cpu"
    name: str = ""
    capability: tuple[int, int] | None = None
    cpu_flags: frozenset[str] = frozenset()

    def describe(self) -> str:
        if self.kind == "cuda":
            cc = f"{self.capability[0]}.{self.capability[1]}" if self.capability else "?"
            return f"cuda ({self.name}, compute capability {cc})"
        isa = "AVX-512" if "avx512f" in self.cpu_flags else "AVX2" if "avx2" in self.cpu_flags else "x86"
        return f"cpu ({os.cpu_count()} cores, {isa}{', AMX' if 'amx_tile' in self.cpu_flags else ''})"


@dataclass
class Requested:
    """What the app asks for; "auto" (or 0) lets `resolve_engine_args` choose for the device."""

    model: str
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    enforce_eager: str = "auto"  # "auto", "true", "false"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 0
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_mb: int = 1024
    attention_backend: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)


def resolve_engine_args(req: Requested, device: Device) -> dict[str, Any]:
    """The `AsyncEngineArgs` keyword arguments for this device (pure: no vLLM, no torch)."""
    gpu = device.kind == "cuda"
    cc = device.capability or (0, 0)
    if req.kv_cache_dtype == "auto":
        kv = "fp8" if gpu and cc >= (8, 9) else "auto"
    else:
        kv = req.kv_cache_dtype
    if req.dtype == "auto":
        dtype = "bfloat16" if gpu else "float32"
    else:
        dtype = req.dtype
    eager = (not gpu) if req.enforce_eager == "auto" else req.enforce_eager.lower() in ("1", "true", "yes", "on")
    seqs = max(1, req.max_num_seqs)
    # vLLM sizes a request's worst-case cross-attention KV by this budget too: keep it modest on CPU
    windows = seqs if gpu else min(seqs, 4)
    args: dict[str, Any] = {
        "model": req.model,
        "dtype": dtype,
        "kv_cache_dtype": kv,
        "enforce_eager": eager,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": seqs,
        # every new segment needs its whole 30 s window (1500 encoder tokens) in one step
        "max_num_batched_tokens": req.max_num_batched_tokens or WINDOW_TOKENS * windows,
        "limit_mm_per_prompt": {"audio": 1},
        "seed": 0,
    }
    backend = req.attention_backend
    if backend == "auto" and gpu and kv.startswith("fp8"):
        # FlashInfer cannot do cross-attention; FA3 (Hopper) and Triton can store fp8 KV
        backend = "FLASH_ATTN" if cc[0] == 9 else "TRITON_ATTN"
    if backend != "auto" and gpu:
        args["attention_backend"] = backend
    if gpu:
        args["gpu_memory_utilization"] = req.gpu_memory_utilization
        if not eager:
            # vLLM forces this for encoder-decoder models; stating it keeps the logged config honest
            args["compilation_config"] = {"cudagraph_mode": "FULL_DECODE_ONLY"}
    else:
        # on CPU "gpu_memory_utilization" would reserve a share of RAM; give the KV cache a fixed size instead
        args["kv_cache_memory_bytes"] = req.cpu_kv_cache_mb << 20
    args.update(req.extra)
    return args


WHISPER_HEAD_SIZE = 64  # every Whisper size, tiny to large-v3(-turbo)


def backend_refusals(args: dict[str, Any], capability: tuple[int, int]) -> list[str]:
    """Why vLLM's own attention backend class refuses the chosen backend for Whisper's attention (decoder
    self-attention and cross-attention) with these arguments on a GPU of this compute capability; empty when it
    takes them or when the backend is left to vLLM. Flash-attention's fp8 answer depends on the flash-attention
    build of the host that asks, so it is exact only on the GPU host itself."""
    import inspect

    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backend import AttentionType
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    name = args.get("attention_backend")
    if not name:
        return []
    backend = AttentionBackendEnum[str(name)].get_class()
    accepted = inspect.signature(backend.validate_configuration).parameters
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(args.get("dtype")), torch.float32)
    reasons: list[str] = []
    for kind in (AttentionType.DECODER, AttentionType.ENCODER_DECODER):
        ask = {"head_size": WHISPER_HEAD_SIZE, "dtype": dtype, "kv_cache_dtype": args.get("kv_cache_dtype", "auto"),
               "block_size": None, "use_mla": False, "has_sink": False, "use_sparse": False, "use_mm_prefix": False,
               "use_per_head_quant_scales": False, "device_capability": DeviceCapability(*capability),
               "attn_type": kind}
        for reason in backend.validate_configuration(**{k: v for k, v in ask.items() if k in accepted}):
            if reason not in reasons:
                reasons.append(reason)
    return reasons


def check_args(req: Requested, gpu: str) -> dict[str, Any]:
    """vLLM's own reading of the arguments `resolve_engine_args` makes for a GPU ("NAME:MAJOR.MINOR")."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    name, _, cc = gpu.rpartition(":")
    major, minor = (int(x) for x in cc.split("."))
    parsed = AsyncEngineArgs(**resolve_engine_args(req, Device("cuda", name, (major, minor))))
    return {
        "gpu": name, "capability": cc, "dtype": parsed.dtype, "kv_cache_dtype": parsed.kv_cache_dtype,
        "attention_backend": str(parsed.attention_backend) if parsed.attention_backend else None,
        "enforce_eager": parsed.enforce_eager,
        "cudagraph_mode": str(parsed.compilation_config.cudagraph_mode).split(".")[-1],
        "max_num_seqs": parsed.max_num_seqs, "max_num_batched_tokens": parsed.max_num_batched_tokens,
        "max_model_len": parsed.max_model_len, "gpu_memory_utilization": parsed.gpu_memory_utilization,
        "backend_refusals": backend_refusals(resolve_engine_args(req, Device("cuda", name, (major, minor))),
                                             (major, minor)),
    }


def detect_device() -> Device:
    flags: frozenset[str] = frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^flags\s*:(.*)$", text, re.M)
        flags = frozenset(m.group(1).split()) if m else frozenset()
    except OSError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return Device("cuda", torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0)), flags)
    except Exception:  # a CPU-only torch, or no driver
        pass
    return Device("cpu", "", None, flags)


# -- tokens and prompts


@dataclass(frozen=True)
class Vocabulary:
    sot: int
    eot: int
    sot_prev: int
    no_timestamps: int
    transcribe: int
    translate: int
    languages: dict[str, int]  # "en" -> token id (empty for English-only checkpoints)
    suppress: tuple[int, ...]
    multilingual: bool

    @classmethod
    def load(cls, token_to_id: Callable[[str], Any], id_to_token: Callable[[int], Any],
             model_dir: Path | None) -> "Vocabulary":
        """From a tokenizer's lookups and the checkpoint's config.json / generation_config.json."""

        def tid(token: str) -> int:
            i = token_to_id(token)
            if not isinstance(i, int) or i < 0:
                raise ValueError(f"the tokenizer has no {token}")
            return i

        gen: dict[str, Any] = {}
        cfg: dict[str, Any] = {}
        if model_dir is not None:
            if (model_dir / "generation_config.json").exists():
                gen = json.loads((model_dir / "generation_config.json").read_text())
            if (model_dir / "config.json").exists():
                cfg = json.loads((model_dir / "config.json").read_text())
        eot = tid("<|endoftext|>")
        if "is_multilingual" in gen:
            multilingual = bool(gen["is_multilingual"])
        elif cfg.get("vocab_size"):
            multilingual = int(cfg["vocab_size"]) >= 51865
        else:
            multilingual = eot != 50256  # English-only vocabularies end GPT-2's at 50256
        languages: dict[str, int] = {}
        if multilingual:
            if gen.get("lang_to_id"):
                languages = {k.strip("<|>"): int(v) for k, v in gen["lang_to_id"].items()}
            else:
                sot, translate = tid("<|startoftranscript|>"), tid("<|translate|>")
                for i in range(sot + 1, translate):
                    tok = id_to_token(i)
                    if isinstance(tok, str) and re.fullmatch(r"<\|[a-z]{2,3}(_[A-Za-z]+)?\|>", tok):
                        languages[tok.strip("<|>")] = i
        suppress = tuple(int(t) for t in (gen.get("suppress_tokens") or cfg.get("suppress_tokens") or []))
        return cls(
            sot=tid("<|startoftranscript|>"), eot=eot, sot_prev=tid("<|startofprev|>"),
            no_timestamps=tid("<|notimestamps|>"), transcribe=tid("<|transcribe|>"),
            translate=tid("<|translate|>"), languages=languages, suppress=suppress, multilingual=multilingual,
        )

    def decoder_prompt(self, language: str | None, task: str, previous: list[int]) -> list[int]:
        """Whisper's decoder prompt as token ids; English-only checkpoints take neither language nor task."""
        prefix = [self.sot_prev, *previous[-MAX_PROMPT_TOKENS:]] if previous else []
        if not self.multilingual:
            return [*prefix, self.sot, self.no_timestamps]
        lang = self.languages.get(language or "en")
        if lang is None:
            raise ValueError(f"unknown language {language!r}")
        return [*prefix, self.sot, lang, self.translate if task == "translate" else self.transcribe,
                self.no_timestamps]


def keep_decoder_prompts() -> bool:
    """Whether vLLM is told that the service's decoder prompts are whole, as Whisper's format has them.

    vLLM puts the model's `decoder_start_token_id` (<|startoftranscript|>) before a decoder prompt that does not
    begin with it, which would turn a prompt with earlier text (<|startofprev|> ... <|startoftranscript|> ...) into
    one that begins twice. Its multimodal processors that supply the whole prefix say so with
    `skip_decoder_start_token`; the service builds every prompt whole, so Whisper's processor says so too. False
    where this vLLM has no such flag (each request's prompt, as vLLM reports it, is still checked).
    """
    try:
        from vllm.model_executor.models.whisper import WhisperMultiModalProcessor
    except ImportError:
        return False
    if not hasattr(WhisperMultiModalProcessor, "skip_decoder_start_token"):
        return False
    WhisperMultiModalProcessor.skip_decoder_start_token = True
    return True


# -- the service


class Service:
    def __init__(self, requested: Requested, device: Device) -> None:
        self.requested = requested
        self.device = device
        self.args = resolve_engine_args(requested, device)
        self.engine: Any = None
        self.vocab: Vocabulary | None = None
        self.tokenizer: Any = None
        self.effective: dict[str, Any] = {}
        self.stats = {"requests": 0, "finished": 0, "aborted": 0, "failed": 0, "running": 0, "peak_running": 0,
                      "batched": 0, "prompt_rewritten": 0}
        """Request counters (`/health`); "batched" counts the requests that came while another was decoding, so
        that vLLM decoded them together."""
        self.startup_s = 0.0
        self._ids = 0

    async def load(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.perf_counter()
        if self.device.kind == "cuda":  # vLLM's advice for Whisper (its CPU platform always spawns)
            os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
            if self.device.capability and (refused := backend_refusals(self.args, self.device.capability)):
                raise ValueError(f"vLLM's {self.args['attention_backend']} attention refuses Whisper with KV cache "
                                 f"{self.args.get('kv_cache_dtype')} on {self.device.describe()}: "
                                 f"{'; '.join(refused)} (choose --vllm-attention-backend or --vllm-kv-cache-dtype)")
        as_given = keep_decoder_prompts()
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self.args))
        self.tokenizer = self.engine.get_tokenizer()
        model_dir = Path(self.args["model"]) if Path(self.args["model"]).is_dir() else None
        if model_dir is None:
            try:
                from huggingface_hub import snapshot_download

                model_dir = Path(snapshot_download(self.args["model"], allow_patterns=["*.json"]))
            except Exception:
                model_dir = None
        self.vocab = Vocabulary.load(self.tokenizer.convert_tokens_to_ids, self.tokenizer.convert_ids_to_tokens,
                                     model_dir)
        cfg = self.engine.vllm_config
        self.effective = {
            "device": self.device.describe(),
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "kv_cache_dtype": str(cfg.cache_config.cache_dtype),
            "enforce_eager": bool(cfg.model_config.enforce_eager),
            "cudagraph_mode": str(getattr(cfg.compilation_config, "cudagraph_mode", None)).split(".")[-1],
            "max_num_seqs": cfg.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "max_model_len": cfg.model_config.max_model_len,
            "attention_backend": str(getattr(cfg.attention_config, "backend", None) or "auto"),
            "multilingual": self.vocab.multilingual,
            "decoder_prompt_as_given": as_given,
        }
        if self.device.kind == "cuda":
            self.effective["gpu_memory_utilization"] = cfg.cache_config.gpu_memory_utilization
        else:
            self.effective["kv_cache_memory_mb"] = (cfg.cache_config.kv_cache_memory_bytes or 0) >> 20
        # warm-up: the first request pays for allocations and kernel selection
        import numpy as np

        warm = (0.01 * np.sin(np.arange(SAMPLE_RATE) / 5.0)).astype(np.float32)
        async for _ in self.generate(warm, language="en", task="transcribe", prompt=None, max_tokens=4,
                                     temperature=0.0, request_id="warmup"):
            pass
        self.startup_s = time.perf_counter() - t0
        log.info("vLLM engine ready in %.1fs: %s", self.startup_s, json.dumps(self.effective))

    def health(self) -> dict[str, Any]:
        return {
            "ready": self.engine is not None and self.vocab is not None,
            "pid": os.getpid(),
            "model": self.args["model"],
            "config": self.effective,
            "engine_args": {k: v for k, v in self.args.items() if k != "model"},
            "startup_s": round(self.startup_s, 2),
            "stats": dict(self.stats),
        }

    async def detect_language(self, audio: Any, request_id: str) -> str:
        from vllm import SamplingParams

        assert self.vocab is not None
        by_id = {v: k for k, v in self.vocab.languages.items()}
        prompt = {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, SAMPLE_RATE)}},
                  "decoder_prompt": {"prompt_token_ids": [self.vocab.sot]}}
        params = SamplingParams(temperature=0.0, max_tokens=1, allowed_token_ids=list(by_id))
        token = None
        async for out in self.engine.generate(prompt, params, request_id + "-lang"):
            if out.outputs and out.outputs[0].token_ids:
                token = out.outputs[0].token_ids[0]
        return by_id.get(token, "en") if token is not None else "en"

    async def generate(self, audio: Any, language: str | None, task: str, prompt: str | None, max_tokens: int,
                       temperature: float, request_id: str) -> AsyncIterator[dict[str, Any]]:
        """Token deltas of one clip, then a final record; closing the iterator aborts the request in vLLM."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        assert self.vocab is not None
        t0 = time.perf_counter()
        if self.vocab.multilingual and not language:
            language = await self.detect_language(audio, request_id)
        elif not self.vocab.multilingual:
            language, task = "en", "transcribe"
        previous = self.tokenizer.encode(" " + prompt.strip(), add_special_tokens=False) if prompt else []
        decoder = self.vocab.decoder_prompt(language, task, previous)
        max_tokens = max(1, min(max_tokens, MAX_MODEL_LEN - len(decoder)))
        params = SamplingParams(
            temperature=temperature, max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA, logprobs=0,
            logit_bias={t: -100.0 for t in self.vocab.suppress} or None, skip_special_tokens=True,
            # a sampled retry draws from its own generator: the same clip reads the same, whatever it is batched with
            seed=SAMPLING_SEED if temperature > 0 else None,
        )
        request = {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, SAMPLE_RATE)}},
                   "decoder_prompt": {"prompt_token_ids": decoder}}
        text: list[str] = []
        tokens: list[int] = []
        logprobs: list[float] = []  # each token's, in order
        finish = None
        first_token_s = None
        decoded_from: list[int] | None = None
        self.stats["requests"] += 1
        if self.stats["running"]:
            self.stats["batched"] += 1
        self.stats["running"] += 1
        self.stats["peak_running"] = max(self.stats["peak_running"], self.stats["running"])
        status = "failed"
        outputs = self.engine.generate(request, params, request_id)
        try:
            async for out in outputs:
                if decoded_from is None and out.prompt_token_ids is not None:
                    decoded_from = list(out.prompt_token_ids)
                    if decoded_from != decoder:
                        self.stats["prompt_rewritten"] += 1
                        log.warning("vLLM decodes request %s from %s, not the prompt %s", request_id, decoded_from,
                                    decoder)
                o = out.outputs[0]
                if o.token_ids:
                    if first_token_s is None:
                        first_token_s = time.perf_counter() - t0
                    tokens.extend(o.token_ids)
                    given = list(o.logprobs or [])
                    logprobs += [float(lp[tid].logprob) if k < len(given) and tid in (lp := given[k]) else 0.0
                                 for k, tid in enumerate(o.token_ids)]
                    if o.text:
                        text.append(o.text)
                        yield {"delta": o.text, "tokens": len(tokens)}
                if out.finished:
                    finish = o.finish_reason
            status = "aborted" if finish == "abort" else "finished"  # aborted by /v1/abort while it streamed
        except (GeneratorExit, asyncio.CancelledError):
            status = "aborted"
            log.info("request %s aborted after %d tokens", request_id, len(tokens))
            raise
        finally:
            await outputs.aclose()  # aborts the request in vLLM if it is still running
            self.stats["running"] -= 1
            self.stats[status] += 1
        yield {
            "done": True, "text": "".join(text).strip(), "token_ids": tokens, "language": language,
            "finish_reason": finish, "avg_logprob": sum(logprobs) / (len(tokens) + 1),
            "token_logprobs": logprobs, "token_spellings": self.tokenizer.convert_ids_to_tokens(tokens),
            "eot": self.vocab.eot,
            "engine_seconds": time.perf_counter() - t0, "first_token_s": first_token_s,
            "decoder_prompt": decoder, "decoded_from": decoded_from,
        }

    def next_id(self) -> str:
        self._ids += 1
        return f"t{self._ids}"


def build_app(service: Service) -> Any:
    import numpy as np
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="realtime vLLM Whisper engine")

    @app.get("/health")
    async def health() -> Any:
        return service.health()

    @app.post("/v1/abort/{request_id}")
    async def abort(request_id: str) -> Any:
        await service.engine.abort(request_id)
        return {"aborted": request_id}

    @app.post("/v1/transcribe")
    async def transcribe(request: Request) -> Any:
        q = request.query_params
        body = await request.body()
        if len(body) % 4:
            return JSONResponse({"error": "the body must be float32 samples"}, status_code=400)
        audio = np.frombuffer(body, dtype="<f4").astype(np.float32)
        if audio.size > MAX_SECONDS * SAMPLE_RATE:
            return JSONResponse({"error": f"clip of {audio.size / SAMPLE_RATE:.1f}s: at most {MAX_SECONDS:.0f}s "
                                          "per request (split longer audio)"}, status_code=413)
        language = q.get("language") or None
        assert service.vocab is not None
        if language and service.vocab.multilingual and language not in service.vocab.languages:
            return JSONResponse({"error": f"unknown language {language!r}"}, status_code=400)
        duration = audio.size / SAMPLE_RATE
        max_tokens = int(q.get("max_tokens") or 0) or int(10 + 10 * duration)
        stream = service.generate(
            audio, language, q.get("task") or "transcribe", q.get("prompt") or None, max_tokens,
            float(q.get("temperature") or 0.0), q.get("id") or service.next_id(),
        )

        async def lines() -> AsyncIterator[bytes]:
            try:
                async for item in stream:
                    yield (json.dumps(item) + "\n").encode()
            except Exception as exc:  # reported in-band: the status line is already sent
                log.exception("transcription failed")
                yield (json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n").encode()
            finally:
                await stream.aclose()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    return app


def _watch_parent(parent: int) -> None:
    """Exit (taking vLLM's engine process with us) once the app that started us is gone."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            log.warning("the app (pid %d) is gone; stopping", parent)
            try:
                os.killpg(os.getpgid(0), signal.SIGTERM)
            finally:
                os._exit(0)


async def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    requested = Requested(**json.loads(args.config))
    device = detect_device()
    service = Service(requested, device)
    log.info("device: %s; engine arguments: %s", device.describe(), json.dumps(service.args))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    await service.load()
    config = uvicorn.Config(build_app(service), log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    ready = {"port": sock.getsockname()[1], "pid": os.getpid(), **service.health()}

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.05)
        print(f"{READY_MARK} {json.dumps(ready)}", flush=True)

    announcer = loop.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()
        service.engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="vLLM Whisper engine service for the real-time transcription app")
    parser.add_argument("--config", required=True, help="JSON of the requested engine settings (see Requested)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--parent-pid", type=int, default=0)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--check-args", nargs="+", metavar="GPU_NAME:MAJOR.MINOR",
                        help="build vLLM's AsyncEngineArgs for these GPUs (e.g. 'NVIDIA H100:9.0'), print them as "
                             "vLLM parsed them, and exit: the GPU configuration, checked without a GPU")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stdout,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.check_args:
        print(json.dumps([check_args(Requested(**json.loads(args.config)), gpu) for gpu in args.check_args]))
        return 0
    if args.parent_pid:
        threading.Thread(target=_watch_parent, args=(args.parent_pid,), daemon=True).start()
    try:
        asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        # one line the app shows as the reason it could not start
        print(f"REALTIME_VLLM_ERROR {type(exc).__name__}: {_root_cause(exc)}", flush=True)
        return 1
    return 0


def _root_cause(exc: BaseException) -> str:
    seen = exc
    while seen.__cause__ is not None or seen.__context__ is not None:
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    text = str(seen).strip() or type(seen).__name__
    outer = str(exc).strip()
    return text if text == outer or not outer else f"{outer} ({text})"


if __name__ == "__main__":
    sys.exit(main())
