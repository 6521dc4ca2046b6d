"""The client's address: the socket's peer, or, when that peer is a trusted proxy
(``TIMELINE_TRUSTED_PROXIES``), the address the proxies forwarded.

The forwarded header (``TIMELINE_TRUSTED_PROXY_HEADER``: ``X-Forwarded-For``, or RFC 7239's
``Forwarded``) is a list each proxy appends the peer it saw to, so only its right end is
trustworthy: it is read from the right, skipping trusted proxies, and the first address that
is not one is the client. Anything a client wrote itself sits left of that and is never
read. An entry that is no address (``unknown``, an obfuscated name, garbage) stops the walk:
the last trusted hop is then the best that is known. aiohttp-remotes was considered: its
``XForwardedFiltered`` never checks that the peer is trusted, its ``XForwardedStrict`` refuses
every request not sent through the whole proxy chain (with a plain-text 400), and neither
reads ``Forwarded`` with ports; the walk below is all that is needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address

from aiohttp import web

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network


def client_address(
    request: web.Request, trusted: Sequence[Network], header: str = "X-Forwarded-For"
) -> str:
    """The client's address as text (``unknown`` when the transport has none)."""
    peer = _parse(request.remote or "")
    if peer is None:
        return request.remote or "unknown"
    if not _is_trusted(peer, trusted):
        return str(peer)
    hops = _forwarded(request) if header == "Forwarded" else _x_forwarded_for(request)
    client = peer
    for hop in reversed(hops):
        address = _parse(hop)
        if address is None:
            break
        client = address
        if not _is_trusted(address, trusted):
            break
    return str(client)


def _is_trusted(address: Address, trusted: Iterable[Network]) -> bool:
    return any(address in network for network in trusted if address.version == network.version)


def _x_forwarded_for(request: web.Request) -> list[str]:
    """Every entry of every ``X-Forwarded-For`` line, in order (several lines are one list)."""
    return [
        part.strip()
        for line in request.headers.getall("X-Forwarded-For", ())
        for part in line.split(",")
    ]


def _forwarded(request: web.Request) -> list[str]:
    """The ``for`` parameter of each ``Forwarded`` element, in order (aiohttp parses them)."""
    return [str(element.get("for", "")) for element in request.forwarded]


def _parse(text: str) -> Address | None:
    """An address from ``1.2.3.4``, ``1.2.3.4:80``, ``2001:db8::1``, ``[2001:db8::1]:80``."""
    text = text.strip().strip('"')
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ip_address(text)
    except ValueError:
        return None
    mapped = address.ipv4_mapped if isinstance(address, IPv6Address) else None
    return mapped or address  # a dual-stack socket's IPv4 peer is an IPv4 address
