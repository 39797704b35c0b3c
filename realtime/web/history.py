"""The history's HTTP routes: the sessions kept (realtime/store), to list, search, read, retitle and delete.

- `GET /v1/transcripts?q=&limit=&before=`: sessions newest first (`q`: those whose text has every word), as
  `{"object": "list", "data": [...], "has_more": ...}`; `before` (a `created_at`) pages on.
- `GET /v1/transcripts/{id}`: one session with its transcript (`text`, `segments` as in the JSON download).
- `PATCH /v1/transcripts/{id}` with `{"title": "..."}`: its title.
- `DELETE /v1/transcripts/{id}`: gone, with its transcript and audio (a live session cannot be deleted).
- `GET /v1/transcripts/{id}/audio`: its audio (Ogg Opus), where the app keeps it (`--keep-audio`).
- `POST /v1/transcripts/{id}/retranscribe` with `{"model": "...", "language": "..."}` (both optional): its kept
  audio through the file path again (realtime/live/retranscribe.py); the new text replaces the session's, which is
  kept as a version. Answers the session as `GET` does, once the pass is done.
- `GET /v1/transcripts/{id}/versions/{n}`: a text the session had before (1: the live draft).

With `--api-key`, listing needs the key; one session's routes take the key or the session's token (`?token=`).
Without a history (`--no-history`) they answer 404 `history_off`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from ..audio import AudioDecodeError
from ..live import transcript as fmt
from ..live.retranscribe import ModelUnavailable, Retranscriber, UnsupportedLanguage
from ..live.service import TranscriptionService
from ..live.transcript import Entry
from ..store import Recorder, Store, StoredSession
from .access import allowed, bearer, is_key
from .api_fields import APIError, key_refused, token_refused

MAX_LIMIT = 100


def unknown(session_id: str) -> APIError:
    return APIError(404, f"no transcript {session_id}", "unknown_transcript")


def kept_audio(recorder: Recorder | None, session_id: str) -> Path:
    """The session's kept audio file; 404 `no_audio` where there is none."""
    path = recorder.audio_file(session_id) if recorder is not None else None
    if path is None:
        raise APIError(404, f"no audio kept for {session_id} (the app keeps it with --keep-audio)", "no_audio")
    return path


async def retranscribe(service: TranscriptionService, history: Store, recorder: Recorder | None,
                       passes: Retranscriber, session_id: str, model: str | None = None,
                       language: str | None = None) -> tuple[int, StoredSession, tuple[Entry, ...]]:
    """A kept session's audio transcribed again: the number its old text has as a version, and the session now.
    Raises APIError where it cannot be (no such session, live, no audio, a model not offered) or the pass failed
    (the text unchanged)."""
    found = await asyncio.to_thread(history.session, session_id)
    if found is None:
        raise unknown(session_id)
    if found[0].state == "live" or session_id in service.sessions:
        raise APIError(409, f"session {session_id} is live; retranscribe it once it has ended", "session_live")
    path = kept_audio(recorder, session_id)
    try:
        made = await passes.run(path, found[1], model, language or None)
    except ModelUnavailable as exc:
        if not exc.offered:
            raise APIError(400, str(exc), "model_not_offered") from None
        raise APIError(503, str(exc), "model_unavailable", kind="server_error") from None
    except UnsupportedLanguage as exc:
        raise APIError(400, str(exc), "unsupported_language") from None
    except AudioDecodeError as exc:
        raise APIError(422, f"the kept audio does not decode: {exc}", "undecodable_audio") from None
    except Exception as exc:
        raise APIError(502, f"the retranscription failed, the text is unchanged: {exc}", "retranscription_failed",
                       kind="server_error") from None
    number = await asyncio.to_thread(history.replace, session_id, made.entries, made.engine, made.model)
    found = await asyncio.to_thread(history.session, session_id)
    if number is None or found is None:  # deleted, or live again, while it ran
        raise APIError(409, f"session {session_id} changed while it was transcribed again", "session_changed")
    service.closed.pop(session_id, None)  # the memory's copy is the old text
    return number, *found


def create_history_router(service: TranscriptionService, history: Store | None,
                          recorder: Recorder | None = None, passes: Retranscriber | None = None) -> APIRouter:
    """The history's routes over `history` (None: the server keeps none); `recorder` has the sessions' audio,
    `passes` transcribes it again."""
    router = APIRouter()
    settings = service.settings
    passes = passes or Retranscriber(service)

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
            return JSONResponse(await described(summary, entries))
        return await guarded(run)

    async def described(summary: StoredSession, entries: tuple[Entry, ...]) -> dict[str, Any]:
        versions = await asyncio.to_thread(store().versions, summary.id)
        return summary.as_dict() | json.loads(fmt.to_json(entries)) | {"versions": [v.as_dict() for v in versions]}

    @router.get("/v1/transcripts/{session_id}/versions/{number}", include_in_schema=False)
    async def get_version(session_id: str, number: str, request: Request) -> Response:
        async def run() -> Response:
            check_session(request, session_id)
            kept = {str(v.number): v for v in await asyncio.to_thread(store().versions, session_id)}
            if number not in kept:
                raise APIError(404, f"transcript {session_id} has no version {number}", "unknown_version")
            version = kept[number]
            return JSONResponse({"id": session_id} | version.as_dict() | json.loads(fmt.to_json(version.entries)))
        return await guarded(run)

    @router.post("/v1/transcripts/{session_id}/retranscribe", include_in_schema=False)
    async def post_retranscribe(session_id: str, request: Request) -> Response:
        async def run() -> Response:
            check_session(request, session_id)
            raw = await request.body()
            try:
                body = json.loads(raw) if raw.strip() else {}
            except ValueError:
                raise APIError(400, "the body must be JSON: {\"model\": \"...\"} or nothing", "invalid_json") from None
            if not isinstance(body, dict):
                raise APIError(400, "the body must be a JSON object", "invalid_json")
            for name in ("model", "language"):
                if body.get(name) is not None and not isinstance(body[name], str):
                    raise APIError(422, f"{name} must be a string", "invalid_value")
            number, summary, entries = await retranscribe(service, store(), recorder, passes, session_id,
                                                          body.get("model") or None, body.get("language") or None)
            return JSONResponse(await described(summary, entries) | {"replaced_version": number})
        return await guarded(run)

    @router.get("/v1/transcripts/{session_id}/audio", include_in_schema=False)
    async def audio(session_id: str, request: Request) -> Response:
        async def run() -> Response:
            check_session(request, session_id)
            store()
            return FileResponse(kept_audio(recorder, session_id), media_type="audio/ogg",
                                filename=f"{session_id}.ogg")
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
