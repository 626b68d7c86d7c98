"""The kopf handlers: thin. They put what they see into the cache and ring the loop; the
finalizer's handler waits until the loop has freed the model's memory on its node.

- ModelDeployments through `on.event`: every change, status-only ones included (the loop
  plans from status.node/gpu), and `on.delete` for the finalizer;
- SwapNodes through `on.event` (their status is the agents' report; `on.update` would miss
  status-only changes);
- node Leases are not watched: the loop lists them each turn (staleness is a matter of
  time, which no watch event reports).
Start-up takes the leader Lease first, so a replica that is not the leader neither watches
nor writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import kopf

from modelswap_api.crds import GROUP, VERSION
from modelswap_operator.runtime import Runtime

MODEL_DEPLOYMENTS = (GROUP, VERSION, "modeldeployments")
SWAP_NODES = (GROUP, VERSION, "swapnodes")
FINALIZER = "modelswap.io/finalizer"
ANNOTATIONS_PREFIX = "modelswap.io"
#: How long the deletion handler waits for the loop to free the model's memory before it
#: lets kopf retry (each retry is a patch and, past this, an Event saying it waits).
RELEASE_WAIT_SECONDS = 20.0
RELEASE_RETRY_SECONDS = 1.0


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's settings the operator relies on."""
    # The status schema has no room for kopf's own keys (`status.kopf` would be pruned).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATIONS_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATIONS_PREFIX, key="last-handled-configuration"
    )
    settings.persistence.finalizer = FINALIZER
    # kopf posts Events from handler log lines only with this (kopf 1.45).
    settings.posting.loggers = True
    settings.posting.level = 30  # warnings and errors only: the loop posts its own Events
    settings.peering.standalone = True  # leadership is our Lease, not kopf's peering
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 30


def register(
    registry: kopf.OperatorRegistry,
    runtime: Runtime,
    *,
    login: Callable[..., kopf.ConnectionInfo] | None = None,
) -> None:
    if login is not None:
        kopf.on.login(registry=registry)(login)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings)
        await runtime.start()

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        await runtime.stop()

    @kopf.on.event(*MODEL_DEPLOYMENTS, registry=registry)
    def deployment_event(event: kopf.RawEvent, **_: Any) -> None:
        body = event["object"]
        if event["type"] == "DELETED":
            runtime.cache.drop_deployment(str(body["metadata"]["uid"]))
        else:
            runtime.cache.put_deployment(body)

    @kopf.on.event(*SWAP_NODES, registry=registry)
    def swapnode_event(event: kopf.RawEvent, **_: Any) -> None:
        body = event["object"]
        if event["type"] == "DELETED":
            runtime.cache.drop_swapnode(str(body["metadata"]["name"]))
        else:
            runtime.cache.put_swapnode(body)

    @kopf.on.delete(*MODEL_DEPLOYMENTS, registry=registry)
    async def deleted(uid: str, name: str, namespace: str | None, **_: Any) -> None:
        await wait_for_release(runtime, uid, name, namespace)


async def wait_for_release(runtime: Runtime, uid: str, name: str, namespace: str | None) -> None:
    """Return once the loop freed the model's memory; else ask kopf to retry (a patch and,
    past a while, an Event saying it waits). In a namespace being deleted kopf's retry
    would log an error and post an Event the namespace refuses (another error line), for
    every model in it: wait here, quietly, instead."""
    while not await runtime.wait_released(uid, RELEASE_WAIT_SECONDS):
        if not runtime.namespace_terminating(namespace or ""):
            raise kopf.TemporaryError(
                f"waiting for the node to free {namespace}/{name}'s memory",
                delay=RELEASE_RETRY_SECONDS,
            )
