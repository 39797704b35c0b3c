"""The engines: 16 kHz audio and options in, text and its times out; and the engine registry (the setting `engine`
names one of its factories).

Owns the contract (`base`, `types`), the decoding policy every engine follows (`policy`), the embedded, vLLM and
remote engines (`embedded`, `vllm`, `remote` with `endpoints`), the CTranslate2 to Hugging Face converter
(`convert`) and the vLLM engine's own process (`vllm_process`). May import only the ground (`realtime.audio`,
`realtime.config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from .base import Engine, EngineBase, EngineError, EngineUnavailable, TimedText, TranscribeOptions, Transcription

if TYPE_CHECKING:
    from ..config import Settings

EngineFactory = Callable[["Settings"], Engine]


def _embedded(settings: Settings) -> Engine:
    from .embedded import EmbeddedEngine

    return EmbeddedEngine.from_settings(settings)


def _vllm(settings: Settings) -> Engine:
    from .vllm import VllmEngine

    return VllmEngine.from_settings(settings)


ENGINES: dict[str, EngineFactory] = {"embedded": _embedded, "vllm": _vllm}


def register(name: str, factory: EngineFactory) -> None:
    ENGINES[name] = factory


def _remote(settings: Settings) -> Engine:
    from .remote import RemoteEngine

    fallback = create_engine(dataclasses.replace(settings, engine="embedded")) if settings.remote_fallback else None
    return RemoteEngine.from_settings(settings, fallback)


register("remote", _remote)


def create_engine(settings: Settings) -> Engine:
    try:
        factory = ENGINES[settings.engine]
    except KeyError:
        raise ValueError(f"unknown engine {settings.engine!r}; choose one of {', '.join(sorted(ENGINES))}") from None
    return factory(settings)


__all__ = [
    "ENGINES",
    "Engine",
    "EngineBase",
    "EngineError",
    "EngineUnavailable",
    "TimedText",
    "TranscribeOptions",
    "Transcription",
    "create_engine",
    "register",
]
