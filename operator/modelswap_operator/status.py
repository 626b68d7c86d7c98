"""A ModelDeployment's status from what the operator decided and what its node reports
(pure); the Events its changes deserve are `status_events`'.

Inputs, for one model: the planner's verdict (placed on a node and GPU, or unplaceable
with the field at fault), a problem with its entry or its credentials, the node's liveness
and its SwapNode report of the model (phase, bytes, swap counts, the agent's reason), the
last push's answer for it, and whether its Service and EndpointSlice are in place.

Conditions (a user acts on their reasons):
- `PolicyValid`: the spec and its merge over the cluster defaults hold, and the runtime can
  honour the policy (`UnsupportedRuntime` from the agent);
- `Placed`: a node and GPU were chosen (False: the reason names the field at fault);
- `Loaded`: the node holds the model's bytes (resident or swapped out);
- `Ready`: a request sent now through its Service is answered (after a swap-in, or a
  reload from its source for a dropped model, if needed): its node is live and its agent
  answers, the node holds it or reloads it on demand (`SERVING_PHASES`; a model that was
  Ready stays so while it loads again), and it is routed. `serves` is that rule less the
  routing: the EndpointSlice's `ready` is it, so the slice and the condition agree.
- `RolledOut`: the model generation that should serve (`status.modelGeneration`, the
  generation at which `spec.model` last changed) is the one its node serves
  (`status.servingModelGeneration`), or none serves an older one. False while a changed
  model rolls out: `RollingOut` (the new one loads beside the old, which serves),
  `RolloutInterrupts` (no room for both: the old was released first and requests wait
  for the new; a Warning Event), `RolloutFailed` (the new one failed; the old serves).
The phase is the node's phase for the model, or `Unknown` while its node cannot vouch for
it (its Lease is stale or its agent unreachable): a stale report is never shown as news.
A condition keeps its `lastTransitionTime` while its status stays the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_api.control import EntryResult
from modelswap_api.models import Condition, HostedModel, KvBytesStatus, ModelDeploymentStatus
from modelswap_api.policy import EffectivePolicy
from modelswap_api.quantities import format_bytes

#: Phases in which the node holds the model's bytes (GPU or host): it can serve.
LOADED_PHASES = frozenset({"Resident", "SwappedOut", "SwappingIn", "SwappingOut"})
#: Phases in which the node still answers for the model (loaded, or dropped and reloaded
#: on the next request from its cached source).
HELD_PHASES = LOADED_PHASES | {"Dropped"}
#: Phases in which a request sent now is answered: `HELD_PHASES` (a dropped model is
#: loaded again from its source by the request that needs it).
SERVING_PHASES = HELD_PHASES
#: The phase while the model's node cannot vouch for it (Lease stale, agent unreachable).
UNKNOWN_PHASE = "Unknown"
#: The reason Loaded gives when the source's credentials cannot be resolved.
CREDENTIALS_UNAVAILABLE = "CredentialsUnavailable"
#: The reason Loaded gives when the operator may not read the model's credentials Secret:
#: its namespace did not opt in (the chart's `operator.credentials.namespaces`) or RBAC
#: refused the read. The message names the namespace and how to opt it in.
CREDENTIALS_NOT_OPTED_IN = "CredentialsNotOptedIn"
CONDITION_TYPES = ("PolicyValid", "Placed", "Loaded", "Ready", "RolledOut")
#: Reasons of a False `RolledOut` the agent reports (`agent.core.instances`).
ROLLING_OUT, ROLLOUT_INTERRUPTS, ROLLOUT_FAILED = "RollingOut", "RolloutInterrupts", "RolloutFailed"


@dataclass(frozen=True)
class Verdict:
    """What the operator decided for one model this turn."""

    node: str | None = None
    gpu: str | None = None
    policy: EffectivePolicy | None = None
    #: Why it is where it is (`Placed`, `Kept`, `NodeLost`, ...) or why it is nowhere.
    reason: str = ""
    message: str = ""
    #: Set when unplaceable, or when its entry or credentials cannot be sent.
    problem_field: str | None = None
    policy_invalid: bool = False
    #: Set when the source's credentials cannot be resolved (the Secret is gone, or lacks
    #: its key) while the node holds the model: it keeps serving, sent without
    #: credentials, but a load from the source would fail. The message says why.
    source_problem: str | None = None
    #: The Loaded reason `source_problem` gives (`CREDENTIALS_NOT_OPTED_IN` when the
    #: namespace may not be read).
    source_reason: str = CREDENTIALS_UNAVAILABLE


@dataclass(frozen=True)
class Observed:
    """What the cluster and the node say about the model."""

    node_live: bool = False
    hosted: HostedModel | None = None
    push: EntryResult | None = None
    #: The node's agent could not be reached or trusted (the message says which).
    agent_error: str | None = None
    routed: bool = False
    route_error: str | None = None
    endpoint: str | None = None
    #: The status in effect said Ready=True on this same node: a model loading again (the
    #: request that found it dropped, or a restarted Triton) stays Ready, the request
    #: waiting for the load; a first load is not Ready until it is loaded.
    was_ready: bool = False
    #: The model generation sent to its node (`model_generations`) and the digest it was
    #: decided from; None for a model not sent.
    model_generation: int | None = None
    model_digest: str | None = None


def build_status(
    *,
    model_name: str | None = None,
    generation: int,
    deleting: bool,
    verdict: Verdict,
    observed: Observed,
    previous: Mapping[str, Any] | None,
    now: str,
) -> dict[str, Any]:
    """The wire status to write (compare it with `previous` to decide whether to write)."""
    hosted = observed.hosted
    placed = verdict.node is not None
    conditions = [
        _policy_valid(verdict, hosted),
        _placed(verdict, previous),
        _loaded(verdict, observed),
    ]
    conditions.append(_ready(verdict, observed))
    serving_generation = _serving_generation(observed)
    conditions.append(_rolled_out(observed, serving_generation))
    phase = _phase(deleting, placed, observed)
    resident_bytes = (hosted.resident_bytes or 0) if hosted else 0
    host_bytes = (hosted.host_bytes or 0) if hosted else 0
    earlier_ins, swap_ins = _swap_count(verdict.node, hosted.swap_ins if hosted else None,
                                        previous, "swapIns", "earlierSwapIns")  # fmt: skip
    earlier_outs, swap_outs = _swap_count(verdict.node, hosted.swap_outs if hosted else None,
                                          previous, "swapOuts", "earlierSwapOuts")  # fmt: skip
    status = ModelDeploymentStatus(
        phase=phase,  # type: ignore[arg-type]
        model_name=model_name,
        node=verdict.node,
        gpu=verdict.gpu,
        endpoint=observed.endpoint if placed else None,
        resident_bytes=resident_bytes,
        resident_size=format_bytes(resident_bytes),
        host_bytes=host_bytes,
        host_size=format_bytes(host_bytes),
        kv=kv_status(hosted),
        last_request_time=hosted.last_request_time if hosted else None,
        swap_ins=swap_ins,
        swap_outs=swap_outs,
        earlier_swap_ins=earlier_ins or None,
        earlier_swap_outs=earlier_outs or None,
        last_swap_in_seconds=hosted.last_swap_in_seconds if hosted else None,
        effective_policy=verdict.policy.to_status() if verdict.policy else None,
        observed_generation=generation,
        model_generation=observed.model_generation or _kept(previous, "modelGeneration"),
        model_digest=observed.model_digest or _kept_text(previous, "modelDigest"),
        serving_model_generation=serving_generation,
        conditions=tuple(_keep_transition_times(conditions, previous, now)),
    )
    return status.to_dict()


def _kept(previous: Mapping[str, Any] | None, key: str) -> int | None:
    """An int the status had, kept while this turn decided none (a model not sent)."""
    value = (previous or {}).get(key)
    return value if isinstance(value, int) else None


def _kept_text(previous: Mapping[str, Any] | None, key: str) -> str | None:
    value = (previous or {}).get(key)
    return value if isinstance(value, str) else None


def _serving_generation(observed: Observed) -> int | None:
    """The model generation its node serves: the reported instance's, while the node can
    vouch for it and the instance answers (`SERVING_PHASES`)."""
    hosted = observed.hosted
    if hosted is None or not _vouched(observed) or hosted.state not in SERVING_PHASES:
        return None
    return hosted.model_generation or 1  # an agent that does not say holds model generation 1


def _rolled_out(observed: Observed, serving: int | None) -> Condition:
    """Whether the model generation that should serve is the one served (see the module)."""
    hosted, push, wanted = observed.hosted, observed.push, observed.model_generation
    reason = hosted.rollout_reason if hosted is not None and _vouched(observed) else None
    message = (hosted.rollout_message if hosted is not None else None) or ""
    pushed = push.reason if push is not None else None
    if (pushed in (ROLLING_OUT, ROLLOUT_FAILED) and reason is None) or pushed == ROLLOUT_INTERRUPTS:
        reason, message = pushed, (push.message if push is not None else None) or message
    behind = wanted is not None and serving is not None and serving != wanted
    if reason is not None and (behind or serving is None):
        return Condition(type="RolledOut", status="False", reason=reason,
                         message=message or f"rolling out model generation {wanted}")  # fmt: skip
    if behind:
        return Condition(type="RolledOut", status="False", reason=ROLLING_OUT,
                         message=f"model generation {serving} serves; {wanted} is on its "
                                 "way")  # fmt: skip
    shown = serving or wanted
    what = f"model generation {shown}" if shown is not None else "the model"
    return Condition(type="RolledOut", status="True", reason="Current",
                     message=f"{what} is the one its spec.model asks for")  # fmt: skip


def _swap_count(
    node: str | None,
    reported: int | None,
    previous: Mapping[str, Any] | None,
    total_key: str,
    earlier_key: str,
) -> tuple[int, int]:
    """(earlier, total) of one swap counter over the model's life. A node counts only
    while it hosts the model (its agent forgets a model that leaves, and starts from 0
    after a restart), so the count the status showed is kept as `earlier` when the model
    left that node (another node, or none) or the node's count went back: the total never
    goes back. A turn without the node's report changes nothing. A swap the node counted
    after the last status write is lost when the model leaves it."""
    before = previous or {}
    earlier = int(before.get(earlier_key) or 0)
    total_before = int(before.get(total_key) or 0)
    if before.get("node") != node:
        return total_before, total_before + (reported or 0)
    if reported is None:
        return earlier, max(total_before, earlier)  # not reported this turn: nothing new
    if reported < total_before - earlier:
        earlier = total_before  # the node counts from 0 again (its agent restarted)
    return earlier, earlier + reported


def _phase(deleting: bool, placed: bool, observed: Observed) -> str:
    hosted = observed.hosted
    if deleting:
        return "Deleting"
    if placed and not _vouched(observed):
        return UNKNOWN_PHASE
    if hosted is not None and hosted.state:
        return hosted.state
    return "Placed" if placed else "Pending"


def kv_status(hosted: HostedModel | None) -> KvBytesStatus | None:
    """`status.kv`: the KV-cache bytes the node reports for the model, per tier, with their
    sizes and the wide KV column's `"<gpu>/<host>"`; None while no node reports it."""
    if hosted is None:
        return None
    gpu, host = hosted.kv_gpu_bytes or 0, hosted.kv_host_bytes or 0
    return KvBytesStatus(
        gpu_bytes=gpu,
        gpu_size=format_bytes(gpu),
        host_bytes=host,
        host_size=format_bytes(host),
        shown=f"{format_bytes(gpu)}/{format_bytes(host)}",
    )


