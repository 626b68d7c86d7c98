"""`make bench-planner`: how long the operator's placement planner takes at cluster scale.

A seeded synthetic cluster: 100 SwapNodes with 8 GPUs each in two pools (60 nodes of H100
80 GB, 40 tainted nodes of GH200 96 GB), and 2,000 ModelDeployments with random sizes,
priorities, pin flags, KV settings and placements (no selector; a nodeSelector for one
pool; the GH200 pool with its toleration; a gpuSelector). It times `plan`:

- cold: no assignments (every model is placed from scratch);
- warm: re-plan with the cold plan's own assignments (every model is kept);
- node_loss: the same, with the 5 nodes that host the most models gone (their models move).

Each is run REPS times after one untimed run; the result file holds every sample and the
median. The planner is pure Python, so no GPU or engine is involved.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import results_schema
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeployment, SwapNode
from modelswap_operator.planner import (
    Assignment,
    PlacedReason,
    Plan,
    clear_policy_cache,
    plan,
)

GIB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]
COMMAND = "make bench-planner (python -m bench.planner)"
NODES = 100
GPUS_PER_NODE = 8
MODELS = 2000
NODES_LOST = 5
SEED = 20260101

#: pool → (nodes, product, HBM total, host store per GPU, taint)
POOLS: dict[str, tuple[int, str, int, int, dict[str, str] | None]] = {
    "h100": (60, "NVIDIA H100 80GB HBM3", 80 * GIB, 256 * GIB, None),
    "gh200": (
        40,
        "NVIDIA GH200 96GB HBM3",
        96 * GIB,
        400 * GIB,
        {"key": "modelswap.io/gh200", "value": "true", "effect": "NoSchedule"},
    ),
}


def swap_nodes(rng: random.Random) -> list[SwapNode]:
    nodes = []
    for pool, (count, product, hbm_bytes, store_bytes, taint) in POOLS.items():
        for n in range(count):
            name = f"{pool}-{n:03d}"
            gpus = [
                {
                    "uuid": f"GPU-{rng.getrandbits(64):016x}",
                    "ordinal": i,
                    "product": product,
                    "hbmTotalBytes": hbm_bytes,
                    "hbmReservedBytes": 2 * GIB,
                    "perProcessOverheadBytes": 512 << 20,
                    "hostStoreCapacityBytes": store_bytes,
                }
                for i in range(GPUS_PER_NODE)
            ]
            status = {
                "gpus": gpus,
                "nodeLabels": {"pool": pool, "zone": f"zone-{n % 3}"},
                "nodeTaints": [taint] if taint else [],
            }
            nodes.append(SwapNode.from_dict({"metadata": {"name": name}, "status": status}))
    return nodes


def _placement(rng: random.Random) -> dict[str, Any] | None:
    roll = rng.random()
    if roll < 0.5:
        return None
    if roll < 0.75:
        return {"nodeSelector": {"pool": "h100"}}
    if roll < 0.9:
        return {
            "nodeSelector": {"pool": "gh200"},
            "tolerations": [{"key": "modelswap.io/gh200", "operator": "Exists"}],
        }
    return {"gpuSelector": {"minHbmBytes": "90Gi"}, "tolerations": [{"operator": "Exists"}]}


def deployments(rng: random.Random) -> list[ModelDeployment]:
    out = []
    for i in range(MODELS):
        weights_gib = round(rng.lognormvariate(2.0, 0.8), 1)
        spec: dict[str, Any] = {
            "model": {
                "source": {"uri": f"/models/m{i}"},
                "weightsBytes": f"{max(1, int(min(weights_gib, 70) * 1024))}Mi",
                "kvCacheBytes": f"{rng.choice([1, 2, 4, 8])}Gi",
            },
            "swapPolicy": {
                "priority": rng.choice([0, 50, 100, 100, 100, 200, 1000]),
                "pinned": rng.random() < 0.03,
                "kv": rng.choice(["discard", "discard", "preserve"]),
            },
        }
        if rng.random() < 0.3:
            spec["kvCache"] = {"hostBytes": f"{rng.choice([1, 2, 4])}Gi"}
        placement = _placement(rng)
        if placement:
            spec["placement"] = placement
        metadata = {"uid": f"{rng.getrandbits(128):032x}", "name": f"m{i}", "namespace": "bench"}
        out.append(ModelDeployment.from_dict({"metadata": metadata, "spec": spec}))
    return out


def _time(
    nodes: Sequence[SwapNode],
    models: Sequence[ModelDeployment],
    assignments: Mapping[str, Assignment],
    reps: int,
    before: Callable[[], None] = lambda: None,
) -> tuple[list[float], Plan]:
    result = plan(nodes, models, assignments, BUILTIN_DEFAULTS)  # untimed warm-up
    samples = []
    for _ in range(reps):
        before()
        gc.collect()
        start = time.perf_counter()
        result = plan(nodes, models, assignments, BUILTIN_DEFAULTS)
        samples.append(time.perf_counter() - start)
    return samples, result


def _row(name: str, params: dict[str, Any], samples: list[float], result: Plan) -> dict[str, Any]:
    reasons = Counter(p.reason for p in result.placed.values())
    row = results_schema.result(name, params, samples)
    row["metrics"] = {
        "placed": len(result.placed),
        "unplaced": len(result.unplaced),
        "kept": reasons[PlacedReason.KEPT],
        "moved": sum(1 for p in result.placed.values() if p.moved_from is not None),
        "gpus_used": len({(p.node, p.gpu) for p in result.placed.values()}),
        "distinct_policies": len({p.policy for p in result.placed.values()}),
    }
    return row


def run(reps: int) -> list[dict[str, Any]]:
    rng = random.Random(SEED)
    nodes = swap_nodes(rng)
    models = deployments(rng)
    params = {"models": MODELS, "nodes": NODES, "gpus": NODES * GPUS_PER_NODE, "reps": reps}
    first_samples, first = _time(nodes, models, {}, reps, before=clear_policy_cache)
    cold_samples, cold = _time(nodes, models, {}, reps)
    own = cold.assignments()
    warm_samples, warm = _time(nodes, models, own, reps)
    busiest = Counter(p.node for p in cold.placed.values()).most_common(NODES_LOST)
    lost = {name for name, _ in busiest}
    survivors = [n for n in nodes if n.metadata["name"] not in lost]
    loss_samples, loss = _time(survivors, models, own, reps)
    return [
        _row("first", params, first_samples, first),
        _row("cold", params, cold_samples, cold),
        _row("warm", params, warm_samples, warm),
        _row("node_loss", {**params, "nodes_lost": NODES_LOST}, loss_samples, loss),
    ]


NOTES = [
    f"Synthetic cluster, seed {SEED}: {NODES} SwapNodes x {GPUS_PER_NODE} GPUs (60 H100 80 GB "
    "nodes with 256 GiB host store per GPU; 40 GH200 96 GB nodes, tainted NoSchedule, 400 GiB "
    f"per GPU; 2 GiB reserved, 512 MiB per-process overhead) and {MODELS} ModelDeployments "
    "(weights log-normal around 7 GiB up to 70 GiB, KV cache 1-8 GiB, 3% pinned, random "
    "priorities and kv modes; half with no placement, the rest a pool nodeSelector, the "
    "GH200 pool with its toleration, or a gpuSelector).",
    "first: no assignments and the planner's effective-policy cache empty, as after the "
    "operator starts; every distinct policy (distinct_policies) goes through "
    "effective_policy, which validates the defaults and evaluates the CEL rules (about 10 ms "
    "each here), and that dominates. cold: the same with that cache filled.",
    "warm: re-plan with the cold plan's assignments (every model kept). node_loss: the same "
    f"with the {NODES_LOST} nodes that host the most models gone (their models move).",
    "Times are wall-clock seconds of one `plan` call; medians of the repetitions after one "
    "untimed run, on a shared machine. The counts describe each plan: best fit packs models "
    "onto few GPUs (gpus_used of 800), so losing the busiest nodes moves many models.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument(
        "--no-results", action="store_true", help="print only; write no result file (tests)"
    )
    args = p.parse_args(argv)
    results = run(args.reps)
    for r in results:
        m = r["metrics"]
        print(
            f"{r['name']:10s} median {r['median'] * 1e3:8.1f} ms  "
            + "  ".join(f"{k} {v}" for k, v in m.items()),
            flush=True,
        )
    if args.no_results:
        return 0
    path = results_schema.write("planner", COMMAND, results, NOTES, backend="none", scaled=False)
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
