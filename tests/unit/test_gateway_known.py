"""Ready means known (issue 12, finding 10): until the agent knows its desired models,
`/v2/health/ready` is 503 and a name it does not route is 503 + Retry-After, never 404; a
404 only for a name the node was not told of once it knows."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from modelswap_api.control import DesiredEntry
from modelswap_api.policy import EffectivePolicy
from modelswap_sidecar.agent.core.knowledge import DesiredKnowledge
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports.gateway_directory import AgentDirectory
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import (
    AmbiguousModelError,
    ModelNotKnownYetError,
    UnknownModelError,
)
from tests.support.agent_harness import entry, new_uid
from tests.support.gateway_fakes import FakeDirectory, route
from tests.support.gateway_world import GatewayWorld, gateway_world

CLASSIFY = route("classify", "default")


def desired(name: str, *, model_name: str | None = None) -> DesiredEntry:
    wire = entry(new_uid(), name=name)
    if model_name is not None:
        wire["spec"]["model"]["name"] = model_name
    return DesiredEntry.from_dict(wire)


def directory(knowledge: DesiredKnowledge, *entries: DesiredEntry) -> AgentDirectory:
    records = {
        e.uid: AgentModel(entry=e, policy=EffectivePolicy.from_status(e.policy)) for e in entries
    }
    return AgentDirectory(SimpleNamespace(records=records), knowledge=knowledge)  # type: ignore[arg-type]


def test_a_name_is_not_known_yet_until_a_set_is_pushed() -> None:
    knowledge = DesiredKnowledge()
    d = directory(knowledge)
    assert not d.knows_desired()
    with pytest.raises(ModelNotKnownYetError) as caught:
        d.lookup("classify", None)
    assert caught.value.status == 503 and caught.value.retry_after_seconds == 1
    knowledge.pushed()
    assert d.knows_desired()
    with pytest.raises(UnknownModelError):
        d.lookup("classify", None)


def test_a_saved_entry_is_awaited_until_taken_back_and_others_are_404() -> None:
    knowledge = DesiredKnowledge()
    saved = desired("classify-deploy", model_name="classify")
    knowledge.read_saved([saved], found=True)
    d = directory(knowledge)
    assert d.knows_desired()
    with pytest.raises(ModelNotKnownYetError):
        d.lookup("classify", "default")
    with pytest.raises(ModelNotKnownYetError):
        d.lookup("classify", None)
    with pytest.raises(UnknownModelError):  # another namespace was never told of it
        d.lookup("classify", "team-b")
    with pytest.raises(UnknownModelError):
        d.lookup("gpt", None)
    knowledge.adopted()
    with pytest.raises(UnknownModelError):
        d.lookup("classify", None)


def test_an_empty_saved_set_is_known_and_a_missing_file_is_not() -> None:
    empty = DesiredKnowledge()
    empty.read_saved([], found=True)
    assert empty.told and not empty.awaits("classify", None)
    missing = DesiredKnowledge()
    missing.read_saved([], found=False)
    assert not missing.told and missing.awaits("classify", None)


def test_a_held_model_without_a_route_is_503_not_404(monkeypatch: pytest.MonkeyPatch) -> None:
    knowledge = DesiredKnowledge()
    knowledge.pushed()
    held = desired("classify")
    d = directory(knowledge, held)
    assert d.lookup("classify", None).uid == held.uid

    def no_route(model: AgentModel) -> ModelRoute:
        raise OSError("config.pbtxt unreadable")

    monkeypatch.setattr(d, "route_of", no_route)
    with pytest.raises(ModelNotKnownYetError):
        d.lookup("classify", None)


def test_a_lookup_routes_only_the_models_of_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    knowledge = DesiredKnowledge()
    knowledge.pushed()
    in_a = DesiredEntry.from_dict(entry(new_uid(), name="m", namespace="team-a"))
    in_b = DesiredEntry.from_dict(entry(new_uid(), name="m", namespace="team-b"))
    others = [desired(f"other-{i}") for i in range(5)]
    d = directory(knowledge, in_a, in_b, *others)
    made: list[str] = []
    route_of = d.route_of

    def counted(model: AgentModel) -> ModelRoute:
        made.append(model.uid)
        return route_of(model)

    monkeypatch.setattr(d, "route_of", counted)
    assert d.lookup("m", "team-b").uid == in_b.uid
    assert sorted(made) == sorted([in_a.uid, in_b.uid])  # not the five others
    with pytest.raises(AmbiguousModelError):
        d.lookup("m", None)
    with pytest.raises(UnknownModelError):
        d.lookup("m", "team-c")
    assert d.lookup("other-3", None).uid == others[3].uid
    assert len(d.routes(None)) == 7


class _NotKnownYet(FakeDirectory):
    def lookup(self, name: str, namespace: str | None) -> ModelRoute:
        if not self.knows:
            raise ModelNotKnownYetError(f"model {name} is not known yet", retry_after_seconds=1)
        return super().lookup(name, namespace)


class World(GatewayWorld):
    async def get(self, path: str) -> tuple[int, Any, dict[str, str]]:
        async with self.http.get(self.served.url + path) as r:
            return r.status, json.loads(await r.read() or b"null"), dict(r.headers)


@pytest.mark.asyncio
async def test_the_gateway_is_not_ready_and_answers_503_until_the_node_knows() -> None:
    async with gateway_world(World, (CLASSIFY,), resident=True, local_mode=True) as w:
        w.directory.__class__ = _NotKnownYet
        w.directory.knows = False
        status, body, headers = await w.get("/v2/health/ready")
        assert status == 503 and body["reason"] == "ModelNotKnownYet"
        assert headers["Retry-After"] == "1"
        status, body, headers = await w.get("/v2/models/classify")
        assert status == 503 and body["reason"] == "ModelNotKnownYet"
        assert headers["Retry-After"] == "1"
        w.directory.knows = True
        assert (await w.get("/v2/health/ready"))[0] == 200
        assert (await w.get("/v2/models/classify"))[0] == 200
        assert (await w.get("/v2/models/gpt"))[0] == 404
