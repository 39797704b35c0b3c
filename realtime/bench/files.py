"""`python -m realtime bench file`: file transcription, RTFx and WER side by side with faster-whisper (sequential and
batched), transformers and vLLM, on a synthesized recording, one real file or a manifest (one file per clip, or
joined into one long recording with `--joined`), with the stretches of speech each pipeline lost.
"""


from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..audio import SAMPLE_RATE, decode_file
from .common import QUANT_PACKAGES, _bar_chart, _bundled_model, _ct2_dir, _machine, timed_runs, write_outputs
from .stream import _percent
from .synth import long_recording

if TYPE_CHECKING:
    from ..engines.vllm import VllmEngine


def file_contenders(model_dir: str, compute_type: str, hf_dir: Path | None,
                    language: str | None = "en", logprobs: bool = False) -> dict[str, Callable[[Path], str]]:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from ..config import WINDOW_S
    from ..engines import TranscribeOptions
    from ..engines.embedded import EmbeddedEngine
    from ..live.transcribe import transcribe_file

    threads = os.cpu_count() or 1
    fw = WhisperModel(model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads)
    batched = BatchedInferencePipeline(model=fw)
    ours = EmbeddedEngine(model=model_dir, compute_type=compute_type, language=language)
    ours.load()

    def realtime(**options: bool) -> Callable[[Path], str]:
        return lambda path: _final_text(asyncio.run(transcribe_file(path, ours, options=TranscribeOptions(**options),
                                                                    window_s=WINDOW_S)))

    def fw_sequential(path: Path) -> str:
        segments, _ = fw.transcribe(str(path), beam_size=1, language=language, vad_filter=True)
        return " ".join(s.text.strip() for s in segments)

    def fw_batched(path: Path) -> str:
        segments, _ = batched.transcribe(str(path), beam_size=1, language=language, batch_size=8)
        return " ".join(s.text.strip() for s in segments)

    contenders: dict[str, Callable[[Path], str]] = {
        "realtime text (json, text: VAD windows, batched)": realtime(),
        "realtime timed (srt, vtt, verbose_json)": realtime(timestamps=True),
        **({"realtime text, with token logprobs (json, include[]=logprobs)": realtime(logprobs=True),
            "realtime timed, with token logprobs": realtime(timestamps=True, logprobs=True)} if logprobs else {}),
        "faster-whisper (sequential, VAD)": fw_sequential,
        "faster-whisper batched (BatchedInferencePipeline, batch 8)": fw_batched,
    }
    if hf_dir is not None:
        contenders["transformers (sequential long-form generate)"] = _transformers_runner(hf_dir)
    return contenders


def _final_text(entries: list[Any]) -> str:
    return " ".join(e.text for e in entries if e.kind == "final")


def _vllm_runs(paths: list[Path], warm: Path, runs: int, model: str | None = None,
               started: tuple[asyncio.AbstractEventLoop, VllmEngine] | None = None) -> tuple[list[float], list[str]]:
    """The vLLM engine (its own environment, the model converted) on the file path: started once in an event loop
    that every run reuses, then timed by `timed_runs` like the others. Raises EngineError when the environment is
    missing. `started` is an engine already running and the event loop it lives on (the tests' shared engine): the
    runs use it as it is and leave it running."""
    from ..config import WINDOW_S, Settings
    from ..engines.vllm import VllmEngine, resolve_python
    from ..live.transcribe import transcribe_file

    if started is None:
        settings = Settings(engine="vllm", model=QUANT_PACKAGES["base"] if model == "base" else model, language="en")
        resolve_python(settings.vllm_python)
        loop, engine = asyncio.new_event_loop(), VllmEngine.from_settings(settings)
    else:
        loop, engine = started
    try:
        if started is None:
            loop.run_until_complete(engine.start())

        def run(p: Path) -> str:
            return _final_text(loop.run_until_complete(transcribe_file(p, engine, window_s=WINDOW_S)))

        return timed_runs(lambda: [run(p) for p in paths], runs, warmup=lambda: run(warm))
    finally:
        if started is None:
            loop.run_until_complete(engine.close())
            loop.close()


