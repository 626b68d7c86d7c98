"""Which GPUs a model may use at all: node selector, taints and tolerations, GPU selector.

Everything here depends on the live SwapNodes and a model's `spec.placement` only, so the
planner computes it once per distinct placement (`PlacementKey`), not once per model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from modelswap_api.models import Placement, SwapNode, Taint, Toleration
from modelswap_operator.planning.results import UnplacedReason

#: Taint effects that keep a model off a node; PreferNoSchedule is only a preference.
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True, kw_only=True)
class GpuSlot:
    """One GPU of one live node, as placement sees it. Unknown sizes count as 0 bytes."""

    index: int  # position in (node name, GPU UUID) order; the tie-break of last resort
    node: str
    uuid: str
    product: str | None
    hbm_total_bytes: int
    hbm_reserved_bytes: int
    overhead_bytes: int  # per model process on this GPU
    host_capacity_bytes: int

    @property
    def budget_bytes(self) -> int:
        """HBM the models may use: total - reserved."""
        return max(0, self.hbm_total_bytes - self.hbm_reserved_bytes)

    @property
    def hardware(self) -> tuple[int, int, int]:
        """What capacity arithmetic reads: empty GPUs alike in this are interchangeable."""
        return (self.budget_bytes, self.overhead_bytes, self.host_capacity_bytes)

    def __str__(self) -> str:
        return f"{self.node}/{self.uuid}"


@dataclass(frozen=True, kw_only=True)
class NodeView:
    name: str
    labels: Mapping[str, str]
    blocking_taints: tuple[Taint, ...]
    gpus: tuple[GpuSlot, ...]


@dataclass(frozen=True, kw_only=True)
class PlacementKey:
    """`spec.placement` in a hashable, order-independent form."""

    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    product: str | None = None
    min_hbm_bytes: int | None = None

    @classmethod
    def of(cls, placement: Placement | None) -> PlacementKey:
        if placement is None:
            return cls()
        gpu = placement.gpu_selector
        tolerations = sorted(
            placement.tolerations or (),
            key=lambda t: (t.key or "", t.operator or "", t.value or "", t.effect or ""),
        )
        return cls(
            node_selector=tuple(sorted((placement.node_selector or {}).items())),
            tolerations=tuple(tolerations),
            product=gpu.product if gpu else None,
            min_hbm_bytes=gpu.min_hbm_bytes.bytes if gpu and gpu.min_hbm_bytes else None,
        )


@dataclass(frozen=True, kw_only=True)
class Ineligible:
    """No GPU passes the placement filters: which one failed and why, for people."""

    reason: UnplacedReason
    field: str | None
    message: str


def node_views(swap_nodes: Sequence[SwapNode]) -> tuple[NodeView, ...]:
    """Live nodes sorted by name, their GPUs by UUID, slots numbered in that order."""
    named = sorted(((_node_name(n), n) for n in swap_nodes), key=lambda pair: pair[0])
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(f"SwapNode names must be unique, got {names}")
    views: list[NodeView] = []
    index = 0
    for name, node in named:
        status = node.status
        gpus = sorted(status.gpus or (), key=lambda g: g.uuid) if status else []
        slots = []
        for gpu in gpus:
            slots.append(
                GpuSlot(
                    index=index,
                    node=name,
                    uuid=gpu.uuid,
                    product=gpu.product,
                    hbm_total_bytes=gpu.hbm_total_bytes or 0,
                    hbm_reserved_bytes=gpu.hbm_reserved_bytes or 0,
                    overhead_bytes=gpu.per_process_overhead_bytes or 0,
                    host_capacity_bytes=gpu.host_store_capacity_bytes or 0,
                )
            )
            index += 1
        taints = (status.node_taints or ()) if status else ()
        views.append(
            NodeView(
                name=name,
                labels=dict((status.node_labels or {}) if status else {}),
                blocking_taints=tuple(t for t in taints if t.effect in BLOCKING_EFFECTS),
                gpus=tuple(slots),
            )
        )
    return tuple(views)


def _node_name(node: SwapNode) -> str:
    name = node.metadata.get("name") or (node.spec.node_name if node.spec else None)
    if not name:
        raise ValueError("a SwapNode without metadata.name")
    return str(name)


def selects(key: PlacementKey, labels: Mapping[str, str]) -> bool:
    """`nodeSelector` ⊆ the node's labels."""
    return all(labels.get(k) == v for k, v in key.node_selector)


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    """Kubernetes' `Toleration.ToleratesTaint`: an empty effect matches every effect, an
    empty key every key; `Exists` ignores the value, `Equal` (the default) compares it."""
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    return (toleration.value or "") == (taint.value or "")


