"""The Realtime API's routes: the WebSocket (`GET /v1/realtime`), calls, hang-up and client secrets, with
authentication, the per-client limits and the concurrency limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocketDisconnect, WebSocketState

from ...live.service import TranscriptionService
from ..access import bearer, is_key
from ..signalling import ClientLimiter, OfferError
from .calls import _Call, _Secret
from .connection import RealtimeConnection
from .protocol import SECRET_TTL_RANGE, SECRET_TTL_S, SUBPROTOCOL_KEY, Config, EventError, _id, apply_update

log = logging.getLogger(__name__)


def create_realtime_router(service: TranscriptionService) -> APIRouter:
    settings = service.settings
    router = APIRouter()
    secrets_: dict[str, _Secret] = {}
    base = settings.vad_config()
    clients = ClientLimiter(settings.max_connections_per_client, settings.max_new_connections_per_minute,
                            settings.client_ip_header)
    minting = ClientLimiter(0, settings.max_new_connections_per_minute, settings.client_ip_header)
    live: set[str] = set()  # the slots of open sessions (WebSockets and calls) in `clients`

    def admit(connection: HTTPConnection, limiter: ClientLimiter = clients) -> str:
        """A new slot for the connection's client (in `live` until the session ends), or `OfferError` (429)."""
        slot = _id("slot")
        client = limiter.client(connection)
        try:
            limiter.admit(client, slot, live)
        except OfferError as exc:
            log.info("realtime connection of %s refused: %s", client, exc.message)
            raise
        if limiter is clients:
            live.add(slot)
        return slot

    def default_config() -> Config:
        return Config(language=settings.language, threshold=base.threshold, prefix_padding_ms=base.pad_before_ms,
                      silence_duration_ms=base.min_silence_ms)

    def expires_at() -> int:
        return int(time.time()) + int(settings.session_time_limit or 3600)

    def offered(headers: Any) -> list[str]:
        raw = headers.get("sec-websocket-protocol", "")
        return [p.strip() for p in raw.split(",") if p.strip()]

    def authorize(headers: Any) -> tuple[bool, Config | None]:
        """(allowed, the configuration an ephemeral secret carries): the Bearer header or the key subprotocol."""
        tokens = [t for t in (bearer(headers.get("authorization", "")),) if t]
        tokens += [p[len(SUBPROTOCOL_KEY):] for p in offered(headers) if p.startswith(SUBPROTOCOL_KEY)]
        now = time.time()
        for expired in [k for k, v in secrets_.items() if v.expires_at <= now]:
            del secrets_[expired]
        for token in tokens:
            secret = secrets_.pop(token, None)  # one session per secret
            if secret is not None:
                return True, secret.config
        if not settings.api_key:
            return True, None
        return any(is_key(t, settings.api_key) for t in tokens), None

    async def refuse(ws: WebSocket, status: int, message: str, code: str, kind: str | None = None,
                     retry_after: int | None = None) -> None:
        """An HTTP answer in place of the WebSocket (ASGI's denial response, which uvicorn serves), else a close
        before accepting: 1013 (try again later) for what may pass later, 1008 (policy) for the rest."""
        body = {"error": {"message": message, "type": kind or ("invalid_request_error" if status < 500 else
                                                                "server_error"), "code": code, "param": None}}
        if "websocket.http.response" in ws.scope.get("extensions", {}):
            headers = {"Retry-After": str(retry_after)} if retry_after else None
            await ws.send_denial_response(JSONResponse(body, status_code=status, headers=headers))
        else:
            await ws.close(code=1013 if status in (429, 503) else 1008, reason=message[:120])

    @router.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        try:
            slot = admit(ws)
        except OfferError as exc:
            await refuse(ws, exc.status, exc.message, exc.code, exc.kind, exc.retry_after)
            return
        try:
            await serve(ws)
        finally:
            live.discard(slot)

    async def serve(ws: WebSocket) -> None:
        allowed, secret_config = authorize(ws.headers)
        if not allowed:
            log.info("realtime connection refused: missing or wrong API key")
            await refuse(ws, 401, "missing or wrong API key: send 'Authorization: Bearer <key>' or the subprotocol "
                                  f"'{SUBPROTOCOL_KEY}<key>'", "invalid_api_key")
            return
        busy = unavailable()
        if busy is not None:
            await refuse(ws, *busy)
            return
        # a browser fails the handshake unless one of the subprotocols it offered is chosen (never the key's)
        choices = [p for p in offered(ws.headers) if not p.startswith(SUBPROTOCOL_KEY)]
        await ws.accept(subprotocol="realtime" if "realtime" in choices else (choices[0] if choices else None))
        config = secret_config or default_config()
        conn = RealtimeConnection(service, config, expires_at(), ws.send_text)
        conn.open()
        log.info("realtime session %s opened (intent=%s, model=%s)", conn.id, ws.query_params.get("intent"),
                 ws.query_params.get("model"))
        conn.send({"type": "session.created", "session": conn.config.as_session(conn.id, conn.expires_at)})
        sender = asyncio.create_task(conn.sender())
        try:
            while not sender.done():
                receive = asyncio.ensure_future(ws.receive())
                await asyncio.wait({receive, sender}, return_when=asyncio.FIRST_COMPLETED)
                if not receive.done():
                    receive.cancel()
                    break
                message = receive.result()
                if message["type"] == "websocket.disconnect":
                    break
                conn.receive(message.get("text"))
        except WebSocketDisconnect:
            pass
        except Exception:
            log.exception("realtime session %s failed", conn.id)
        finally:
            conn.close()
            if not sender.done():
                conn.outbox.put_nowait(None)
                try:
                    await asyncio.wait_for(sender, 2.0)
                except (TimeoutError, Exception):
                    sender.cancel()
            if ws.client_state == WebSocketState.CONNECTED:
                try:
                    await ws.close(code=1000 if conn.closed_reason is None else 1008,
                                   reason=conn.closed_reason.reason if conn.closed_reason else "")
                except Exception:  # already gone
                    pass
            log.info("realtime session %s closed", conn.id)

    def unavailable() -> tuple[int, str, str] | None:
        if not service.ready or not service.engine.ready:
            return 503, "the transcription engine is not ready", "engine_not_ready"
        if len(service.sessions) >= settings.concurrency_limit:
            return (503, f"the server is at its limit of {settings.concurrency_limit} sessions; retry later",
                    "session_limit_reached")
        return None

    def fail(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": "invalid_request_error" if status < 500 else
                                       "server_error", "code": code, "param": param}}, status_code=status)

    def refused_update(exc: EventError) -> JSONResponse:
        """A session configuration refused on an HTTP route: 400 for a language the model lacks (as the HTTP API
        answers it), else 422."""
        return fail(400 if exc.code == "unsupported_language" else 422, exc.message, exc.code, exc.param)

    calls: dict[str, _Call] = {}

    @router.post("/v1/realtime/calls", include_in_schema=False)
    async def create_call(request: Request) -> Response:
        try:
            slot = admit(request)
        except OfferError as exc:
            return exc.response()
        kept = False
        try:
            response = await open_call(request, slot)
            kept = response.status_code == 201
            return response
        finally:
            if not kept:
                live.discard(slot)

    async def open_call(request: Request, slot: str) -> Response:
        allowed, secret_config = authorize(request.headers)
        if not allowed:
            return fail(401, "missing or wrong API key: send 'Authorization: Bearer <key>' (or an ephemeral secret)",
                        "invalid_api_key")
        busy = unavailable()
        if busy is not None:
            return fail(*busy)
        config = secret_config or default_config()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype == "multipart/form-data":  # OpenAI's other form: the offer and a session configuration
            form = await request.form()
            sdp = form.get("sdp")
            raw_session = form.get("session")
            if raw_session is not None:
                try:
                    config = apply_update(config, json.loads(str(raw_session)), False, service.engine)
                except ValueError:
                    return fail(400, "the session field must be JSON", "invalid_json")
                except EventError as exc:
                    return refused_update(exc)
        else:
            sdp = (await request.body()).decode("utf-8", "replace")
        if not isinstance(sdp, str) or not sdp.lstrip().startswith("v="):
            return fail(400, "the body must be an SDP offer (Content-Type: application/sdp)", "invalid_offer")
        call = _Call(service, config, expires_at())
        try:
            answer = await call.answer(sdp)
        except Exception as exc:
            await call.hang_up()
            log.info("realtime call refused: %s", exc)
            return fail(400, f"the SDP offer was not accepted ({type(exc).__name__}: {exc})", "invalid_offer")
        calls[call.id] = call

        def ended() -> None:
            calls.pop(call.id, None)
            live.discard(slot)

        call.on_end = ended
        log.info("realtime call %s opened (session %s)", call.id, call.conn.id)
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/v1/realtime/calls/{call.id}"})

    @router.post("/v1/realtime/calls/{call_id}/hangup", include_in_schema=False)
    async def hangup(call_id: str, request: Request) -> Response:
        if settings.api_key and not authorize(request.headers)[0]:
            return fail(401, "missing or wrong API key", "invalid_api_key")
        call = calls.get(call_id)
        if call is None:
            return fail(404, f"no call {call_id}", "unknown_call")
        await call.hang_up()
        return Response(status_code=200)

    @router.post("/v1/realtime/client_secrets", include_in_schema=False)
    async def client_secrets(request: Request) -> Response:
        try:
            admit(request, minting)  # a secret holds no session: only the per-minute cap
        except OfferError as exc:
            return exc.response()
        if settings.api_key and not is_key(bearer(request.headers.get("authorization", "")), settings.api_key):
            return fail(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "invalid_api_key")
        try:
            body = await request.json() if await request.body() else {}
        except ValueError:
            return fail(400, "the body must be JSON", "invalid_json")
        if not isinstance(body, dict):
            return fail(400, "the body must be a JSON object", "invalid_json")
        ttl = SECRET_TTL_S
        after = body.get("expires_after")
        if after is not None:
            seconds = after.get("seconds") if isinstance(after, dict) else None
            if not isinstance(seconds, int) or isinstance(seconds, bool) or not (
                    SECRET_TTL_RANGE[0] <= seconds <= SECRET_TTL_RANGE[1]):
                return fail(422, f"expires_after.seconds must be an integer from {SECRET_TTL_RANGE[0]} to "
                                 f"{SECRET_TTL_RANGE[1]}", "invalid_value")
            ttl = seconds
        config = default_config()
        if body.get("session") is not None:
            try:
                config = apply_update(config, body["session"], False, service.engine)
            except EventError as exc:
                return refused_update(exc)
        now = time.time()
        value = "ek_" + secrets.token_urlsafe(24)
        secrets_[value] = _Secret(now + ttl, config)
        return JSONResponse({"value": value, "expires_at": int(now + ttl),
                             "session": config.as_session(_id("sess"), int(now + ttl))})

    return router

