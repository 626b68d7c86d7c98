"""The objects the heartbeat writes, built from plain dicts (pure): the SwapNode, its
status, and the node Lease.

A SwapNode is named after its Node and owned by it (an ownerReference, so deleting the
Node deletes it). Its status is the agent's `NodeReport` plus the Node's labels and taints.
A Lease's `renewTime` is a MicroTime (`2006-01-02T15:04:05.000000Z`); taking over a Lease
held by another identity sets `acquireTime` and counts a transition, as client-go does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from modelswap_api.models import SwapNode, SwapNodeSpec, SwapNodeStatus, Taint
from modelswap_api.quantities import format_bytes
from modelswap_sidecar.heartbeat.report import NodeReport

MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True)
class NodeFacts:
    """What the heartbeat needs of a Node."""

    name: str
    uid: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeFacts:
        metadata = node.get("metadata") or {}
        taints = tuple(
            Taint(key=t["key"], effect=t["effect"], value=t.get("value") or None)
            for t in (node.get("spec") or {}).get("taints") or ()
            if t.get("key") and t.get("effect")
        )
        return cls(
            name=metadata["name"],
            uid=metadata["uid"],
            labels=dict(metadata.get("labels") or {}),
            taints=taints,
        )

    def owner_reference(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.uid}


def swapnode_body(node: NodeFacts) -> dict[str, Any]:
    """A new SwapNode for `node` (status is written separately, through the subresource)."""
    swapnode = SwapNode(
        metadata={"name": node.name, "ownerReferences": [node.owner_reference()]},
        spec=SwapNodeSpec(node_name=node.name),
    )
    return swapnode.to_dict()


def owned_by(swapnode: Mapping[str, Any], node: NodeFacts) -> bool:
    """True when `swapnode` has an ownerReference to this very Node (same uid)."""
    references = (swapnode.get("metadata") or {}).get("ownerReferences") or ()
    return any(
        r.get("kind") == "Node" and r.get("name") == node.name and r.get("uid") == node.uid
        for r in references
    )


def owner_patch(swapnode: Mapping[str, Any], node: NodeFacts) -> dict[str, Any]:
    """A merge patch that points the ownerReference at `node` (a Node re-created under the
    same name has a new uid), keeping references to anything that is not a Node."""
    references = (swapnode.get("metadata") or {}).get("ownerReferences") or ()
    kept = [r for r in references if r.get("kind") != "Node"]
    return {"metadata": {"ownerReferences": [*kept, node.owner_reference()]}}


def desired_status(report: NodeReport, node: NodeFacts) -> dict[str, Any]:
    """The SwapNode status to write: the report, with the Node's labels and taints, and
    the summaries `kubectl get swapnodes` shows (GPUS, HBM-FREE, MODELS: a printer column
    shows one value, not a sum over a list)."""
    gpus = report.gpus or ()
    hbm_free_bytes = sum(gpu.hbm_free_bytes or 0 for gpu in gpus)
    status = SwapNodeStatus(
        agent_version=report.agent_version,
        endpoint=report.endpoint,
        gateway_endpoint=report.gateway_endpoint,
        gateway_grpc_endpoint=report.gateway_grpc_endpoint,
        certificate=report.certificate,
        gpus=report.gpus,
        gpu_count=len(gpus),
        hbm_free_bytes=hbm_free_bytes,
        hbm_free_size=format_bytes(hbm_free_bytes),
        model_count=sum(1 for model in report.models or () if model.desired is not False),
        node_labels=dict(node.labels),
        node_taints=node.taints,
        models=report.models,
        conditions=report.conditions or None,
    )
    return status.to_dict()


def micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime(MICRO_TIME_FORMAT)


def parse_micro_time(text: str) -> datetime:
    """A MicroTime or RFC 3339 time as the API server writes it (`Z` or an offset)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def new_lease(
    *,
    name: str,
    namespace: str,
    holder: str,
    duration_seconds: int,
    now: datetime,
    owner: NodeFacts | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if owner is not None:
        metadata["ownerReferences"] = [owner.owner_reference()]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_seconds,
            "acquireTime": micro_time(now),
            "renewTime": micro_time(now),
            "leaseTransitions": 0,
        },
    }


def renewed_lease(
    current: Mapping[str, Any], *, holder: str, duration_seconds: int, now: datetime
) -> dict[str, Any]:
    """`current` renewed at `now` by `holder` (its resourceVersion kept, for a PUT)."""
    lease = copy.deepcopy(dict(current))
    spec = lease.setdefault("spec", {}) or {}
    lease["spec"] = spec
    if spec.get("holderIdentity") != holder:
        spec["holderIdentity"] = holder
        spec["acquireTime"] = micro_time(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
    spec["leaseDurationSeconds"] = duration_seconds
    spec["renewTime"] = micro_time(now)
    return lease
