"""One listening socket on exactly the address a server was given (never all interfaces
unless told), shared by the servers that bind their own: the frame connections and the Raft
peer transport."""

from __future__ import annotations

import asyncio
import socket


async def bind_listener(host: str, port: int, what: str) -> socket.socket:
    """A TCP socket bound to the first address ``host`` names (port 0: any free one), ready
    for ``asyncio.start_server(sock=...)``; an OSError naming ``what`` and the address if the
    bind fails. One address only: with port 0, each address of a name would get a port of
    its own, and a server can announce only one."""
    loop = asyncio.get_running_loop()
    family, kind, proto, _, address = (await loop.getaddrinfo(
        host.strip("[]") or None, port, type=socket.SOCK_STREAM,
        flags=socket.AI_PASSIVE))[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen for {what} on {host}:{port}: {e.strerror}") from None
    return sock
