"""The web app: the Gradio page, fastrtc's WebRTC signalling, transcript routes and health.

Routes besides the page:
- `POST /webrtc/offer`: SDP offer for non-browser WebRTC clients (same connection table as the page); bad,
  oversized or too frequent offers are refused (realtime/web/signalling.py).
- `GET /webrtc/rtc-configuration`: the ICE servers (fresh TURN credentials) a client should use, as the page gets them.
- `GET /transcript/{webrtc_id}/events`: the session's transcript events as Server-Sent Events (JSON).
- `GET /transcript/{webrtc_id}.{txt,srt,vtt,json}`: the transcript so far (`?max_line_chars=N`: srt/vtt cues cut
  at word times). With `--api-key`, both transcript routes need the key or the session's token (realtime/web/access.py).
- `GET /health`: engine, model, readiness, queue figures and the history's state (an error while it cannot be
  written).
- `/v1/transcripts`: the history of sessions (realtime/web/history.py).
- `GET /metrics`: Prometheus metrics (realtime/web/metrics.py).
- `GET /health/live` (200 while the process serves) and `GET /health/ready` (503 while the engine loads or its
  endpoints are down).
- `GET /v1/realtime` (WebSocket) and `POST /v1/realtime/client_secrets`: OpenAI's Realtime API for transcription
  sessions (realtime/web/realtime_api/).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import gradio as gr
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.routing import Route

from ..config import Settings, parse_settings
from ..live import transcript as fmt
from ..live.retranscribe import Retranscriber
from ..live.service import TranscriptionService
from ..live.transcript import TranscriptSnapshot
from ..store import AudioKeeper, Recorder, Store, data_dir, open_store
from .access import allowed, session_token, use_secret
from .api import create_router
from .api_fields import APIError, line_chars, token_refused
from .history import create_history_router
from .history_tab import build_history_tab
from .ice import use_loopback_only
from .jitter import release_audio_promptly
from .limits import SessionLimits
from .metrics import Metrics
from .realtime_api import create_realtime_router
from .shutdown import GRACEFUL_HTTP_S, Drain, GracefulServer
from .signalling import ClientLimiter, OfferError, check_sdp, read_offer
from .turn import Turn, TurnError
from .ui import PageTranscripts, build_page, connection_outputs

log = logging.getLogger("realtime")

_FORMATS: dict[str, tuple[str, Callable[[TranscriptSnapshot, int | None], str]]] = {
    "txt": ("text/plain; charset=utf-8", lambda s, _: fmt.to_text(s.entries) + "\n"),
    "srt": ("application/x-subrip; charset=utf-8", lambda s, n: fmt.to_srt(s.entries, n)),
    "vtt": ("text/vtt; charset=utf-8", lambda s, n: fmt.to_vtt(s.entries, n)),
    "json": ("application/json", lambda s, _: fmt.to_json(s.entries)),
}


# Gradio's page template loads iframe-resizer from a CDN and preconnects to web-font hosts; the page must
# work offline and talk only to its own server, so those tags are removed from every HTML response.
_EXTERNAL_TAGS = re.compile(rb'<script[^>]*src="https?://[^"]*"[^>]*>\s*</script>|<link[^>]*rel="preconnect"[^>]*>',
                            re.S)


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": "invalid_request_error",
                                                               "code": code, "param": None}})


class _WrongMethod:
    """An ASGI app for every method a path does not take: 405 in OpenAI's shape, with the methods it allows."""

    def __init__(self, allow: str) -> None:
        self.allow = allow

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        response = _error(405, f"{scope['method']} is not allowed on {scope['path']}; use {self.allow}",
                          "method_not_allowed")
        response.headers["Allow"] = self.allow
        await response(scope, receive, send)


def _refuse_other_methods(app: FastAPI, routes: list[Any]) -> None:
    """A method that a route does not take (any: TRACE, QUERY, ...) would fall through to the page's catch-all mount,
    a 404 in FastAPI's shape: a route after the real ones answers it with 405 instead. (The API's own `refuse`
    routes answer the common wrong methods of its paths: they are not what a path allows.)"""
    allowed: dict[str, set[str]] = {}
    for route in routes:  # the app's own and its routers' (included routers are not in app.routes one by one)
        if isinstance(route, APIRoute):
            methods = allowed.setdefault(route.path, set())
            if getattr(route.endpoint, "__name__", "") != "refuse":
                methods.update(route.methods)
    for path, methods in allowed.items():
        app.router.routes.append(Route(path, _WrongMethod(", ".join(sorted(methods))), include_in_schema=False))


