"""The FastRTC audio handler: one per WebRTC connection, bridging frames to a `TranscriptionSession`; and
`apply_page_inputs` (with `picked_language`), the page's language picker, translate toggle and end of a line on a
session.

The page applies those itself (`build_page`: at the session's first event, speech started, before any decoding,
and on each change, on the session the page's state names) rather than as stream inputs: fastrtc's inputs
(`latest_args`, `wait_for_args`) add events on the WebRTC component with which the page sometimes lost its
transcript after a stop and a new start.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
from fastrtc import AdditionalOutputs, AsyncStreamHandler
from fastrtc.utils import get_current_context

from ..audio import SAMPLE_RATE, FrameConverter
from ..config import MAX_WAIT_S, TurnConfig, vocabulary_of
from ..live import end_of_turn
from ..live.events import PAGE_EVENTS, Event
from ..live.service import TranscriptionService
from ..live.session import TranscriptionSession

EMIT_WAIT = 0.5  # emit() must wait on something: an idle session wakes twice a second
DETECT = "detect"
"""The language picker's value for letting the model detect the language."""


def picked_language(engine_languages: tuple[str, ...], value: Any, default: str | None) -> str | None:
    """The language code a picker value asks for (None: detect); a value the engine does not take: `default`."""
    if value == DETECT:
        return None
    return value if isinstance(value, str) and value in engine_languages else default


TURN_CHOICES: tuple[tuple[str, str], ...] = (
    ("a pause", "silence"),
    ("a finished sentence, or 2 s of pause", "high"),
    ("a finished sentence, or 4 s of pause", "medium"),
    ("a finished sentence, or 8 s of pause", "low"),
)
"""The page's choices of what ends a line (`--end-of-turn`): the VAD's minimum silence, or the end-of-turn model
with OpenAI's eagerness."""


def page_turn(value: str) -> str:
    """The page's choice for an `--end-of-turn` value (auto is medium)."""
    return "medium" if value == "auto" else value


def page_vocabulary(service: TranscriptionService, value: Any) -> tuple[str, ...]:
    """The terms of the page's vocabulary box; the app's `--vocabulary` where it is not a vocabulary."""
    try:
        return vocabulary_of(value) if isinstance(value, str) else service.settings.vocabulary_terms
    except ValueError:
        return service.settings.vocabulary_terms


def apply_page_inputs(service: TranscriptionService, session: TranscriptionSession, language: Any,
                      translate: Any, speakers: Any = True, turn: Any = None, vocabulary: Any = None) -> None:
    """The page's (language, translate, speaker labels, end of a line) on `session`: a language the engine does not
    take, or translation on an engine that cannot, leaves the app's setting; speaker labels switched off stay off
    for the session; an end of a line the page does not offer (or with no end-of-turn model) leaves the app's, and so
    does a vocabulary that is none."""
    engine = service.engine
    chosen = picked_language(engine.languages, language, service.settings.language)
    session.choose(chosen, "translate" if translate and engine.translates else "transcribe")
    if not speakers:
        session.speakers = None
    session.options = dataclasses.replace(session.options, vocabulary=page_vocabulary(service, vocabulary))
    if turn == "silence":
        session.choose_turn(None)
    elif turn in MAX_WAIT_S and end_of_turn.available():
        session.choose_turn(TurnConfig(turn))


class TranscriptionHandler(AsyncStreamHandler):
    def __init__(self, service: TranscriptionService) -> None:
        # fastrtc resamples browser audio to input_sample_rate before receive()
        super().__init__(expected_layout="mono", output_sample_rate=SAMPLE_RATE, input_sample_rate=SAMPLE_RATE)
        self.service = service
        self.session: TranscriptionSession | None = None
        self._outbox: asyncio.Queue[Event] = asyncio.Queue()
        self._convert = FrameConverter()

    def copy(self) -> TranscriptionHandler:
        return TranscriptionHandler(self.service)

    def _session(self) -> TranscriptionSession:
        if self.session is None:
            webrtc_id = get_current_context().webrtc_id
            self.session = self.service.open_session(webrtc_id, self._on_event)
        return self.session

    def _on_event(self, event: Event) -> None:
        if isinstance(event, PAGE_EVENTS):
            self._outbox.put_nowait(event)

    async def start_up(self) -> None:
        self._session()

    async def receive(self, frame: tuple[int, np.ndarray]) -> None:
        sample_rate, samples = frame
        self._session().feed(self._convert(sample_rate, samples))

    async def emit(self) -> AdditionalOutputs | None:
        session = self._session()
        try:
            event = await asyncio.wait_for(self._outbox.get(), EMIT_WAIT)
        except TimeoutError:
            return None
        return AdditionalOutputs(event.as_dict(), session.id)

    async def shutdown(self) -> None:
        if self.session is not None:
            self.service.close_session(self.session.id)
            self.session = None
