"""The GPU check: the vLLM engine on a host with an NVIDIA GPU, measured the way a user can paste into an issue.

    python -m realtime bench gpu [--model openai/whisper-large-v3-turbo] [--concurrency 1,16,64] [--out DIR]

For each KV cache dtype (fp8, then the model's own): the engine's start-up time and effective configuration
(attention backend, KV dtype, CUDA graphs, as `/health` reports them), WER on the real clips of `tests/data`,
RTFx and time to first token with 1, 16 and 64 requests at once, an abort inside vLLM, and the GPU memory given
back at stop. Beside them, transformers on the same GPU and the same clips (in vLLM's environment, which has a
CUDA torch). Writes DIR/bench-gpu.json and DIR/bench-gpu.md. Without an NVIDIA GPU it says so and exits 2;
`--allow-cpu` runs the same steps on vLLM's CPU build (a dry run of the check itself, not a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..audio import SAMPLE_RATE, decode_file
from ..config import Settings
from .corpus import Clip, corpus_wer, read_manifest

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "tests" / "data" / "manifest.tsv"
NO_GPU_EXIT = 2

TRANSFORMERS_SCRIPT = r"""
import json, sys, time
import numpy as np, torch
from transformers import WhisperForConditionalGeneration, WhisperProcessor
spec = json.loads(sys.argv[1])
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
processor = WhisperProcessor.from_pretrained(spec["model"])
model = WhisperForConditionalGeneration.from_pretrained(spec["model"], torch_dtype=dtype).to(device).eval()
audios = [np.fromfile(p, dtype=np.float32) for p in spec["clips"]]
ask = {"language": "en", "task": "transcribe"} if model.generation_config.is_multilingual else {}
def run(batch, new_tokens):
    feats = processor(batch, sampling_rate=16000, return_tensors="pt").input_features.to(device, dtype)
    with torch.inference_mode():
        ids = model.generate(feats, max_new_tokens=new_tokens, **ask)
    if device == "cuda":
        torch.cuda.synchronize()
    return processor.batch_decode(ids, skip_special_tokens=True)
run(audios[:1], 4)
texts = []
for i in range(0, len(audios), 16):
    texts += [t.strip() for t in run(audios[i:i + 16], 440)]
steps = []
for n in spec["concurrency"]:
    batch = [audios[i % len(audios)] for i in range(n)]
    t0 = time.perf_counter(); run(batch, 1); first = time.perf_counter() - t0
    t0 = time.perf_counter(); run(batch, 440); wall = time.perf_counter() - t0
    steps.append({"concurrency": n, "rtfx": sum(a.size for a in batch) / 16000 / wall, "first_token_s": first})
print("RESULT " + json.dumps({"texts": texts, "steps": steps, "device": device}))
"""


def gpu_info() -> dict[str, Any] | None:
    """The first NVIDIA GPU as nvidia-smi reports it (name, compute capability, memory used and total in MiB), or
    None where there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,compute_cap,memory.used,memory.total",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    name, cap, used, total = (x.strip() for x in out.stdout.strip().splitlines()[0].split(","))
    return {"name": name, "compute_capability": cap, "memory_used_mib": int(used), "memory_total_mib": int(total)}


def _gpu_memory_used() -> int | None:
    info = gpu_info()
    return info["memory_used_mib"] if info else None


