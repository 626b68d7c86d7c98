"""Reading the cache's bodies: which nodes are live, what each SwapNode reports, which
ModelDeployments decode, and when a node was lost. Pure, apart from `ReadOnce`'s memo of
decodings (kept while the cache holds the very same body)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar

from modelswap_api.errors import ContractError
from modelswap_api.models import HostedModel, ModelDeployment, SwapNode
from modelswap_operator.cache import Body


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def live_nodes(
    swapnodes: Mapping[str, Body], leases: Mapping[str, Body], now: float, grace_seconds: float
) -> set[str]:
    """Nodes with a SwapNode whose Lease was renewed within the grace period."""
    live = set()
    for name in swapnodes:
        spec = (leases.get(name) or {}).get("spec") or {}
        renewed = parse_time(spec.get("renewTime"))
        if renewed is not None and now - renewed <= grace_seconds:
            live.add(name)
    return live


def lost_since(lease: Body | None, grace_seconds: float) -> float | None:
    """When a node with this Lease was lost (its last renewal plus the grace period);
    None when the Lease holds no renewal time."""
    renewed = parse_time(((lease or {}).get("spec") or {}).get("renewTime"))
    return None if renewed is None else renewed + grace_seconds


def reported_models(swapnode: Body) -> dict[str, HostedModel]:
    """The models a SwapNode's status lists, by uid."""
    found = {}
    for model in (swapnode.get("status") or {}).get("models") or ():
        try:
            hosted = HostedModel.from_dict(model)
        except ContractError:
            continue
        found[hosted.uid] = hosted
    return found


def deleting(body: Body) -> bool:
    return bool((body.get("metadata") or {}).get("deletionTimestamp"))


def model_name(body: Body) -> str:
    """The name users call the model by (spec.model.name, else metadata.name), read from
    the raw body: a body that does not parse still shows its name."""
    model = (body.get("spec") or {}).get("model") or {}
    name = model.get("name") if isinstance(model, dict) else None
    return str(name or body["metadata"]["name"])


def read_deployment(body: Body) -> ModelDeployment | ContractError:
    try:
        return ModelDeployment.from_dict(
            {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
        )
    except ContractError as e:
        return e


def read_swapnode(body: Body) -> SwapNode | ContractError:
    try:
        return SwapNode.from_dict(body)
    except ContractError as e:
        return e


R = TypeVar("R")


class ReadOnce(Generic[R]):
    """`read(body)` remembered per key for as long as the cache holds that very body.

    The cache replaces a body with a new dict on every watch event and never mutates one
    (`Snapshot`), so the same dict object means the same content."""

    def __init__(self, read: Callable[[Body], R]) -> None:
        self._read = read
        self._seen: dict[str, tuple[Body, R]] = {}

    def __call__(self, key: str, body: Body) -> R:
        seen = self._seen.get(key)
        if seen is not None and seen[0] is body:
            return seen[1]
        result = self._read(body)
        self._seen[key] = (body, result)
        return result

    def keep(self, keys: Mapping[str, Any]) -> None:
        """Forget what the cache no longer holds."""
        for key in [k for k in self._seen if k not in keys]:
            del self._seen[key]
