"""Each live node's desired set, decided without I/O (stage 2 of `turn_plan`): every
entry checked as the agent will, a model whose entry cannot be sent given its problem in
its verdict instead. The credentials Secrets it needs (`secrets_wanted`) are read first by
`entry_building`, which carries the plan out and remembers the model generations sent."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_api.control import DesiredEntry, SourceCredentials
from modelswap_api.models import HostedModel, ModelDeployment
from modelswap_operator import desired, model_generations
from modelswap_operator.cache import Body
from modelswap_operator.errors import CredentialsNotPermitted
from modelswap_operator.status import (
    CREDENTIALS_NOT_OPTED_IN,
    CREDENTIALS_UNAVAILABLE,
    HELD_PHASES,
    Verdict,
)

#: A credentials Secret as read: its body, None when there is none, or why it may not be.
SecretRead = Body | CredentialsNotPermitted | None
CREDENTIALS_FIELD = "spec.model.source.credentialsSecretRef"


def sendable(verdict: Verdict | None) -> bool:
    """A verdict whose model gets an entry: placed, with a valid policy."""
    return verdict is not None and verdict.node is not None and verdict.policy is not None


def secrets_wanted(
    active: Sequence[ModelDeployment], verdicts: Mapping[str, Verdict]
) -> list[tuple[str, str]]:
    """The (namespace, name) of each credentials Secret a sendable model names, once each,
    in the order `plan_entries` uses them."""
    wanted: dict[tuple[str, str], None] = {}
    for deployment in active:
        reference = deployment.spec.model.source.credentials_secret_ref
        if reference is not None and sendable(verdicts.get(str(deployment.metadata["uid"]))):
            wanted[(deployment.namespace, reference.name)] = None
    return list(wanted)


@dataclass(frozen=True)
class EntriesPlan:
    #: Each live node's full desired set.
    by_node: Mapping[str, list[DesiredEntry]]
    #: The verdicts changed: a model whose entry cannot be sent, with its problem instead.
    verdicts: Mapping[str, Verdict]
    #: Per uid sent: (digest of spec.model, model generation), to remember.
    model_generations: Mapping[str, tuple[str, int]]


def with_problem(verdict: Verdict, reason: str, field_path: str, message: str) -> Verdict:
    return Verdict(node=verdict.node, gpu=verdict.gpu, policy=verdict.policy, reason=reason,
                   message=message, problem_field=field_path, policy_invalid=False)  # fmt: skip


def plan_entries(
    live: Collection[str],
    active: Sequence[ModelDeployment],
    verdicts: Mapping[str, Verdict],
    reports: Mapping[str, Mapping[str, HostedModel]],
    bodies: Mapping[str, Body],
    *,
    secrets: Mapping[tuple[str, str], SecretRead],
    written: Mapping[str, Mapping[str, Any]],
    model_generations_sent: Mapping[str, tuple[str, int]],
    refusals: Mapping[tuple[str, int], tuple[str, str]],
) -> EntriesPlan:
    """Each live node's set, every entry checked as the agent will (one bad entry makes it
    refuse the whole set); `secrets`: those `secrets_wanted` names, as read.

    A model whose credentials cannot be resolved any more (its Secret deleted or emptied)
    while its node holds it is sent without them: the agent takes the change in place and
    the model keeps serving; its status says the source is unreachable. Left out, it would
    be unloaded after the grace period. A model not held yet is left out: a load would
    fail. An entry generation an agent refused (`refusals`) is not sent again."""
    by_node: dict[str, list[DesiredEntry]] = {name: [] for name in live}
    changed: dict[str, Verdict] = {}
    decided: dict[str, tuple[str, int]] = {}
    for deployment in active:
        uid = str(deployment.metadata["uid"])
        verdict = verdicts.get(uid)
        if verdict is None or verdict.node is None or verdict.policy is None:
            continue
        node, policy = verdict.node, verdict.policy
        credentials: SourceCredentials | None = None
        reference = deployment.spec.model.source.credentials_secret_ref
        if reference is not None:
            found = secrets[(deployment.namespace, reference.name)]
            unusable: ValueError | None = None
            reason = CREDENTIALS_UNAVAILABLE
            if isinstance(found, CredentialsNotPermitted):
                unusable, reason = found, CREDENTIALS_NOT_OPTED_IN
            else:
                try:
                    credentials = desired.credentials_from_secret(found, reference.name)
                except ValueError as e:
                    unusable = e
            if unusable is not None:
                hosted = (reports.get(node) or {}).get(uid)
                if hosted is None or hosted.state not in HELD_PHASES:
                    changed[uid] = with_problem(verdict, reason, CREDENTIALS_FIELD, str(unusable))
                    continue
                verdict = changed[uid] = dataclasses.replace(
                    verdict, source_problem=f"{CREDENTIALS_FIELD}: {unusable}",
                    source_reason=reason,
                )  # fmt: skip
        model_digest = model_generations.digest(deployment.spec.model)
        generation = model_generations.model_generation(
            generation=int(deployment.metadata.get("generation") or 1),
            model_digest=model_digest,
            status=written.get(uid) or (bodies.get(uid) or {}).get("status"),
            remembered=model_generations_sent.get(uid),
        )
        decided[uid] = (model_digest, generation)
        entry = desired.entry_for(deployment, gpu=verdict.gpu or "", policy=policy,
                                  credentials=credentials, model_generation=generation)  # fmt: skip
        problem = desired.check_entry(entry)
        if problem is not None:
            changed[uid] = with_problem(verdict, problem.reason, problem.field, problem.message)
            continue
        if (refusal := refusals.get((uid, entry.generation))) is not None:
            changed[uid] = with_problem(verdict, "RefusedByAgent", *refusal)
            continue
        by_node[node].append(entry)
    return EntriesPlan(by_node, changed, decided)