async def _engine_run(settings: Settings, clips: list[Clip], audios: list[Any], concurrency: list[int],
                      on_gpu: bool) -> dict[str, Any]:
    from ..engines.types import TranscribeOptions
    from ..engines.vllm import VllmEngine

    engine = VllmEngine.from_settings(settings)
    before = _gpu_memory_used() if on_gpu else None
    t0 = time.perf_counter()
    await engine.start()
    row: dict[str, Any] = {"startup_s": round(time.perf_counter() - t0, 1)}
    try:
        health = await engine.service_health()
        row["config"] = health.get("config", {})
        row["model"] = health.get("model")
        row["memory_in_use_mib"] = _gpu_memory_used() if on_gpu else None
        english = [TranscribeOptions(language="en")] * len(audios)
        results = await engine.transcribe_batch(audios, english)
        failed = [r for r in results if isinstance(r, BaseException)]
        texts = ["" if isinstance(r, BaseException) else r.text for r in results]
        row["wer"] = round(corpus_wer([c.text for c in clips], texts), 4)
        row["failed"] = len(failed)
        row["steps"] = []
        for n in concurrency:
            batch = [audios[i % len(audios)] for i in range(n)]
            t1 = time.perf_counter()
            done = await asyncio.gather(*(engine.transcribe(a, TranscribeOptions(language="en")) for a in batch),
                                        return_exceptions=True)
            wall = time.perf_counter() - t1
            firsts = [r.extra.get("first_token_s") for r in done if not isinstance(r, BaseException)]
            firsts = [f for f in firsts if f is not None]
            row["steps"].append({"concurrency": n, "rtfx": round(sum(a.size for a in batch) / SAMPLE_RATE / wall, 1),
                                 "first_token_p50_s": round(statistics.median(firsts), 3) if firsts else None,
                                 "failed": sum(isinstance(r, BaseException) for r in done)})
        row["abort"] = await _abort(engine, max(audios, key=len))
    finally:
        await engine.close()
    if on_gpu:
        await asyncio.sleep(3)
        after = _gpu_memory_used()
        row["memory_after_stop_mib"] = after
        row["memory_released"] = after is not None and before is not None and after <= before + 256
    return row


async def _abort(engine: Any, audio: Any) -> bool:
    """Whether a request left after its first text is aborted inside vLLM (the service counts it)."""
    from ..engines.types import TranscribeOptions

    before = (await engine.service_health())["stats"]["aborted"]
    stream = engine.transcribe_stream(audio, TranscribeOptions(language="en", partial=True))
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(50):
        if (await engine.service_health())["stats"]["aborted"] > before:
            return True
        await asyncio.sleep(0.1)
    return False


