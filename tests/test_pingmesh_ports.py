"""Pingmesh sockets: a prober's reuse-port socket never shares its port with another socket."""

from __future__ import annotations

import socket

from fabricd.udpport import bind_own_port


def test_a_probers_reuse_port_socket_gets_a_port_no_other_socket_holds() -> None:
    # bind(port 0) with SO_REUSEPORT may return a port another reuse-port socket holds (62 of 2,000
    # here), and the kernel then splits that port's replies between the two: CI's live eval lost
    # every reply of one pair to another agent's prober. bind_own_port never shares.
    held = []
    try:
        for _ in range(1000):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            s.bind(("0.0.0.0", 0))
            held.append(s)
        taken = [s.getsockname()[1] for s in held]
        mine = []
        for _ in range(300):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            held.append(s)
            mine.append(bind_own_port(s, "0.0.0.0"))
        assert not set(mine) & set(taken)
        assert len(set(mine)) == len(mine)
    finally:
        for s in held:
            s.close()
