"""Which endpoint a request path names, and the parameters it carries (pure).

The gateway's paths have few shapes, matched here by their segments rather than by a
general router trying patterns one after another:

    /v2/health/live, /v2/health/ready, /v2                       fixed (no /ns/ prefix)
    [/ns/{ns}]/v1/models, /v1/completions, /v1/chat/completions,
        /v1/embeddings                                           scoped
    [/ns/{ns}]/v2/models/{model}[/versions/{version}][/{tail}]   a v2 model's endpoints
    [/ns/{ns}]/v1/models/{model}                                 an OpenAI model (may hold /)

Every path names at most one endpoint, and every endpoint one method; a path known under
another method is told apart from an unknown one (405 vs 404). Paths are matched as
aiohttp's router matched them: on the URL's decoded path with `%2F` and `%25` kept encoded
(`yarl.URL.path_safe`), each parameter decoded after matching and never empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from modelswap_sidecar.gateway.context import Flavour

H = TypeVar("H")

_NS = "/ns/"
_V2_MODELS = "/v2/models/"
_V1_MODELS = "/v1/models/"
_VERSIONS = "versions"


@dataclass(frozen=True, slots=True)
class Endpoint(Generic[H]):
    method: str
    handler: H
    flavour: Flavour


@dataclass(frozen=True, slots=True)
class PathMatch(Generic[H]):
    endpoint: Endpoint[H]
    namespace: str | None = None
    model: str | None = None
    version: str | None = None


def _decoded(segment: str) -> str:
    """A parameter as aiohttp's router gave it: `%2F` and `%25` decoded."""
    if "%" not in segment:
        return segment
    return segment.replace("%2F", "/").replace("%25", "%")


class PathTable(Generic[H]):
    def __init__(self) -> None:
        self._fixed: dict[str, Endpoint[H]] = {}
        self._scoped: dict[str, Endpoint[H]] = {}
        #: v2 model endpoints by tail ("" for the model itself), without and with a version
        self._model: tuple[dict[str, Endpoint[H]], dict[str, Endpoint[H]]] = ({}, {})
        self._openai_model: Endpoint[H] | None = None

    # -- building
    def fixed(self, path: str, endpoint: Endpoint[H]) -> None:
        """`path` exactly, never under a `/ns/` prefix."""
        self._fixed[path] = endpoint

    def scoped(self, path: str, endpoint: Endpoint[H]) -> None:
        """`path`, alone or under a `/ns/{ns}` prefix."""
        self._scoped[path] = endpoint

    def v2_model(self, tail: str, endpoint: Endpoint[H], *, versioned: bool = True) -> None:
        """`[/ns/{ns}]/v2/models/{model}<tail>`, and with `/versions/{version}` before the
        tail unless `versioned` is False."""
        self._model[0][tail] = endpoint
        if versioned:
            self._model[1][tail] = endpoint

    def openai_model(self, endpoint: Endpoint[H]) -> None:
        """`[/ns/{ns}]/v1/models/{model}`, the model any non-empty rest of the path."""
        self._openai_model = endpoint

    # -- matching
    def match(self, path: str) -> PathMatch[H] | None:
        """The endpoint `path` names (a `path_safe` path), or None."""
        namespace = None
        if path.startswith(_NS):
            prefix, slash, rest = path[len(_NS) :].partition("/")
            if not prefix or not slash:
                return None
            namespace = _decoded(prefix)
            path = "/" + rest
        else:
            fixed = self._fixed.get(path)
            if fixed is not None:
                return PathMatch(fixed)
        scoped = self._scoped.get(path)
        if scoped is not None:
            return PathMatch(scoped, namespace)
        if path.startswith(_V2_MODELS):
            return self._match_v2_model(path[len(_V2_MODELS) :], namespace)
        if path.startswith(_V1_MODELS) and self._openai_model is not None:
            model = path[len(_V1_MODELS) :]
            if model:
                return PathMatch(self._openai_model, namespace, _decoded(model))
        return None

    def _match_v2_model(self, rest: str, namespace: str | None) -> PathMatch[H] | None:
        parts = rest.split("/")
        count = len(parts)
        if not parts[0] or count > 4:
            return None
        version = None
        if count >= 3:  # {model}/versions/{version}[/{tail}]
            if parts[1] != _VERSIONS or not parts[2]:
                return None
            version = _decoded(parts[2])
            tails = self._model[1]
            tail = "/" + parts[3] if count == 4 else ""
        else:
            tails = self._model[0]
            tail = "/" + parts[1] if count == 2 else ""
        endpoint = tails.get(tail)
        if endpoint is None:
            return None
        return PathMatch(endpoint, namespace, _decoded(parts[0]), version)