def _policy_valid(verdict: Verdict, hosted: HostedModel | None) -> Condition:
    if verdict.policy_invalid:
        return Condition(type="PolicyValid", status="False", reason="PolicyInvalid",
                         message=verdict.message)  # fmt: skip
    if hosted is not None and hosted.reason == "UnsupportedRuntime":
        return Condition(type="PolicyValid", status="False", reason="UnsupportedRuntime",
                         message=hosted.message or "the runtime cannot swap in place")  # fmt: skip
    return Condition(type="PolicyValid", status="True", reason="Valid",
                     message="the spec and its merge over the cluster defaults hold")  # fmt: skip


def _placed(verdict: Verdict, previous: Mapping[str, Any] | None) -> Condition:
    if verdict.node is None:
        message = verdict.message
        if verdict.problem_field and verdict.problem_field not in message:
            message = f"{verdict.problem_field}: {message}"
        return Condition(type="Placed", status="False", reason=verdict.reason or "Pending",
                         message=message)  # fmt: skip
    where = f"node {verdict.node}, GPU {verdict.gpu}"
    if verdict.reason == "Kept":
        # Staying put: the condition keeps saying how the model got there (a move's reason).
        before = _condition(previous, "Placed")
        if before.get("status") == "True" and str(before.get("message", "")).startswith(where):
            return Condition(type="Placed", status="True", reason=before.get("reason"),
                             message=before.get("message"))  # fmt: skip
    reason = "Placed" if verdict.reason in ("", "Kept", "Placed") else verdict.reason
    message = f"{where}: {verdict.message}" if verdict.message else where
    return Condition(type="Placed", status="True", reason=reason, message=message)


