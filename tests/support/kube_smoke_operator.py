"""A minimal kopf operator for emulator tests: it marks ModelDeployments it sees, mirrors
their generation into status, and records deletions (so kopf keeps its finalizer on them).

Handlers are registered on a registry the test passes in, with a login handler that reads
the test's kubeconfig, so nothing here touches global kopf state or the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
import yaml

RESOURCE = ("modelswap.io", "v1alpha1", "modeldeployments")
SMOKE_NODE = "smoke-node"


@dataclass
class SmokeRecord:
    """What the handlers saw, for the test to assert on (appends are thread-safe)."""

    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


def connection_from_kubeconfig(path: Path) -> kopf.ConnectionInfo:
    config = yaml.safe_load(path.read_text())
    contexts = {c["name"]: c["context"] for c in config["contexts"]}
    context = contexts[config["current-context"]]
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    return kopf.ConnectionInfo(
        server=cluster["server"],
        scheme="Bearer",
        token=user.get("token"),
        default_namespace=context.get("namespace", "default"),
    )


def register(registry: kopf.OperatorRegistry, kubeconfig: Path, record: SmokeRecord) -> None:
    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return connection_from_kubeconfig(kubeconfig)

    @kopf.on.create(*RESOURCE, registry=registry)
    def created(name: str, meta: kopf.Meta, patch: kopf.Patch, **_: Any) -> None:
        record.created.append(name)
        patch.status["phase"] = "Placed"
        patch.status["node"] = SMOKE_NODE
        patch.status["observedGeneration"] = meta.get("generation")

    @kopf.on.update(*RESOURCE, registry=registry)
    def updated(meta: kopf.Meta, patch: kopf.Patch, **_: Any) -> None:
        patch.status["observedGeneration"] = meta.get("generation")

    @kopf.on.delete(*RESOURCE, registry=registry)
    def deleted(name: str, **_: Any) -> None:
        record.deleted.append(name)


def settings(*, post_events: bool = False) -> kopf.OperatorSettings:
    configured = kopf.OperatorSettings()
    # kopf 1.45 posts Events for handler log lines only with `posting.loggers` (off by default).
    configured.posting.loggers = post_events
    configured.watching.server_timeout = 30
    configured.networking.request_timeout = 10
    return configured
