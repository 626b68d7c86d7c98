"""Generated ModelDeployment specs (issue 12, deliverable 2): drawn from the CRD schema in
crds/, half of them broken in one to three places, through `modelswap validate`, the API
emulator (jsonschema + cel-python) and the agent's control API. Each is accepted, or refused
naming a field (or the input limit), in bounded time; the three agree on what a valid spec
is; and nothing else is disturbed: a healthy model stays as it was in the emulator and in
the agent, and a refused push changes no state."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.errors import PolicyError
from modelswap_api.policy import effective_policy
from modelswap_api.resources import validate_resource
from modelswap_api.validate_command import validate_paths
from tests.support.control_thread import ControlThread
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT
from tests.support.reliability import record
from tests.support.schema_strategies import from_schema, maybe_mutated

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

CRD = yaml.safe_load((REPO_ROOT / "crds" / "modelswap.io_modeldeployments.yaml").read_text())
SPEC_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
SPECS = maybe_mutated(from_schema(SPEC_SCHEMA))
#: Longest any one input may take to be answered: typically < 0.1 s; the bound catches a
#: blow-up (seconds to minutes), not a loaded CI machine's slow second.
ANSWER_SECONDS = 10.0
EXAMPLES = settings(
    max_examples=40,
    deadline=None,  # bounded by ANSWER_SECONDS per call instead, with the call named
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
HEALTHY_SPEC = {"model": {"source": {"uri": "/models/healthy"}, "weightsBytes": "1Mi"}}
HEALTHY_UID = "00000000-0000-4000-8000-00000000beef"
TOKEN = "generated-specs-token"


def manifest(spec: Any, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "modelswap.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def valid(spec: Any) -> bool:
    return validate_resource(manifest(spec, "m")).ok


def timed(what: str, call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    result = call()
    seconds = time.monotonic() - started
    assert seconds < ANSWER_SECONDS, f"{what} took {seconds:.2f} s"
    return result, seconds


# --- modelswap validate ------------------------------------------------------------------------


@given(spec=SPECS)
@EXAMPLES
def test_validate_accepts_or_names_a_field_in_bounded_time(
    spec: Any, tmp_path_factory: Any
) -> None:
    file = tmp_path_factory.mktemp("spec") / "md.yaml"
    file.write_text(yaml.safe_dump(manifest(spec, "generated"), allow_unicode=True))
    out = io.StringIO()
    code, seconds = timed("modelswap validate", lambda: validate_paths([file], out))
    lines = out.getvalue().splitlines()
    if code == 0:
        assert lines == ["1 document(s) checked: valid"]
    else:
        problems = [line.removeprefix(f"{file}: ") for line in lines[:-1]]
        assert problems and lines[-1].endswith("problem(s)")
        for problem in problems:
            label, _, message = problem.partition(": ")
            assert label in {"file", "ModelDeployment default/generated"}, problem
            # a field path (spec.…, metadata.…) or, for the file, the limit it broke
            assert label == "file" or message.split(":")[0].startswith(("spec", "metadata")), (
                problem
            )
    record(
        "inputs",
        input="modelswap validate: a generated ModelDeployment (CRD schema, maybe mutated)",
        limit="yaml_input limits, schema bounds pre-check, MAX_CEL_EVALUATIONS",
        outcome="valid" if code == 0 else f"refused: {lines[0].removeprefix(f'{file}: ')[:100]}",
        answered_seconds=round(seconds, 4),
    )


# --- the API emulator --------------------------------------------------------------------------

MDS = "/apis/modelswap.io/v1alpha1/namespaces/default/modeldeployments"


@pytest.fixture(scope="module")
def emulator() -> Iterator[tuple[httpx.Client, dict[str, Any]]]:
    with (
        EmulatorThread(
            manifests=[REPO_ROOT / "crds" / "modelswap.io_modeldeployments.yaml"]
        ) as api,
        httpx.Client(base_url=api.url, timeout=30) as http,
    ):
        made = http.post(MDS, json=manifest(HEALTHY_SPEC, "healthy"))
        assert made.status_code == 201, made.text
        yield http, made.json()


_names = iter(range(1_000_000))


@given(spec=SPECS, as_yaml=st.booleans())
@EXAMPLES
def test_the_emulator_accepts_or_names_the_field_and_the_healthy_model_stays(
    emulator: tuple[httpx.Client, dict[str, Any]], spec: Any, as_yaml: bool
) -> None:
    http, healthy = emulator
    name = f"generated-{next(_names)}"
    body = manifest(spec, name)
    if as_yaml:
        content = yaml.safe_dump(body, allow_unicode=True).encode()
        headers = {"Content-Type": "application/yaml"}
    else:
        content = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
    answer, seconds = timed(
        "the emulator",
        lambda: http.post(
            MDS, params={"fieldValidation": "Strict"}, content=content, headers=headers
        ),
    )
    status = answer.json()
    assert answer.status_code in (201, 400, 422), answer.text
    if answer.status_code == 201:
        assert valid(spec), "the emulator took what modelswap validate refuses"
        assert http.delete(f"{MDS}/{name}").status_code == 200
    else:
        assert not valid(spec), f"the emulator refused what modelswap validate takes: {status}"
        causes = status.get("details", {}).get("causes", [])
        named = [c.get("field", "") for c in causes] or [status["message"]]
        assert all(n for n in named), status
    now = http.get(f"{MDS}/healthy").json()
    assert now["metadata"]["resourceVersion"] == healthy["metadata"]["resourceVersion"]
    assert now["spec"] == healthy["spec"]
    record(
        "inputs",
        input=f"API emulator: a generated ModelDeployment as {'YAML' if as_yaml else 'JSON'}",
        limit="CRD schema + CEL (validator), yaml_input limits on YAML bodies",
        outcome=f"{answer.status_code}; the healthy model unchanged",
        answered_seconds=round(seconds, 4),
    )


# --- the agent's control API -------------------------------------------------------------------


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def policy_of(spec: Any) -> dict[str, Any] | None:
    try:
        return effective_policy(spec, BUILTIN_DEFAULTS).to_status().to_dict()
    except (PolicyError, TypeError, ValueError, AttributeError):
        return None


def desired_entry(uid: str, name: str, spec: Any, policy: dict[str, Any]) -> dict[str, Any]:
    return {"uid": uid, "namespace": "default", "name": name, "generation": 1,
            "spec": spec, "policy": policy}  # fmt: skip


@pytest.fixture(scope="module")
def agent(tmp_path_factory: Any) -> Iterator[tuple[httpx.Client, list[int]]]:
    with (
        ControlThread(tmp_path_factory.mktemp("agent"), TOKEN) as control,
        httpx.Client(base_url=control.url, headers=AUTH, timeout=30) as http,
    ):
        yield http, [0]


def snapshot(http: httpx.Client) -> tuple[Any, Any]:
    node = http.get("/v1/node").json()
    healthy = http.get(f"/v1/models/{HEALTHY_UID}")
    return node["revision"], healthy.json() if healthy.status_code == 200 else healthy.status_code


@given(spec=SPECS)
@EXAMPLES
def test_the_control_api_accepts_or_names_the_field_and_a_refusal_changes_nothing(
    agent: tuple[httpx.Client, list[int]], spec: Any
) -> None:
    http, counter = agent
    policy = policy_of(spec)
    if policy is None:  # the sender (operator, local mode) refuses it: PolicyValid=False
        return
    healthy_policy = policy_of(HEALTHY_SPEC)
    assert healthy_policy is not None
    counter[0] += 1
    body = {
        "revision": {"term": 1, "counter": counter[0]},
        "entries": [
            desired_entry(HEALTHY_UID, "healthy", HEALTHY_SPEC, healthy_policy),
            desired_entry("00000000-0000-4000-8000-000000000001", "generated", spec, policy),
        ],
    }
    before = snapshot(http) if counter[0] > 1 else None
    answer, seconds = timed("the control API", lambda: http.put("/v1/desired", json=body))
    result = answer.json()
    assert answer.status_code in (200, 400), answer.text
    if answer.status_code == 400:
        assert result["field"].startswith("entries[1]."), result
        assert not valid(spec) or result["field"].startswith("entries[1].policy"), result
        if before is not None:
            assert snapshot(http) == before  # no state change on a refused push
    else:
        outcomes = {r["uid"]: r["outcome"] for r in result["results"]}
        assert outcomes[HEALTHY_UID] in ("applied", "unchanged"), result
        assert http.get(f"/v1/models/{HEALTHY_UID}").status_code == 200
    record(
        "inputs",
        input="control API: PUT /v1/desired with a generated spec beside a healthy entry",
        limit="16 MiB body, depth 32, 4,096 entries, schema bounds, MAX_CEL_EVALUATIONS",
        outcome=f"{answer.status_code} {result.get('field', '')}".strip(),
        answered_seconds=round(seconds, 4),
    )
