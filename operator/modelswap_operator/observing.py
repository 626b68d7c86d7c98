"""What the cluster and each placed model's node say of it (`status.Observed`), read from
the SwapNodes' reports and what the turn's pushes answered. Pure: the memos it reads are
handed in as lookups. Its routing is added once it is routed: the EndpointSlice's `ready`
is decided from the rest."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from modelswap_api.models import HostedModel
from modelswap_operator import routing
from modelswap_operator.cache import Body, Snapshot
from modelswap_operator.status import Observed, Verdict
from modelswap_operator.turn_plan import Sent


def observe_all(
    snap: Snapshot,
    verdicts: Mapping[str, Verdict],
    live: set[str],
    reports: Mapping[str, Mapping[str, HostedModel]],
    *,
    sent: Callable[[str], Sent | None],
    status_of: Callable[[str, Body | None], Mapping[str, Any] | None],
    model_generation: Callable[[str], tuple[str, int] | None],
) -> dict[str, Observed]:
    found = {}
    for uid, verdict in verdicts.items():
        node = verdict.node
        body = snap.deployments.get(uid)
        if node is None or body is None:
            continue
        metadata = body["metadata"]
        pushed = sent(node)
        try:
            endpoint = routing.endpoint_name(str(metadata.get("namespace") or ""),
                                             str(metadata["name"]))  # fmt: skip
        except routing.RouteError:
            endpoint = None
        previous = status_of(uid, body) or {}
        was_ready = previous.get("node") == node and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in previous.get("conditions") or ()
        )
        decided = model_generation(uid)
        found[uid] = Observed(
            model_digest=decided[0] if decided else None,
            model_generation=decided[1] if decided else None,
            was_ready=was_ready,
            node_live=node in live,
            hosted=(reports.get(node) or {}).get(uid),
            push=pushed.results.get(uid) if pushed is not None and pushed.ok else None,
            agent_error=pushed.error if pushed is not None and not pushed.ok else None,
            endpoint=endpoint,
        )
    return found
