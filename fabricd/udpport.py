"""UDP ports for sockets that path traces share (``SO_REUSEPORT``, ``fabricd.tracing``)."""

from __future__ import annotations

import socket


def bind_own_port(sock: socket.socket, address: str, attempts: int = 20) -> int:
    """Bind ``sock`` (``SO_REUSEPORT`` set: path traces share its port, ``fabricd.tracing``) to a
    port no other socket holds; returns it.

    ``bind(port 0)`` with ``SO_REUSEPORT`` may hand out a port another reuse-port socket of the same
    user already holds (measured here: 62 of 2,000 such binds got a taken port; none without the
    option), and the kernel then spreads the datagrams to that port over both sockets by their
    4-tuple. Two agents' probers on one port lost every reply of the pairs hashed to the other:
    CI's live eval saw 100 % loss on one pair from its first probe and opened a link flap. So the
    port is drawn by a socket without the option (the kernel gives it a free one) and ``sock``
    binds it by number; another process taking it in between is a failed bind, and a retry.
    """
    family = sock.family
    for _ in range(attempts):
        with socket.socket(family, socket.SOCK_DGRAM) as draw:
            draw.bind((address, 0))
            port = int(draw.getsockname()[1])
        try:
            sock.bind((address, port))
        except OSError:
            continue
        return port
    raise OSError(f"no free UDP port on {address} after {attempts} attempts")