def _transformers_runner(hf_dir: Path) -> Callable[[Path], str]:
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(os.cpu_count() or 1)
    processor = WhisperProcessor.from_pretrained(hf_dir)
    model = WhisperForConditionalGeneration.from_pretrained(hf_dir, torch_dtype=torch.float32).eval()

    def run(path: Path) -> str:
        audio = decode_file(path)
        inputs = processor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", truncation=False,
                           padding="longest", return_attention_mask=True)
        if inputs.input_features.shape[-1] < 3000:
            inputs = processor(audio, sampling_rate=SAMPLE_RATE, return_tensors="pt", return_attention_mask=True)
        with torch.inference_mode():
            ids = model.generate(**inputs, return_timestamps=True, num_beams=1, do_sample=False)
        return processor.batch_decode(ids, skip_special_tokens=True)[0]

    return run


def _hf_checkpoint(out: Path, model_dir: str) -> tuple[Path | None, str]:
    """The model converted to a Hugging Face checkpoint, for the transformers baseline."""
    try:
        import transformers  # noqa: F401

        from ..engines.convert import convert
    except ImportError as exc:
        return None, f"unavailable: {exc}"
    target = out / f"hf-{Path(model_dir).name}"
    if not (target / "config.json").exists():
        convert(model_dir, target, dtype="float32")
    return target, ""


def _bench_model(name: str | None, compute_type: str | None, cache: Path) -> tuple[str, str, str, str | None]:
    """(CTranslate2 directory, display name, compute type, language) for --model: tiny.en (bundled, int8) or base
    (the multilingual base from its packages, float32, English asked for), or a CTranslate2 directory."""
    if not name or name == "tiny.en":
        return _bundled_model(), "tiny.en (bundled)", compute_type or "int8", "en"
    if name == "base":
        return str(_ct2_dir(QUANT_PACKAGES["base"], cache)), "base (multilingual)", compute_type or "float32", "en"
    return name, Path(name).name, compute_type or "int8", "en"


def _items(args: argparse.Namespace, out: Path) -> tuple[list[tuple[Path, str]], str]:
    """What to transcribe: every clip of a manifest (.tsv), one real recording with its text, or a synthesized
    recording; and a description for the table."""
    if args.audio and args.audio.endswith(".tsv"):
        from .corpus import compilation, read_manifest

        clips = read_manifest(Path(args.audio))
        if getattr(args, "joined", None) is not None:
            comp = compilation(clips, out / "joined.wav", gap=args.joined)
            return [(comp.path, comp.text)], (f"{len(clips)} real recordings joined into one file of "
                                               f"{comp.spans[-1][1] / 60:.1f} minutes ({args.joined:g} s pauses)")
        return [(c.path, c.text) for c in clips], f"{len(clips)} real recordings, one file each"
    if args.audio:
        reference = Path(args.text).read_text() if args.text else ""
        return [(Path(args.audio), reference)], f"{Path(args.audio).name}"
    speech = long_recording(out / "long.wav", minutes=args.minutes)
    return [(speech.path, speech.text)], "multi-voice synthesized speech"


