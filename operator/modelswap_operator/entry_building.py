"""Building each live node's full desired set: reads the credentials Secrets the sendable
models name (`entry_plan.secrets_wanted`), then carries out `entry_plan.plan_entries`.
`EntryBuilder` owns the memo of the model generation last sent per model
(`model_generations`), kept until its status records it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from modelswap_api import kube
from modelswap_api.control import DesiredEntry
from modelswap_api.models import HostedModel, ModelDeployment
from modelswap_operator import desired
from modelswap_operator.cache import Body
from modelswap_operator.entry_plan import SecretRead, plan_entries, secrets_wanted
from modelswap_operator.errors import CredentialsNotPermitted
from modelswap_operator.kubeio import KubeIO
from modelswap_operator.status import Verdict


class EntryBuilder:
    def __init__(
        self,
        io: KubeIO,
        *,
        statuses_written: Callable[[], Mapping[str, Mapping[str, Any]]],
        refusals: Callable[[], Mapping[tuple[str, int], tuple[str, str]]],
    ) -> None:
        """`statuses_written()`: the statuses this process last wrote, by uid;
        `refusals()`: (field, message) of each entry generation an agent refused."""
        self.io = io
        self.statuses_written = statuses_written
        self.refusals = refusals
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
        """Each live node's set; `verdicts` gets each problem found on the way."""
        secrets = {
            key: await self._secret(*key, credential_namespaces)
            for key in secrets_wanted(active, verdicts)
        }
        plan = plan_entries(live, active, verdicts, reports, bodies, secrets=secrets,
                            written=self.statuses_written(),
                            model_generations_sent=self._model_generations,
                            refusals=self.refusals())  # fmt: skip
        verdicts.update(plan.verdicts)
        self._model_generations.update(plan.model_generations)
        return dict(plan.by_node)

    async def _secret(
        self, namespace: str, name: str, credential_namespaces: tuple[str, ...] | None
    ) -> SecretRead:
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
