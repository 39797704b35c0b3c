"""Who may read a live transcript (`/transcript/{id}.{ext}`, `/transcript/{id}/events`), and the check of
`--api-key` that every route shares (`bearer`, `is_key`).

Without `--api-key`, an unguessable connection id is the rule: whoever has the id can read its transcript
(the page makes random ids). With `--api-key`, a request needs the key as a Bearer token, or the session's
own token as `?token=...`: an HMAC of the id under the app's secret (`--secret`, else the one kept in the history's
database, else one made at start-up), so only the page (in its status links) and the client that posted the offer
(`transcript_token` in the answer) hold it, and it still opens the transcript after a restart. Both are
compared with `hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from starlette.requests import Request

_SECRET = secrets.token_bytes(32)


def use_secret(secret: bytes) -> None:
    """Make the sessions' tokens under `secret` from now on."""
    global _SECRET
    _SECRET = secret


def bearer(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer <token>` header value, or None."""
    scheme, _, token = authorization.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def is_key(token: str | None, api_key: str) -> bool:
    """Whether `token` is the API key (compared in constant time)."""
    return token is not None and hmac.compare_digest(token.encode(), api_key.encode())


def session_token(session_id: str) -> str:
    """The token that opens this session's transcript (the same while the secret is)."""
    return hmac.new(_SECRET, session_id.encode(), hashlib.sha256).hexdigest()[:32]


def allowed(request: Request, session_id: str, api_key: str) -> bool:
    """True when no key is set, or the request carries the key (Bearer) or the session's token."""
    if not api_key:
        return True
    if is_key(bearer(request.headers.get("authorization", "")), api_key):
        return True
    token = request.query_params.get("token", "")
    return bool(token) and hmac.compare_digest(token.encode(), session_token(session_id).encode())
