"""Which network interface an RDMA port is (one port, one identity: issue 16 §3).

A RoCE port's GID table names its netdev: ``<dev>/ports/<p>/gid_attrs/ndevs/<index>`` holds the
interface of GID ``index`` (kernel ABI ``sysfs-class-infiniband``, kernel >= 4.11; index 0 is the
port's default GID, always populated while the netdev exists). Older kernels lack ``gid_attrs``:
then a device with exactly one entry in ``device/net/`` is that entry. InfiniBand ports have no
GID netdevs; an IPoIB interface is a different thing and is not joined.
"""

from __future__ import annotations

import os

_NAME_SIZE = 64  # IFNAMSIZ is 16; anything longer is not an interface name


def port_netdev(port_path: str) -> str:
    """The netdev of the port at ``port_path`` (``.../class/infiniband/<dev>/ports/<p>``); "" if none."""
    ndevs = f"{port_path}/gid_attrs/ndevs"
    for index in sorted(_entries(ndevs), key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)):
        name = _read(f"{ndevs}/{index}")
        if name:
            return name
    if _read(f"{port_path}/link_layer") != "Ethernet":
        return ""
    net = _entries(f"{port_path.rsplit('/ports/', 1)[0]}/device/net")
    return net[0] if len(net) == 1 else ""


def _entries(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(_NAME_SIZE).decode(errors="replace").strip()
    except OSError:  # an unused GID reads EINVAL ("Invalid argument") on some kernels
        return ""
