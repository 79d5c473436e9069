"""Random variants of the shipped faults through ``fabricd eval``'s replay: what the shipped set misses.

    python bench/variants.py [--seed N] [--per-kind K] [--jobs J] [--keep DIR]

Each variant draws a fat tree (2-8 nodes per leaf, 2-6 leaves, 1-4 HCAs, 2-4 spines, InfiniBand or
RoCE where the fault allows), a place for the fault (a lossy or flapping link is a fabric link one
time in three), its severity (0.45-0.9), the load (0.35-0.8),
the seed and a 5 s or 10 s scrape, and is replayed as ``fabricd eval`` does. A variant is a
*problem* when its incidents are not exactly its fault's right element (missed, misplaced, or an
extra incident: the eval's precision counts an extra incident inside the fault's scope as the
fault's, so it does not show them), or when the fault is reported late. ``--keep`` writes each
variant's YAML, to replay one with ``fabricd eval FILE``.

The cases of tests/test_eval_variants.py were found so (docs/detection.md). Known and left: in
a two-leaf fabric a spine link's congestion is reported as one of the two links to that spine
(every path crosses both, and the simulator's queue has no direction: the element named is the
first, right half the time), and a queue crossed by fewer probe pairs than the guard asks is
reported only where the NCCL runs across it are slow and may all cross it (fabricd/detect/runs.py:
on 12 nodes two a leaf, one such variant in four; on 4 nodes behind 2 leaves no pair at all). A lossy fabric link is often
reported late (its pairs cross the 0.3 % threshold of a 60 s window one by one): on InfiniBand,
whose sequence errors behind two leaves lower the share of lossy pairs asked, 3 in 7 are on time
and the rest 18-30 s in; RoCE without traced routes 15-47 s in. On 8 InfiniBand nodes the host
link of the node whose every pair crossed it opened first.
"""

from __future__ import annotations

import argparse
import random
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Fault kind -> the link layers it exists on (PFC is Ethernet's; HOL needs pause counters here).
KINDS = {
    "congestion": ("infiniband", "roce"),
    "lossy_link": ("infiniband", "roce"),
    "link_flap": ("infiniband", "roce"),
    "hol_blocking": ("roce",),
    "pfc_storm": ("roce",),
    "straggler": ("infiniband", "roce"),
}
ACTIVE_SECONDS = 240  # how long each fault lasts; the replay runs a minute past it


def variant(rng: random.Random, kind: str, index: int) -> dict[str, Any]:
    """One scenario document with a ``kind`` fault somewhere on a random fat tree."""
    per_leaf, leaves = rng.choice([2, 4, 8]), rng.choice([2, 3, 4, 6])
    hcas, spines = rng.choice([1, 2, 4]), rng.choice([2, 3, 4])
    layer = rng.choice(KINDS[kind])
    node = rng.randrange(1, per_leaf * leaves + 1)
    port = f"node-{node:03d}/mlx5_{rng.randrange(hcas)}"
    uplink = f"leaf-{rng.randrange(1, leaves + 1):02d}~spine-{rng.randrange(1, spines + 1):02d}"
    # a cable fails between switches as well as at a host: a third of the links are fabric links
    link = uplink if rng.random() < 1 / 3 else f"{port}~leaf-{(node - 1) // per_leaf + 1:02d}"
    at = {
        "congestion": uplink,
        "lossy_link": link,
        "link_flap": link,
        "hol_blocking": port,
        "pfc_storm": port,
        "straggler": f"node-{node:03d}",
    }[kind]
    start = rng.choice([90, 120, 150, 180])
    return {
        "name": f"v-{kind}-{layer}-{index}",
        "seed": rng.randrange(1000),
        "duration": f"{start + ACTIVE_SECONDS + 60}s",
        "interval": f"{rng.choice([5, 10])}s",
        "topology": {
            "nodes": per_leaf * leaves,
            "hcas_per_node": hcas,
            "nodes_per_leaf": per_leaf,
            "spines": spines,
            "link_layer": layer,
        },
        "workload": {"kind": "allreduce", "load": round(rng.uniform(0.35, 0.8), 2)},
        "faults": [
            {
                "kind": kind,
                "at": at,
                "start": f"{start}s",
                "end": f"{start + ACTIVE_SECONDS}s",
                "severity": round(rng.uniform(0.45, 0.9), 2),
            }
        ],
    }


def judge(doc: dict[str, Any]) -> dict[str, Any]:
    """Replay one variant; its fault's outcome and every incident it opened."""
    from fabricd.sim import eval as ev
    from fabricd.sim.scenario import parse

    result = ev.evaluate(parse(doc, doc["name"]))
    (fault,) = result.faults
    opened = [(o["kind"], o["element"]) for o in result.opened]
    problems = []
    if not fault.detected:
        problems.append("missed")
    elif not fault.correct or len(opened) != 1:
        problems.append("placed " + ", ".join(f"{k}@{e}" for k, e in opened))
    elif not fault.on_time:
        problems.append(f"late ({fault.time_to_detect_seconds:.0f} s)")
    return {"name": doc["name"], "fault": f"{fault.kind}@{fault.element}", "problems": problems}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-kind", type=int, default=3, help="variants of each fault kind")
    ap.add_argument("--jobs", type=int, default=2, help="replays at once")
    ap.add_argument("--keep", type=Path, help="write each variant's YAML here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    docs = [variant(rng, kind, i) for kind in KINDS for i in range(args.per_kind)]
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        for doc in docs:
            (args.keep / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(judge, docs))
    bad = [r for r in results if r["problems"]]
    for r in results:
        print(f"{r['name']:<28} {r['fault']:<36} {'; '.join(r['problems']) or 'ok'}")
    print(f"{len(results) - len(bad)} of {len(results)} variants exactly right (seed {args.seed})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
