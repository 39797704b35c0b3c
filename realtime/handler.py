"""The FastRTC audio handler: one per WebRTC connection, bridging frames to a `TranscriptionSession`.

The page's other stream inputs (its language picker and translate toggle, `build_page`) reach the handler as
fastrtc's `latest_args`: asked for once the connection is up (`wait_for_args`), sent again whenever the user
changes them; each new set is applied to the session's options, so a change applies from the next segment.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from fastrtc import AdditionalOutputs, AsyncStreamHandler
from fastrtc.utils import get_current_context

from .audio import SAMPLE_RATE, FrameConverter
from .events import PAGE_EVENTS, Event
from .service import TranscriptionService
from .session import TranscriptionSession

EMIT_WAIT = 0.5  # emit() must wait on something: an idle session wakes twice a second
ARGS_WAIT = 10.0
"""How long start_up waits for the page's inputs; a client that sends none (POST /webrtc/offer) keeps the app's."""
DETECT = "detect"
"""The language picker's value for letting the model detect the language."""


class TranscriptionHandler(AsyncStreamHandler):
    def __init__(self, service: TranscriptionService) -> None:
        # fastrtc resamples browser audio to input_sample_rate before receive()
        super().__init__(expected_layout="mono", output_sample_rate=SAMPLE_RATE, input_sample_rate=SAMPLE_RATE)
        self.service = service
        self.session: TranscriptionSession | None = None
        self._outbox: asyncio.Queue[Event] = asyncio.Queue()
        self._convert = FrameConverter()
        self._applied: list[Any] | None = None

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

    def _apply_args(self) -> None:
        """The page's latest (language, translate) on the session, if they changed: a language the engine does not
        take, or translation on an engine that cannot, leaves the app's setting."""
        args = self.latest_args
        if args is self._applied or not args:
            return
        self._applied = args
        values = args[2:] if args[0] == "__webrtc_value__" else args[1:]  # after the WebRTC component's own value
        if len(values) < 2:
            return
        language, translate = values[0], values[1]
        engine = self.service.engine
        chosen = self.service.settings.language
        if language == DETECT:
            chosen = None
        elif isinstance(language, str) and language in engine.languages:
            chosen = language
        task = "translate" if translate and engine.translates else "transcribe"
        self._session().choose(chosen, task)

    async def start_up(self) -> None:
        self._session()
        try:
            await asyncio.wait_for(self.wait_for_args(), ARGS_WAIT)
        except TimeoutError:
            return
        self._apply_args()

    async def receive(self, frame: tuple[int, np.ndarray]) -> None:
        sample_rate, samples = frame
        self._apply_args()
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
