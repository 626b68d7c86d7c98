"""Which of Triton's protocol extensions the gateway serves, derived from its path table
(pure).

`GET /v2` relays Triton's server metadata, whose `extensions` name what Triton serves; the
gateway does not expose all of it (the repository, shared-memory, trace and logging APIs
are the node's business). Each extension is served through certain requests (Triton's
protocol says which: `USES`); an extension is listed when the gateway's `PathTable` routes
every one of its requests, under its method, to an endpoint naming the same model (or none
where the request names none). So the list follows the routes: a route added or removed
changes it without a second list to keep. An extension `USES` does not know (a newer
Triton's) is left out: the gateway cannot tell that it serves it.

The extensions carried by an inference request's parameters (classification, sequence,
schedule_policy, binary_tensor_data, parameters) are served when `/infer` is: the gateway
forwards those parameters (`tensors.parse_infer` checks their types, as Triton reads them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from modelswap_sidecar.gateway.paths import PathTable

#: The model name a use's path holds where it names one.
PLACEHOLDER = "{model}"

_INFER = (("POST", f"/v2/models/{PLACEHOLDER}/infer"),)

#: Each extension Triton lists (2.51), with the requests a client uses it through.
USES: dict[str, tuple[tuple[str, str], ...]] = {
    "classification": _INFER,
    "sequence": _INFER,
    "schedule_policy": _INFER,
    "binary_tensor_data": _INFER,
    "parameters": _INFER,
    "model_configuration": (("GET", f"/v2/models/{PLACEHOLDER}/config"),),
    "statistics": (
        ("GET", f"/v2/models/{PLACEHOLDER}/stats"),
        ("GET", "/v2/models/stats"),
    ),
    "generate": (
        ("POST", f"/v2/models/{PLACEHOLDER}/generate"),
        ("POST", f"/v2/models/{PLACEHOLDER}/generate_stream"),
    ),
    "model_repository": (
        ("POST", "/v2/repository/index"),
        ("POST", f"/v2/repository/models/{PLACEHOLDER}/load"),
        ("POST", f"/v2/repository/models/{PLACEHOLDER}/unload"),
    ),
    "model_repository(unload_dependents)": (
        ("POST", f"/v2/repository/models/{PLACEHOLDER}/unload"),
    ),
    "system_shared_memory": (
        ("GET", "/v2/systemsharedmemory/status"),
        ("POST", "/v2/systemsharedmemory/region/r/register"),
    ),
    "cuda_shared_memory": (
        ("GET", "/v2/cudasharedmemory/status"),
        ("POST", "/v2/cudasharedmemory/region/r/register"),
    ),
    "trace": (("GET", "/v2/trace/setting"), ("GET", f"/v2/models/{PLACEHOLDER}/trace/setting")),
    "logging": (("GET", "/v2/logging"),),
}

#: The model name put in a use's path to probe the table.
_PROBE_MODEL = "probe"


def routed(paths: PathTable[Any], method: str, path: str) -> bool:
    """`path` (with `PLACEHOLDER` for a model) is served under `method`, by an endpoint
    for that model (none when the path names none)."""
    model = _PROBE_MODEL if PLACEHOLDER in path else None
    found = paths.match(path.replace(PLACEHOLDER, _PROBE_MODEL))
    return found is not None and found.endpoint.method == method and found.model == model


def served(extensions: Iterable[object], paths: PathTable[Any]) -> list[str]:
    """Those of `extensions` (Triton's list) whose every use `paths` routes, in order."""
    kept: list[str] = []
    for name in extensions:
        uses = USES.get(name) if isinstance(name, str) else None
        if uses and all(routed(paths, method, path) for method, path in uses):
            kept.append(str(name))
    return kept


#: Each extension Triton lists, with the gRPC methods (`inference.GRPCInferenceService`)
#: a client uses it through; empty: none over gRPC (`generate` is HTTP's only), so not
#: served there. The gRPC front's `ServerMetadata` lists an extension when the front
#: answers every one of its methods (`grpc_server.serves`: defined, and not as a refusal).
GRPC_USES: dict[str, tuple[str, ...]] = {
    "classification": ("ModelInfer",),
    "sequence": ("ModelInfer",),
    "schedule_policy": ("ModelInfer",),
    "binary_tensor_data": ("ModelInfer",),
    "parameters": ("ModelInfer",),
    "model_configuration": ("ModelConfig",),
    "statistics": ("ModelStatistics",),
    "generate": (),
    "model_repository": ("RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"),
    "model_repository(unload_dependents)": ("RepositoryModelUnload",),
    "system_shared_memory": (
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
    ),
    "cuda_shared_memory": (
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
    ),
    "trace": ("TraceSetting",),
    "logging": ("LogSettings",),
}


def served_grpc(extensions: Iterable[object], serves: Callable[[str], bool]) -> list[str]:
    """Those of `extensions` (Triton's list) whose every gRPC method `serves`, in order; one
    `GRPC_USES` does not know, or with no gRPC method, is left out."""
    kept: list[str] = []
    for name in extensions:
        uses = GRPC_USES.get(name) if isinstance(name, str) else None
        if uses and all(serves(method) for method in uses):
            kept.append(str(name))
    return kept
