"""Model instances (issue 27, item 2): the agent keys what it holds by (uid, model
generation), and the operator decides each ModelDeployment's model generation."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from modelswap_api.control import DesiredEntry, EntryResult, parse_desired_set
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.errors import ModelError
from modelswap_api.models import HostedModel, ModelSpec
from modelswap_api.policy import effective_policy
from modelswap_operator import model_generations
from modelswap_operator.status import Observed, Verdict, build_status
from modelswap_operator.status_events import events_between
from modelswap_sidecar.agent.core import instances
from modelswap_sidecar.agent.core.instances import ROLLOUT_INTERRUPTS, RolloutNote, instance_key
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports.reports import reported
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.triton.naming import is_triton_model_name, triton_model_name

UID = "2f1c8a52-7d0e-4c1b-9a57-0d1b5c3e9a10"
SPEC: dict[str, Any] = {
    "model": {"runtime": "triton", "source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"},
}
POLICY = effective_policy(SPEC, BUILTIN_DEFAULTS)
NOW = "2026-11-27T18:00:00Z"


def entry(model_generation: int | None, *, generation: int = 3, uid: str = UID) -> DesiredEntry:
    return DesiredEntry.from_dict(
        {
            "uid": uid,
            "namespace": "team-a",
            "name": "classify",
            "generation": generation,
            "spec": SPEC,
            "policy": POLICY.to_status().to_dict(),
            **({"modelGeneration": model_generation} if model_generation else {}),
        }
    )


def record(model_generation: int | None, serving: Serving, **fields: Any) -> AgentModel:
    model = AgentModel(entry=entry(model_generation), policy=POLICY)
    model.serving = serving
    for name, value in fields.items():
        setattr(model, name, value)
    return model


# -- the agent's instance identity -------------------------------------------------------------


def test_model_generation_1_is_keyed_by_the_uid_itself() -> None:
    # what agents held before model generations existed keeps its key and Triton name
    assert instance_key(UID, None) == instance_key(UID, 1) == UID
    assert record(None, Serving.LOADED).triton_name == triton_model_name(UID)


def test_a_later_model_generation_is_another_instance_with_its_own_triton_name() -> None:
    keys = {instance_key(UID, g) for g in (1, 2, 3, 2**63 - 1)}
    assert len(keys) == 4
    second = record(2, Serving.LOADED)
    assert second.uid == instance_key(UID, 2) != UID
    assert second.deployment_uid == UID and second.model_generation == 2
    assert second.triton_name != triton_model_name(UID)
    assert is_triton_model_name(second.triton_name)
    # deterministic: a restarted agent derives the same key from its saved entry
    assert instance_key(UID, 2) == str(
        uuid.uuid5(uuid.UUID(UID), "modelswap.io/model-generation/2")
    )
    # another ModelDeployment's model generation 2 is another key
    other = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    assert instance_key(other, 2) != instance_key(UID, 2)


def test_an_instance_key_needs_a_uid() -> None:
    with pytest.raises(ValueError, match="not a UID"):
        instance_key("not-a-uid", 2)


def test_the_entrys_model_generation_is_bounded_by_its_generation() -> None:
    def checked(model_generation: int, generation: int) -> None:
        wire = entry(None, generation=generation).to_dict() | {"modelGeneration": model_generation}
        parse_desired_set({"revision": {"term": 0, "counter": 1}, "entries": [wire]})

    checked(3, 3)
    checked(1, 3)
    for bad in (0, 4):
        with pytest.raises(ModelError, match="modelGeneration"):
            checked(bad, 3)


@pytest.mark.parametrize(
    ("old", "new", "shown"),
    [
        # the new one loads: the old one serves (and is reported) meanwhile
        (Serving.LOADED, Serving.LOADING, 1),
        (Serving.DROPPED, Serving.PENDING, 1),
        # the new one answers: it serves
        (Serving.LOADED, Serving.LOADED, 2),
        # the old one answers no more (released first, no room): the new one, waited for
        (Serving.UNLOADING, Serving.PENDING, 2),
        (Serving.LOADED, Serving.FAILED, 1),  # the new one failed: the old one serves on
    ],
)
def test_one_instance_serves_each_deployment(old: Serving, new: Serving, shown: int) -> None:
    older = record(1, old, superseded=True)
    newer = record(2, new)
    other = AgentModel(entry=entry(None, uid="7c9e6679-7425-40de-944b-e07fc1f90ae7"), policy=POLICY)
    picked = {m.deployment_uid: m for m in reported([older, other, newer])}
    assert sorted(picked) == sorted([UID, other.deployment_uid])  # one each
    assert picked[UID].model_generation == shown


def test_the_set_going_back_serves_the_instance_it_names() -> None:
    # the entry names model generation 1 again: generation 2 (loaded) is the one replaced
    older = record(1, Serving.LOADED)
    newer = record(2, Serving.LOADED, superseded=True)
    (shown,) = reported([older, newer])
    assert shown is older
    grouped = instances.by_deployment([older, newer])
    assert [m.model_generation for m in grouped[UID]] == [2, 1]  # newest first


# -- the operator's model generations --------------------------------------------------------------


def spec_model(**overrides: Any) -> ModelSpec:
    return ModelSpec.from_dict({**SPEC["model"], **overrides})


def test_the_digest_follows_the_fields_that_change_the_bytes() -> None:
    base = model_generations.digest(spec_model())
    assert model_generations.digest(spec_model(name="other")) == base
    assert model_generations.digest(spec_model(weightsBytes=32 << 20)) == base
    credentials = {"uri": "/models/mlp", "credentialsSecretRef": {"name": "s"}}
    assert model_generations.digest(spec_model(source=credentials)) == base
    changed = [
        spec_model(weightsBytes="48Mi"),
        spec_model(kvCacheBytes="4Mi"),
        spec_model(source={"uri": "/models/tinylm"}),
        spec_model(source={"uri": "/models/mlp", "sha256": "a" * 64}),
    ]
    digests = {model_generations.digest(m) for m in changed}
    assert base not in digests and len(digests) == len(changed)


def decide(
    generation: int, digest: str, status: dict[str, Any] | None, remembered: Any = None
) -> int:
    return model_generations.model_generation(
        generation=generation, model_digest=digest, status=status, remembered=remembered
    )


def test_a_model_generation_moves_only_when_spec_model_changes() -> None:
    a, b = "sha256:a", "sha256:b"
    assert decide(1, a, None) == 1  # a new object
    assert decide(3, a, None) == 3  # edited before the operator first saw it
    written = {"observedGeneration": 4, "modelGeneration": 2, "modelDigest": a}
    assert decide(5, a, written) == 2  # a policy edit: the same instance
    assert decide(5, b, written) == 5  # spec.model changed (even while no operator ran)
    assert decide(5, b, written, remembered=(b, 5)) == 5  # decided, status not yet written
    assert decide(6, b, written, remembered=(b, 5)) == 5
    # written by an operator before model generations: the model its node holds is kept
    assert decide(7, a, {"observedGeneration": 7}) == 1
    # a changed digest after a remembered decision is a new model generation
    assert decide(8, a, written, remembered=(b, 5)) == 2
    assert decide(8, "sha256:c", written, remembered=(b, 5)) == 8


# -- status: which model generation serves, and the RolledOut condition -------------------------


def status_of(hosted: HostedModel, *, wanted: int, push: EntryResult | None = None,
              previous: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return build_status(
        generation=wanted,
        deleting=False,
        verdict=Verdict(node="n1", gpu="g0", policy=POLICY, reason="Placed"),
        observed=Observed(
            node_live=True,
            hosted=hosted,
            push=push,
            routed=True,
            endpoint="classify.team-a.svc",
            model_generation=wanted,
            model_digest="sha256:x",
        ),
        previous=previous,
        now=NOW,
    )


def rolled_out(status: dict[str, Any]) -> tuple[str, str]:
    (condition,) = [c for c in status["conditions"] if c["type"] == "RolledOut"]
    return condition["status"], condition["reason"]


def test_status_says_which_model_generation_serves_through_a_rollout() -> None:
    serving = HostedModel(uid=UID, state="Resident", model_generation=1)
    current = status_of(serving, wanted=1)
    assert current["modelGeneration"] == current["servingModelGeneration"] == 1
    assert current["modelDigest"] == "sha256:x"
    assert rolled_out(current) == ("True", "Current")

    rolling = HostedModel(uid=UID, state="Resident", model_generation=1,
                          rollout_reason="RollingOut", rollout_model_generation=2,
                          rollout_message="loading beside the old model")  # fmt: skip
    during = status_of(rolling, wanted=2, previous=current)
    assert during["servingModelGeneration"] == 1 and during["modelGeneration"] == 2
    assert rolled_out(during) == ("False", "RollingOut")
    ready = next(c for c in during["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"  # the old model serves meanwhile
    assert [(n.type, n.reason) for n in events_between(current, during)] == [
        ("Normal", "RollingOut")
    ]

    done = status_of(HostedModel(uid=UID, state="Resident", model_generation=2), wanted=2,
                     previous=during)  # fmt: skip
    assert done["servingModelGeneration"] == 2 and rolled_out(done) == ("True", "Current")
    assert [(n.type, n.reason) for n in events_between(during, done)] == [("Normal", "Current")]


def test_an_interrupted_rollout_is_a_warning_event() -> None:
    before = status_of(HostedModel(uid=UID, state="Resident", model_generation=1), wanted=1)
    message = "no room for both model generations on this node; the old model generation is released first"
    push = EntryResult(uid=UID, outcome="applied", reason=ROLLOUT_INTERRUPTS, message=message)
    waiting = HostedModel(uid=UID, state="Pending", model_generation=2)
    during = status_of(waiting, wanted=2, push=push, previous=before)
    assert during.get("servingModelGeneration") is None  # none serves while it waits
    assert rolled_out(during) == ("False", "RolloutInterrupts")
    notes = [(n.type, n.reason, n.message) for n in events_between(before, during)]
    assert ("Warning", "RolloutInterrupts", f"RolledOut=False: {message}") in notes


def test_a_failed_rollout_says_the_old_model_serves() -> None:
    note = RolloutNote(reason="RolloutFailed", model_generation=2, message="the new model failed")
    failed = HostedModel(uid=UID, state="Resident", model_generation=1,
                         rollout_reason=note.reason, rollout_message=note.message)  # fmt: skip
    status = status_of(failed, wanted=2)
    assert status["servingModelGeneration"] == 1
    assert rolled_out(status) == ("False", "RolloutFailed")


def test_requests_wait_for_the_new_instance_of_an_interrupted_rollout() -> None:
    from modelswap_sidecar.agent.ports.gateway_directory import _waitable

    interrupts = RolloutNote(reason=ROLLOUT_INTERRUPTS, model_generation=2, message="")
    rolling = RolloutNote(reason="RollingOut", model_generation=2, message="")
    # placed after the old one's release, or deferred while it still held the room
    assert _waitable(record(2, Serving.PENDING, rollout=interrupts))
    assert _waitable(record(2, Serving.DEFERRED, rollout=interrupts))
    assert _waitable(record(2, Serving.LOADING))
    # a model merely deferred (or a rollout with room, whose old instance serves) is refused
    # at once with its reason, as before
    assert not _waitable(record(2, Serving.DEFERRED))
    assert not _waitable(record(2, Serving.PENDING, rollout=rolling))
    assert not _waitable(record(2, Serving.FAILED, rollout=interrupts))