def _transformers_run(model_dir: str, python: str, clips_f32: list[Path], concurrency: list[int]) -> dict[str, Any]:
    spec = {"model": model_dir, "clips": [str(p) for p in clips_f32], "concurrency": concurrency}
    out = subprocess.run([python, "-c", TRANSFORMERS_SCRIPT, json.dumps(spec)], capture_output=True, text=True,
                         timeout=3600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode != 0 or line is None:
        return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(line[len("RESULT "):])


def table(doc: dict[str, Any]) -> str:
    lines = [f"GPU check: {doc['model']} on {doc['device']}, {doc['clips']} real clips ({doc['audio_s']:.0f} s), "
             f"vLLM engine through this app against transformers on the same device.", "",
             "| engine | KV cache | backend | CUDA graphs | start-up (s) | WER | "
             + " | ".join(f"RTFx / first token at {n}" for n in doc["concurrency"]) + " | abort | memory released |",
             "|---|---|---|---|---|---|" + "---|" * len(doc["concurrency"]) + "---|---|"]
    for kv, row in doc["vllm"].items():
        if "error" in row:
            lines.append(f"| vLLM | {kv} | | | | error: {row['error']} |" + " |" * (len(doc["concurrency"]) + 2))
            continue
        cfg = row.get("config", {})
        steps = " | ".join(f"{s['rtfx']} / {s['first_token_p50_s']} s" for s in row["steps"])
        graphs = "no (eager)" if cfg.get("enforce_eager") else cfg.get("cudagraph_mode")
        lines.append(f"| vLLM | {cfg.get('kv_cache_dtype')} | {cfg.get('attention_backend')} | {graphs} | "
                     f"{row['startup_s']} | "
                     f"{100 * row['wer']:.2f} % | {steps} | {'yes' if row['abort'] else 'NO'} | "
                     f"{row.get('memory_released', 'n/a')} |")
    tf = doc.get("transformers") or {}
    if "error" in tf:
        lines.append(f"| transformers | | | | | error: {tf['error']} |" + " |" * (len(doc["concurrency"]) + 2))
    elif tf:
        steps = " | ".join(f"{s['rtfx']:.1f} / {s['first_token_s']:.3f} s" for s in tf["steps"])
        lines.append(f"| transformers ({tf.get('device')}) | model's | | | | {100 * tf['wer']:.2f} % | {steps} | | |")
    return "\n".join(lines) + "\n"


def bench_gpu(args: argparse.Namespace) -> int:
    gpu = gpu_info()
    if gpu is None and not args.allow_cpu:
        print("the GPU check needs an NVIDIA GPU (nvidia-smi found none here) and vLLM in .venv-vllm "
              "(python3 -m venv .venv-vllm && .venv-vllm/bin/pip install vllm==0.33.0); --allow-cpu runs its steps "
              "on vLLM's CPU build as a dry run", file=sys.stderr)
        return NO_GPU_EXIT
    from ..engines.vllm import EngineProcessError, resolve_python

    try:
        python = str(resolve_python(Settings().vllm_python))
    except EngineProcessError as exc:
        print(exc, file=sys.stderr)
        return 1
    clips = read_manifest(Path(args.audio), {"short", "read"}, longest=12.0)[: args.clips]
    audios = [decode_file(c.path) for c in clips]
    concurrency = [int(x) for x in args.concurrency.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {"kind": "gpu", "model": args.model or "default", "clips": len(clips),
                           "audio_s": sum(a.size for a in audios) / SAMPLE_RATE, "concurrency": concurrency,
                           "device": f"{gpu['name']} (compute capability {gpu['compute_capability']})" if gpu
                           else "CPU (dry run: --allow-cpu)", "gpu": gpu, "vllm": {}}
    for kv in ("fp8", "auto"):
        run_settings = Settings(engine="vllm", model=args.model, vllm_kv_cache_dtype=kv)
        print(f"vLLM, KV cache {kv} ...", flush=True)
        try:
            doc["vllm"][kv] = asyncio.run(_engine_run(run_settings, clips, audios, concurrency, gpu is not None))
        except Exception as exc:  # a refused configuration is a finding, not the end of the check
            doc["vllm"][kv] = {"error": f"{type(exc).__name__}: {exc}"}
    model_dir = next((r["model"] for r in doc["vllm"].values() if r.get("model")), None)
    if model_dir and not args.skip_transformers:
        print("transformers ...", flush=True)
        raw = []
        for i, a in enumerate(audios):
            p = out / f"clip-{i}.f32"
            a.astype("float32").tofile(p)
            raw.append(p)
        tf = _transformers_run(str(model_dir), python, raw, concurrency)
        for p in raw:
            p.unlink()
        if "texts" in tf:
            tf["wer"] = round(corpus_wer([c.text for c in clips], tf.pop("texts")), 4)
        doc["transformers"] = tf
    (out / "bench-gpu.json").write_text(json.dumps(doc, indent=2))
    (out / "bench-gpu.md").write_text(table(doc))
    print(table(doc))
    refused = [kv for kv, row in doc["vllm"].items() if "error" in row]
    return 1 if len(refused) == len(doc["vllm"]) else 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("gpu", help="the vLLM engine on an NVIDIA GPU: configuration, WER fp8 vs model KV vs "
                                   "transformers, RTFx and first token at 1/16/64 requests, abort, memory")
    p.add_argument("--model", help="default: openai/whisper-large-v3-turbo where the GPU has it, as the app chooses")
    p.add_argument("--audio", default=str(MANIFEST), help="a manifest of real clips (tests/data/manifest.tsv)")
    p.add_argument("--clips", type=int, default=64, help="at most this many clips (short and read, up to 12 s)")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--allow-cpu", action="store_true", help="without a GPU, run the steps on vLLM's CPU build")
    p.add_argument("--out", default="bench-out")
