"""The control API over HTTP on 127.0.0.1, with the in-memory backend and a fake clock."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from modelswap_api.control import (
    MAX_GENERATION,
    MAX_REVISION_NUMBER,
    Revision,
    parse_desired_set,
)
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.errors import PolicyError
from modelswap_api.policy import effective_policy
from modelswap_sidecar.control.app import make_app, start
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.certificate import self_signed
from modelswap_sidecar.control.errors import RevisionStoreError
from modelswap_sidecar.control.revisions import RevisionStore
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from tests.support.memory_backend import InMemoryBackend
from tests.support.waiting import until_on_loop

GiB = 1 << 30
#: Kubernetes UIDs (the control API takes nothing else), named for the models they stand for.
A, B, C, P, NOPE = (f"00000000-0000-4000-8000-{n:012x}" for n in (0xA, 0xB, 0xC, 0xF, 0x99))
TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GRACE = 90.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Node:
    """One agent's control API on loopback and the knobs a test turns."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.token_file = tmp_path / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.settings = ControlSettings(
            node_name="node-1",
            token_file=self.token_file,
            state_file=tmp_path / "state" / "revision.json",
            grace_seconds=GRACE,
            unload_check_interval_seconds=3600,  # tests call unload_due themselves
        )
        self.backend = InMemoryBackend("node-1", {"gpu-0": 10 * GiB, "gpu-1": 10 * GiB})
        self.service = ControlService(self.backend, self.settings, clock=self.clock)
        self.client: TestClient[Any, Any]

    @contextlib.asynccontextmanager
    async def served(self) -> AsyncIterator[TestClient[Any, Any]]:
        app = make_app(self.service, TokenFile(self.settings.token_file))
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            self.client = client
            yield client

    async def put(self, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        response = await self.client.put(
            "/v1/desired", json=body, headers=AUTH if headers is None else headers
        )
        return response.status, await response.json()

    async def get(self, path: str) -> tuple[int, Any]:
        response = await self.client.get(path, headers=AUTH)
        return response.status, await response.json()

    async def post(self, path: str) -> tuple[int, Any]:
        response = await self.client.post(path, headers=AUTH)
        return response.status, await response.json()


def policy_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The effective policy the sender computes; for a spec whose policy cannot merge (a
    test of the spec's own checks), the built-in defaults' (the spec is refused first)."""
    try:
        return effective_policy(spec, BUILTIN_DEFAULTS).to_status().to_dict()
    except PolicyError:
        return effective_policy({}, BUILTIN_DEFAULTS).to_status().to_dict()


def entry(uid: str, weights: str = "1Gi", *, generation: int = 1, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"source": {"uri": f"/models/{uid}"}, "weightsBytes": weights},
        "swapPolicy": {"idleAfter": "10m", "minResident": "1m"},
    }
    spec.update(extra.pop("spec", {}))
    return {
        "uid": uid,
        "namespace": extra.pop("namespace", "team-a"),
        "name": extra.pop("name", uid),
        "generation": generation,
        "spec": spec,
        "policy": policy_of(spec),
        **extra,
    }


def desired(term: int, counter: int, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"revision": {"term": term, "counter": counter}, "entries": list(entries)}


def outcomes(body: Any) -> dict[str, tuple[str, str]]:
    return {r["uid"]: (r["outcome"], r["reason"]) for r in body["results"]}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


# --- the desired set -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_set_loads_what_fits_and_defers_what_does_not_with_a_reason(node: Node) -> None:
    async with node.served():
        status, body = await node.put(
            desired(1, 1, entry(A, "6Gi"), entry(B, "6Gi"), entry(C, "9Gi"))
        )
        assert status == 200
        assert outcomes(body) == {
            A: ("applied", "Loaded"),
            B: ("applied", "Loaded"),
            C: ("deferred", "InsufficientHBM"),
        }
        assert body["revision"] == {"term": 1, "counter": 1}
        status, listed = await node.get("/v1/models")
        assert status == 200
        assert [(m["uid"], m["phase"], m["desired"]) for m in listed["models"]] == [
            (A, "Resident", True),
            (B, "Resident", True),
        ]


@pytest.mark.asyncio
async def test_an_older_term_is_refused_and_changes_nothing(node: Node) -> None:
    async with node.served():
        assert (await node.put(desired(5, 1, entry(A))))[0] == 200
        status, body = await node.put(desired(4, 99, entry(B)))
        assert (status, body["reason"]) == (409, "OlderTerm")
        status, body = await node.put(desired(5, 0, entry(B)))
        assert (status, body["reason"]) == (409, "OlderRevision")
        _, listed = await node.get("/v1/models")
        assert [m["uid"] for m in listed["models"]] == [A]
        # The same revision again (a retried push) is fine; a newer term is taken.
        assert (await node.put(desired(5, 1, entry(A))))[0] == 200
        assert (await node.put(desired(6, 0, entry(A))))[0] == 200
        _, info = await node.get("/v1/node")
        assert info["revision"] == {"term": 6, "counter": 0}


@pytest.mark.asyncio
async def test_the_highest_revision_survives_an_agent_restart(node: Node) -> None:
    async with node.served():
        assert (await node.put(desired(7, 3, entry(A))))[0] == 200
    assert RevisionStore(node.settings.state_file).load() == Revision(term=7, counter=3)
    restarted = ControlService(node.backend, node.settings, clock=node.clock)
    node.service = restarted
    async with node.served():
        status, body = await node.put(desired(6, 50, entry(A)))
        assert (status, body["reason"]) == (409, "OlderTerm")
        # What the backend still holds keeps its identity and generation across the restart.
        status, body = await node.put(desired(7, 4, entry(A, namespace="team-z")))
        assert outcomes(body) == {A: ("conflict", "IdentityChanged")}


@pytest.mark.asyncio
async def test_a_set_for_another_node_is_refused(node: Node) -> None:
    async with node.served():
        status, body = await node.put({**desired(1, 1, entry(A)), "nodeName": "node-2"})
        assert (status, body["reason"]) == (409, "WrongNode")
        assert (await node.get("/v1/models"))[1]["models"] == []


@pytest.mark.asyncio
async def test_an_older_generation_is_stale_and_a_changed_identity_is_a_conflict(
    node: Node,
) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A, generation=3), entry(B)))
        status, body = await node.put(
            desired(1, 2, entry(A, generation=2), entry(B, namespace="team-b"))
        )
        assert status == 200
        assert outcomes(body) == {
            A: ("stale", "OlderGeneration"),
            B: ("conflict", "IdentityChanged"),
        }
        _, model = await node.get(f"/v1/models/{A}")
        assert model["generation"] == 3


@pytest.mark.asyncio
async def test_a_policy_change_is_applied_to_the_loaded_model(node: Node) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A)))
        changed = entry(A, generation=2, spec={"swapPolicy": {"idleAfter": "30m"}})
        status, body = await node.put(desired(1, 2, changed))
        assert (status, outcomes(body)) == (200, {A: ("applied", "Updated")})
        _, model = await node.get(f"/v1/models/{A}")
        assert (model["generation"], model["swapIns"]) == (2, 0)


@pytest.mark.asyncio
async def test_a_model_missing_from_the_set_is_unloaded_only_after_the_grace_period(
    node: Node,
) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A), entry(B)))
        node.clock.now += 10
        _, body = await node.put(desired(1, 2, entry(A)))
        assert body["pendingUnloads"] == [{"uid": B, "unloadInSeconds": GRACE}]
        node.clock.now += 30
        await node.put(desired(1, 3, entry(A)))  # a heartbeat push: the deadline holds
        node.clock.now += GRACE - 30 - 1
        assert await node.service.unload_due() == ()
        _, model = await node.get(f"/v1/models/{B}")
        assert (model["desired"], model["unloadInSeconds"], model["phase"]) == (
            False,
            1.0,
            "Resident",
        )
        node.clock.now += 1
        assert await node.service.unload_due() == (B,)
        _, model = await node.get(f"/v1/models/{B}")
        assert model["phase"] == "Dropped" and model["hostBytes"] == GiB  # host bytes kept
        assert await node.service.unload_due() == ()  # not twice
        assert node.backend.unloaded == [B]


@pytest.mark.asyncio
async def test_a_model_that_comes_back_in_time_is_not_unloaded(node: Node) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A), entry(B)))
        await node.put(desired(1, 2, entry(A)))
        node.clock.now += GRACE / 2
        _, body = await node.put(desired(1, 3, entry(A), entry(B)))
        assert body["pendingUnloads"] == []
        node.clock.now += GRACE
        assert await node.service.unload_due() == ()


@pytest.mark.asyncio
async def test_a_model_back_after_its_unload_is_restored_from_the_host_store(node: Node) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A)))
        await node.put(desired(1, 2))
        node.clock.now += GRACE
        assert await node.service.unload_due() == (A,)
        _, body = await node.put(desired(1, 3, entry(A)))
        assert outcomes(body) == {A: ("applied", "Loaded")}
        assert "host store" in body["results"][0]["message"]


@pytest.mark.asyncio
async def test_delete_forgets_a_dropped_model_and_refuses_a_desired_one(node: Node) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A), entry(B)))
        response = await node.client.delete(f"/v1/models/{A}", headers=AUTH)
        assert response.status == 409
        assert (await response.json())["reason"] == "StillDesired"
        await node.put(desired(1, 2, entry(B)))
        response = await node.client.delete(f"/v1/models/{A}", headers=AUTH)
        assert (response.status, (await response.json())["outcome"]) == (200, "completed")
        assert (await node.get(f"/v1/models/{A}"))[0] == 404
        node.clock.now += GRACE
        assert await node.service.unload_due() == ()  # off the schedule
        response = await node.client.delete(f"/v1/models/{A}", headers=AUTH)
        assert (response.status, (await response.json())["reason"]) == (200, "NotHeld")


# --- manual swaps and reads ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_manual_swap_out_and_in(node: Node) -> None:
    async with node.served():
        pinned = entry(P, spec={"swapPolicy": {"idleAfter": "never", "pinned": True}})
        await node.put(desired(1, 1, entry(A), pinned))
        assert await node.post(f"/v1/models/{A}/swap-out") == (
            200,
            {"uid": A, "outcome": "completed", "reason": "SwappedOut"},
        )
        assert (await node.get(f"/v1/models/{A}"))[1]["phase"] == "SwappedOut"
        status, body = await node.post(f"/v1/models/{A}/swap-in")
        assert (status, body["outcome"]) == (200, "completed")
        assert (await node.get(f"/v1/models/{A}"))[1]["swapIns"] == 1
        status, body = await node.post(f"/v1/models/{P}/swap-out")
        assert (status, body["outcome"], body["reason"]) == (409, "refused", "Pinned")
        assert (await node.post(f"/v1/models/{NOPE}/swap-in"))[0] == 404


@pytest.mark.asyncio
async def test_a_reload_names_its_host_copy_choice_and_an_unknown_model_is_404(node: Node) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A)))
        assert await node.post(f"/v1/models/{A}/reload?hostCopy=drop") == (
            200,
            {"uid": A, "outcome": "completed", "reason": "Reloading"},
        )
        assert (await node.post(f"/v1/models/{A}/reload"))[0] == 200  # keep, by default
        status, body = await node.post(f"/v1/models/{A}/reload?hostCopy=maybe")
        assert (status, body["field"]) == (400, "hostCopy")
        assert (await node.post(f"/v1/models/{NOPE}/reload"))[0] == 404


@pytest.mark.asyncio
async def test_a_fenced_agent_refuses_swap_ins_until_a_push_or_lease_renewal(node: Node) -> None:
    async with node.served():
        await node.put(desired(1, 1, entry(A)))
        await node.post(f"/v1/models/{A}/swap-out")
        node.clock.now += GRACE
        assert (await node.get("/v1/node"))[1]["fenced"] is True
        status, body = await node.post(f"/v1/models/{A}/swap-in")
        assert (status, body["reason"]) == (409, "Fenced")
        status, body = await node.post(f"/v1/models/{A}/reload")  # a reload loads too
        assert (status, body["reason"]) == (409, "Fenced")
        node.service.record_lease_renewal()
        assert (await node.get("/v1/node"))[1]["fenced"] is False
        assert (await node.post(f"/v1/models/{A}/swap-in"))[0] == 200


@pytest.mark.asyncio
async def test_node_info_reports_gpus_and_what_is_free(node: Node) -> None:
    async with node.served():
        await node.put(desired(2, 0, entry(A, "4Gi", gpu="gpu-1")))
        status, info = await node.get("/v1/node")
        assert status == 200
        assert info["nodeName"] == "node-1" and info["fenced"] is False
        free = {g["uuid"]: g["hbmFreeBytes"] for g in info["gpus"]}
        assert free == {"gpu-0": 10 * GiB, "gpu-1": 6 * GiB}


@pytest.mark.asyncio
async def test_an_unknown_gpu_is_a_conflict(node: Node) -> None:
    async with node.served():
        _, body = await node.put(desired(1, 1, entry(A, gpu="gpu-9")))
        assert outcomes(body) == {A: ("conflict", "UnknownGpu")}


# --- malformed requests ------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"revision": {"term": 1}, "entries": []}, "revision.counter"),
        ({"revision": {"term": -1, "counter": 0}, "entries": []}, "revision.term"),
        ({"revision": {"term": 1, "counter": 0}, "entries": {}}, "entries"),
        (desired(1, 0, entry(A), entry(A)), "entries[1].uid"),
        (desired(1, 0, entry("../etc")), "entries[0].uid"),
        # the documented pattern once took these; the node cannot name a model after them
        (desired(1, 0, entry(A), entry("not-a-uuid")), "entries[1].uid"),
        (desired(1, 0, entry(A.upper())), "entries[0].uid"),
        (desired(1, 0, entry(A + "0")), "entries[0].uid"),
        (desired(1, 0, entry(A, generation=0)), "entries[0].generation"),
        # Issue 26, item 8: a revision or generation no operator can produce was saved, and
        # every later push was refused as older (the node stuck).
        (desired(2**63, 0), "revision.term"),
        (desired(MAX_REVISION_NUMBER + 1, 0), "revision.term"),
        (desired(1, 2**64), "revision.counter"),
        (desired(1, MAX_REVISION_NUMBER + 1), "revision.counter"),
        (desired(1, 0, entry(A, generation=2**70)), "entries[0].generation"),
        (desired(1, 0, entry(A, generation=MAX_GENERATION + 1)), "entries[0].generation"),
        (desired(1, 0, entry(A, "0")), "entries[0].spec.model.weightsBytes"),
        (desired(1, 0, {**entry(A), "colour": "red"}), "entries[0].colour"),
        (
            desired(1, 0, entry(A, spec={"swapPolicy": {"pinned": True, "onSwapOut": "drop"}})),
            "entries[0].spec.swapPolicy.onSwapOut",
        ),
    ],
)
async def test_a_malformed_body_is_a_400_naming_the_field(
    node: Node, body: dict[str, Any], field: str
) -> None:
    async with node.served():
        status, answer = await node.put(body)
        assert (status, answer["field"]) == (400, field), answer
        assert (await node.get("/v1/models"))[1]["models"] == []
        assert node.service.revision is None


@pytest.mark.asyncio
async def test_a_refused_bound_is_not_stored_and_the_next_push_is_taken(node: Node) -> None:
    """Issue 26, item 8: after a refused 2^63 term the node still takes an ordinary push;
    the largest bounds themselves are taken (and stored)."""
    async with node.served():
        status, answer = await node.put(desired(2**63, 2**64, entry(A, generation=2**70)))
        assert (status, answer["field"]) == (400, "revision.term")
        assert RevisionStore(node.settings.state_file).load() is None
        assert (await node.put(desired(3, 1, entry(A))))[0] == 200
        top = desired(MAX_REVISION_NUMBER, MAX_REVISION_NUMBER, entry(A, generation=MAX_GENERATION))
        status, body = await node.put(top)
        assert (status, outcomes(body)) == (200, {A: ("applied", "Updated")})
        _, info = await node.get("/v1/node")
        assert info["revision"] == {"term": MAX_REVISION_NUMBER, "counter": MAX_REVISION_NUMBER}
        assert (await node.get(f"/v1/models/{A}"))[1]["generation"] == MAX_GENERATION
    stored = RevisionStore(node.settings.state_file).load()
    assert stored == Revision(term=MAX_REVISION_NUMBER, counter=MAX_REVISION_NUMBER)


def test_a_stored_revision_out_of_bounds_is_ignored_so_pushes_are_taken(tmp_path: Path) -> None:
    """An agent before the bounds may have saved a hostile 2^63 term: kept, it would refuse
    every push for good; it is ignored (logged) and the next push sets the revision."""
    store = RevisionStore(tmp_path / "r.json")
    store.save(Revision(term=2**63, counter=0))
    assert store.load() is None
    store.save(Revision(term=1, counter=2**64))
    assert store.load() is None
    store.save(Revision(term=MAX_REVISION_NUMBER, counter=0))
    assert store.load() == Revision(term=MAX_REVISION_NUMBER, counter=0)


@pytest.mark.asyncio
async def test_a_body_that_is_not_json_is_a_400(node: Node) -> None:
    async with node.served():
        response = await node.client.put("/v1/desired", data=b"{not json", headers=AUTH)
        assert response.status == 400
        assert "not JSON" in (await response.json())["message"]
        response = await node.client.get("/v1/models/bad%2Fuid", headers=AUTH)
        assert (response.status, (await response.json())["field"]) == (400, "uid")
        response = await node.client.get("/v1/models/not-a-uuid", headers=AUTH)
        assert (response.status, (await response.json())["field"]) == (400, "uid")


@pytest.mark.asyncio
async def test_a_uid_that_is_not_a_uuid_is_refused_naming_the_field_and_nothing_changes(
    node: Node,
) -> None:
    async with node.served():
        assert (await node.put(desired(1, 1, entry(A))))[0] == 200
        status, answer = await node.put(desired(1, 2, entry(A), entry("not-a-uuid")))
        assert (status, answer["reason"], answer["field"]) == (400, "Invalid", "entries[1].uid")
        assert "UUID" in answer["message"]
        status, body = await node.get("/v1/models")
        assert status == 200 and [m["uid"] for m in body["models"]] == [A]
        assert (await node.put(desired(1, 3, entry(A), entry(B))))[0] == 200


@pytest.mark.asyncio
@pytest.mark.parametrize("segment", ["%7B", "%7D", "a%7Bb%7D", "not-a-uuid"])
async def test_a_malformed_uid_in_the_path_is_a_400_naming_uid(node: Node, segment: str) -> None:
    """Found by the generated-request suite: `{` or `}` in the segment matched no route
    (aiohttp's default pattern leaves them out) and was answered an undocumented 404."""
    async with node.served():
        for method, path in (
            ("GET", f"/v1/models/{segment}"),
            ("DELETE", f"/v1/models/{segment}"),
            ("POST", f"/v1/models/{segment}/swap-in"),
            ("POST", f"/v1/models/{segment}/swap-out"),
        ):
            response = await node.client.request(method, path, headers=AUTH)
            answer = await response.json()
            assert (response.status, answer.get("field")) == (400, "uid"), (method, path, answer)


# --- authentication ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_calls_without_or_with_a_wrong_token_change_nothing(node: Node) -> None:
    async with node.served():
        status, body = await node.put(desired(1, 1, entry(A)), headers={})
        assert (status, body["reason"]) == (401, "Unauthorized")
        wrong = {"Authorization": "Bearer not-the-token"}
        assert (await node.put(desired(1, 1, entry(A)), headers=wrong))[0] == 403
        basic = {"Authorization": f"Basic {TOKEN}"}
        assert (await node.put(desired(1, 1, entry(A)), headers=basic))[0] == 401
        for method, path in [
            ("GET", "/v1/node"),
            ("GET", "/v1/models"),
            ("POST", f"/v1/models/{A}/swap-in"),
            ("DELETE", f"/v1/models/{A}"),
        ]:
            response = await node.client.request(method, path, headers=wrong)
            assert response.status == 403, path
        assert node.service.revision is None
        assert node.backend.models is not None and await node.backend.models() == []
        response = await node.client.get("/v1/node")
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        # The document is public.
        assert (await node.client.get("/v1/openapi.yaml")).status == 200


@pytest.mark.asyncio
async def test_a_rotated_token_file_is_picked_up_and_a_missing_one_admits_nobody(
    node: Node,
) -> None:
    async with node.served():
        assert (await node.get("/v1/node"))[0] == 200
        rotated = node.token_file.with_name("token.new")
        rotated.write_text("rotated")
        os.replace(rotated, node.token_file)  # as a Secret volume swaps its files
        assert (await node.get("/v1/node"))[0] == 403
        response = await node.client.get("/v1/node", headers={"Authorization": "Bearer rotated"})
        assert response.status == 200
        node.token_file.unlink()
        response = await node.client.get("/v1/node", headers={"Authorization": "Bearer rotated"})
        assert (response.status, (await response.json())["reason"]) == (503, "TokenUnavailable")


@pytest.mark.asyncio
async def test_unknown_routes_and_methods_answer_json(node: Node) -> None:
    async with node.served():
        response = await node.client.get("/v1/nothing", headers=AUTH)
        assert response.status == 404 and "reason" in await response.json()
        response = await node.client.post("/v1/node", headers=AUTH)
        assert response.status == 405


def test_the_revision_file_is_json_and_a_corrupt_one_is_refused(tmp_path: Path) -> None:
    store = RevisionStore(tmp_path / "r.json")
    assert store.load() is None
    store.save(Revision(term=2, counter=9))
    assert json.loads((tmp_path / "r.json").read_text())["revision"] == {"term": 2, "counter": 9}
    assert store.load() == Revision(term=2, counter=9)
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left behind
    (tmp_path / "r.json").write_text("{")
    with pytest.raises(RevisionStoreError, match=r"r\.json"):
        store.load()


class FlakyBackend(InMemoryBackend):
    """Answers converge out of order once asked to, and fails the first unload."""

    def __init__(self) -> None:
        super().__init__("node-1", {"gpu-0": 10 * GiB})
        self.scramble = False
        self.unload_failures = 1

    async def converge(self, entries: Any) -> Any:
        results = list(await super().converge(entries))
        return results[::-1] if self.scramble else results

    async def unload(self, uid: str) -> None:
        if self.unload_failures:
            self.unload_failures -= 1
            raise OSError("triton is restarting")
        await super().unload(uid)


@pytest.mark.asyncio
async def test_a_failed_unload_is_retried_and_a_broken_backend_is_a_500(node: Node) -> None:
    backend = FlakyBackend()
    node.backend = backend
    node.service = ControlService(backend, node.settings, clock=node.clock)
    async with node.served():
        await node.put(desired(1, 1, entry(A), entry(B)))
        await node.put(desired(1, 2, entry(A)))
        node.clock.now += GRACE
        assert await node.service.unload_due() == ()  # failed: stays scheduled
        assert await node.service.unload_due() == (B,)
        backend.scramble = True
        status, body = await node.put(desired(1, 3, entry(A), entry(C)))
        assert (status, body["reason"]) == (500, "InternalError")


class HeldUnloadBackend(InMemoryBackend):
    """Holds the unload of `held` until `release` is set."""

    def __init__(self, held: str) -> None:
        super().__init__("node-1", {"gpu-0": 10 * GiB})
        self.held = held
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def unload(self, uid: str) -> None:
        if uid == self.held:
            self.entered.set()
            await self.release.wait()
        await super().unload(uid)


@pytest.mark.asyncio
async def test_a_batch_of_unloads_lets_pushes_through_and_skips_what_came_back(
    node: Node,
) -> None:
    """Issue 26, item 8: a set shrinking from thousands of entries unloaded them all with
    the control lock held, and PUT and DELETE timed out meanwhile. The lock is now taken
    per unload: a PUT waiting while B unloads goes next (asyncio's lock is first come,
    first served), before C's unload, and C, back in its set, is not unloaded."""
    backend = HeldUnloadBackend(B)
    node.backend = backend
    node.service = ControlService(backend, node.settings, clock=node.clock)
    async with node.served():
        await node.put(desired(1, 1, entry(A), entry(B), entry(C)))
        await node.put(desired(1, 2, entry(A)))
        node.clock.now += GRACE
        unloading = asyncio.create_task(node.service.unload_due())
        await asyncio.wait_for(backend.entered.wait(), 10.0)
        back = parse_desired_set(desired(1, 3, entry(A), entry(C)))
        pushing = asyncio.create_task(node.service.put_desired(back))
        await asyncio.sleep(0)  # one turn: the PUT now waits for the lock B's unload holds
        assert not pushing.done()
        backend.release.set()
        result = await asyncio.wait_for(pushing, 10.0)
        assert {r.uid: r.outcome for r in result.results} == {A: "applied", C: "applied"}
        assert await asyncio.wait_for(unloading, 10.0) == (B,)
        assert backend.unloaded == [B]
        _, listed = await node.get("/v1/models")
        assert {m["uid"]: m["desired"] for m in listed["models"]} == {A: True, B: False, C: True}


@pytest.mark.asyncio
async def test_the_served_app_unloads_on_its_own_timer(tmp_path: Path) -> None:
    node = Node(tmp_path)
    node.settings = dataclasses.replace(
        node.settings, host="127.0.0.1", port=0, unload_check_interval_seconds=0.01
    )
    node.service = ControlService(node.backend, node.settings, clock=node.clock)
    runner = await start(make_app(node.service, TokenFile(node.token_file)))
    try:
        host, port = runner.addresses[0][:2]
        async with aiohttp.ClientSession(headers=AUTH) as session:
            url = f"http://{host}:{port}/v1/desired"
            for body in (desired(1, 1, entry(A)), desired(1, 2)):
                async with session.put(url, json=body) as response:
                    assert response.status == 200
        node.clock.now += GRACE
        await until_on_loop(lambda: node.backend.unloaded == [A], "the app to unload A", 10.0)
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_https_with_the_agent_certificate(tmp_path: Path) -> None:
    certificate = self_signed(["127.0.0.1"])
    node = Node(tmp_path)
    node.settings = dataclasses.replace(node.settings, host="127.0.0.1", port=0, tls=certificate)
    node.service = ControlService(node.backend, node.settings, clock=node.clock)
    runner = await start(make_app(node.service, TokenFile(node.token_file)))
    try:
        host, port = runner.addresses[0][:2]
        trusted = ssl.create_default_context(cadata=certificate.certificate_pem)
        async with (
            aiohttp.ClientSession(headers=AUTH) as session,
            session.get(f"https://{host}:{port}/v1/node", ssl=trusted) as response,
        ):
            assert response.status == 200
            assert (await response.json())["nodeName"] == "node-1"
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            async with aiohttp.ClientSession() as session:
                await session.get(f"https://{host}:{port}/v1/node")  # not trusted
    finally:
        await runner.cleanup()
