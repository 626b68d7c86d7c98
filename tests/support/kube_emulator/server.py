"""A Kubernetes API server emulator for tests: an aiohttp server on a loopback port.

Why not kmock's `KubernetesEmulator` alone: kmock 0.8 (by kopf's author) lacks behaviour
that kopf, the official client and kubectl rely on, so this is a server of its own (plain
aiohttp, no kmock import), with everything below made real:

- discovery: `/api`, `/apis`, `/apis/{group}`, resource lists with core `v1` as `v1`,
  shortNames, categories, verbs, `status` subresources, and aggregated discovery
  (apidiscovery.k8s.io/v2, what kubectl asks for); `/version` (1.34); `/healthz`;
- `/openapi/v2` (JSON only; protobuf is refused with 406) and `/openapi/v3` (root and one
  document per group/version, with CRD schemas, PATCH content types and `fieldValidation`),
  so `kubectl apply` validates through the server as against a real cluster;
- CRD registration on create (Established/NamesAccepted status just after), update and
  delete (instances and watches dropped); built-ins: Namespaces, Nodes, Pods, Events,
  Secrets, ConfigMaps, ServiceAccounts, Services, PVCs, Leases, EndpointSlices,
  Deployments/DaemonSets/StatefulSets, PDBs, NetworkPolicies, RBAC, ValidatingAdmission-
  Policies(+Bindings), CRDs -- stored as given (no controllers run), with the server's
  defaults where clients rely on them (Secret stringData → data, Service clusterIP);
- metadata semantics: uid, creationTimestamp, resourceVersion on every write (one global
  counter), generation bumped on spec changes and when deletionTimestamp is set,
  generateName, namespace from the URL (checked against the body), POST → 201, PUT with a
  resourceVersion required on custom resources (422) and compared (409), no-op writes not
  written, `/status` subresource rules, finalizers and deletionTimestamp (no new finalizers
  while deleting), delete preconditions, garbage collection of dependents by
  ownerReferences, namespace termination, 404 for a missing namespace;
- patches: merge, JSON (with `test`), strategic merge for built-ins (415 on custom
  resources), server-side apply simplified (per-manager applied configuration: fields a
  manager stops applying are removed; no cross-manager ownership, conflicts or
  managedFields);
- request bodies in JSON, YAML, or protobuf for Namespace/ConfigMap/Secret/ServiceAccount/
  DeleteOptions (what `kubectl create …` and helm's release storage send);
- `fieldValidation=Strict|Warn|Ignore` with the real wording (400 / `Warning: 299` / pruned),
  `dryRun=All` on every write;
- custom objects validated by `modelswap_api.validation.SchemaValidator` (schema, defaults,
  pruning, CEL): 422 Invalid with one cause per field;
- list: `labelSelector` (equality and set-based), `fieldSelector` (metadata.name,
  metadata.namespace, CRD selectableFields, event fields; 400 for others), kind/apiVersion,
  `limit`/`continue`, server-side Table output from additionalPrinterColumns (also as watch
  event objects, for `kubectl get -w`);
- watch: initial ADDED, resume from resourceVersion, ADDED/MODIFIED/DELETED/BOOKMARK,
  selector transitions, `sendInitialEvents`, `timeoutSeconds`, and a too-old
  resourceVersion answered as an ERROR event (Status 410) inside the 200 stream;
- a generated kubeconfig (by default a token is written but not checked: client-go sends
  no bearer token over plain HTTP, and the emulator serves plain HTTP on loopback only);
- a request log (`request_log()`: user, verb, resource, namespace, name, allowed, code);
- opt-in, `KubeEmulator(faults=FaultRates(...))`: seeded 409/429/500 answers and 504s
  after a hold, at given rates per resource request (`faults`), marked in the request log;
- opt-in, `KubeEmulator(tls=True)`: HTTPS with its own CA (in the kubeconfig), bearer-token
  authentication (the admin token in `system:masters`; ServiceAccount tokens from
  `token_for()` or TokenRequest, bound tokens carrying the node-name extra), the RBAC
  authorizer over the stored Roles/ClusterRoles/bindings (403 worded as the real server),
  ValidatingAdmissionPolicies evaluated with cel-python on create/update/patch/delete, and
  SelfSubjectAccessReview / SubjectAccessReview / SelfSubjectReview (`kubectl auth can-i`,
  `kubectl auth whoami`), impersonation (`kubectl --as`). What is evaluated: `authn`,
  `rbac`, `admission_policies`, `impersonation`.

Not emulated: schemas of built-in types (their unknown fields are kept, never refused),
managedFields and server-side apply conflicts, protobuf responses and `/openapi/v2` in
protobuf, admission webhooks, Kubernetes' CEL libraries in admission policies, foreground/orphan deletion propagation, CRD conversion between versions
(objects are served under every version as stored), controllers (no Deployment ever
becomes ready), RBAC aggregation, client certificates, `events.k8s.io`.

Start it in-process (`async with KubeEmulator() as api`), in a thread of its own
(`tests.support.kube_emulator.hosting.EmulatorThread`, for blocking clients and KopfRunner)
or as a subprocess (`hosting.EmulatorProcess`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from tests.support.kube_emulator import rbac
from tests.support.kube_emulator.audit import RequestRecord
from tests.support.kube_emulator.errors import ApiError, bad_request
from tests.support.kube_emulator.faults import Fault, FaultInjector, FaultRates
from tests.support.kube_emulator.handlers import Handlers, error_response, json_response
from tests.support.kube_emulator.operations import Cluster
from tests.support.kube_emulator.request_info import attributes
from tests.support.kube_emulator.security import Security

if TYPE_CHECKING:
    from tests.support.kube_emulator.tls import ServingCertificate

_log = logging.getLogger(__name__)


class KubeEmulator:
    """One emulated API server. `url`, `token` and `kubeconfig()` once started.

    `tls=True` serves HTTPS with a fresh CA (`ca_pem`, in the kubeconfig) and turns on
    authentication, RBAC and admission policies (`auth` alone turns those on over plain
    HTTP, for clients that send tokens there; `auth=False` keeps HTTPS open to all)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        history_size: int = 10_000,
        bookmark_interval_s: float = 1.0,
        tls: bool = False,
        auth: bool | None = None,
        faults: FaultRates | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.token = token or secrets.token_hex(16)
        self.cluster = Cluster(history_size)
        self._handlers = Handlers(self.cluster, bookmark_interval_s=bookmark_interval_s)
        self._runner: web.AppRunner | None = None
        self.certificate: ServingCertificate | None = None
        if tls:  # imported only when used, as `cryptography` slows every emulator's start
            from tests.support.kube_emulator.tls import make_serving_certificate

            self.certificate = make_serving_certificate(_hosts(host))
        self.security = Security(self.cluster, self.token, enabled=tls if auth is None else auth)
        self.faults = FaultInjector(faults) if faults is not None else None
        if self.security.enabled:
            for obj in rbac.bootstrap_objects():
                self.create_object(obj)

    @property
    def url(self) -> str:
        scheme = "https" if self.certificate is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def ca_pem(self) -> bytes | None:
        """The CA clients must trust (None over plain HTTP)."""
        return self.certificate.ca_pem if self.certificate is not None else None

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self.security.middleware, self._middleware],
            client_max_size=64 * 1024 * 1024,
        )
        self.security.install(app)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        return app

    @web.middleware
    async def _middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if self.faults is not None:
            attrs = attributes(request.method, request.path, dict(request.query))
            fault = self.faults.draw(
                resource_request=attrs.resource_request,
                watch=attrs.verb == "watch",
                write=attrs.verb not in ("get", "list", "watch"),
                path=request.path,
            )
            if fault is not None:
                return await self._inject(request, fault)
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e)
        except web.HTTPException:
            raise
        except Exception as e:  # a bug in the emulator: answer as the server would, and log it
            _log.exception("emulator failed on %s %s", request.method, request.path_qs)
            return error_response(ApiError(500, f"emulator internal error: {e!r}"))

    def inject(self, faults: FaultRates | None) -> None:
        """Fail requests from now on at these rates (a fresh seeded sequence), or stop."""
        self.faults = FaultInjector(faults) if faults is not None else None

    async def _inject(self, request: web.Request, fault: Fault) -> web.Response:
        """Answer `fault` instead of the store (which is not touched)."""
        assert self.faults is not None
        if fault.hold_seconds:
            await asyncio.sleep(fault.hold_seconds)  # what a request past its deadline sees
        self.security.mark_fault(request, f"injected {fault.code}")
        retry_after = self.faults.rates.retry_after_seconds
        response = error_response(fault.error(retry_after))
        if fault.code == 429:
            response.headers["Retry-After"] = str(retry_after)
        return response

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/emulator/compact" and request.method == "POST":
            self.cluster.store.compact()
            return json_response({"resourceVersion": str(self.cluster.store.rv)})
        if request.path == "/emulator/tokens" and request.method == "POST":
            return await self._mint_over_http(request)
        if request.method == "GET":
            answered = self._handlers.non_resource(request)
            if answered is not None:
                return answered
        response = await self._handlers.resource(request)
        if response is None:
            raise ApiError(404, "the server could not find the requested resource")
        return response

    async def start(self) -> None:
        self._runner = web.AppRunner(
            self.app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.1
        )
        await self._runner.setup()
        ssl_context = self.certificate.server_context() if self.certificate else None
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=ssl_context)
        await site.start()
        server = site._server
        assert server is not None
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> KubeEmulator:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def create_object(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create one object of any served kind directly (call on the emulator's loop)."""
        rt = self.cluster.types.by_kind(obj.get("apiVersion", ""), obj.get("kind", ""))
        if rt is None:
            raise LookupError(f"no served kind {obj.get('kind')} in {obj.get('apiVersion')}")
        namespace = obj.get("metadata", {}).get("namespace", "default") if rt.namespaced else None
        return self.cluster.create(rt, namespace, obj).object

    def load_manifests(self, paths: Sequence[Path]) -> None:
        """Create every object in these YAML files (multi-document), in order."""
        for path in paths:
            for obj in yaml.safe_load_all(path.read_text()):
                if obj:
                    self.create_object(obj)

    def kubeconfig(self, namespace: str = "default", token: str | None = None) -> dict[str, Any]:
        return kubeconfig(self.url, token or self.token, namespace, self.ca_pem)

    def write_kubeconfig(
        self, path: Path, namespace: str = "default", token: str | None = None
    ) -> Path:
        path.write_text(yaml.safe_dump(self.kubeconfig(namespace, token)))
        path.chmod(0o600)
        return path

    # -- authentication and the request log (call on the emulator's loop) ------------------

    def token_for(self, namespace: str, service_account: str, node_name: str | None = None) -> str:
        """A bearer token for an existing ServiceAccount (LookupError if absent), as user
        `system:serviceaccount:<ns>:<name>`; with `node_name`, the user info carries
        `extra["authentication.kubernetes.io/node-name"] = [node_name]` as a token bound to
        a pod on that node does (and the node's uid when a Node of that name exists)."""
        node = None
        if node_name is not None:
            node = self.cluster.store.get(("", "nodes"), "", node_name)
        return self.security.authenticator.mint(
            namespace, service_account, node=node, node_name=node_name
        )

    def write_kubeconfig_for(
        self,
        path: Path,
        namespace: str,
        service_account: str,
        node_name: str | None = None,
    ) -> Path:
        """A kubeconfig authenticating as that ServiceAccount (default namespace: its own)."""
        token = self.token_for(namespace, service_account, node_name)
        return self.write_kubeconfig(path, namespace, token)

    def request_log(self) -> list[RequestRecord]:
        return self.security.log.records()

    def clear_request_log(self) -> None:
        self.security.log.clear()

    async def _mint_over_http(self, request: web.Request) -> web.Response:
        """`POST /emulator/tokens {namespace, serviceAccount, nodeName?}` → `{token}`: what
        `token_for` does, for an emulator in another process (masters only when auth is on)."""
        try:
            body = await request.json()
            token = self.token_for(body["namespace"], body["serviceAccount"], body.get("nodeName"))
        except (ValueError, KeyError, TypeError) as e:
            raise bad_request(f"want {{namespace, serviceAccount, nodeName?}}: {e!r}") from e
        except LookupError as e:
            raise ApiError(404, str(e)) from e
        return json_response({"token": token}, 201)


def _hosts(host: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys((host, "127.0.0.1", "localhost")))


def kubeconfig(
    url: str, token: str, namespace: str = "default", ca_pem: bytes | None = None
) -> dict[str, Any]:
    cluster: dict[str, Any] = {"server": url}
    if ca_pem is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": cluster}],
        "users": [{"name": "emulator", "user": {"token": token}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
            }
        ],
        "current-context": "emulator",
        "preferences": {},
    }
