"""Building each live node's full desired set (`desired`), checking every entry as the
agent will: a model whose entry cannot be sent gets its problem in its verdict instead
(and is not sent: the agent would refuse the whole set). `EntryBuilder` reads the
credentials Secrets and owns the memo of the model generation last sent per model
(`model_generations`), kept until its status records it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from typing import Any

from modelswap_api import kube
from modelswap_api.control import DesiredEntry, SourceCredentials
from modelswap_api.models import HostedModel, ModelDeployment
from modelswap_operator import desired, model_generations
from modelswap_operator.cache import Body
from modelswap_operator.errors import CredentialsNotPermitted
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.status import (
    CREDENTIALS_NOT_OPTED_IN,
    CREDENTIALS_UNAVAILABLE,
    HELD_PHASES,
    Verdict,
)


def with_problem(verdict: Verdict, reason: str, field_path: str, message: str) -> Verdict:
    return Verdict(
        node=verdict.node,
        gpu=verdict.gpu,
        policy=verdict.policy,
        reason=reason,
        message=message,
        problem_field=field_path,
        policy_invalid=False,
    )


class EntryBuilder:
    def __init__(
        self,
        io: KubeIO,
        *,
        status_of: Callable[[str, Body | None], Mapping[str, Any] | None],
        refusal_of: Callable[[str, int], tuple[str, str] | None],
    ) -> None:
        """`status_of(uid, body)`: the status in effect; `refusal_of(uid, generation)`:
        (field, message) of an agent's refusal of that entry."""
        self.io = io
        self.status_of = status_of
        self.refusal_of = refusal_of
        #: Per uid: (digest of spec.model, model generation) last sent.
        self._model_generations: dict[str, tuple[str, int]] = {}

    def model_generation(self, uid: str) -> tuple[str, int] | None:
        """(digest of spec.model, model generation) last sent for `uid`."""
        return self._model_generations.get(uid)

    def keep(self, uids: Collection[str]) -> None:
        """Forget the models no longer known."""
        for uid in set(self._model_generations) - set(uids):
            del self._model_generations[uid]

    async def build(
        self,
        live: set[str],
        active: list[ModelDeployment],
        verdicts: dict[str, Verdict],
        reports: Mapping[str, Mapping[str, HostedModel]],
        bodies: Mapping[str, Body],
        *,
        credential_namespaces: tuple[str, ...] | None,
    ) -> dict[str, list[DesiredEntry]]:
        """Each live node's set.

        A model whose credentials cannot be resolved any more (its Secret deleted or
        emptied) while its node holds it is sent without them: the agent takes the change
        in place and the model keeps serving; its status says the source is unreachable.
        Left out, it would be unloaded after the grace period. A model not held yet is
        left out: a load would fail."""
        by_node: dict[str, list[DesiredEntry]] = {name: [] for name in live}
        secrets: dict[tuple[str, str], Body | CredentialsNotPermitted | None] = {}
        for deployment in active:
            uid = str(deployment.metadata["uid"])
            verdict = verdicts.get(uid)
            if verdict is None or verdict.node is None or verdict.policy is None:
                continue
            credentials: SourceCredentials | None = None
            reference = deployment.spec.model.source.credentials_secret_ref
            if reference is not None:
                key = (deployment.namespace, reference.name)
                if key not in secrets:
                    secrets[key] = await self._secret(*key, credential_namespaces)
                found = secrets[key]
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
                    field_path = "spec.model.source.credentialsSecretRef"
                    hosted = (reports.get(verdict.node) or {}).get(uid)
                    if hosted is None or hosted.state not in HELD_PHASES:
                        verdicts[uid] = with_problem(verdict, reason, field_path, str(unusable))
                        continue
                    verdicts[uid] = dataclasses.replace(
                        verdict, source_problem=f"{field_path}: {unusable}", source_reason=reason
                    )
            entry = desired.entry_for(
                deployment,
                gpu=verdict.gpu or "",
                policy=verdict.policy,
                credentials=credentials,
                model_generation=self._model_generation_of(deployment, bodies.get(uid)),
            )
            problem = desired.check_entry(entry)
            if problem is not None:
                verdicts[uid] = with_problem(
                    verdict, problem.reason, problem.field, problem.message
                )
                continue
            if (refusal := self.refusal_of(uid, entry.generation)) is not None:
                verdicts[uid] = with_problem(verdict, "RefusedByAgent", *refusal)
                continue
            by_node[verdict.node].append(entry)
        return by_node

    def _model_generation_of(self, deployment: ModelDeployment, body: Body | None) -> int:
        """The model generation to send (`model_generations`), remembered until its status
        is written: `spec.model` changed since the last one makes a new instance."""
        uid = str(deployment.metadata["uid"])
        model_digest = model_generations.digest(deployment.spec.model)
        decided = model_generations.model_generation(
            generation=int(deployment.metadata.get("generation") or 1),
            model_digest=model_digest,
            status=self.status_of(uid, body),
            remembered=self._model_generations.get(uid),
        )
        self._model_generations[uid] = (model_digest, decided)
        return decided

    async def _secret(
        self, namespace: str, name: str, credential_namespaces: tuple[str, ...] | None
    ) -> Body | CredentialsNotPermitted | None:
        """A credentialsSecretRef Secret, None when there is none, or why it may not be
        read: a namespace that did not opt in (`settings.credential_namespaces`) is not
        asked at all; a 403 (RBAC and the settings disagree) is the model's problem, not a
        failed turn for every model."""
        refusal = desired.credentials_refusal(namespace, credential_namespaces)
        if refusal is not None:
            return CredentialsNotPermitted(refusal)
        try:
            return await self.io.call(kube.read_secret, namespace, name)
        except kube.KubeError as e:
            if e.status != 403:
                raise
            return CredentialsNotPermitted(desired.forbidden_message(namespace, name))
