"""Bounds on one generate request (pure): how many tokens it may ask for and how long its
prompt may be, per model (`spec.gateway.maxTokens`, `spec.gateway.maxPromptBytes`, carried
in `ModelRoute`), checked before anything is sent or swapped in; and the cap on how many
responses a generation may stream when it did not ask for a number.

A request asking more than the bound is refused (400 `GenerationBound`) rather than
clamped: a client that asked for 10,000 tokens and silently got 4,096 would take the
cut-off answer for the model's whole answer; a refusal names the field and the bound, and
the client can ask again within it. A request that asks for no number gets the model's own
default, which the gateway cannot see: it ends the stream (and so the generation, since
closing Triton's connection cancels the request) when a response past the bound arrives.
Each streamed response carries at least one token, so a generation never yields more
than the bound's number of responses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import BadRequestError, GenerationBoundError

#: The generate extension's prompt input (the OpenAI routes send their prompt in it).
TEXT_INPUT = "text_input"
MAX_TOKENS = "max_tokens"


def check_max_tokens(value: object, route: ModelRoute, field: str = MAX_TOKENS) -> int | None:
    """`value` (None: not asked) as a positive integer within the route's bound."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequestError(f"{field}: must be a positive integer")
    if value > route.max_tokens:
        raise GenerationBoundError(
            f"{field}: {_shown(value)} is more than model {route.name!r} allows: at most "
            f"{route.max_tokens} tokens (spec.gateway.maxTokens)"
        )
    return value


def check_prompt(prompt_bytes: int, route: ModelRoute, field: str) -> None:
    """A prompt of `prompt_bytes` (UTF-8) within the route's bound."""
    if prompt_bytes > route.max_prompt_bytes:
        raise GenerationBoundError(
            f"{field}: the prompt is {prompt_bytes} bytes; model {route.name!r} takes at most "
            f"{route.max_prompt_bytes} bytes (spec.gateway.maxPromptBytes)"
        )


def utf8_bytes(text: str) -> int:
    """`text`'s length in UTF-8 bytes (a lone surrogate counts as the 3 bytes it escapes to)."""
    return len(text.encode("utf-8", "surrogatepass"))


def check_generate_body(body: Mapping[str, Any], route: ModelRoute) -> None:
    """A v2 `generate`/`generate_stream` body: its `text_input` (a string, or strings in
    lists) and `max_tokens` (a top-level field, or one of its `parameters`)."""
    check_prompt(_strings_bytes(body.get(TEXT_INPUT)), route, TEXT_INPUT)
    check_max_tokens(body.get(MAX_TOKENS), route)
    parameters = body.get("parameters")
    if isinstance(parameters, Mapping):
        check_max_tokens(parameters.get(MAX_TOKENS), route, f"parameters.{MAX_TOKENS}")


def prompt_bytes(fields: Mapping[str, Any]) -> int:
    """A v2 generate body's prompt (`text_input`) in UTF-8 bytes."""
    return _strings_bytes(fields.get(TEXT_INPUT))


def _strings_bytes(value: object) -> int:
    """UTF-8 bytes of every string in `value` (a string or nested lists; the body's
    nesting is bounded before it is parsed)."""
    if isinstance(value, str):
        return utf8_bytes(value)
    if isinstance(value, list):
        return sum(_strings_bytes(item) for item in value)
    return 0


def _shown(value: int) -> str:
    """`value` in the message, or its size when its digits would be longer than useful
    (or than Python prints: 4,300 digits)."""
    return str(value) if value.bit_length() < 200 else f"a number of {value.bit_length()} bits"


class ResponseCap:
    """Counts a generation's streamed responses against the route's `max_tokens`."""

    __slots__ = ("bound", "count")

    def __init__(self, route: ModelRoute) -> None:
        self.bound = route.max_tokens
        self.count = 0

    def take(self) -> bool:
        """One more response arrived: True while it is within the bound, False for the
        first past it (the caller ends the generation without passing it on)."""
        self.count += 1
        return self.count <= self.bound


# -- sessions: a conversation's KV cache kept by the model between turns -----------------------

#: The header that names a conversation (any route that generates); OpenAI's `user` field
#: names one too, the header winning when both are given.
SESSION_HEADER = "X-Modelswap-Session"
#: The request parameter the model reads the session from (`json.loads(request.parameters())`).
SESSION_PARAMETER = "session_id"
#: Longest session id a client may send, in characters.
MAX_SESSION_CHARS = 256


def session_of(header: str | None, given: object, field: str) -> str | None:
    """The session a request names: the `X-Modelswap-Session` header, else `given` (the
    OpenAI `user` field or the v2 `parameters.session_id`, named `field`); None: none.
    A session id is 1 to 256 characters without control characters (400 naming where it
    came from otherwise)."""
    if header is not None:
        return _session_text(header, SESSION_HEADER)
    if given is None:
        return None
    if not isinstance(given, str):
        raise BadRequestError(f"{field}: must be a string")
    return _session_text(given, field)


def _session_text(value: str, field: str) -> str:
    if not value:
        raise BadRequestError(f"{field}: must not be empty")
    if len(value) > MAX_SESSION_CHARS:
        raise BadRequestError(
            f"{field}: at most {MAX_SESSION_CHARS} characters, not {_shown(len(value))}"
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise BadRequestError(f"{field}: must not hold control characters")
    return value


def scoped_session(route: ModelRoute, session: str) -> str:
    """What the model sees: `namespace/name/session`. Namespaces and model names hold no
    `/`, so two namespaces' (or models') sessions of one id never meet."""
    return f"{route.namespace}/{route.name}/{session}"


def scope_generate_body(
    fields: Mapping[str, Any], header: str | None, route: ModelRoute
) -> dict[str, Any] | None:
    """A v2 `generate`/`generate_stream` body with its session (the header, else
    `parameters.session_id`) replaced by the scoped one; None when it names no session
    (the body goes to Triton as it came)."""
    parameters = fields.get("parameters")
    given = parameters.get(SESSION_PARAMETER) if isinstance(parameters, Mapping) else None
    session = session_of(header, given, f"parameters.{SESSION_PARAMETER}")
    if session is None:
        return None
    if parameters is not None and not isinstance(parameters, Mapping):
        raise BadRequestError("parameters: must be an object")
    scoped = {**(parameters or {}), SESSION_PARAMETER: scoped_session(route, session)}
    return {**fields, "parameters": scoped}
