"""Signalling that refuses bad input: the checks `POST /webrtc/offer` runs before fastrtc sees an offer.

- `read_offer`: the body is capped (`--max-offer-kb`), on Content-Length first and again while reading,
  and must be a JSON object; an oversized one gets 413, a broken one 400.
- `check_sdp`: an offer's SDP must parse (`v=0` first, every line `x=value`) and hold exactly one audio
  media section (`m=audio`); anything else gets 400.
- `ClientLimiter`: per client address, a cap on open connections (`--max-connections-per-client`) and on
  new connections per minute (`--max-new-connections-per-minute`); over either gets 429 with Retry-After.
  Both are off by default (0) and on by default on a Space (realtime/space.py), where the client address is
  the first hop of `X-Forwarded-For` (`--client-ip-header`). The Realtime API's routes (realtime/web/realtime_api/)
  apply the same caps with a limiter of their own.

Refusals carry OpenAI's error shape `{"error": {"message", "type", "code", "param"}}`.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Collection
from typing import Any

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse

MAX_MEDIA_SECTIONS = 8
_LINE = re.compile(r"^[a-z]=.*$")


class OfferError(Exception):
    """A refused offer: HTTP `status`, a message for the client and an error `code`."""

    def __init__(self, status: int, message: str, code: str, kind: str = "invalid_request_error",
                 param: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.kind, self.param = status, message, code, kind, param
        self.retry_after = retry_after

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "code": self.code, "param": self.param}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


async def read_offer(request: Request, limit: int) -> dict[str, Any]:
    """The offer body as a dict, read up to `limit` bytes (413 beyond it, 400 when it is not a JSON object)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise OfferError(413, f"the offer ({int(length)} bytes) is larger than the limit of {limit} bytes",
                         "offer_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise OfferError(413, f"the offer is larger than the limit of {limit} bytes", "offer_too_large")
        chunks.append(chunk)
    try:
        body = json.loads(b"".join(chunks))
    except ValueError:
        raise OfferError(400, "the body must be JSON", "invalid_json") from None
    if not isinstance(body, dict):
        raise OfferError(400, "the body must be a JSON object", "invalid_json")
    return body


def check_sdp(sdp: str) -> None:
    """Raise `OfferError` (400) unless `sdp` parses as SDP with exactly one `m=audio` section."""
    lines = [line for line in sdp.replace("\r\n", "\n").split("\n") if line]
    if not lines or lines[0].strip() != "v=0" or not all(_LINE.match(line) for line in lines):
        raise OfferError(400, "sdp is not a session description (RFC 8866)", "invalid_sdp", param="sdp")
    media = [line[2:].split(" ", 1)[0] for line in lines if line.startswith("m=")]
    if len(media) > MAX_MEDIA_SECTIONS:
        raise OfferError(400, f"the offer has {len(media)} media sections; at most {MAX_MEDIA_SECTIONS}",
                         "invalid_sdp", param="sdp")
    audio = media.count("audio")
    if audio != 1:
        raise OfferError(400, f"the offer must have exactly one audio section (m=audio); it has {audio}",
                         "invalid_sdp", param="sdp")
    from aiortc.sdp import SessionDescription

    try:
        SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises assorted errors on malformed lines
        raise OfferError(400, f"sdp does not parse: {exc}", "invalid_sdp", param="sdp") from None


class ClientLimiter:
    """Open and new connections per client address; 0 turns a cap off. A connection holds its slot while its id
    is in the `live` collection given to `admit`."""

    WINDOW_S = 60.0

    def __init__(self, max_open: int, max_per_minute: int, ip_header: str = "") -> None:
        self.max_open, self.max_per_minute, self.ip_header = max_open, max_per_minute, ip_header.lower()
        self.refused = 0
        self._owner: dict[str, str] = {}  # connection id -> client address
        self._recent: dict[str, deque[float]] = {}

    def client(self, request: HTTPConnection) -> str:
        """The client address of a request or WebSocket: the trusted header's first hop, else the peer."""
        if self.ip_header:
            forwarded = request.headers.get(self.ip_header, "").split(",")[0].strip()
            if forwarded:
                return forwarded
        return request.client.host if request.client else "unknown"

    def admit(self, client: str, connection_id: str, live: Collection[str], now: float | None = None) -> None:
        """Count a new connection of `client`, or raise `OfferError` (429) when it is over a cap."""
        now = time.monotonic() if now is None else now
        for sid in [s for s in self._owner if s not in live]:
            del self._owner[sid]
        for address, times in list(self._recent.items()):  # every client's, so one that left is forgotten
            while times and now - times[0] >= self.WINDOW_S:
                times.popleft()
            if not times:
                del self._recent[address]
        recent = self._recent.setdefault(client, deque())
        if self.max_open and sum(1 for c in self._owner.values() if c == client) >= self.max_open:
            self.refused += 1
            raise OfferError(429, f"this client already has {self.max_open} open connections; close one first",
                             "too_many_connections", kind="rate_limit_error", retry_after=5)
        if self.max_per_minute and len(recent) >= self.max_per_minute:
            self.refused += 1
            wait = max(1, int(self.WINDOW_S - (now - recent[0])) + 1)
            raise OfferError(429, f"this client opened {self.max_per_minute} connections in the last minute; "
                             f"retry in {wait} s", "rate_limit_exceeded", kind="rate_limit_error", retry_after=wait)
        recent.append(now)
        self._owner[connection_id] = client

    def describe(self) -> dict[str, Any]:
        return {"max_connections_per_client": self.max_open or None,
                "max_new_connections_per_minute": self.max_per_minute or None, "refused": self.refused}
