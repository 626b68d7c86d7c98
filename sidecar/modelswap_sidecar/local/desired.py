"""Pure: the agent's desired set from the local models, as the operator would send it.

Local mode is the only writer, so the revision's term is always 1 and its counter grows
with each push. A model's generation starts at 1 and grows whenever its spec changes (as
`metadata.generation` does in a cluster). Each entry carries the model's effective policy
(merged over the local defaults when its file was read), as the operator's entries do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from modelswap_api.control import DesiredEntry, DesiredSet, Revision
from modelswap_api.models import ModelDeploymentSpec
from modelswap_sidecar.local.manifests import LocalModel

LOCAL_TERM = 1


def _fingerprint(spec: Mapping[str, object]) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


@dataclass
class Generations:
    """Each UID's generation and the spec it was given for (kept across pushes)."""

    _known: dict[str, tuple[str, int]] = field(default_factory=dict)

    def of(self, model: LocalModel) -> int:
        fingerprint = _fingerprint(model.spec)
        known = self._known.get(model.uid)
        if known is None:
            generation = 1
        elif known[0] == fingerprint:
            generation = known[1]
        else:
            generation = known[1] + 1
        self._known[model.uid] = (fingerprint, generation)
        return generation


def desired_set(
    models: Sequence[LocalModel], generations: Generations, *, counter: int, node_name: str
) -> DesiredSet:
    entries = tuple(
        DesiredEntry(
            uid=m.uid,
            namespace=m.namespace,
            name=m.name,
            generation=generations.of(m),
            spec=ModelDeploymentSpec.from_dict(m.spec),
            policy=m.policy.to_status(),
        )
        for m in sorted(models, key=lambda m: m.uid)
    )
    return DesiredSet(
        revision=Revision(term=LOCAL_TERM, counter=counter),
        entries=entries,
        node_name=node_name,
    )
