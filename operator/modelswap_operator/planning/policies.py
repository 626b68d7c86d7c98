"""Each ModelDeployment's effective policy for the planner (`effective_policy` over the
cluster defaults), remembered across plans: a pure function's results, so `plan` stays
pure."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelswap_api.errors import PolicyError
from modelswap_api.models import (
    GatewayPolicy,
    KvCachePolicy,
    ModelDeployment,
    ModelDeploymentSpec,
    SwapPolicy,
)
from modelswap_api.policy import EffectivePolicy, effective_policy
from modelswap_operator.planning.results import Unplaced, UnplacedReason


def uid_of(deployment: ModelDeployment) -> str:
    return str(deployment.metadata["uid"])


def policies(
    deployments: Sequence[ModelDeployment], defaults: Mapping[str, Any]
) -> list[tuple[ModelDeployment, EffectivePolicy | PolicyError]]:
    """Each deployment (by UID) with its effective policy, or the error that refused it."""
    ordered = sorted(deployments, key=uid_of)
    uids = [uid_of(d) for d in ordered]
    if len(set(uids)) != len(uids):
        raise ValueError("ModelDeployment UIDs must be unique")
    defaults_json = json.dumps(defaults, sort_keys=True, default=repr)
    out: list[tuple[ModelDeployment, EffectivePolicy | PolicyError]] = []
    for deployment in ordered:
        spec = deployment.spec
        query = _PolicyQuery(
            defaults_json, spec.swap_policy, spec.kv_cache, spec.gateway, spec, defaults
        )
        out.append((deployment, _effective_policy(query)))
    return out


@dataclass(frozen=True)
class _PolicyQuery:
    """An `effective_policy` call, compared and hashed by what that function reads: the
    defaults and the spec's policy sections (if it ever reads more, this must grow)."""

    defaults_json: str
    swap_policy: SwapPolicy | None
    kv_cache: KvCachePolicy | None
    gateway: GatewayPolicy | None
    spec: ModelDeploymentSpec = field(compare=False, hash=False)
    defaults: Mapping[str, Any] = field(compare=False, hash=False)


@functools.lru_cache(maxsize=8192)
def _effective_policy(query: _PolicyQuery) -> EffectivePolicy | PolicyError:
    """`effective_policy`, remembered across calls: it validates the defaults and evaluates
    the CEL rules every time (about 15 ms on a slow CPU), and a cluster has far fewer
    distinct policies than models. Remembering a pure function's results keeps `plan` pure."""
    try:
        return effective_policy(query.spec.to_dict(), query.defaults)
    except PolicyError as e:
        return e


def clear_policy_cache() -> None:
    """Forget remembered effective policies (a benchmark times a first plan this way)."""
    _effective_policy.cache_clear()


def policy_invalid(uid: str, error: PolicyError) -> Unplaced:
    first = error.errors[0] if error.errors else None
    return Unplaced(
        uid=uid,
        reason=UnplacedReason.POLICY_INVALID,
        field=first.path if first else None,
        message=str(error),
        policy=None,
    )
