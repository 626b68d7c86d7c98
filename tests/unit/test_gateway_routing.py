"""Which model a request means: Host header, /ns/ prefix, bare names (pure functions)."""

from __future__ import annotations

import pytest

from modelswap_sidecar.gateway.errors import (
    AmbiguousModelError,
    NamespaceRequiredError,
    UnknownModelError,
)
from modelswap_sidecar.gateway.routing import (
    display_ids,
    namespace_from_host,
    resolve,
    scope_of,
    split_qualified,
)
from tests.support.gateway_fakes import RouteTable, route

LLAMA_A = route("llama", "team-a")
LLAMA_B = route("llama", "team-b")
BERT_A = route("bert", "team-a")
ROUTES = (LLAMA_A, LLAMA_B, BERT_A)


@pytest.mark.parametrize(
    ("host", "namespace"),
    [
        ("llama.team-a.svc.cluster.local", "team-a"),
        ("llama.team-a.svc.cluster.local:8080", "team-a"),
        ("llama.team-a.svc", "team-a"),
        ("llama.team-a.svc.example.org.", "team-a"),
        ("llama.team-a", "team-a"),
        ("LLAMA.Team-A.SVC", "team-a"),
        ("localhost", None),
        ("localhost:8080", None),
        ("127.0.0.1:8080", None),
        ("[::1]:8080", None),
        ("api.example.com", None),
        ("a.b.c.d", None),
        ("bad_name.team-a.svc", None),
        ("", None),
        (None, None),
    ],
)
def test_namespace_from_the_service_host(host: str | None, namespace: str | None) -> None:
    assert namespace_from_host(host) == namespace


def test_the_path_prefix_wins_over_the_host() -> None:
    scope = scope_of("team-b", "llama.team-a.svc", local_mode=False)
    assert scope.namespace == "team-b"
    assert "/ns/team-b/" in scope.origin
    assert scope_of(None, "llama.team-a.svc", local_mode=False).namespace == "team-a"


def test_no_namespace_is_refused_outside_local_mode() -> None:
    with pytest.raises(NamespaceRequiredError, match=r"/ns/<namespace>/"):
        scope_of(None, "localhost:8080", local_mode=False)
    assert scope_of(None, "localhost:8080", local_mode=True).namespace is None


def test_resolve_by_namespace() -> None:
    assert resolve(ROUTES, "llama", "team-b") is LLAMA_B
    with pytest.raises(UnknownModelError, match="'bert' not found in namespace 'team-b'"):
        resolve(ROUTES, "bert", "team-b")


def test_a_bare_name_resolves_only_when_unique() -> None:
    assert resolve(ROUTES, "bert", None) is BERT_A
    with pytest.raises(AmbiguousModelError) as caught:
        resolve(ROUTES, "llama", None)
    assert caught.value.candidates == ("team-a/llama", "team-b/llama")
    assert "team-a/llama, team-b/llama" in caught.value.message
    with pytest.raises(UnknownModelError, match="'gpt' not found"):
        resolve(ROUTES, "gpt", None)


def test_qualified_openai_names() -> None:
    assert split_qualified("team-a/llama") == ("team-a", "llama")
    assert split_qualified("llama") == (None, "llama")
    assert split_qualified("meta/Llama-3/8B") == ("meta", "Llama-3/8B")
    assert split_qualified("Org_X/model") == (None, "Org_X/model")  # not a namespace


def test_listing_qualifies_only_names_that_collide() -> None:
    ids = [model_id for model_id, _ in display_ids(ROUTES)]
    assert ids == ["bert", "team-a/llama", "team-b/llama"]


def test_route_table_replaces_its_set_whole() -> None:
    table = RouteTable(ROUTES)
    assert table.routes("team-a") == (LLAMA_A, BERT_A)
    assert table.by_uid(LLAMA_B.uid) is LLAMA_B
    table.replace([BERT_A])
    assert table.routes(None) == (BERT_A,)
    with pytest.raises(UnknownModelError):
        table.lookup("llama", "team-a")
