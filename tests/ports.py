"""Loopback TCP ports for the servers the tests start, taken outside the kernel's ephemeral range.

A port found by binding to port 0 comes from the ephemeral range, the same range the kernel draws the
source port of every outgoing connection from. Between the moment the test releases such a port and the
moment its server binds it, any process's next connection (Jaeger's, Prometheus's, the test's own) may take
it as its source port, and the server then fails with "address already in use". Ports below (or above) the
ephemeral range are never handed out that way, so only a listener can hold one: ``free_port()`` checks that
none does, and walks the range from a random start so two callers in one run do not pick the same port.
"""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LINUX_DEFAULT = (32768, 60999)
_LOWEST = 10_000  # below this sit the well-known and registered ports that system services may use


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(word) for word in _PORT_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return _LINUX_DEFAULT
    return low, high


def _candidates() -> list[int]:
    low, high = _ephemeral_range()
    below = range(_LOWEST, low) if low - _LOWEST >= 1_000 else range(0)
    above = range(high + 1, 65_536)
    ports = list(below) + list(above)
    if not ports:  # a kernel that makes (nearly) every port ephemeral: take what binding gives
        return []
    start = random.randrange(len(ports))
    return ports[start:] + ports[:start]


_CANDIDATES = _candidates()
_NEXT = itertools.cycle(_CANDIDATES) if _CANDIDATES else None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port nothing listens on now, outside the ephemeral range (a server's, or a closed one)."""
    if _NEXT is not None:
        for _ in range(len(_CANDIDATES)):
            port = next(_NEXT)
            if _bindable(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
