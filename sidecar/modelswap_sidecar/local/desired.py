"""Pure: the agent's desired set from the local models, as the operator would send it.

Local mode is the only writer, so the revision's term is always 1 and its counter grows
with each push. A model's generation starts at 1 and grows whenever its spec changes (as
`metadata.generation` does in a cluster). Each entry carries the model's effective policy
(merged over the local defaults when its file was read), as the operator's entries do.

Each entry carries a model generation too, as the operator's do
(`modelswap_operator.model_generations`): the generation at which the fields of
`spec.model` that change the model's bytes (`agent.core.model_changes.changed_fields`:
source uri/sha256, weightsBytes, kvCacheBytes, runtime) last changed, so an edit of them is
a new model instance the agent rolls out beside the old one, not a `ModelChanged` refusal.
Both are kept in memory only: a new `modelswap up` starts every model at generation 1 and
model generation 1, which is right because it also starts the agent afresh (its state
and host store are removed at start). A dev model's entry carries none: its process
attaches under the uid's engine name, which a new instance would change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from modelswap_api.control import DesiredEntry, DesiredSet, Revision
from modelswap_api.models import ModelDeploymentSpec, ModelSpec
from modelswap_sidecar.agent.core.model_changes import changed_fields
from modelswap_sidecar.local.manifests import LocalModel

LOCAL_TERM = 1


def _fingerprint(spec: Mapping[str, object]) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


@dataclass(frozen=True)
class _Known:
    fingerprint: str
    generation: int
    model: ModelSpec
    model_generation: int


@dataclass
class Generations:
    """Each UID's generation, model generation and the spec they were given for (kept
    across pushes)."""

    _known: dict[str, _Known] = field(default_factory=dict)

    def of(self, model: LocalModel, spec: ModelDeploymentSpec) -> tuple[int, int]:
        """(generation, model generation) of `model`, whose spec parses as `spec`."""
        fingerprint = _fingerprint(model.spec)
        known = self._known.get(model.uid)
        if known is None:
            generation = model_generation = 1
        elif known.fingerprint == fingerprint:
            return known.generation, known.model_generation
        else:
            generation = known.generation + 1
            changed = changed_fields(known.model, spec.model)
            model_generation = generation if changed else known.model_generation
        self._known[model.uid] = _Known(fingerprint, generation, spec.model, model_generation)
        return generation, model_generation


def _entry(model: LocalModel, generations: Generations) -> DesiredEntry:
    spec = ModelDeploymentSpec.from_dict(model.spec)
    generation, model_generation = generations.of(model, spec)
    return DesiredEntry(
        uid=model.uid,
        namespace=model.namespace,
        name=model.name,
        generation=generation,
        spec=spec,
        policy=model.policy.to_status(),
        model_generation=None if model.dev else model_generation,
    )


def desired_set(
    models: Sequence[LocalModel], generations: Generations, *, counter: int, node_name: str
) -> DesiredSet:
    entries = tuple(_entry(m, generations) for m in sorted(models, key=lambda m: m.uid))
    return DesiredSet(
        revision=Revision(term=LOCAL_TERM, counter=counter),
        entries=entries,
        node_name=node_name,
    )
