"""Wire types of the agent control API (operator → agent, `/v1`; DESIGN.md §3).

The operator sends a node's **full desired set** keyed by UID with a revision
`(term, counter)`; the agent answers per entry `applied | deferred | stale | conflict` with
a reason. JSON on the wire is camelCase (`codec`); `docs/control-api.openapi.yaml`
describes the same shapes and a test keeps the two in step.

`parse_desired_set` turns a request body into a `DesiredSet`, checking what the types
cannot say (bounds, unique UIDs, each entry's spec against the ModelDeployment CRD schema
and its CEL rules, each entry's effective policy complete and within the same bounds);
every failure names the field (`entries[2].spec.model.weightsBytes`,
`entries[0].policy.idleAfter`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Self

from modelswap_api import codec
from modelswap_api import field_errors as fe
from modelswap_api.defaults import spec_schema
from modelswap_api.errors import ModelError, PolicyError, ResourceError
from modelswap_api.field_errors import FieldError, join_path
from modelswap_api.models import EffectivePolicyStatus, GpuStatus, ModelDeploymentSpec, Phase
from modelswap_api.policy import EffectivePolicy
from modelswap_api.validation import SchemaValidator

Outcome = Literal["applied", "deferred", "stale", "conflict"]
ActionOutcome = Literal["completed", "unchanged", "refused"]

#: A Kubernetes UID: a UUID in its canonical lower-case form (the API server makes them so).
#: The agent derives each model's Triton name from it (`m-` + its 32 hex digits), so only
#: this form is taken: anything else could not be held, and an upper-case twin of a UID
#: would name the same Triton model as a second record.
UID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_UID_RE = re.compile(UID_PATTERN)
#: Longest UID echoed back in an error message (a refused value can be megabytes long).
_UID_ECHO_CHARS = 64
MAX_ENTRIES = 4096
#: Largest revision term and counter taken: 2**53 - 1, the largest integer every JSON
#: client holds exactly (a float64's mantissa). Today's term is the leader Lease's int32
#: `leaseTransitions` and the counter one per push, so no operator comes near it; the
#: bound leaves room for a term taken from elsewhere (a new leader starting above every
#: term the agents have seen), while a hostile 2**63 can no longer be saved and then
#: refuse every later push as older.
MAX_REVISION_NUMBER = 2**53 - 1
#: Largest entry generation taken: Kubernetes' `metadata.generation` is an int64.
MAX_GENERATION = 2**63 - 1


class _Wire:
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        return codec.from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        return codec.to_dict(self)


@dataclass(frozen=True, kw_only=True, order=True)
class Revision(_Wire):
    """Leader term (at least the leader Lease's `leaseTransitions`, above every term the
    agents have seen: `modelswap_operator.terms`) and a counter within the term."""

    term: int
    counter: int

    def __str__(self) -> str:
        return f"{self.term}/{self.counter}"


@dataclass(frozen=True, kw_only=True)
class SourceCredentials(_Wire):
    """Credentials for an http(s) source, resolved by the operator from the Secret.

    Secret values are left out of `repr` so a logged entry never carries them.
    """

    bearer_token: str | None = field(default=None, repr=False)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] | None = field(default=None, repr=False)


@dataclass(frozen=True, kw_only=True)
class DesiredEntry(_Wire):
    """One model the node should host: identity, generation and its effective spec."""

    uid: str
    namespace: str
    name: str
    generation: int
    spec: ModelDeploymentSpec
    credentials: SourceCredentials | None = None
    #: UUID of the GPU the operator placed the model on; unset: the agent chooses.
    gpu: str | None = None
    #: The generation at which `spec.model` last changed (the "model generation"): with
    #: `uid` it names the model *instance* the agent holds (`agent.core.instances`). An
    #: entry with a new model generation is a changed model, rolled out beside the old
    #: instance; unset (a sender that does not say, a dev model in local mode): model generation 1.
    model_generation: int | None = None
    #: The effective policy (the spec's policy fields merged over the cluster defaults, as
    #: in the ModelDeployment's status.effectivePolicy); every field set. The sender (the
    #: operator, local mode) computes it once; the agent applies it as given.
    policy: EffectivePolicyStatus


@dataclass(frozen=True, kw_only=True)
class DesiredSet(_Wire):
    """Body of `PUT /v1/desired`: the node's full set and the revision it was sent under."""

    revision: Revision
    entries: tuple[DesiredEntry, ...]
    #: When set, an agent of another node refuses the set (409).
    node_name: str | None = None

    @property
    def uids(self) -> frozenset[str]:
        return frozenset(entry.uid for entry in self.entries)


