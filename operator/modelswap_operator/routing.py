"""One Service and one EndpointSlice per ModelDeployment, pointing at its node's gateway.

The Service has no selector: the operator writes its EndpointSlice, whose one endpoint is
the hosting node's gateway (the address and port its SwapNode's `gatewayEndpoint` names,
and the port of `gatewayGrpcEndpoint` where the node serves the gateway's gRPC front: a
second port, `grpc`, with `appProtocol: grpc`), and rewrites it when the model moves. The
gateway takes the namespace from the Host a request was sent to
(`<service>.<namespace>.svc…`) and the model from the path (a gRPC request names the
namespace in its model name or metadata: docs/GATEWAY.md, "gRPC"), so the Service is
named after the ModelDeployment and `status.endpoint` is its DNS name.
Both objects are owned by the ModelDeployment (garbage-collected with it) and labelled as
ours; a Service of the same name that is not ours is left alone and reported.

Building the objects is pure; `Router` writes them, each only when it differs from what
was last written.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from modelswap_api import kube
from modelswap_operator.kubeio import KubeIO

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "modelswap"
DEPLOYMENT_LABEL = "modelswap.io/model-deployment"
SLICE_MANAGER = "operator.modelswap.io"
SERVICE_PORT = 80
#: The Service's gRPC port: Triton's own default, where gRPC clients of Triton look first.
GRPC_SERVICE_PORT = 8001
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


class RouteError(Exception):
    pass


@dataclass(frozen=True)
class Gateway:
    """A node's gateway address, from its SwapNode's `gatewayEndpoint` (`http://host:port`)."""

    host: str
    port: int
    #: the gateway's gRPC port (`gatewayGrpcEndpoint`, on the same host); None: not served
    grpc_port: int | None = None

    @classmethod
    def parse(cls, endpoint: str | None) -> Gateway | None:
        if not endpoint:
            return None
        parts = urlsplit(endpoint)
        if parts.hostname is None or parts.port is None:
            return None
        return cls(parts.hostname, parts.port)

    @classmethod
    def of_node(cls, status: Mapping[str, Any]) -> Gateway | None:
        """A SwapNode status's gateway: `gatewayEndpoint`, with the port of
        `gatewayGrpcEndpoint` when it names one on the same host."""
        gateway = cls.parse(status.get("gatewayEndpoint"))
        grpc = cls.parse(status.get("gatewayGrpcEndpoint"))
        if gateway is None or grpc is None or grpc.host != gateway.host:
            return gateway
        return cls(gateway.host, gateway.port, grpc.port)

    @property
    def address_type(self) -> str:
        try:
            return "IPv6" if ipaddress.ip_address(self.host).version == 6 else "IPv4"
        except ValueError:
            return "FQDN"


def service_name(deployment_name: str) -> str:
    """The Service's name: the ModelDeployment's, which must then be a DNS label."""
    if not _DNS_LABEL.match(deployment_name):
        raise RouteError(
            f"metadata.name {deployment_name!r} cannot name a Service (a DNS label: lower-case "
            "letters, digits and '-', starting with a letter, at most 63 characters)"
        )
    return deployment_name


def endpoint_name(namespace: str, name: str) -> str:
    """`status.endpoint`: the Service's DNS name (clients add `.cluster.local` if they must)."""
    return f"{service_name(name)}.{namespace}.svc"


def _metadata(name: str, namespace: str, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY, DEPLOYMENT_LABEL: owner["name"]},
        "ownerReferences": [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["name"],
                "uid": owner["uid"],
                "controller": True,
            }
        ],
    }


def service_body(namespace: str, owner: Mapping[str, Any], gateway: Gateway) -> dict[str, Any]:
    name = service_name(owner["name"])
    ports: list[dict[str, Any]] = [
        {"name": "http", "port": SERVICE_PORT, "targetPort": gateway.port, "protocol": "TCP"}
    ]
    if gateway.grpc_port is not None:
        ports.append({"name": "grpc", "port": GRPC_SERVICE_PORT, "targetPort": gateway.grpc_port,
                      "protocol": "TCP", "appProtocol": "grpc"})  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(name, namespace, owner),
        "spec": {"type": "ClusterIP", "ports": ports},
    }


