"""The desired set's lifecycle through the real agent: grace-period unloads restored from the
host store (not the source), older terms refused, same-named models in two namespaces,
bad sources reported with the field while other models keep serving."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from examples.models import reference
from examples.models.reference import mlp_infer_body
from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import (
    EXAMPLES,
    MIB,
    AgentConfig,
    entry,
    eventually,
    new_uid,
    node,
)
from tests.support.origin import Files, mlp_archive, served

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]


async def test_dropped_entry_unloads_after_grace_and_returns_from_the_host_store(
    tmp_path: Path,
) -> None:
    source = tmp_path / "mounted" / "mlp"
    shutil.copytree(EXAMPLES / "mlp", source)
    async with node(tmp_path) as n:
        triton, _agent, control, models = n.parts()
        uid, other = new_uid(), new_uid()
        mlp = entry(uid, source={"uri": str(source)}, swap_policy={"idleAfter": "never"})
        await control.desired([mlp, entry(other)])
        await control.wait_state(uid, "Resident")
        await control.wait_state(other, "Resident")
        x = reference.mlp_input(7)
        first = await models.mlp(uid, x)
        assert not first.restored

        response = await control.put([entry(other)])
        assert response.status_code == 200
        pending = response.json()["pendingUnloads"]
        assert [p["uid"] for p in pending] == [uid] and pending[0]["unloadInSeconds"] > 0
        # Still served during the grace period; unloaded after it, host bytes kept.
        assert (await control.model(uid))["state"] == "Resident"
        gone = await control.wait_state(uid, "SwappedOut", timeout_seconds=30)
        assert not gone["desired"] and gone["hostBytes"] == 32 * MIB
        assert triton.stub_pids(uid) == []

        # The source's weights are gone now: coming back must not read them.
        (source / "1" / "weights.f32").write_bytes(b"\0" * 16)
        results = await control.desired([mlp, entry(other)])
        assert results[uid]["outcome"] == "applied"
        await control.wait_state(uid, "Resident")
        again = await models.mlp(uid, x)
        assert again.restored  # from the host store
        assert np.array_equal(again.output, first.output)
        assert again.checksum == first.checksum == reference.mlp_checksum(32 * MIB)


async def test_older_term_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        _triton, _agent, control, _models = n.parts()
        control.term = 3
        uid = new_uid()
        await control.desired([entry(uid)])
        refused = await control.put([], term=2)
        assert refused.status_code == 409 and refused.json()["reason"] == "OlderTerm"
        info = await control.model(uid)
        assert info["desired"] and "unloadInSeconds" not in info


async def test_same_name_in_two_namespaces_side_by_side(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        triton, _agent, control, models = n.parts()
        a, b = new_uid(), new_uid()
        await control.desired(
            [
                entry(a, name="llama", namespace="team-a"),
                entry(b, name="llama", namespace="team-b"),
            ]
        )
        info_a = await control.wait_state(a, "Resident")
        info_b = await control.wait_state(b, "Resident")
        assert (info_a["namespace"], info_b["namespace"]) == ("team-a", "team-b")
        assert triton.stub_pids(a) != triton.stub_pids(b)
        x = reference.mlp_input(3)
        for uid in (a, b):
            answer = await models.mlp(uid, x)
            assert np.allclose(answer.output, reference.mlp_forward(x), atol=1e-5)


@pytest.fixture
def file_server() -> Iterator[str]:
    with served(Files) as url:
        yield url


async def test_bad_sources_name_the_field_and_leave_others_serving(
    tmp_path: Path, file_server: str
) -> None:
    archive = mlp_archive()
    Files.files = {"/mlp.tar.gz": archive, "/huge.tar.gz": b"\0" * (2 * MIB)}
    async with node(tmp_path) as n:
        _triton, _agent, control, models = n.parts()
        good, fetched, missing, digest, huge = (new_uid() for _ in range(5))
        wrong = hashlib.sha256(b"something else").hexdigest()
        entries = [
            entry(good),
            entry(fetched, source={"uri": f"{file_server}/mlp.tar.gz",
                                   "sha256": hashlib.sha256(archive).hexdigest()}),
            entry(missing, source={"uri": f"{file_server}/nothing.tar.gz"}),
            entry(digest, source={"uri": f"{file_server}/mlp.tar.gz", "sha256": wrong}),
            entry(huge, source={"uri": f"{file_server}/huge.tar.gz"}),
        ]  # fmt: skip
        results = await control.desired(entries)
        assert results[good]["outcome"] == "applied"

        async def failed(uid: str) -> dict[str, str] | None:
            info = await control.model(uid)
            return info if info.get("phase") == "Failed" else None

        messages = {}
        for uid in (missing, digest, huge):
            info = await eventually(lambda uid=uid: failed(uid), what=f"{uid} to fail")
            assert info["reason"] == "BadSource", info
            messages[uid] = info["message"]
        assert messages[missing].startswith("spec.model.source: ")
        assert "404" in messages[missing]
        assert messages[digest].startswith("spec.model.source.sha256: ")
        assert "limit" in messages[huge] and "spec.model.source: " in messages[huge]

        # The others are unaffected: the mounted one and the fetched one serve.
        await control.wait_state(good, "Resident")
        await control.wait_state(fetched, "Resident")
        x = reference.mlp_input(5)
        for uid in (good, fetched):
            answer = await models.mlp(uid, x)
            assert np.allclose(answer.output, reference.mlp_forward(x), atol=1e-5)

        # The same entries again: deferred with the reason, not retried in a loop.
        again = await control.desired(entries)
        assert again[missing]["outcome"] == "deferred"
        assert again[missing]["reason"] == "BadSource"


async def test_a_uid_the_node_cannot_hold_is_refused_and_disturbs_nothing(tmp_path: Path) -> None:
    """Issue 12, finding 1: an entry whose uid is not a UUID was answered 500 and kept, and
    every later request, push and policy tick failed. Now it is a 400 naming the field, and
    a bad record left by an older agent is skipped at adoption."""
    gateway_port = free_loopback_port()
    config = AgentConfig(extra={"gateway": {"host": "127.0.0.1", "port": gateway_port}})
    async with node(tmp_path, config) as n:
        _triton, agent, control, models = n.parts()
        good, later = new_uid(), new_uid()
        await control.desired([entry(good)])
        await control.wait_state(good, "Resident")

        refused = await control.put([entry(good), entry("not-a-uuid", name="bad")])
        assert refused.status_code == 400, refused.text
        assert refused.json()["field"] == "entries[1].uid"
        assert list(await control.models()) == [good]

        x = reference.mlp_input(11)
        gateway = httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway_port}", trust_env=False)
        async with gateway:
            answer = await gateway.post("/v2/models/mlp/infer", json=mlp_infer_body(x))
            assert answer.status_code == 200, answer.text
        assert (await control.swap(good, "out")).status_code == 200
        assert (await control.swap(good, "in")).status_code == 200
        results = await control.desired([entry(good), entry(later, name="later")])
        assert results[later]["outcome"] == "applied"
        await control.wait_state(later, "Resident")
        assert (await control.client.delete("/v1/models/not-a-uuid")).status_code == 400

        # An older agent may have saved such an entry: a restarted agent leaves it out.
        await agent.stop()
        saved = agent.state_dir / "desired.json"
        doc = json.loads(saved.read_text())
        bad = {**doc["entries"][0], "uid": "not-a-uuid", "name": "bad"}
        saved.write_text(json.dumps({**doc, "entries": [*doc["entries"], bad]}))
        await agent.start()
        await control.wait_state(good, "Resident")
        assert set(await control.models()) == {good, later}
        answer = await models.mlp(good, x)
        assert np.allclose(answer.output, reference.mlp_forward(x), atol=1e-5)
        assert "Traceback" not in agent.log_path.read_text()


async def test_a_credential_is_trimmed_and_no_secret_is_ever_shown(
    tmp_path: Path, file_server: str
) -> None:
    """Issue 12, finding 4: a token read from a file ending in a newline was echoed into the
    model's status message and the log (`Illegal header value b'Bearer …\\n'`)."""
    Files.files = {"/mlp.tar.gz": mlp_archive()}
    Files.authorizations = []
    async with node(tmp_path) as n:
        _triton, agent, control, models = n.parts()
        good, bad = new_uid(), new_uid()
        source = {"uri": f"{file_server}/mlp.tar.gz"}
        entries = [
            {**entry(good, source=source), "credentials": {"bearerToken": "s3cret-token\n"}},
            {**entry(bad, name="bad", source=source),
             "credentials": {"bearerToken": "a\nb-s3cret"}},
        ]  # fmt: skip
        await control.desired(entries)
        await control.wait_state(good, "Resident")
        assert Files.authorizations == ["Bearer s3cret-token"]  # trimmed, sent once

        async def failed() -> dict[str, str] | None:
            info = await control.model(bad)
            return info if info.get("phase") == "Failed" else None

        info = await eventually(failed, what="the bad credential to fail")
        assert info["reason"] == "BadSource"
        assert info["message"].startswith("spec.model.source.credentialsSecretRef: ")
        x = reference.mlp_input(2)
        answer = await models.mlp(good, x)
        assert np.allclose(answer.output, reference.mlp_forward(x), atol=1e-5)

        listed = (await control.client.get("/v1/models")).text
        log = agent.log_path.read_text()
        for shown in (listed, log):
            assert "s3cret" not in shown and "a\\nb" not in shown and "a\nb" not in shown