@dataclass(frozen=True, kw_only=True)
class EntryResult(_Wire):
    """What the agent made of one entry; `reason` is CamelCase, `message` for people."""

    uid: str
    outcome: Outcome
    reason: str
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class PendingUnload(_Wire):
    """A model missing from the set, unloaded once its grace period ends."""

    uid: str
    unload_in_seconds: float


@dataclass(frozen=True, kw_only=True)
class DesiredSetResult(_Wire):
    """Answer to `PUT /v1/desired`: the highest revision seen and a result per entry."""

    revision: Revision
    results: tuple[EntryResult, ...]
    pending_unloads: tuple[PendingUnload, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ModelInfo(_Wire):
    """`GET /v1/models/{uid}`: one model as the agent holds it."""

    uid: str
    namespace: str
    name: str
    state: str  # engine state (modelswap_sidecar.engine.states.EngineState)
    phase: Phase
    generation: int | None = None
    #: The model generation of the instance reported (the one that serves, or loads)
    model_generation: int | None = None
    desired: bool = True
    gpu: str | None = None
    resident_bytes: int = 0
    host_bytes: int = 0
    #: KV-cache bytes its processes' session stores hold (`modelswap_client.kv_sessions`,
    #: reported with their heartbeats): in GPU memory (the KV region's blocks; 0 while
    #: swapped out) and in the host tier (`kvCache.hostBytes` caps it).
    kv_gpu_bytes: int = 0
    kv_host_bytes: int = 0
    last_request_time: str | None = None  # RFC 3339
    swap_ins: int = 0
    swap_outs: int = 0
    last_swap_in_seconds: float | None = None
    #: CamelCase (`Loaded`, `LoadFailed`, `InsufficientHBM`, `UnsupportedRuntime`, …): a
    #: field of its own so programs need not parse `message`, which is for people.
    reason: str | None = None
    message: str | None = None
    unload_in_seconds: float | None = None
    #: While a changed model rolls out (`agent.core.instances`): `RollingOut` (the new
    #: instance loads beside the old, which serves), `RolloutInterrupts` (no room for
    #: both: the old was released first), `RolloutFailed` (the new one failed; the old
    #: serves); the model generation it rolls out to, and a message for people.
    rollout_reason: str | None = None
    rollout_model_generation: int | None = None
    rollout_message: str | None = None


@dataclass(frozen=True, kw_only=True)
class ModelList(_Wire):
    models: tuple[ModelInfo, ...]


@dataclass(frozen=True, kw_only=True)
class NodeInfo(_Wire):
    """`GET /v1/node`: capacity and the agent's view of its own standing."""

    node_name: str
    agent_version: str
    gpus: tuple[GpuStatus, ...] = ()
    revision: Revision | None = None
    #: Lease renewals and operator pushes have both failed for the grace period:
    #: resident models keep serving, nothing new is loaded.
    fenced: bool = False


@dataclass(frozen=True, kw_only=True)
class ActionResult(_Wire):
    """Answer to a manual swap-in or swap-out, or a delete."""

    uid: str
    outcome: ActionOutcome
    reason: str
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class Cause(_Wire):
    field: str
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True)
class ErrorBody(_Wire):
    """Body of every 4xx/5xx answer; `field` names the offending field of a 400."""

    reason: str
    message: str
    field: str | None = None
    causes: tuple[Cause, ...] | None = None


def parse_desired_set(data: Any) -> DesiredSet:
    """A checked `DesiredSet` from a decoded JSON body.

    ModelError (one field) or ResourceError (every problem of one entry's spec), each
    naming the field path from the body's root.
    """
    if not isinstance(data, Mapping):
        raise ModelError("", f"expected an object, got {type(data).__name__}")
    entries = data.get("entries")
    if isinstance(entries, list):
        if len(entries) > MAX_ENTRIES:
            raise ModelError("entries", f"at most {MAX_ENTRIES} entries, got {len(entries)}")
        for index, entry in enumerate(entries):
            if isinstance(entry, Mapping) and "spec" in entry:
                _check_spec(entry["spec"], f"entries[{index}].spec")
    desired = DesiredSet.from_dict(data)
    check_revision(desired.revision, "revision")
    seen: set[str] = set()
    for index, entry in enumerate(desired.entries):
        path = f"entries[{index}]"
        _check_entry(entry, path)
        if entry.uid in seen:
            raise ModelError(join_path(path, "uid"), f"duplicate uid {entry.uid!r}")
        seen.add(entry.uid)
    return desired


