"""Live sessions for the pool's and the remote engine's tests (tests/test_pool.py, tests/test_remote.py,
tests/test_remote_realtime.py).

What these tests prove about a live stream is the front end's engine: its requests to another instance or to the
pool, their retries and fallbacks. The WebRTC transport is tested over real WebRTC in real time elsewhere
(tests/test_stream.py), so here a front end is built in the test process as `python app.py --engine remote ...`
builds it (a TranscriptionService on the settings those flags give) and fed through the WebRTC audio path at the
speed the code allows (tests/live_feed.py `feed`).
`live_recording` is the recording they stream (four people's read speech one after another,
`real_speech.SEVERAL`), and `embedded_live` the embedded engine's live reading of it, computed once per run for
every test that compares a front end's live reading with it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from test_stream import check_events

from realtime.audio import decode_file
from realtime.bench.corpus import Compilation
from realtime.config import Settings, parse_settings
from realtime.engines import Engine
from realtime.live.service import TranscriptionService

from conftest import once
from live_feed import feed
from real_speech import several_speakers


def live_recording(path: Path) -> Compilation:
    """The live recording (about 26 s: four speakers' read sentences with pauses), written to `path`."""
    return several_speakers(path)


def front_settings(*flags: str) -> Settings:
    """The settings of `python app.py --engine remote FLAGS`."""
    return parse_settings(["--engine", "remote", *flags])


async def stream(service: TranscriptionService, path: Path, session_id: str = "live",
                 await_partials: bool = False) -> list[dict[str, Any]]:
    """The events of one live session on `service` fed the recording at `path` (the service started; `feed`)."""
    events: list[dict[str, Any]] = []
    session = service.open_session(session_id, lambda e: events.append(e.as_dict()))
    try:
        await feed(session, decode_file(path), await_partials=await_partials)
    finally:
        service.close_session(session_id)
    return events


def finals_text(events: list[dict[str, Any]]) -> str:
    """The finals' text, after checking that every segment ended final (tests/test_stream.py `check_events`)."""
    return " ".join(f["text"] for f in check_events(events))


def embedded_live(shared: Path, engine: Engine, tmp: Path) -> str:
    """The embedded engine's live reading of `live_recording` (the app's default settings on `engine`), computed
    once per run."""

    def produce() -> str:
        comp = live_recording(tmp / "embedded-live.wav")
        service = TranscriptionService(Settings(), engine=engine)

        async def run() -> list[dict[str, Any]]:
            await service.start()
            try:
                return await stream(service, comp.path)
            finally:
                assert service.worker is not None
                await service.worker.stop()  # not service.stop(): the engine is the test session's

        return finals_text(asyncio.run(run()))

    return once(shared, "live-embedded-several", produce)
