"""A small typed model of the fabric: nodes, HCA ports, switches and the links between them.

Element ids are strings a user can read and detectors can join on (localization, the simulator):

- node ``node-007``; HCA port ``node-007/mlx5_3``; switch ``leaf-01`` / ``spine-02``;
- host link ``node-007/mlx5_3~leaf-01`` (HCA port first); fabric link ``leaf-01~spine-02`` (lower
  tier first, then by name). Parallel cables between the same two switches are one fabric link
  element (a trunk) whose ``ports`` lists every cable.

``paths(src, dst)`` returns the candidate element sets a flow between two nodes may use: one set per
shortest switch path (ECMP over spines on a two-level leaf/spine) and HCA pairing.

The model lives in ``model``; building one (fat tree, YAML) in ``build``; the versioned document
(``PUT /api/v1/topology``, ``fabricd topology``) in ``document``; the
topology of ``ibnetdiscover`` output in ``ibnet`` (``fabricd.parsers.ibnetdiscover`` parses it).
This package re-exports their public names.
"""

from __future__ import annotations

from fabricd.topology.build import Naming, fat_tree, from_yaml
from fabricd.topology.document import DOC_VERSION, Routes, from_doc, replies_of, routes_of, to_doc
from fabricd.topology.ibnet import ca_port_id, end_id, from_ibnetdiscover, switch_ids
from fabricd.topology.model import LEAF, MAX_PATHS, SPINE, Element, ElementKind, HcaPort, Link, Switch, Topology

__all__ = [
    "DOC_VERSION",
    "LEAF",
    "MAX_PATHS",
    "SPINE",
    "Element",
    "ElementKind",
    "HcaPort",
    "Link",
    "Naming",
    "Routes",
    "Switch",
    "Topology",
    "ca_port_id",
    "end_id",
    "fat_tree",
    "from_doc",
    "from_ibnetdiscover",
    "from_yaml",
    "replies_of",
    "routes_of",
    "switch_ids",
    "to_doc",
]
