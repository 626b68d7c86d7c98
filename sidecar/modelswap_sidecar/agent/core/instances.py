"""Model instances: what the agent holds is keyed by (ModelDeployment uid, model generation).

A ModelDeployment's *model generation* is the `metadata.generation` at which its
`spec.model` last changed (the operator computes it and sends it with each entry,
`DesiredEntry.model_generation`). One instance is one model generation of one
ModelDeployment; when `spec.model` changes, the new instance is loaded beside the old one
(each under its own Triton name, engine record and host-store bytes) and the old one is
released once the new one serves (`ports.backend`). Replicas will add a replica index
to the same identity.

Everything below the agent's records (the engine, Triton, the host store, the policy, the
gateway's routes) names a model by one UUID-shaped key, so an instance's key is a UUID
too: model generation 1 (and an entry that gives none) is keyed by the ModelDeployment's
uid itself, so what agents held before model generations existed stays theirs (its
Triton name, host-store bytes and saved entry are unchanged); a later model generation is
keyed by a name-based UUID (RFC 4122 version 5) of the uid and the model generation:
deterministic, so a restarted agent derives the same key from its saved entry and adopts
the same Triton model. Pure.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

#: The model generation an entry without one stands for.
BASE_MODEL_GENERATION = 1


def model_generation_of(model_generation: int | None) -> int:
    return BASE_MODEL_GENERATION if model_generation is None else model_generation


def instance_key(uid: str, model_generation: int | None) -> str:
    """The key of instance (uid, model generation): the uid for model generation 1 (or
    none), else a version-5 UUID of both. ValueError for a uid that is not a UUID."""
    try:
        parsed = uuid.UUID(uid)
    except ValueError as e:
        raise ValueError(f"not a UID: {uid!r}") from e
    generation = model_generation_of(model_generation)
    if generation == BASE_MODEL_GENERATION:
        return str(parsed)
    return str(uuid.uuid5(parsed, f"modelswap.io/model-generation/{generation}"))


class Instance(Protocol):
    """What choosing among a ModelDeployment's instances reads of a record."""

    @property
    def deployment_uid(self) -> str: ...

    @property
    def model_generation(self) -> int: ...


InstanceT = TypeVar("InstanceT", bound=Instance)


def by_deployment(records: Iterable[InstanceT]) -> dict[str, list[InstanceT]]:
    """Each ModelDeployment's instances, newest model generation first."""
    grouped: dict[str, list[InstanceT]] = {}
    for record in records:
        grouped.setdefault(record.deployment_uid, []).append(record)
    for instances in grouped.values():
        instances.sort(key=lambda r: -r.model_generation)
    return grouped


#: The new instance loads beside the old one, which serves meanwhile.
ROLLING_OUT = "RollingOut"
#: No room for both: the old instance is released first and requests wait for the new.
ROLLOUT_INTERRUPTS = "RolloutInterrupts"
#: The new instance failed to load; the old one (if any) serves on.
ROLLOUT_FAILED = "RolloutFailed"


@dataclass(frozen=True, kw_only=True)
class RolloutNote:
    """Where a changed model's rollout stands, as reported beside the model."""

    reason: str
    model_generation: int
    message: str


def chosen(
    instances: Sequence[InstanceT],
    answers: Callable[[InstanceT], bool],
    current: Callable[[InstanceT], bool],
) -> InstanceT:
    """The instance that serves a ModelDeployment (`instances` newest first, not empty):
    the current one (its entry is in the set) once it answers, else an older one that
    still answers (the old model serves while the new one loads), else the current one
    (requests wait for it or are refused with its reason)."""
    target = next((i for i in instances if current(i)), instances[0])
    if answers(target):
        return target
    return next((i for i in instances if i is not target and answers(i)), target)
