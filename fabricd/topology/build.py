"""Building a ``Topology``: the simulator's fat tree, topology files, and the REST API's document."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fabricd.topology.model import LEAF, SPINE, HcaPort, Switch, Topology


@dataclass(frozen=True, slots=True)
class Naming:
    """How ``fat_tree`` names its hosts and switches: ``str.format`` templates given the 1-based
    number. The default is the simulator's ``node-001`` / ``leaf-01`` / ``spine-01``; a site's own
    scheme (``dgx-h100-{:03d}``, ``ib-leaf-{}``) works the same, since kinds come from the topology."""

    node: str = "node-{:03d}"
    leaf: str = "leaf-{:02d}"
    spine: str = "spine-{:02d}"

    def check(self) -> None:
        """Raise ValueError naming a template that does not make distinct, usable ids."""
        for key in ("node", "leaf", "spine"):
            template = getattr(self, key)
            try:
                one, two = template.format(1), template.format(2)
            except (IndexError, KeyError, ValueError) as exc:
                raise ValueError(f"{key}: {template!r} is not a template of one number ({exc})") from exc
            if one == two:
                raise ValueError(f"{key}: {template!r} gives every {key} the same name (use {{}} for the number)")
            if any(c in one for c in "/~|") or not one.strip() or one != one.strip():
                raise ValueError(
                    f"{key}: {template!r} makes {one!r}; names may not hold '/', '~', '|' or spaces at the ends"
                )


def fat_tree(
    nodes: int,
    hcas_per_node: int,
    nodes_per_leaf: int,
    spines: int,
    link_layer: str = "infiniband",
    names: Naming | None = None,
) -> Topology:
    """A two-level leaf/spine: ``node-001..``, each with HCAs ``mlx5_0..`` on its group's leaf
    ``leaf-01..``; every leaf has one uplink to every spine ``spine-01..`` (other names: ``names``).
    Raises ValueError when the names collide."""
    if min(nodes, hcas_per_node, nodes_per_leaf, spines) < 1:
        raise ValueError("fat_tree needs at least one node, HCA, node per leaf and spine")
    names = names or Naming()
    names.check()
    topo = Topology(link_layer=link_layer)
    leaves = -(-nodes // nodes_per_leaf)
    spine_ids = [names.spine.format(s) for s in range(1, spines + 1)]
    leaf_ids = [names.leaf.format(leaf) for leaf in range(1, leaves + 1)]
    node_ids = [names.node.format(n) for n in range(1, nodes + 1)]
    every = spine_ids + leaf_ids + node_ids
    if len(set(every)) != len(every):
        twice = sorted({x for x in every if every.count(x) > 1})
        raise ValueError(f"names: {', '.join(twice[:3])} named twice")
    for sid in spine_ids:
        topo.add_switch(Switch(sid, SPINE))
    for leaf, lid in enumerate(leaf_ids, 1):
        topo.add_switch(Switch(lid, LEAF))
        for s, sid in enumerate(spine_ids, 1):
            topo.connect_switches(lid, sid, (nodes_per_leaf * hcas_per_node + s, leaf))
    for n, node in enumerate(node_ids, 1):
        leaf_id = leaf_ids[(n - 1) // nodes_per_leaf]
        for h in range(hcas_per_node):
            hca = HcaPort(f"{node}/mlx5_{h}", node, f"mlx5_{h}")
            topo.add_hca_port(hca)
            leaf_port = ((n - 1) % nodes_per_leaf) * hcas_per_node + h + 1
            topo.connect_host(hca.id, leaf_id, (1, leaf_port))
    return topo


def from_yaml(path: Path) -> Topology:
    """A topology file: either ``fat_tree: {nodes, hcas_per_node, nodes_per_leaf, spines, names}`` or explicit
    ``switches: [{id, tier}]``, ``nodes: [{id, hcas: [mlx5_0, ...]}]``, ``links: [{a, b}]``."""
    doc = yaml.safe_load(path.read_text()) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: a topology file is a mapping")
    layer = str(doc.get("link_layer", "infiniband"))
    if "fat_tree" in doc:
        shape = dict(doc["fat_tree"])
        names = Naming(**shape.pop("names", None) or {})
        return fat_tree(**shape, link_layer=layer, names=names)
    return _explicit(doc, layer)


def _explicit(doc: dict[str, Any], layer: str) -> Topology:
    topo = Topology(link_layer=layer)
    for sw in doc.get("switches", []):
        topo.add_switch(Switch(str(sw["id"]), str(sw.get("tier", LEAF)), str(sw.get("guid", ""))))
    for node in doc.get("nodes", []):
        for dev in node.get("hcas", []):
            topo.add_hca_port(HcaPort(f"{node['id']}/{dev}", str(node["id"]), str(dev)))
    for link in doc.get("links", []):
        a, b = str(link["a"]), str(link["b"])
        if a in topo.hca_ports:
            topo.connect_host(a, b)
        elif a in topo.switches and b in topo.switches:
            topo.connect_switches(a, b)
        else:
            raise ValueError(f"link {a}~{b}: unknown end (declare nodes and switches first)")
    return topo
