"""Which names the view answers to, and whether where it listens deserves a warning.

A page of another site can have its own name resolve to 127.0.0.1 (DNS rebinding): the
browser then sends that page's requests to a view on loopback, with the site's name in the
``Host`` header, and lets the page read the answers. A view that answers only the names it
is reached by (its bound address, loopback's names, and the names given as trusted hosts:
a proxy's) gives such a page a ``400`` and nothing else. Pure: the app asks, and answers."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

#: Loopback's names, always answered: a browser on this host reaches the view by them.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
_NAME = re.compile(r"^(?:[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?|\[[0-9a-f:.]+\])$")
_PORT = re.compile(r"^[0-9]{0,5}$")


def as_host_name(name: str) -> str:
    """``name`` (a bound address or a trusted host) as a ``Host`` header names it:
    lowercase, an IPv6 address in brackets."""
    name = name.strip().lower()
    try:
        if ipaddress.ip_address(name).version == 6:
            return f"[{name}]"
    except ValueError:
        pass
    return name


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a trusted host (a host name or address, no port), or None."""
    if not _NAME.match(as_host_name(name)):
        return f"--trusted-host takes a host name or address without a port, got {name!r:.100}"
    return None


def trusted_names(names: Iterable[str]) -> frozenset[str]:
    """The names a request may give: loopback's and ``names``."""
    return LOOPBACK_NAMES | {as_host_name(name) for name in names}


def named_host(header: str | None) -> str | None:
    """The host a ``Host`` header value names, without its port (lowercase); None for a
    missing or malformed one."""
    header = (header or "").strip().lower()
    if header.startswith("["):  # an IPv6 address: its colons are not the port's
        end = header.find("]") + 1
        name, rest = header[:end], header[end:]
        if not end or (rest and not rest.startswith(":")):
            return None
        port = rest[1:]
    else:
        name, _, port = header.partition(":")
    return name if name and _PORT.match(port) else None


def is_trusted(header: str | None, trusted: frozenset[str]) -> bool:
    """Whether a request whose ``Host`` header is ``header`` is one the view answers."""
    name = named_host(header)
    return name is not None and name in trusted


def is_loopback(address: str) -> bool:
    """Whether a view bound to ``address`` is reachable from this host only."""
    if address.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a name: whatever it resolves to, it may be more than loopback


def exposure_warning(address: str, authenticated: bool) -> str | None:
    """What to warn of when the view listens on ``address`` (``authenticated``: it asks
    for credentials): None on loopback."""
    if is_loopback(address):
        return None
    if not authenticated:
        return (
            f"the saga web view listens on {address}, beyond loopback, without authentication:"
            " every page is open to whoever reaches the port (give --basic-auth or --token)"
        )
    return (
        f"the saga web view listens on {address}, beyond loopback: serve it behind HTTPS,"
        " its credentials travel with every request"
    )