def _loaded(verdict: Verdict, observed: Observed) -> Condition:
    hosted, push = observed.hosted, observed.push
    if verdict.node is None:
        return Condition(type="Loaded", status="False", reason="NotPlaced",
                         message="the model has no node")  # fmt: skip
    if verdict.problem_field is not None:
        return Condition(type="Loaded", status="False", reason=verdict.reason,
                         message=f"{verdict.problem_field}: {verdict.message}")  # fmt: skip
    if observed.agent_error is not None:
        return Condition(type="Loaded", status="False", reason="AgentUnavailable",
                         message=observed.agent_error)  # fmt: skip
    if push is not None and push.outcome in ("conflict", "stale"):
        return Condition(type="Loaded", status="False", reason=push.reason,
                         message=push.message or f"the agent answered {push.outcome}")  # fmt: skip
    if hosted is not None and hosted.state in LOADED_PHASES:
        if verdict.source_problem is not None:
            return Condition(type="Loaded", status="True", reason=verdict.source_reason,
                             message=f"held by node {verdict.node}, but the source is no "
                                     f"longer reachable: {verdict.source_problem}; a load "
                                     "from the source would fail")  # fmt: skip
        return Condition(type="Loaded", status="True", reason=hosted.state or "Resident",
                         message=f"held by node {verdict.node}")  # fmt: skip
    if verdict.source_problem is not None:
        return Condition(type="Loaded", status="False", reason=verdict.source_reason,
                         message=f"the source is no longer reachable: "
                                 f"{verdict.source_problem}")  # fmt: skip
    if hosted is not None and hosted.state == "Failed":
        return Condition(type="Loaded", status="False", reason=hosted.reason or "LoadFailed",
                         message=hosted.message or "the node failed to load the model")  # fmt: skip
    if push is not None and push.outcome == "deferred":
        return Condition(type="Loaded", status="False", reason=push.reason,
                         message=push.message or "the node cannot load it yet")  # fmt: skip
    if hosted is not None and hosted.state == "Dropped":
        return Condition(type="Loaded", status="False", reason="Dropped",
                         message=f"node {verdict.node} dropped its bytes; the next request "
                                 "loads it again from its source")  # fmt: skip
    if hosted is not None:
        return Condition(type="Loaded", status="False", reason="Loading",
                         message=f"node {verdict.node}: {hosted.state}")  # fmt: skip
    return Condition(type="Loaded", status="False", reason="NotReported",
                     message=f"node {verdict.node} does not report the model yet")  # fmt: skip