RECOVER_EVERY_S = 60.0
PURGE_EVERY_S = 3600.0


async def _housekeeping(service: TranscriptionService, store: Store, keep_days: float) -> None:
    """Every minute, the live sessions of instances that have died since (on a shared database) marked interrupted;
    with `keep_days`, sessions older than that deleted, at start and every hour."""
    purged_at = -PURGE_EVERY_S
    while True:
        try:
            if keep_days and time.monotonic() - purged_at >= PURGE_EVERY_S:
                purged_at = time.monotonic()
                gone = await asyncio.to_thread(store.purge, time.time() - keep_days * 86400)
                if gone:
                    log.info("%d sessions older than %g days deleted", len(gone), keep_days)
                    if isinstance(service.history, Recorder):
                        service.history.forget(gone)
            await asyncio.sleep(RECOVER_EVERY_S)
            if service.history is not None:
                await asyncio.to_thread(service.history.recover)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("history housekeeping failed: %s", exc)
            await asyncio.sleep(RECOVER_EVERY_S)


def build_app(settings: Settings, service: TranscriptionService | None = None) -> tuple[FastAPI, TranscriptionService]:
    if settings.ice_loopback:
        use_loopback_only()
    release_audio_promptly()
    service = service or TranscriptionService(settings)
    store = open_store(settings)
    if store is not None:
        described = service.engine.describe()
        folder = data_dir(settings)
        keeper = AudioKeeper(folder / "audio") if settings.keep_audio and folder is not None else None
        service.history = Recorder(store, str(described.get("engine", settings.engine)),
                                   str(described.get("model") or settings.model or ""), settings.language,
                                   audio=keeper)
    if settings.secret:
        use_secret(hashlib.sha256(settings.secret.encode()).digest())
    elif store is not None:
        use_secret(store.secret())
    turn = Turn(settings)
    transcripts = PageTranscripts(service)
    recorder = service.history if isinstance(service.history, Recorder) else None
    passes = Retranscriber(service)

    def history_tab(page: gr.Blocks) -> None:
        with gr.Tab("History", id="history", elem_id="rt-tab-history", render_children=True) as tab:
            build_history_tab(tab, service, store, recorder, passes, page)

    page, webrtc = build_page(service, turn, transcripts, history_tab)
    limits = SessionLimits(settings, service, webrtc)
    metrics = Metrics(service)
    metrics.attach()
    drain = Drain(service, settings.shutdown_timeout)
    clients = ClientLimiter(settings.max_connections_per_client, settings.max_new_connections_per_minute,
                            settings.client_ip_header)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await service.start()
        log.info("engine ready: %s", json.dumps(service.engine.describe()))
        log.info("limits: %s", json.dumps(limits.describe()))
        await turn.start()
        limits.start()
        housekeeping = (asyncio.create_task(_housekeeping(service, store, settings.keep_days))
                        if store is not None else None)
        yield
        if housekeeping is not None:
            housekeeping.cancel()
        await limits.stop()
        await passes.close()
        await service.stop()

    app = FastAPI(title="realtime transcription", lifespan=lifespan)

    @app.post("/webrtc/offer")
    async def offer(request: Request) -> Any:
        if drain.draining:
            return _error(503, "the server is shutting down", "shutting_down")
        try:
            body = await read_offer(request, settings.max_offer_kb * 1024)
            if not isinstance(body.get("webrtc_id"), str):
                return _error(422, "webrtc_id (string) is required", "missing_field")
            if body.get("type") != "ice-candidate":
                if not isinstance(body.get("sdp"), str):
                    return _error(422, "sdp and type are required", "missing_field")
                check_sdp(body["sdp"])
                if body["webrtc_id"] not in webrtc.connections and body["webrtc_id"] not in webrtc.pcs:
                    clients.admit(clients.client(request), body["webrtc_id"], webrtc.pcs)
        except OfferError as exc:
            return exc.response()
        # a token only for an id never seen: reusing a live or closed session's id must not open its transcript
        new = (body.get("type") != "ice-candidate" and body["webrtc_id"] not in webrtc.pcs
               and service.snapshot(body["webrtc_id"]) is None)
        answer = await webrtc.handle_offer(body, webrtc.set_additional_outputs(body["webrtc_id"]))
        if settings.api_key and new and isinstance(answer, dict) and "sdp" in answer:
            answer["transcript_token"] = session_token(body["webrtc_id"])  # only the offer's poster gets it
        return answer

    @app.get("/webrtc/rtc-configuration")
    async def rtc_configuration() -> Any:
        try:
            return await turn.browser_configuration()
        except TurnError as exc:
            return _error(503, str(exc), "turn_unavailable")

    @app.get("/transcript/{webrtc_id}/events")
    async def events(webrtc_id: str, request: Request) -> Any:
        if not allowed(request, webrtc_id, settings.api_key):
            return token_refused().response()
        if webrtc_id not in webrtc.pcs and webrtc_id not in webrtc.additional_outputs:
            return _error(404, f"no live session {webrtc_id}", "unknown_session")
        _ = webrtc.additional_outputs[webrtc_id]  # a live connection's queue (a defaultdict), before its first output

        async def stream() -> AsyncIterator[str]:
            yield ": connected\n\n"
            async for args in connection_outputs(webrtc, webrtc_id):
                yield f"data: {json.dumps(args[0])}\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/transcript/{webrtc_id}.{ext}")
    async def download(webrtc_id: str, ext: str, request: Request) -> Any:
        if not allowed(request, webrtc_id, settings.api_key):
            return token_refused().response()
        if ext not in _FORMATS:
            return _error(404, f"unknown format .{ext}; use txt, srt, vtt or json", "unknown_format")
        snapshot = transcripts.snapshot(webrtc_id)  # after the page's earlier sessions that it carries on from
        if snapshot is None:
            return _error(404, f"no transcript for session {webrtc_id}", "unknown_session")
        try:
            max_line = line_chars(request.query_params.get("max_line_chars"), ext, ".srt and .vtt")
        except APIError as exc:
            return exc.response()
        media, render = _FORMATS[ext]
        return PlainTextResponse(render(snapshot, max_line), media_type=media)

    @app.get("/health")
    async def health() -> Any:
        body = {**service.health(), "space": settings.space_id or None, "limits": limits.describe(),
                "signalling": clients.describe(), "turn": turn.describe()}
        return JSONResponse(body, status_code=200 if service.ready else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Any:
        return metrics.render()

    @app.get("/health/live")
    async def health_live() -> Any:
        return {"status": "live"}

    @app.get("/health/ready")
    async def health_ready() -> Any:
        ready = service.ready and service.engine.ready
        reason = None if ready else (service.error or ("the engine is loading" if not service.ready
                                                       else "the engine's endpoints are down"))
        return JSONResponse({"ready": ready, "reason": reason}, status_code=200 if ready else 503)

    @app.middleware("http")
    async def no_external_assets(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        if not response.headers.get("content-type", "").startswith("text/html"):
            return response
        body = _EXTERNAL_TAGS.sub(b"", b"".join([chunk async for chunk in response.body_iterator]))
        headers = {k: v for k, v in response.headers.items() if k.lower() != "content-length"}
        return Response(body, status_code=response.status_code, headers=headers)

    app.middleware("http")(metrics.middleware)
    routers = [create_router(service, lane_hints=bool(settings.api_key)), create_realtime_router(service),
               create_history_router(service, store, recorder, passes)]
    for router in routers:
        app.include_router(router)
    _refuse_other_methods(app, [*app.routes, *(r for router in routers for r in router.routes)])
    app.state.drain = drain
    # the page's file tab uploads through Gradio: the same size cap as the HTTP API
    app = gr.mount_gradio_app(app, page, path="", show_api=False,
                              max_file_size=int(settings.max_upload_mb * 1024 * 1024))
    return app, service


def main(argv: list[str] | None = None) -> None:
    settings = parse_settings(argv)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("faster_whisper").setLevel(logging.WARNING)
    import uvicorn

    app, _ = build_app(settings)
    print(f"* Real-time transcription on http://{settings.host}:{settings.port}", flush=True)
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                            timeout_graceful_shutdown=GRACEFUL_HTTP_S)
    GracefulServer(config, app.state.drain).run()
