"""The history's HTTP routes: the sessions kept (realtime/store), to list, search, read, retitle and delete.

- `GET /v1/transcripts?q=&limit=&before=`: sessions newest first (`q`: those whose text has every word), as
  `{"object": "list", "data": [...], "has_more": ...}`; `before` (a `created_at`) pages on.
- `GET /v1/transcripts/{id}`: one session with its transcript (`text`, `segments` as in the JSON download).
- `PATCH /v1/transcripts/{id}` with `{"title": "..."}`: its title.
- `DELETE /v1/transcripts/{id}`: gone, with its transcript and audio (a live session cannot be deleted).
- `GET /v1/transcripts/{id}/audio`: its audio (Ogg Opus), where the app keeps it (`--keep-audio`).

With `--api-key`, listing needs the key; one session's routes take the key or the session's token (`?token=`).
Without a history (`--no-history`) they answer 404 `history_off`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from ..live import transcript as fmt
from ..live.service import TranscriptionService
from ..store import Recorder, Store
from .access import allowed, bearer, is_key
from .api_fields import APIError, key_refused, token_refused

MAX_LIMIT = 100


def create_history_router(service: TranscriptionService, history: Store | None,
                          recorder: Recorder | None = None) -> APIRouter:
    """The history's routes over `history` (None: the server keeps none); `recorder` has the sessions' audio."""
    router = APIRouter()
    settings = service.settings

    def store() -> Store:
        if history is None:
            raise APIError(404, "this server keeps no history (started with --no-history, or on a Space without "
                                "persistent storage)", "history_off")
        return history

    def check_key(request: Request) -> None:
        if settings.api_key and not is_key(bearer(request.headers.get("authorization", "")), settings.api_key):
            raise key_refused()

    def check_session(request: Request, session_id: str) -> None:
        if not allowed(request, session_id, settings.api_key):
            raise token_refused()

    def unknown(session_id: str) -> APIError:
        return APIError(404, f"no transcript {session_id}", "unknown_transcript")

    def number(request: Request, name: str, default: float | None, low: float, high: float) -> float | None:
        raw = request.query_params.get(name)
        if raw is None or raw == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise APIError(422, f"{name} must be a number", "invalid_value") from None
        if not low <= value <= high:
            raise APIError(422, f"{name} must be between {low:g} and {high:g}", "invalid_value")
        return value

    async def guarded(call: Any) -> Response:
        try:
            return await call()
        except APIError as exc:
            return exc.response()

    @router.get("/v1/transcripts", include_in_schema=False)
    async def list_transcripts(request: Request) -> Response:
        async def run() -> Response:
            check_key(request)
            history = store()
            limit = int(number(request, "limit", 20, 1, MAX_LIMIT) or 20)
            before = number(request, "before", None, 0, 1e11)
            q = request.query_params.get("q") or None
            found = await asyncio.to_thread(history.sessions, q, limit + 1, before)
            return JSONResponse({"object": "list", "data": [s.as_dict() for s in found[:limit]],
                                 "has_more": len(found) > limit})
        return await guarded(run)

    @router.get("/v1/transcripts/{session_id}", include_in_schema=False)
    async def get_transcript(session_id: str, request: Request) -> Response:
        async def run() -> Response:
            check_session(request, session_id)
            found = await asyncio.to_thread(store().session, session_id)
            if found is None:
                raise unknown(session_id)
            summary, entries = found
            live = service.sessions.get(session_id)
            if live is not None:  # what the session has, also what its history is still writing
                entries = live.transcript.snapshot().entries
            return JSONResponse(summary.as_dict() | json.loads(fmt.to_json(entries)))
        return await guarded(run)

    @router.get("/v1/transcripts/{session_id}/audio", include_in_schema=False)
    async def audio(session_id: str, request: Request) -> Response:
        async def run() -> Response:
            check_session(request, session_id)
            store()
            path = recorder.audio_file(session_id) if recorder is not None else None
            if path is None:
                raise APIError(404, f"no audio kept for {session_id} (the app keeps it with --keep-audio)",
                               "no_audio")
            return FileResponse(path, media_type="audio/ogg", filename=f"{session_id}.ogg")
        return await guarded(run)

    @router.patch("/v1/transcripts/{session_id}", include_in_schema=False)
    async def retitle(session_id: str, request: Request) -> Response:
        async def run() -> Response:
            check_session(request, session_id)
            try:
                body = await request.json()
            except ValueError:
                raise APIError(400, "the body must be JSON: {\"title\": \"...\"}", "invalid_json") from None
            title = body.get("title") if isinstance(body, dict) else None
            if not isinstance(title, str):
                raise APIError(422, "title (string) is required", "missing_field")
            if not await asyncio.to_thread(store().retitle, session_id, title):
                raise unknown(session_id)
            found = await asyncio.to_thread(store().session, session_id)
            assert found is not None
            return JSONResponse(found[0].as_dict())
        return await guarded(run)

    @router.delete("/v1/transcripts/{session_id}", include_in_schema=False)
    async def delete(session_id: str, request: Request) -> Response:
        async def run() -> Response:
            check_session(request, session_id)
            history = store()
            if not await asyncio.to_thread(history.delete, session_id):
                found = await asyncio.to_thread(history.session, session_id)
                if found is not None and found[0].state == "live":
                    raise APIError(409, f"session {session_id} is live; delete it once it has ended", "session_live")
                raise unknown(session_id)
            if recorder is not None:
                recorder.forget([session_id])
            service.closed.pop(session_id, None)
            return JSONResponse({"id": session_id, "object": "transcript.deleted", "deleted": True})
        return await guarded(run)

    return router