def untolerated(key: PlacementKey, node: NodeView) -> tuple[Taint, ...]:
    """The node's NoSchedule/NoExecute taints that no toleration of `key` matches."""
    return tuple(
        t for t in node.blocking_taints if not any(tolerates(tol, t) for tol in key.tolerations)
    )


def gpu_selects(key: PlacementKey, gpu: GpuSlot) -> bool:
    if key.product is not None and gpu.product != key.product:
        return False
    return key.min_hbm_bytes is None or gpu.hbm_total_bytes >= key.min_hbm_bytes


def eligible_gpus(key: PlacementKey, nodes: Sequence[NodeView]) -> tuple[GpuSlot, ...] | Ineligible:
    """The GPUs a model with this placement may use (in slot order), or why there are none.

    Filters apply in this order, and the first that leaves nothing is the one reported:
    live nodes with GPUs, nodeSelector, taints, gpuSelector.product, gpuSelector.minHbmBytes.
    """
    with_gpus = [n for n in nodes if n.gpus]
    if not with_gpus:
        return Ineligible(
            reason=UnplacedReason.NO_SWAP_NODES,
            field=None,
            message=f"no live SwapNode reports a GPU ({len(nodes)} live SwapNodes)",
        )
    selected = [n for n in with_gpus if selects(key, n.labels)]
    if not selected:
        wanted = ", ".join(f"{k}={v}" for k, v in key.node_selector)
        return Ineligible(
            reason=UnplacedReason.NO_MATCHING_NODE,
            field="spec.placement.nodeSelector",
            message=f"no live node with GPUs has the labels {wanted} "
            f"({len(with_gpus)} live nodes with GPUs)",
        )
    tolerated = [n for n in selected if not untolerated(key, n)]
    if not tolerated:
        return Ineligible(
            reason=UnplacedReason.TAINTS_NOT_TOLERATED,
            field="spec.placement.tolerations",
            message=_taints_message(key, selected),
        )
    gpus = [g for n in tolerated for g in n.gpus]
    return _gpu_filter(key, gpus, len(tolerated))


def _gpu_filter(
    key: PlacementKey, gpus: list[GpuSlot], nodes: int
) -> tuple[GpuSlot, ...] | Ineligible:
    of_product = [g for g in gpus if key.product is None or g.product == key.product]
    if not of_product:
        found = ", ".join(sorted({str(g.product) for g in gpus}))
        return Ineligible(
            reason=UnplacedReason.NO_MATCHING_GPU,
            field="spec.placement.gpuSelector.product",
            message=f"no GPU on the {nodes} eligible nodes is a {key.product!r} "
            f"(products there: {found})",
        )
    large = [g for g in of_product if gpu_selects(key, g)]
    if not large:
        largest = max(of_product, key=lambda g: g.hbm_total_bytes)
        return Ineligible(
            reason=UnplacedReason.NO_MATCHING_GPU,
            field="spec.placement.gpuSelector.minHbmBytes",
            message=f"no eligible GPU has at least {show_bytes(key.min_hbm_bytes or 0)} of HBM; "
            f"the largest has {show_bytes(largest.hbm_total_bytes)} ({largest})",
        )
    return tuple(large)


def _taints_message(key: PlacementKey, selected: Sequence[NodeView]) -> str:
    shown = [
        f"{n.name}: " + ", ".join(_show_taint(t) for t in untolerated(key, n)) for n in selected[:3]
    ]
    more = f" and {len(selected) - 3} more" if len(selected) > 3 else ""
    return (
        f"all {len(selected)} nodes that match the nodeSelector have a NoSchedule/NoExecute "
        f"taint the model does not tolerate ({'; '.join(shown)}{more})"
    )


def _show_taint(taint: Taint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


def show_bytes(count: int) -> str:
    """Bytes for people, binary units: `512 MiB`, `23.5 GiB`, `100 bytes`."""
    for unit, name in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(count) >= unit:
            text = f"{count / unit:.2f}".rstrip("0").rstrip(".")
            return f"{text} {name}"
    return f"{count} bytes"
