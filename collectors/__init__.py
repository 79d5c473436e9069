"""fabricd's collectors: one module each, registered here by name, imported lazily.

A collector whose optional dependency is missing fails to load alone; the agent keeps the others.
"""

REGISTRY: dict[str, str] = {
    "infiniband": "collectors.infiniband:InfinibandCollector",
    "ethtool": "collectors.ethtool:EthtoolCollector",
    "netlink": "collectors.netlink:NetlinkCollector",
    "ibfabric": "collectors.ibfabric:IbFabricCollector",
    "nccl": "collectors.nccl:NcclCollector",
    "pingmesh": "collectors.pingmesh:PingmeshCollector",
    "capture": "collectors.capture:CaptureCollector",
    "jobs": "collectors.jobs:JobsCollector",
    "inspector": "collectors.inspector:InspectorCollector",
    "ras": "collectors.ras:RasCollector",
    "lldp": "collectors.lldp:LldpCollector",
}

# What the agent and ``fabricd collect`` run when the config names no collectors: the host
# counters, which need no configuration. The others need peers, commands or tools.
DEFAULT_COLLECTORS: tuple[str, ...] = ("infiniband",)
