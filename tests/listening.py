"""What a process listens on, read from /proc: how a test checks that a server it started
is reachable on 127.0.0.1 only, and on the ports it was given."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path


def _address(hex_address: str) -> str:
    """An address as /proc/net writes it (little-endian hex words, IPv4 or IPv6) in its usual
    form; an IPv4-mapped IPv6 address as the IPv4 one."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.ip_address(words)
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


def listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                out.append((_address(address), int(port, 16)))
    return out