def check_uid(uid: str, path: str = "uid") -> None:
    """ModelError naming `path` unless `uid` is a Kubernetes UID (see `UID_PATTERN`)."""
    if _UID_RE.fullmatch(uid) is None:
        shown = uid if len(uid) <= _UID_ECHO_CHARS else uid[:_UID_ECHO_CHARS] + "…"
        raise ModelError(
            path, f"{shown!r} is not a Kubernetes UID (a lower-case UUID, {UID_PATTERN})"
        )


def check_revision(revision: Revision, path: str = "revision") -> None:
    """ModelError naming `path.term` or `path.counter` unless both are within
    0..`MAX_REVISION_NUMBER`."""
    for name in ("term", "counter"):
        value = getattr(revision, name)
        if value < 0:
            raise ModelError(join_path(path, name), "must be 0 or more")
        if value > MAX_REVISION_NUMBER:
            raise ModelError(
                join_path(path, name), f"must be at most {MAX_REVISION_NUMBER} (2^53 - 1)"
            )


def _check_entry(entry: DesiredEntry, path: str) -> None:
    check_uid(entry.uid, join_path(path, "uid"))
    for name in ("namespace", "name"):
        if not getattr(entry, name):
            raise ModelError(join_path(path, name), "must not be empty")
    if entry.generation < 1:
        raise ModelError(join_path(path, "generation"), "must be 1 or more")
    if entry.generation > MAX_GENERATION:
        raise ModelError(
            join_path(path, "generation"), f"must be at most {MAX_GENERATION} (2^63 - 1)"
        )
    if entry.model_generation is not None and not 1 <= entry.model_generation <= entry.generation:
        raise ModelError(
            join_path(path, "modelGeneration"),
            f"must be 1 or more and at most the entry's generation ({entry.generation})",
        )
    _check_policy(entry.policy, join_path(path, "policy"))


#: Distinct specs and policies whose verdicts are remembered. A node's set is pushed whole
#: every grace/3 and mostly unchanged; checking every spec's schema and CEL rules again each
#: time cost ~10-30 ms per entry, seconds per push of a few hundred, on the agent's loop.
CHECK_CACHE_SIZE = 8192
#: Specs longer than this (canonical JSON) are checked every time, never remembered.
CACHED_SPEC_CHARS = 16 * 1024

_Problem = tuple[str, str, str]  # (path relative to the checked object, reason, message)


def _check_policy(policy: EffectivePolicyStatus, path: str) -> None:
    """Every field set and each as the CRD bounds the spec field it merges (durations,
    non-negative numbers, enums, cross-field rules); ResourceError naming `path.<field>`."""
    problems = _policy_problems(policy)
    if problems:
        errors = [FieldError(join_path(path, p) if p else path, r, m) for p, r, m in problems]
        raise ResourceError(sorted(errors), "invalid desired entry")


@functools.lru_cache(maxsize=CHECK_CACHE_SIZE)
def _policy_problems(policy: EffectivePolicyStatus) -> tuple[_Problem, ...]:
    try:
        EffectivePolicy.from_status(policy)
    except PolicyError as e:
        return tuple((c.path, c.reason, c.message) for c in e.errors)
    return ()


@functools.cache
def _spec_validator() -> SchemaValidator:
    return SchemaValidator(spec_schema(), kind="ModelDeploymentSpec")


def _check_spec(spec: Any, path: str) -> None:
    """The spec as the API server would check it (schema and CEL rules), unknown fields
    refused; paths are prefixed with `path`. Verdicts are remembered per spec (its
    canonical JSON), so an unchanged entry costs a serialisation, not a validation."""
    if not isinstance(spec, Mapping):
        raise ModelError(path, f"expected an object, got {type(spec).__name__}")
    try:
        canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ModelError(path, f"not a JSON object: {e}") from e
    # Only small specs are remembered: the cache must not hold what a hostile body sent.
    check = _spec_problems if len(canonical) <= CACHED_SPEC_CHARS else _spec_problems.__wrapped__
    problems = check(canonical)
    if problems:
        errors = [FieldError(join_path(path, p) if p else path, r, m) for p, r, m in problems]
        raise ResourceError(sorted(errors), "invalid desired entry")


@functools.lru_cache(maxsize=CHECK_CACHE_SIZE)
def _spec_problems(canonical: str) -> tuple[_Problem, ...]:
    result = _spec_validator().validate(json.loads(canonical))
    problems = [(e.path, e.reason, e.message) for e in result.errors]
    problems += [(unknown, fe.UNKNOWN, f'unknown field "{unknown}"')
                 for unknown in result.unknown_fields]  # fmt: skip
    return tuple(problems)