async def test_a_deleted_model_stays_deleted_after_an_agent_restart(tmp_path: Path) -> None:
    """Issue 26, item 8: a model dropped from the set and DELETEd within its grace period
    (the operator's finalizer does not wait for it) stayed in desired.json, and the
    restarted agent took it back. Two entries whose files are missing (no model is
    loaded): each is a record, saved, Failed; restart adopts what is saved."""
    async with node(tmp_path, AgentConfig(grace_seconds=600.0)) as n:
        _triton, agent, control, _models = n.parts()
        gone, kept = new_uid(), new_uid()
        entries = {
            uid: entry(uid, name=name, source={"uri": f"/models/absent-{name}"})
            for uid, name in ((gone, "gone"), (kept, "kept"))
        }
        await control.desired(list(entries.values()))
        assert set(await control.models()) == {gone, kept}
        response = await control.put([entries[kept]])
        assert [p["uid"] for p in response.json()["pendingUnloads"]] == [gone]
        deleted = await control.client.delete(f"/v1/models/{gone}")
        assert (deleted.status_code, deleted.json()["reason"]) == (200, "Forgotten")
        assert set(await control.models()) == {kept}

        await agent.stop()
        saved = json.loads((agent.state_dir / "desired.json").read_text())
        assert [e["uid"] for e in saved["entries"]] == [kept]
        await agent.start()

        async def adopted() -> dict[str, dict[str, Any]] | None:
            models = await control.models()
            return models if kept in models else None

        assert set(await eventually(adopted, what="the saved set to be taken back")) == {kept}
