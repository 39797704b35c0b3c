"""TURN relay credentials for both WebRTC peers, renewed per connection before they expire.

A browser outside the server's network (always, on a Hugging Face Space) reaches the app only through a
TURN relay, and the server's own peer needs one too when it has no public address. Where credentials come
from (`--turn-provider`; `auto` takes the first one configured, in this order):

- `secret`: `--turn-url` plus `--turn-shared-secret`, coturn's TURN REST API (time-limited user names
  signed with HMAC-SHA1), made here for each renewal;
- `static`: `--turn-url` with `--turn-username` / `--turn-credential`;
- `cloudflare`: Cloudflare Realtime TURN keys (CLOUDFLARE_TURN_KEY_ID, CLOUDFLARE_TURN_KEY_API_TOKEN), via
  fastrtc's `get_cloudflare_turn_credentials_async`;
- `twilio`: Twilio Network Traversal tokens (TWILIO_ACCOUNT_SID, TWILIO_AUTH_TOKEN): the REST call that
  fastrtc's `get_twilio_turn_credentials` makes through the `twilio` SDK, made here with httpx;
- `hf`: free Cloudflare TURN through Hugging Face with HF_TOKEN, via fastrtc's helper. HF_TOKEN serves
  other purposes too, so `auto` picks it only on a Space (SPACE_ID set): a local launch stays offline.

Every connection asks `Turn` for its ICE servers (the browser through the WebRTC component's `turn()` call,
the server's peer in the guarded `handle_offer`); one set of credentials is shared until it gets close to
expiring, then renewed. Before a set is handed out, a relay is allocated with it from this machine, so
wrong credentials or an unreachable relay give a plain error in the page and the log instead of a
connection that never comes up. Where TURN is required (on Spaces, or `--turn-required`, or
`--ice-transport-policy relay`) and none works, offers are refused with that message.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from aioice import stun
from aioice import turn as aioice_turn
from aiortc import RTCConfiguration, RTCIceServer
from aiortc.rtcconfiguration import RTCIceTransportPolicy
from aiortc.rtcicetransport import parse_stun_turn_uri
from fastapi.responses import JSONResponse

from ..config import Settings

log = logging.getLogger(__name__)

PROVIDERS = ("auto", "none", "static", "secret", "cloudflare", "twilio", "hf")
POLICIES = ("all", "relay")
STATIC_RECHECK_S = 300.0  # fixed credentials are checked against the relay again after this long
RETRY_AFTER_S = 5.0  # a failed fetch or check is answered from memory for this long, then tried again
CHECK_TIMEOUT_S = 5.0
SPACE_OUTBOUND_PORTS = (443, 80, 8080)  # the only ports a Space may connect out to (Spaces networking docs)
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")

LABELS = {
    "static": "TURN server (--turn-url)",
    "secret": "TURN server (--turn-url, shared secret)",
    "cloudflare": "Cloudflare TURN (CLOUDFLARE_TURN_KEY_ID)",
    "twilio": "Twilio TURN (TWILIO_ACCOUNT_SID)",
    "hf": "Cloudflare TURN via HF_TOKEN",
}
NO_TURN = ("No TURN relay is configured, so browsers outside this server's network cannot connect. The owner "
           "can add the HF_TOKEN secret (free Cloudflare TURN), Cloudflare or Twilio TURN keys, or a TURN server "
           "(REALTIME_TURN_URL); see docs/space.md (TURN).")
REMOTE_WITHOUT_TURN = ("This server has no TURN relay configured: a browser on another network may not be able "
                       "to connect. The owner can start it with --turn-provider hf and HF_TOKEN, or --turn-url "
                       "(see docs/space.md, TURN).")


class TurnError(RuntimeError):
    """No working TURN relay; the message says why in words fit for the page and the log."""


@dataclass
class Credentials:
    servers: list[dict[str, Any]]  # RTCIceServer dicts: urls (list), username, credential
    expires_at: float  # time.time()


def resolve_provider(settings: Settings) -> str:
    """The provider `--turn-provider auto` means with these settings."""
    if settings.turn_provider != "auto":
        return settings.turn_provider
    if settings.turn_url and settings.turn_shared_secret:
        return "secret"
    if settings.turn_url:
        return "static"
    if settings.cloudflare_turn_key_id and settings.cloudflare_turn_key_api_token:
        return "cloudflare"
    if settings.twilio_account_sid and settings.twilio_auth_token:
        return "twilio"
    if settings.hf_token and settings.space_id:
        return "hf"
    return "none"


def rest_credentials(secret: str, ttl: int, now: float | None = None, user: str = "realtime") -> tuple[str, str]:
    """coturn's TURN REST API: user name `<expiry>:<user>`, password base64(HMAC-SHA1(secret, user name))."""
    username = f"{int((time.time() if now is None else now) + ttl)}:{user}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def _split(urls: str) -> list[str]:
    return [u.strip() for u in urls.split(",") if u.strip()]