def endpoint_slice_body(
    namespace: str, owner: Mapping[str, Any], gateway: Gateway, node: str, *, ready: bool
) -> dict[str, Any]:
    service = service_name(owner["name"])
    metadata = _metadata(f"{service}-modelswap", namespace, owner)
    metadata["labels"].update(
        {
            "kubernetes.io/service-name": service,
            "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
        }
    )
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": metadata,
        "addressType": gateway.address_type,
        "endpoints": [
            {"addresses": [gateway.host], "conditions": {"ready": ready}, "nodeName": node}
        ],
        "ports": [
            {"name": "http", "port": gateway.port, "protocol": "TCP"},
            *(
                [{"name": "grpc", "port": gateway.grpc_port, "protocol": "TCP",
                  "appProtocol": "grpc"}]
                if gateway.grpc_port is not None
                else []
            ),
        ],
    }  # fmt: skip


def _ours(body: Mapping[str, Any] | None) -> bool:
    labels = (body or {}).get("metadata", {}).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY


def _content(body: Mapping[str, Any]) -> Any:
    """What of an object we decide (the server adds the rest)."""
    metadata = body.get("metadata") or {}
    return (
        metadata.get("labels"),
        metadata.get("ownerReferences"),
        body.get("spec", {}).get("ports"),
        body.get("addressType"),
        body.get("endpoints"),
        body.get("ports"),
    )


class Router:
    """Writes Services and EndpointSlices; remembers what it wrote so an unchanged route
    costs no API call."""

    def __init__(self, io: KubeIO) -> None:
        self.io = io
        self._written: dict[tuple[str, str, str], Any] = {}
        #: Counts `forget` calls: a route ensured under an older one may have to be written
        #: again (the caller's memo of what it ensured is only good for one generation).
        self.generation = 0

    async def ensure(
        self,
        namespace: str,
        owner: Mapping[str, Any],
        gateway: Gateway,
        node: str,
        ready: bool,
        *,
        new: bool = False,
    ) -> None:
        """Make the model's Service and EndpointSlice point at `gateway`. RouteError when a
        Service of that name exists and is not ours, or the name cannot be a Service's.

        `new`: the model was never routed (its status names no endpoint), so its objects
        most likely do not exist: each is created at once, and read only when the create
        finds one there (one call each instead of a read and a create)."""
        service = service_body(namespace, owner, gateway)
        await self._apply("Service", service, kube.read_service, kube.create_service, new=new)
        slice_ = endpoint_slice_body(namespace, owner, gateway, node, ready=ready)
        await self._apply(
            "EndpointSlice",
            slice_,
            kube.read_endpoint_slice,
            kube.create_endpoint_slice,
            new=new,
        )

    async def remove(self, namespace: str, name: str) -> None:
        """Delete the model's route (its owner's deletion would too, through the garbage
        collector; this does not wait for that)."""
        try:
            service = service_name(name)
        except RouteError:
            return
        for kind, object_name, read, delete in (
            ("EndpointSlice", f"{service}-modelswap", kube.read_endpoint_slice,
             kube.delete_endpoint_slice),
            ("Service", service, kube.read_service, kube.delete_service),
        ):  # fmt: skip
            self._written.pop((kind, namespace, object_name), None)
            found = await self.io.call(read, namespace, object_name)
            if found is not None and _ours(found):
                await self.io.call(delete, namespace, object_name)

    async def _apply(
        self, kind: str, body: dict[str, Any], read: Any, create: Any, *, new: bool
    ) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        key = (kind, namespace, name)
        wanted = _content(body)
        if self._written.get(key) == wanted:
            return
        if new and key not in self._written:
            try:
                await self.io.call(create, namespace, body)
            except kube.Conflict:
                pass  # it exists after all: read it and decide as below
            else:
                self._written[key] = wanted
                return
        found = await self.io.call(read, namespace, name)
        if found is None:
            await self.io.call(create, namespace, body)
        elif not _ours(found):
            raise RouteError(
                f"{kind} {namespace}/{name} exists and is not managed by modelswap; rename "
                "the ModelDeployment or remove that object"
            )
        elif _content(found) != wanted:
            await self._update(kind, body, found)
        self._written[key] = wanted

    async def _update(self, kind: str, body: dict[str, Any], found: Mapping[str, Any]) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if kind == "Service":  # a merge patch: the API server keeps its clusterIP
            patch = {"metadata": {k: body["metadata"][k] for k in ("labels", "ownerReferences")},
                     "spec": body["spec"]}  # fmt: skip
            await self.io.call(kube.patch_service, namespace, name, patch)
            return
        version = found["metadata"]["resourceVersion"]
        replaced = {**body, "metadata": {**body["metadata"], "resourceVersion": version}}
        await self.io.call(kube.replace_endpoint_slice, namespace, replaced)

    def forget(self) -> None:
        """Drop what was remembered (after a write failed, re-read on the next turn)."""
        self._written.clear()
        self.generation += 1
