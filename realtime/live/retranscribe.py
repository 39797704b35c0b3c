"""A kept session's audio through the file path again, with a model chosen: the careful pass after a live draft.

Two models can be chosen: the one the app serves (`--model`), on its own worker behind the live finals, and
`--retranscribe-model`, an embedded engine loaded on the first pass that asks for it and kept. One pass runs at a
time. The new text keeps the speakers of the text it replaces (each line takes the speaker the old lines give most
of its time), so names given to speakers stay. A pass that fails changes nothing: its error is raised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..engines import EngineError, TranscribeOptions
from .service import TranscriptionService
from .transcribe import timed_entries, transcribe_results
from .transcript import Entry
from .worker import Worker

log = logging.getLogger(__name__)


class ModelUnavailable(Exception):
    """The model asked for is not one this app retranscribes with (`offered` False), or it could not be loaded."""

    def __init__(self, message: str, offered: bool = True) -> None:
        super().__init__(message)
        self.offered = offered


class UnsupportedLanguage(ValueError):
    """The language asked for is not one the chosen model speaks."""


@dataclass(frozen=True)
class Pass:
    """What a pass made: the new entries and who made them."""

    entries: tuple[Entry, ...]
    engine: str
    model: str


def _speaker(entry: Entry, old: Sequence[Entry]) -> str | None:
    """The speaker the old entries give most of `entry`'s time (or the nearest one's, where none overlaps)."""
    spoken: dict[str, float] = {}
    for o in old:
        if o.speaker:
            spoken[o.speaker] = spoken.get(o.speaker, 0.0) + max(0.0, min(entry.end, o.end) - max(entry.start, o.start))
    if spoken and max(spoken.values()) > 0:
        return max(spoken, key=lambda s: spoken[s])
    labelled = [o for o in old if o.speaker]
    if not labelled:
        return None
    middle = (entry.start + entry.end) / 2
    return min(labelled, key=lambda o: abs((o.start + o.end) / 2 - middle)).speaker


class Retranscriber:
    """Passes over kept audio for `service`, with its model or the app's `--retranscribe-model`."""

    def __init__(self, service: TranscriptionService) -> None:
        self.service = service
        self.settings = service.settings
        self._extra: Worker | None = None
        self._loading = asyncio.Lock()
        self._one = asyncio.Lock()

    @property
    def served(self) -> str:
        return str(self.service.engine.describe().get("model") or self.settings.model or "")

    def _served(self, model: str) -> bool:
        return model in {self.served, self.settings.model, "whisper-1"} - {"", None}

    def models(self) -> list[str]:
        """The models a pass may use: `--retranscribe-model` (the default) and the served one."""
        extra = self.settings.retranscribe_model
        return [extra, self.served] if extra and not self._served(extra) else [self.served]

    async def _worker(self, model: str | None) -> Worker:
        chosen = model or self.models()[0]
        if self._served(chosen):
            return self.service.file_worker()
        if chosen != self.settings.retranscribe_model:
            raise ModelUnavailable(f"this app retranscribes with {' or '.join(self.models())}, not {chosen!r}",
                                   offered=False)
        async with self._loading:
            if self._extra is None:
                from ..engines.embedded import EmbeddedEngine

                s = self.settings
                try:
                    engine = EmbeddedEngine.from_settings(dataclasses.replace(
                        s, model=chosen, compute_type=s.retranscribe_compute_type, language=None))
                    await engine.start()
                except (EngineError, OSError, RuntimeError, ValueError) as exc:
                    raise ModelUnavailable(f"the model {chosen} could not be loaded: {exc}") from exc
                log.info("retranscription engine ready: %s", engine.describe())
                self._extra = Worker(engine, batch_size=engine.max_batch_size)
                self._extra.start()
            return self._extra

    async def run(self, audio: Path, old: Sequence[Entry], model: str | None = None,
                  language: str | None = None) -> Pass:
        """The kept `audio` transcribed again with `model` (None: the first of `models()`), in `language` (None:
        the old text's, else detected), its lines labelled with `old`'s speakers. Raises ModelUnavailable,
        UnsupportedLanguage, or the pass's own error."""
        async with self._one:
            worker = await self._worker(model)
            engine = worker.engine
            if language is not None and language not in (engine.languages or (language,)):
                raise UnsupportedLanguage(f"the model {engine.describe().get('model')} does not speak {language!r}")
            if not engine.multilingual:
                language = "en"
            elif language is None:  # the language the old text was in, where it says
                languages = [e.language for e in old if e.language]
                language = max(set(languages), key=languages.count) if languages else None
            window = (self.settings.file_window_s or None) if engine.timestamps else None
            options = TranscribeOptions(language=language, timestamps=bool(engine.timestamps),
                                        vocabulary=self.settings.vocabulary_terms)
            entries: list[Entry] = []
            async for end, result in transcribe_results(audio, worker, self.settings.vad_config(), options,
                                                        window_s=window):
                if isinstance(result, BaseException):
                    raise result
                entries += [e for e in timed_entries(end, result, len(entries)) if e.text]
            if any(o.speaker for o in old):
                entries = [replace(e, speaker=_speaker(e, old)) for e in entries]
            described = engine.describe()
            return Pass(tuple(entries), str(described.get("engine", engine.name)),
                        str(described.get("model") or model or ""))

    async def close(self) -> None:
        if self._extra is not None:
            await self._extra.stop()
            await self._extra.engine.close()
            self._extra = None
