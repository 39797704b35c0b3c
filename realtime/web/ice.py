"""ICE configuration: STUN/TURN servers for both peers, and loopback-only candidates.

`use_loopback_only()` makes aioice offer 127.0.0.1 as its only host candidate (aioice skips loopback
by default), so tests and single-machine use never send media to another address.
"""

from __future__ import annotations

from typing import Any

_patched = False


def use_loopback_only() -> None:
    global _patched
    if _patched:
        return
    import aioice.ice

    def loopback_addresses(use_ipv4: bool = True, use_ipv6: bool = False) -> list[str]:
        return ["127.0.0.1"] if use_ipv4 else []

    aioice.ice.get_host_addresses = loopback_addresses
    _patched = True


def rtc_configuration(ice_servers: list[dict[str, Any]]) -> dict[str, Any]:
    """The RTCPeerConnection configuration handed to the browser and to the server's peer."""
    return {"iceServers": ice_servers}