def normalize(servers: Any) -> list[dict[str, Any]]:
    """ICE servers as the browser takes them, whatever shape a provider answered with."""
    if isinstance(servers, dict):
        servers = [servers]
    out = []
    for s in servers or []:
        urls = s.get("urls") or s.get("url") or []
        entry: dict[str, Any] = {"urls": [urls] if isinstance(urls, str) else list(urls)}
        for key in ("username", "credential"):
            if s.get(key):
                entry[key] = s[key]
        if entry["urls"]:
            out.append(entry)
    return out


def _turn_urls(servers: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(u, s) for s in servers for u in s["urls"] if u.split(":", 1)[0] in ("turn", "turns")]


def _port(url: str) -> int:
    try:
        return int(parse_stun_turn_uri(url)["port"])
    except ValueError:
        return 0


def prefer_ports(servers: list[dict[str, Any]], ports: tuple[int, ...]) -> list[dict[str, Any]]:
    """The same servers with TURN URLs on `ports` first (aiortc uses the first TURN URL it supports)."""
    def rank(url: str) -> int:
        p = _port(url)
        return ports.index(p) if p in ports else len(ports)

    reordered = [{**s, "urls": sorted(s["urls"], key=rank)} for s in servers]
    return sorted(reordered, key=lambda s: min((rank(u) for u in s["urls"] if u.startswith("turn")),
                                               default=len(ports) + 1))


async def check_relay(servers: list[dict[str, Any]], timeout: float = CHECK_TIMEOUT_S) -> str:
    """Allocate (then free) a relay on the first TURN URL aiortc would use; return that URL or raise TurnError."""
    for url, server in _turn_urls(servers):
        try:
            parsed = parse_stun_turn_uri(url)
        except ValueError:
            continue
        tls = parsed["scheme"] == "turns"
        if parsed["transport"] not in ("udp", "tcp") or (tls and parsed["transport"] != "tcp"):
            continue
        try:
            transport, _ = await asyncio.wait_for(aioice_turn.create_turn_endpoint(
                asyncio.DatagramProtocol, server_addr=(parsed["host"], parsed["port"]),
                username=server.get("username"), password=server.get("credential"),
                ssl=tls, transport=parsed["transport"]), timeout)
        except stun.TransactionFailed as exc:
            code, reason = exc.response.attributes.get("ERROR-CODE", (0, "error"))
            if code == 401:
                raise TurnError(f"the relay at {url} refused the credentials of user "
                                f"'{server.get('username', '')}' (401 {reason})") from None
            raise TurnError(f"the relay at {url} refused an allocation ({code} {reason})") from None
        except (TimeoutError, stun.TransactionTimeout):
            raise TurnError(f"the relay at {url} did not answer within {timeout:.0f} s") from None
        except OSError as exc:
            raise TurnError(f"cannot reach the relay at {url}: {exc}") from None
        transport.close()
        return url
    raise TurnError("no TURN URL among the ICE servers that this server's WebRTC stack can use")


