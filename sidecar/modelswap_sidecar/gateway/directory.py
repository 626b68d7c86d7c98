"""What the gateway needs from the agent: `ModelDirectory`, and the `ModelRoute` it returns.

The gateway never touches the engine. The agent implements this Protocol over its engine;
tests implement it with a fake whose swap-in is an event they control
(`tests/support/gateway_fakes.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from modelswap_api.defaults import DEFAULT_MAX_PROMPT_BYTES, DEFAULT_MAX_TOKENS


@dataclass(frozen=True, kw_only=True)
class ModelRoute:
    """One model as the gateway serves it."""

    uid: str
    namespace: str
    #: The name users call (`spec.model.name`).
    name: str
    #: Triton's name for it (`triton.naming.triton_model_name(uid)`).
    triton_name: str
    #: Triton's `model_transaction_policy { decoupled: true }`: served by generate_stream only.
    decoupled: bool = False
    #: Requests that may wait for a swap-in; more are answered 429.
    max_queued: int = 100
    #: Longest wait for a swap-in before a 503; None waits as long as it takes (`never`).
    queue_timeout_seconds: float | None = 60.0
    #: Most tokens one generate request may ask for (`spec.gateway.maxTokens`), and most
    #: responses one generation that asked for none may stream (`generation`).
    max_tokens: int = DEFAULT_MAX_TOKENS
    #: Longest prompt of one generate request, UTF-8 bytes (`spec.gateway.maxPromptBytes`).
    max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES
    #: Session-less generate requests wait up to this long in their prompt-length bucket
    #: (`spec.gateway.batchShaping`; 0: off, `shaping`).
    shaping_wait_seconds: float = 0.0
    #: The buckets' edges in prompt UTF-8 bytes, strictly increasing.
    shaping_edges_bytes: tuple[int, ...] = ()


class ModelDirectory(Protocol):
    """The agent's models, their residency, and the one way to make one resident."""

    def knows_desired(self) -> bool:
        """The node knows which models it serves (it was told its desired set, or read the
        one it saved); until then `/v2/health/ready` is 503."""
        ...

    def lookup(self, name: str, namespace: str | None) -> ModelRoute:
        """The model users call `name` in `namespace`; with `namespace` None (local mode),
        the only model of that name. Raises `errors.UnknownModelError` for a name the node
        was not told of, `errors.ModelNotKnownYetError` for one it may still be told of or
        holds but cannot route yet, or `errors.AmbiguousModelError` naming the candidates."""
        ...

    def routes(self, namespace: str | None) -> Sequence[ModelRoute]:
        """Every model served, in `namespace` or (None) in all of them."""
        ...

    def is_resident(self, uid: str) -> bool:
        """True when the model can serve a request now, without a swap-in."""
        ...

    def swap_state(self, uid: str) -> str:
        """A short word for where the model is (e.g. the engine state), for progress lines."""
        ...

    async def ensure_resident(self, uid: str) -> None:
        """Start or join the model's swap-in and return once it serves. The gateway calls it
        at most once per cold period per model, and cancels it only when it shuts down.
        Raises `errors.SwapInFailedError` (any other exception is reported the same way)."""
        ...

    def record_request(self, uid: str, at_seconds: float) -> None:
        """A request for the model arrived (or a stream ended) at `at_seconds` (epoch), for
        the idle policy."""
        ...

    def request_started(self, uid: str) -> None:
        """A request for the model was admitted (it serves it now) or queued for its
        swap-in: one more in flight, which the policy reads (a model with requests in
        flight is not an idle victim)."""
        ...

    def request_finished(self, uid: str) -> None:
        """A request `request_started` counted was answered (or its client went away)."""
        ...
