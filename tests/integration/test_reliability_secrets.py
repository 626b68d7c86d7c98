"""No secret leaves where it belongs (issue 12, deliverable 5): a source credential and the
control token are planted, a real agent with Triton and its gateway serves a model fetched
with the credential, then everything a user, the runtime's uid or an operator can read is
grepped for them: the agent's log, `GET /v1/models`, `/v1/models/{uid}`, `/v1/node`, the
agent's state files, the Triton model repository (the runtime's uid reads it), Triton's
config API directly and through the gateway, the gateway's OpenAI model list. The control
API also refuses missing and wrong tokens without changing anything."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from examples.models import reference
from modelswap_sidecar.triton.naming import triton_model_name
from modelswap_sidecar.triton.process import free_loopback_port
from tests.integration.test_agent_lifecycle import file_server
from tests.integration.test_operator import ready
from tests.support.agent_harness import TOKEN, AgentConfig, entry, new_uid, node
from tests.support.operator_world import Objects, agents, emulator, operator
from tests.support.origin import Files, mlp_archive, served
from tests.support.reliability import record
from tests.support.waiting import until

pytestmark = [pytest.mark.slow, pytest.mark.asyncio, pytest.mark.timeout(300)]
__all__ = ["file_server"]  # a fixture, used by name

PLANTED = "PLANTED-source-secret-7f3a9c"


def readable_text(root: Path) -> dict[str, str]:
    """Every file under `root` as text (undecodable bytes replaced)."""
    return {
        str(p): p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file()
    }


async def test_a_planted_credential_and_the_control_token_appear_nowhere(
    tmp_path: Path, file_server: str
) -> None:
    Files.files = {"/mlp.tar.gz": mlp_archive()}
    Files.authorizations = []
    gateway_port = free_loopback_port()
    config = AgentConfig(extra={"gateway": {"host": "127.0.0.1", "port": gateway_port}})
    async with node(tmp_path, config) as n:
        triton, agent, control, models = n.parts()
        uid = new_uid()
        mlp = entry(uid, name="secretive", source={"uri": f"{file_server}/mlp.tar.gz"})
        await control.desired([{**mlp, "credentials": {"bearerToken": PLANTED + "\n"}}])
        await control.wait_state(uid, "Resident")
        assert Files.authorizations == [f"Bearer {PLANTED}"]  # it was used, once
        x = reference.mlp_input(3)
        assert np.allclose((await models.mlp(uid, x)).output, reference.mlp_forward(x), atol=1e-5)

        seen: dict[str, str] = {}
        for path in ("/v1/models", f"/v1/models/{uid}", "/v1/node"):
            seen[f"control API GET {path}"] = (await control.client.get(path)).text
        gateway = f"http://127.0.0.1:{gateway_port}"
        triton_name = triton_model_name(uid)
        async with httpx.AsyncClient(timeout=30) as http:
            base = triton.url if "://" in triton.url else f"http://{triton.url}"
            direct = await http.get(f"{base}/v2/models/{triton_name}/config")
            assert direct.status_code == 200, direct.text
            seen["Triton GET /v2/models/{m}/config"] = direct.text
            for path in ("/ns/default/v2/models/secretive/config", "/ns/default/v1/models"):
                answer = await http.get(gateway + path)
                assert answer.status_code == 200, answer.text
                seen[f"gateway GET {path}"] = answer.text
        seen["agent log"] = agent.log_path.read_text()
        seen.update({f"state file {k}": v for k, v in readable_text(agent.state_dir).items()})
        seen.update(
            {f"repository file {k}": v for k, v in readable_text(triton.repository).items()}
        )
        config_parameters = json.loads(seen["Triton GET /v2/models/{m}/config"])["parameters"]
        assert "modelswap.agent_socket" in config_parameters  # the config API was read

    leaks = sorted(where for where, text in seen.items() if PLANTED in text or TOKEN in text)
    assert leaks == [], f"a secret appears in: {leaks}"
    for where in sorted(seen):
        if where.startswith(("state file", "repository file")):
            continue
        record("access", check=f"planted credential and control token in {where}",
               outcome="absent")  # fmt: skip
    files = [w for w in seen if w.startswith(("state file", "repository file"))]
    record("access", check=f"planted credential and control token in the agent's state files "
           f"and Triton's model repository ({len(files)} files)", outcome="absent")  # fmt: skip


async def test_the_control_api_refuses_missing_and_wrong_tokens_and_nothing_changes(
    tmp_path: Path,
) -> None:
    async with node(tmp_path) as n:
        _triton, _agent, control, _models = n.parts()
        uid = new_uid()
        await control.desired([entry(uid)])
        await control.wait_state(uid, "Resident")
        before = (await control.client.get(f"/v1/models/{uid}")).json()
        tries = {
            "no Authorization header": {},
            "a wrong token": {"Authorization": "Bearer not-the-token"},
            "the token with another scheme": {"Authorization": f"Basic {TOKEN}"},
            "the token with a suffix": {"Authorization": f"Bearer {TOKEN}x"},
            "a bearer without a token": {"Authorization": "Bearer"},
        }
        async with httpx.AsyncClient(base_url=control.client.base_url, timeout=30) as anonymous:
            for what, headers in tries.items():
                statuses = [
                    (await anonymous.request(method, path, headers=headers)).status_code
                    for method, path in (
                        ("DELETE", f"/v1/models/{uid}"),
                        ("POST", f"/v1/models/{uid}/swap-out"),
                        ("PUT", "/v1/desired"),
                        ("GET", "/v1/models"),
                    )
                ]
                assert set(statuses) <= {401, 403} and len(set(statuses)) == 1, (what, statuses)
                record("access", check=f"control API with {what}",
                       outcome=f"{statuses[0]} on DELETE, swap-out, PUT and GET")  # fmt: skip
        after = (await control.client.get(f"/v1/models/{uid}")).json()
        assert (after["state"], after["swapOuts"]) == (before["state"], before["swapOuts"])


# --- through the operator: Secrets, Events and status -------------------------------------------


class _Guarded(Files):
    """The archive only for the planted credential; 401 (naming nothing) otherwise."""

    def do_GET(self) -> None:  # noqa: N802 - http.server names it
        if self.headers.get("Authorization") != f"Bearer {PLANTED}":
            self.authorizations.append("refused")
            self.send_error(401)
            return
        super().do_GET()


@pytest.fixture
def guarded_server() -> Iterator[str]:
    with served(_Guarded) as url:
        yield url


def source_secret(name: str, authorization: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "default"},
            "data": {"authorization": base64.b64encode(authorization.encode()).decode()}}  # fmt: skip


def protected_model(name: str, url: str, secret: str) -> dict[str, Any]:
    return {"apiVersion": "modelswap.io/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"model": {"name": "mlp", "weightsBytes": "32Mi",
                               "source": {"uri": f"{url}/mlp.tar.gz",
                                          "credentialsSecretRef": {"name": secret}}}}}  # fmt: skip


def conditions(objects: Objects, name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = ((objects.get(name) or {}).get("status") or {}).get(
        "conditions"
    ) or []
    return found


@pytest.mark.timeout(300)
async def test_secrets_read_by_the_operator_appear_in_no_event_status_or_log(
    tmp_path: Path, guarded_server: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Credentials the operator reads from Secrets — the right one (ending in a newline),
    a wrong one the origin refuses, one spanning two lines — never reach an Event, a
    ModelDeployment's or SwapNode's status, the operator's log or the agent's."""
    Files.files = {"/mlp.tar.gz": mlp_archive()}
    Files.authorizations = []
    caplog.set_level(logging.DEBUG)
    with emulator() as api:
        objects = Objects(api)
        for body in (
            source_secret("right", f"Bearer {PLANTED}\n"),
            source_secret("wrong", f"Bearer {PLANTED}-wrong"),
            source_secret("two-lines", f"Bearer {PLANTED}\nX-Planted: {PLANTED}"),
        ):
            api.create(body)
        async with agents(api, tmp_path, names=("node-a",)) as nodes:
            with operator(api):
                for name in ("right", "wrong", "two-lines"):
                    objects.apply(protected_model(f"from-{name}", guarded_server, name))
                await until(lambda: ready(objects, "from-right"), "from-right Ready")
                refused = await until(
                    lambda: (
                        objects.condition("from-wrong", "Loaded").get("status") == "False"
                        and objects.condition("from-wrong", "Loaded")
                    ),
                    "from-wrong not loaded",
                )
                assert "401" in refused["message"], refused
                two_lines = await until(
                    lambda: next(
                        (c for c in conditions(objects, "from-two-lines")
                         if c.get("reason") == "CredentialsUnavailable"),
                        None,
                    ),
                    "from-two-lines refused",
                )  # fmt: skip
                assert "Secret 'two-lines' key 'authorization'" in two_lines["message"], two_lines
                assert "refused" in Files.authorizations  # the wrong one was sent, and refused
                seen = {
                    "Events in default": json.dumps(
                        objects.core.list_namespaced_event("default").to_dict(), default=str
                    ),
                    "ModelDeployments": json.dumps(
                        [objects.get(f"from-{n}") for n in ("right", "wrong", "two-lines")]
                    ),
                    "SwapNodes": json.dumps(
                        objects.custom.list_cluster_custom_object(
                            "modelswap.io", "v1alpha1", "swapnodes"
                        )
                    ),
                }
            seen["operator log"] = "\n".join(r.getMessage() for r in caplog.records)
            seen["agent log"] = nodes["node-a"].agent.log_path.read_text()
        objects.close()
    assert "from-wrong" in seen["Events in default"]  # Events were written and read
    leaks = sorted(where for where, text in seen.items() if PLANTED in text)
    assert leaks == [], f"a secret appears in: {leaks}"
    for where in sorted(seen):
        record("access", check=f"credentials from Secrets (right, wrong, two lines) in {where}",
               outcome="absent")  # fmt: skip