class Turn:
    """ICE servers for each new connection: STUN from --stun-urls plus fresh TURN credentials."""

    def __init__(self, settings: Settings) -> None:
        if settings.turn_provider not in PROVIDERS:
            raise ValueError(f"--turn-provider must be one of {', '.join(PROVIDERS)}, not {settings.turn_provider!r}")
        if settings.ice_transport_policy not in POLICIES:
            raise ValueError(f"--ice-transport-policy must be all or relay, not {settings.ice_transport_policy!r}")
        self.settings = settings
        self.provider = resolve_provider(settings)
        if self.provider in ("static", "secret") and not settings.turn_url:
            raise ValueError(f"--turn-provider {self.provider} needs --turn-url")
        self.relay_only = settings.ice_transport_policy == "relay"
        self.required = settings.turn_required or self.relay_only
        self.on_space = bool(settings.space_id)
        self.stun = [{"urls": _split(settings.stun_urls)}] if _split(settings.stun_urls) else []
        self._credentials: Credentials | None = None
        self._checked_url: str | None = None
        self._error: str | None = NO_TURN if self.provider == "none" and self.required else None
        self._failed_at = float("-inf")
        self._lock = asyncio.Lock()
        self.fetched = 0  # credential sets fetched (the first, then each renewal)

    # -- state
    @property
    def configured(self) -> bool:
        return self.provider != "none"

    @property
    def error(self) -> str | None:
        """Why no relay can be handed out now (None when the last attempt worked or none was made)."""
        return self._error

    def describe(self) -> dict[str, Any]:
        c = self._credentials
        return {
            "provider": self.provider,
            "required": self.required,
            "relay_only": self.relay_only,
            "ok": self._error is None and c is not None,
            "error": self._error,
            "relay": self._checked_url,
            "expires_in_s": round(c.expires_at - time.time()) if c else None,
            "credentials_fetched": self.fetched,
        }

    def notice(self, page_host: str | None) -> str | None:
        """A plain sentence for the page when a browser there may not be able to connect, else None."""
        if self._error is not None:
            if self._error == NO_TURN:
                return NO_TURN
            if self.required:
                return f"WebRTC cannot connect: {self._error}"
            return f"The TURN relay is unavailable ({self._error}): a browser on another network may not connect."
        if not self.configured and page_host is not None and page_host.rsplit(":", 1)[0] not in LOOPBACK_HOSTS:
            return REMOTE_WITHOUT_TURN
        return None

    async def start(self) -> None:
        """Log what the relay setup is at launch, and check the credentials once so the log shows a problem."""
        if not self.configured:
            if self.required:
                log.error("TURN relay required but none configured: %s", NO_TURN)
            else:
                log.info("no TURN relay configured: browsers on this machine or its network connect directly")
            return
        try:
            await self._current()
        except TurnError:
            pass  # logged; the page says it too

    # -- per connection
    async def ice_servers(self) -> list[dict[str, Any]]:
        """STUN and TURN servers for one new connection; raises TurnError where TURN is required and broken."""
        if not self.configured:
            if self.required:
                raise TurnError(NO_TURN)
            return list(self.stun)
        try:
            credentials = await self._current()
        except TurnError:
            if self.required:
                raise
            return list(self.stun)  # TURN is optional here: connect directly where that works
        return self.stun + credentials.servers

    async def browser_configuration(self) -> dict[str, Any]:
        config: dict[str, Any] = {"iceServers": await self.ice_servers()}
        if self.relay_only:
            config["iceTransportPolicy"] = "relay"
        return config

    async def server_configuration(self) -> RTCConfiguration:
        servers = [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential"))
                   for s in await self.ice_servers()]
        policy = RTCIceTransportPolicy.RELAY if self.relay_only else RTCIceTransportPolicy.ALL
        return RTCConfiguration(iceServers=servers, iceTransportPolicy=policy)

    # -- credentials
    def _margin(self) -> float:
        """Renew when less than this is left, so a session starting now ends before its credentials expire."""
        if self.provider == "static":
            return 0.0
        return min(self.settings.turn_ttl / 2, max(60.0, self.settings.session_time_limit) + 30.0)

    async def _current(self) -> Credentials:
        async with self._lock:
            now = time.time()
            c = self._credentials
            if c is not None and self._error is None and c.expires_at - now > self._margin():
                return c
            if self._error is not None and now - self._failed_at < RETRY_AFTER_S:
                raise TurnError(self._error)
            try:
                c = await self._fetch(now)
                if not _turn_urls(c.servers):
                    raise TurnError(f"{LABELS[self.provider]} answered without a turn: server")
                if self.on_space:  # for the server's own peer (browsers try every URL whatever the order)
                    c.servers = prefer_ports(c.servers, SPACE_OUTBOUND_PORTS)
                if self.settings.turn_check:
                    self._checked_url = await check_relay(c.servers)
            except Exception as exc:
                reason = str(exc) if isinstance(exc, TurnError) else \
                    f"could not get credentials ({type(exc).__name__}: {exc})"
                message = f"{LABELS[self.provider]}: {reason}"
                if message != self._error:
                    log.error("TURN relay unavailable: %s", message)
                self._error, self._failed_at, self._credentials = message, now, None
                raise TurnError(message) from None
            if self._error is not None or self._credentials is None:
                log.info("TURN relay ready: %s%s, credentials valid for %d s", LABELS[self.provider],
                         f", relay checked at {self._checked_url}" if self._checked_url else "",
                         c.expires_at - now)
            else:
                log.info("TURN credentials renewed (%s, valid for %d s)", self.provider, c.expires_at - now)
            self._credentials, self._error = c, None
            self.fetched += 1
            return c

    async def _fetch(self, now: float) -> Credentials:
        s, ttl = self.settings, self.settings.turn_ttl
        if self.provider == "static":
            server = {"urls": _split(s.turn_url), "username": s.turn_username, "credential": s.turn_credential}
            return Credentials(normalize([server]), now + STATIC_RECHECK_S)
        if self.provider == "secret":
            username, credential = rest_credentials(s.turn_shared_secret, ttl, now)
            server = {"urls": _split(s.turn_url), "username": username, "credential": credential}
            return Credentials(normalize([server]), now + ttl)
        if self.provider == "twilio":
            return await self._twilio(now)
        from fastrtc.credentials import get_cloudflare_turn_credentials_async  # fastrtc loads gradio: on first use

        if self.provider == "cloudflare":
            if not (s.cloudflare_turn_key_id and s.cloudflare_turn_key_api_token):
                raise TurnError("CLOUDFLARE_TURN_KEY_ID and CLOUDFLARE_TURN_KEY_API_TOKEN must both be set")
            body = await get_cloudflare_turn_credentials_async(
                turn_key_id=s.cloudflare_turn_key_id, turn_key_api_token=s.cloudflare_turn_key_api_token,
                hf_token="", ttl=ttl)
        else:
            if not s.hf_token:
                raise TurnError("HF_TOKEN is not set")
            body = await get_cloudflare_turn_credentials_async(hf_token=s.hf_token, ttl=ttl)
        return Credentials(normalize(body.get("iceServers")), now + ttl)

    async def _twilio(self, now: float) -> Credentials:
        s = self.settings
        if not (s.twilio_account_sid and s.twilio_auth_token):
            raise TurnError("TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN must both be set")
        url = f"https://api.twilio.com/2010-04-01/Accounts/{s.twilio_account_sid}/Tokens.json"
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(url, auth=(s.twilio_account_sid, s.twilio_auth_token), data={"Ttl": str(s.turn_ttl)})
        if not r.is_success:
            raise TurnError(f"Twilio refused the token request ({r.status_code}): {r.text[:200]}")
        body = r.json()
        return Credentials(normalize(body.get("ice_servers")), now + int(body.get("ttl") or s.turn_ttl))

    # -- wiring into fastrtc's WebRTC component
    def attach(self, webrtc: Any) -> None:
        """Per-connection ICE servers for the browser and the server's peer.

        The page's component calls its `turn()` server function before each connection, and that answers
        `resolve_rtc_configuration()`; the server's peer is built in `handle_offer`. Both are replaced on
        this instance. The component's own `rtc_configuration` stays a plain dict (STUN only): the page
        falls back to it when `turn()` answers an error, and the offer is then refused with that error.
        """
        webrtc.rtc_configuration = {"iceServers": list(self.stun)}
        webrtc.resolve_rtc_configuration = self.browser_configuration
        webrtc.handle_offer = self.guard(webrtc, webrtc.handle_offer)

    def guard(self, webrtc: Any, handle_offer: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def guarded(body: dict[str, Any], set_outputs: Callable[..., None]) -> Any:
            if body.get("type") == "ice-candidate" or body.get("webrtc_id") in webrtc.connections:
                return await handle_offer(body, set_outputs)
            if len(webrtc.pcs) >= webrtc.concurrency_limit:
                log.warning("session %s refused: all %d sessions are in use", body.get("webrtc_id"),
                            webrtc.concurrency_limit)
                return await handle_offer(body, set_outputs)  # fastrtc answers concurrency_limit_reached
            try:
                config = await self.server_configuration()
            except TurnError as exc:
                log.warning("session %s refused: %s", body.get("webrtc_id"), exc)
                return JSONResponse(status_code=200, content={
                    "status": "failed", "meta": {"error": "turn_unavailable", "message": str(exc)}})
            # fastrtc builds the peer from this attribute before its first await: set per connection
            webrtc.server_rtc_configuration = config
            return await handle_offer(body, set_outputs)

        return guarded