def bench_file(args: argparse.Namespace) -> dict[str, Any]:
    from .corpus import LOST_RUN_WORDS, corpus_wer, loops, lost_runs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    items, what = _items(args, out)
    model_dir, model_name, compute_type, language = _bench_model(args.model, args.compute_type, out / "models")
    durations = [decode_file(p).size / SAMPLE_RATE for p, _ in items]
    duration = sum(durations)
    only = [o.strip().lower() for o in args.only.split(",")] if args.only else None

    def wanted(name: str) -> bool:
        return only is None or name.startswith("faster-whisper (") or any(name.lower().startswith(o) for o in only)

    hf_dir, why = _hf_checkpoint(out, model_dir) if wanted("transformers") else (None, "not run (--only)")
    contenders = {k: v for k, v in file_contenders(model_dir, compute_type, hf_dir, language,
                                                              getattr(args, "logprobs", False)).items() if wanted(k)}
    results: list[dict[str, Any]] = []
    warm = out / "warmup.wav"
    import soundfile as sf

    sf.write(str(warm), decode_file(items[0][0])[: 30 * SAMPLE_RATE], SAMPLE_RATE, subtype="PCM_16")
    references = [t for _, t in items]

    def row(name: str, times: list[float], texts: list[str]) -> dict[str, Any]:
        wall = statistics.median(times)
        return {"name": name, "rtfx": round(duration / wall, 2), "wall_s": round(wall, 2),
                "runs": [round(t, 2) for t in times],
                "wer": round(corpus_wer(references, texts), 4) if any(references) else None,
                "loops": sum(bool(loops([t], r or None)) for r, t in zip(references, texts, strict=True)),
                "empty": sum(not t.strip() for t in texts),
                "lost": sum(len(lost_runs(r, t)) for r, t in zip(references, texts, strict=True) if r),
                "texts": texts}

    def each(fn: Callable[[Path], str]) -> Callable[[], list[str]]:
        return lambda: [fn(p) for p, _ in items]

    for name, fn in contenders.items():
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results.append(row(name, *timed_runs(each(fn), args.runs, warmup=lambda fn=fn: fn(warm))))
    if hf_dir is None and wanted("transformers"):
        results.append({"name": "transformers", "rtfx": None, "wer": None, "note": why})
    if wanted("vllm"):
        print("running vllm ...", file=sys.stderr, flush=True)
        try:
            results.append(row(f"vllm ({model_name} converted, float32, VAD windows)",
                               *_vllm_runs([p for p, _ in items], warm, args.runs, args.model)))
        except Exception as exc:  # the vLLM environment is optional for users
            results.append({"name": "vllm", "rtfx": None, "wer": None, "note": f"unavailable: {exc}"})
    base = next(r for r in results if r["name"].startswith("faster-whisper (sequential"))
    for r in results:
        r["vs_faster_whisper"] = round(r["rtfx"] / base["rtfx"], 2) if r.get("rtfx") else None
        if "texts" in r:  # empty answers where faster-whisper found words
            r["empty_where_fw_has_text"] = sum(bool(f.strip()) and not t.strip()
                                               for t, f in zip(r["texts"], base["texts"], strict=True))
    doc = {"kind": "file", "input": what, "audio_seconds": round(duration, 1), "model": model_name,
           "compute_type": compute_type, "decoding": "greedy (beam 1), English", "machine": _machine(),
           "runs": args.runs, "results": results}
    rows = [f"| {r['name']} | {r['rtfx'] or '-'} | {r['vs_faster_whisper'] or '-'}x | {_percent(r['wer'])} | "
            f"{r.get('lost', '-')} | {r.get('loops', '-')} | {r.get('empty_where_fw_has_text', '-')} |"
            for r in results]
    table = (f"File transcription, {what} ({duration / 60:.1f} min), {model_name} {compute_type}, greedy, "
             f"{_machine()}, median of {args.runs} runs after a warm-up. Lost: stretches of {LOST_RUN_WORDS} or more "
             "reference words missing from the answer; loops: answers that repeat themselves back to back; empty: "
             "answers with no text where faster-whisper has some.\n\n"
             "| pipeline | RTFx | vs faster-whisper | WER | lost | loops | empty |\n|---|---|---|---|---|---|---|\n"
             + "\n".join(rows) + "\n")
    ok = [r for r in results if r.get("rtfx")]
    write_outputs(out, "file", doc, table, lambda p: _bar_chart(
        p, [r["name"] for r in ok], [r["rtfx"] for r in ok], "RTFx (audio seconds per wall second)",
        f"File transcription, {model_name} {compute_type}, {_machine()}"))
    return doc
