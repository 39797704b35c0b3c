"""Reference decoding for the converter and vLLM tests: faster-whisper (CTranslate2) on one 30 s window.

vLLM and transformers always encode a clip padded to 30 s with silence; this decodes exactly that window
with CTranslate2 (float32, greedy, the checkpoint's suppress list), so token ids can be compared one
for one, on the CTranslate2 weights the checkpoints were converted from.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

WINDOW = 480000  # 30 s at 16 kHz


def ct2_model(name: str) -> Path:
    """The CTranslate2 directory of "tiny.en" (the bundled package) or "base" (the multilingual base's two
    packages joined once into the user's cache, as `--model base` finds it)."""
    from references import base, tiny_en

    return Path({"tiny.en": tiny_en, "base": base}[name]())


@cache
def _model(path: str):
    from faster_whisper import WhisperModel

    return WhisperModel(path, device="cpu", compute_type="float32", cpu_threads=2)


def window_tokens(ct2_dir: Path, audio: np.ndarray, prompt: list[int], max_length: int = 200) -> list[int]:
    """Greedy token ids of the clip padded to one 30 s window, after the given decoder prompt."""
    from faster_whisper.transcribe import get_ctranslate2_storage

    model = _model(str(ct2_dir))
    padded = np.concatenate([audio.astype(np.float32), np.zeros(WINDOW, dtype=np.float32)])
    features = model.feature_extractor(padded)[:, :3000]
    encoded = model.model.encode(get_ctranslate2_storage(features[None].astype(np.float32)))
    suppress = json.loads((ct2_dir / "config.json").read_text()).get("suppress_ids", [])
    result = model.model.generate(encoded, [prompt], beam_size=1, max_length=max_length, suppress_blank=False,
                                  suppress_tokens=suppress)
    return list(result[0].sequences_ids[0])


def decode(ct2_dir: Path, tokens: list[int]) -> str:
    return _model(str(ct2_dir)).hf_tokenizer.decode(tokens).strip()
