"""Taking modelswap off a cluster without leaving objects nobody can delete.

Without an operator, a ModelDeployment's finalizer is never removed (its delete hangs),
and its Service and EndpointSlice keep routing to gateways that are gone. `Uninstaller`
puts that right before the release's objects go (the chart's pre-delete hook runs it; a
user may run `modelswap uninstall` by hand first), in order:

1. stop the operator: its Deployment scaled to 0, then wait until the leader Lease has no
   live holder (a running operator would put the finalizers back);
2. each ModelDeployment: `Ready=False` (`OperatorUninstalled`) and phase `Unknown` (no
   operator vouches for it any more, as for a lost node: docs/OPERATOR.md, "Status"),
   then modelswap's finalizer removed, so a later delete completes at once;
3. its Service and EndpointSlice deleted, when they are ours (labelled as the operator
   labels them): a Service of that name someone else made is left alone.

Every step can run again (a retried Job): what is done already is skipped. Left in place
on purpose: the ModelDeployments (the user's objects, and the CRD is kept by default),
and the SwapNodes (the node pods re-create them until helm deletes the DaemonSet; each is
owned by its Node; `kubectl delete swapnodes --all` once the node pods are gone).

The decisions (is the Lease held, the finalizers without ours, the status to write) are
pure functions; `Uninstaller` only calls the API.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_api import kube
from modelswap_operator.handlers import FINALIZER
from modelswap_operator.routing import MANAGED_BY, MANAGED_BY_LABEL

log = logging.getLogger(__name__)

UNINSTALLED_REASON = "OperatorUninstalled"
UNINSTALLED_MESSAGE = "modelswap was uninstalled: nothing serves this model"
#: The phase beside Ready=False: what the nodes hold is no longer watched.
UNINSTALLED_PHASE = "Unknown"


class UninstallError(Exception):
    pass


# -- decisions (pure) ---------------------------------------------------------------------------


def live_holder(lease: Mapping[str, Any] | None, now: datetime.datetime) -> str | None:
    """Who holds the Lease at `now`: its holder while the claim is fresh; None when it is
    gone, released (no holder) or expired (not renewed within its duration)."""
    spec = (lease or {}).get("spec") or {}
    holder = str(spec.get("holderIdentity") or "")
    if not holder:
        return None
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    duration_seconds = spec.get("leaseDurationSeconds")
    if not renewed or not isinstance(duration_seconds, int):
        return holder  # no expiry to judge by: taken as held
    try:
        renewed_at = datetime.datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
    except ValueError:
        return holder
    if renewed_at.tzinfo is None:
        renewed_at = renewed_at.replace(tzinfo=datetime.UTC)
    expires_at = renewed_at + datetime.timedelta(seconds=duration_seconds)
    return holder if now < expires_at else None


def finalizers_without_ours(model: Mapping[str, Any]) -> list[str] | None:
    """The model's finalizers without modelswap's; None when it has none of ours."""
    finalizers = list((model.get("metadata") or {}).get("finalizers") or [])
    if FINALIZER not in finalizers:
        return None
    return [f for f in finalizers if f != FINALIZER]


def uninstalled_conditions(model: Mapping[str, Any], now_rfc3339: str) -> list[dict[str, Any]]:
    """The model's conditions with Ready replaced by False/OperatorUninstalled (its
    transition time kept when it was False already), the others as they were."""
    conditions = [dict(c) for c in ((model.get("status") or {}).get("conditions") or [])]
    old = next((c for c in conditions if c.get("type") == "Ready"), None)
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": UNINSTALLED_REASON,
        "message": UNINSTALLED_MESSAGE,
        "lastTransitionTime": (
            old.get("lastTransitionTime", now_rfc3339)
            if old is not None and old.get("status") == "False"
            else now_rfc3339
        ),
    }
    if old is not None and "observedGeneration" in old:
        ready["observedGeneration"] = old["observedGeneration"]
    return (
        [ready if c is old else c for c in conditions]
        if old is not None
        else [
            *conditions,
            ready,
        ]
    )


def ours(body: Mapping[str, Any] | None) -> bool:
    labels = ((body or {}).get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY


# -- acting ---------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Target:
    """The release to take off: the operator's Deployment and leader Lease (in
    `operator_namespace`), and where ModelDeployments live (empty: every namespace)."""

    operator_namespace: str
    operator_deployment: str
    leader_lease: str
    namespaces: tuple[str, ...] = ()
    wait_seconds: float = 120.0


@dataclass
class Report:
    operator_stopped: bool = False
    models: int = 0
    finalizers_removed: int = 0
    routes_deleted: int = 0


class Uninstaller:
    def __init__(
        self,
        api: Any,
        target: Target,
        *,
        clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], None] = time.sleep,
        poll_seconds: float = 1.0,
    ) -> None:
        self.api = api
        self.target = target
        self.clock = clock
        self.sleep = sleep
        self.poll_seconds = poll_seconds

    def run(self) -> Report:
        report = Report()
        self.stop_operator()
        report.operator_stopped = True
        for model in self._models():
            report.models += 1
            removed, routes = self.release(model)
            report.finalizers_removed += removed
            report.routes_deleted += routes
        log.info(
            "uninstall: %d ModelDeployments: %d finalizers removed, %d Services and "
            "EndpointSlices deleted",
            report.models,
            report.finalizers_removed,
            report.routes_deleted,
        )
        return report

    def stop_operator(self) -> None:
        t = self.target
        if kube.scale_deployment(self.api, t.operator_namespace, t.operator_deployment, 0):
            log.info("uninstall: %s/%s scaled to 0", t.operator_namespace, t.operator_deployment)
        deadline = time.monotonic() + t.wait_seconds
        while True:
            lease = kube.read_lease(self.api, t.operator_namespace, t.leader_lease)
            holder = live_holder(lease, self.clock())
            if holder is None:
                log.info("uninstall: the leader Lease %s is free", t.leader_lease)
                return
            if time.monotonic() >= deadline:
                raise UninstallError(
                    f"the operator {holder!r} still holds the leader Lease "
                    f"{t.operator_namespace}/{t.leader_lease} after {t.wait_seconds:g} s: "
                    "its pods have not stopped; nothing was changed"
                )
            log.info("uninstall: waiting for the operator %r to stop", holder)
            self.sleep(self.poll_seconds)

    def _models(self) -> Sequence[dict[str, Any]]:
        namespaces: Sequence[str | None] = self.target.namespaces or (None,)
        return [m for ns in namespaces for m in kube.list_model_deployments(self.api, ns)]

    def release(self, model: Mapping[str, Any]) -> tuple[int, int]:
        """Ready=False (phase Unknown), our finalizer removed, our routes deleted:
        (finalizers removed, routes deleted). A model deleted meanwhile is skipped."""
        metadata = model.get("metadata") or {}
        namespace, name = str(metadata["namespace"]), str(metadata["name"])
        now = self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        removed = 0
        try:
            kube.patch_model_deployment_status(
                self.api,
                namespace,
                name,
                {
                    "status": {
                        "phase": UNINSTALLED_PHASE,
                        "conditions": uninstalled_conditions(model, now),
                    }
                },
            )
            remaining = finalizers_without_ours(model)
            if remaining is not None:
                kube.patch_model_deployment(
                    self.api, namespace, name, {"metadata": {"finalizers": remaining or None}}
                )
                removed = 1
        except kube.NotFound:
            return 0, 0
        routes = 0
        if ours(kube.read_service(self.api, namespace, name)):
            routes += kube.delete_service(self.api, namespace, name)
        slice_name = f"{name}-modelswap"
        if ours(kube.read_endpoint_slice(self.api, namespace, slice_name)):
            routes += kube.delete_endpoint_slice(self.api, namespace, slice_name)
        log.info(
            "uninstall: %s/%s released (%s, %d routes deleted)",
            namespace,
            name,
            "finalizer removed" if removed else "no finalizer of ours",
            routes,
        )
        return removed, routes
