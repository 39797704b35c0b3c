"""The recorded references (tests/references.py): read when their key matches, computed and said so when not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import references
from references import Reference, ReferenceRecomputed


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(references, "STORE", tmp_path)
    return tmp_path


@pytest.mark.fast
def test_a_matching_record_is_read_and_another_machine_s_is_kept(store: Path) -> None:
    calls: list[int] = []

    def produce() -> dict[str, str]:
        calls.append(1)
        return {"a.flac": "hello"}

    here = Reference("fw-x", {"cpu": "x86_64-GenuineIntel-avx512", "model": "m1"}, produce)
    here.write()
    there = Reference("fw-x", {"cpu": "x86_64-AuthenticAMD-avx2", "model": "m1"}, lambda: {"a.flac": "hullo"})
    there.write()
    assert len(json.loads((store / "fw-x.json").read_text())) == 2, "each machine's record is kept"
    assert here.value() == {"a.flac": "hello"} and there.value() == {"a.flac": "hullo"}
    assert calls == [1], "a matching record is read, not computed again"


@pytest.mark.fast
def test_no_matching_record_computes_it_and_says_which_part_of_the_key_differs(store: Path) -> None:
    Reference("fw-x", {"cpu": "x86_64-AuthenticAMD-avx2", "ctranslate2": "4.8.5"}, lambda: "old").write()
    newer = Reference("fw-x", {"cpu": "x86_64-AuthenticAMD-avx2", "ctranslate2": "4.9.0"}, lambda: "new")
    with pytest.warns(ReferenceRecomputed, match=r"computed in this run: no record matches \(ctranslate2 differ"):
        assert newer.value() == "new"
    with pytest.warns(ReferenceRecomputed, match="none recorded"):
        assert Reference("fw-y", {"cpu": "c"}, lambda: 1).value() == 1


@pytest.mark.fast
def test_the_key_names_what_decides_the_output(tmp_path: Path) -> None:
    clip = tmp_path / "a.flac"
    clip.write_bytes(b"one")
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.bin").write_bytes(b"weights")
    key = references.key("transcribe(beam_size=1)", str(model), [clip])
    assert set(key) == {"recipe", "model", "audio", "cpu", "faster-whisper", "ctranslate2", "onnxruntime", "av"}
    clip.write_bytes(b"two")
    assert references.key("transcribe(beam_size=1)", str(model), [clip])["audio"] != key["audio"]
    assert references.cpu_isa().count("-") >= 1