def _vouched(observed: Observed) -> bool:
    """The node can vouch for what it reports: its Lease is fresh and its agent answers."""
    return observed.node_live and observed.agent_error is None


def serves(verdict: Verdict, observed: Observed) -> bool:
    """A request sent now to the model's node is answered (after a swap-in or a reload
    if needed): the Ready rule less the routing, and the EndpointSlice's `ready`."""
    return _ready_problem(verdict, observed, _loaded(verdict, observed)) is None


def _ready_problem(
    verdict: Verdict, observed: Observed, loaded: Condition
) -> tuple[str, str] | None:
    """(reason, message) of why a request sent now would not be answered; None: it would."""
    if verdict.node is None:
        return "NotLoaded", loaded.message or "the model has no node"
    if not observed.node_live:
        return "NodeLost", "the node's Lease is stale"
    if observed.agent_error is not None:
        return "AgentUnavailable", observed.agent_error
    hosted = observed.hosted
    if loaded.status == "True":
        return None
    if loaded.reason == "Dropped" and hosted is not None and hosted.state in SERVING_PHASES:
        return None  # the request that needs it loads it again
    if loaded.reason == "Loading" and observed.was_ready:
        return None  # loading again: the request waits for it
    return "NotLoaded", loaded.message or ""


def _ready(verdict: Verdict, observed: Observed) -> Condition:
    problem = _ready_problem(verdict, observed, _loaded(verdict, observed))
    if problem is not None:
        return Condition(type="Ready", status="False", reason=problem[0], message=problem[1])
    if not observed.routed:
        message = observed.route_error or "its Service is not in place yet"
        return Condition(type="Ready", status="False", reason="NotRouted", message=message)
    return Condition(type="Ready", status="True", reason="Serving",
                     message=f"answering at {observed.endpoint}")  # fmt: skip


def _condition(status: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    for condition in (status or {}).get("conditions") or ():
        if condition.get("type") == kind:
            found: Mapping[str, Any] = condition
            return found
    return {}


def _keep_transition_times(
    conditions: Sequence[Condition], previous: Mapping[str, Any] | None, now: str
) -> list[Condition]:
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or ()}
    kept = []
    for condition in conditions:
        old = before.get(condition.type) or {}
        same = old.get("status") == condition.status and old.get("lastTransitionTime")
        kept.append(
            Condition(
                type=condition.type,
                status=condition.status,
                reason=condition.reason,
                message=condition.message,
                last_transition_time=old["lastTransitionTime"] if same else now,
            )
        )
    return kept
