"""OpenAI completions and chat completions in terms of Triton's generate extension (pure).

A request becomes one `generate_stream` body: the prompt (chat messages rendered by
`chat_prompt`) in the `text_input` input, and the sampling fields as request parameters,
which a python-backend model reads with `json.loads(request.parameters())`:

    max_tokens (max_completion_tokens too), temperature, top_p, top_k, seed,
    presence_penalty, frequency_penalty     as given (numbers)
    stop                                    a string, or a JSON list of strings

Each streamed response's `text_output` is one chunk of the completion. `n` other than 1,
token-id prompts, tools and text holding a lone UTF-16 surrogate (which Triton's reader
fails on with a 500) are refused with 400. Token counts (`usage`) are not reported:
the gateway sees responses, not tokens.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from modelswap_sidecar.gateway.errors import BadRequestError, ModelStreamError

Kind = Literal["completion", "chat"]
ParameterValue = str | int | float | bool

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
_NUMBERS = ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty")


@dataclass(frozen=True)
class TextRequest:
    kind: Kind
    model: str
    prompt: str
    stream: bool
    max_tokens: int | None = None
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)

    def generate_body(self) -> dict[str, Any]:
        """The JSON body of `POST /v2/models/{triton name}/generate_stream`."""
        body: dict[str, Any] = {TEXT_INPUT: self.prompt}
        if self.parameters:
            body["parameters"] = dict(self.parameters)
        return body


def request_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise BadRequestError("the body must be a JSON object")
    return body


def _text(value: str, field: str) -> str:
    """`value`, which must be text: JSON may escape a lone UTF-16 surrogate (`"\\ud800"`),
    which names no character, and Triton's reader fails on it with a 500."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequestError(
            f"{field}: holds a lone surrogate at {e.start}, which is not text"
        ) from e
    return value


def model_field(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("model: a model name is required")
    return model


def _common(body: Mapping[str, Any]) -> tuple[bool, int | None, dict[str, ParameterValue]]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequestError("stream: must be true or false")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequestError("n: only 1 is supported")
    parameters: dict[str, ParameterValue] = {}
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequestError("max_tokens: must be a positive integer")
        parameters["max_tokens"] = max_tokens
    for name in _NUMBERS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise BadRequestError(f"{name}: must be a number")
        parameters[name] = value
    stop = body.get("stop")
    if isinstance(stop, str):
        parameters["stop"] = _text(stop, "stop")
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        parameters["stop"] = json.dumps([_text(s, f"stop[{i}]") for i, s in enumerate(stop)])
    elif stop is not None:
        raise BadRequestError("stop: must be a string or a list of strings")
    return stream, max_tokens, parameters


def parse_completion(body: Any) -> TextRequest:
    """`POST /v1/completions`."""
    body = request_object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequestError("prompt: must be a string (token ids and batches are not supported)")
    stream, max_tokens, parameters = _common(body)
    prompt = _text(prompt, "prompt")
    return TextRequest("completion", model_field(body), prompt, stream, max_tokens, parameters)


def parse_chat(body: Any) -> TextRequest:
    """`POST /v1/chat/completions`."""
    body = request_object(body)
    if body.get("tools") or body.get("functions"):
        raise BadRequestError("tools: not supported")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("messages: a non-empty list is required")
    stream, max_tokens, parameters = _common(body)
    prompt = chat_prompt(messages)
    return TextRequest("chat", model_field(body), prompt, stream, max_tokens, parameters)


def _content(message: Any, index: int) -> tuple[str, str]:
    if not isinstance(message, Mapping):
        raise BadRequestError(f"messages[{index}]: must be an object")
    role = message.get("role")
    if not isinstance(role, str):
        raise BadRequestError(f"messages[{index}].role: must be a string")
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (isinstance(part, Mapping) and part.get("type") == "text"):
                raise BadRequestError(f"messages[{index}].content: only text parts are supported")
            parts.append(str(part.get("text", "")))
        content = "".join(parts)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise BadRequestError(f"messages[{index}].content: must be a string or text parts")
    return _text(role, f"messages[{index}].role"), _text(content, f"messages[{index}].content")


def chat_prompt(messages: Sequence[Any]) -> str:
    """One `role: content` line per message, then `assistant:` for the model to continue."""
    lines = [
        f"{role}: {content}" for role, content in (_content(m, i) for i, m in enumerate(messages))
    ]
    return "\n".join([*lines, "assistant:"])


def text_of(data: str) -> tuple[str, str | None]:
    """The text of one `generate_stream` event, and its `finish_reason` when the model
    gives one. Raises ModelStreamError for an error event."""
    try:
        event = json.loads(data)
    except ValueError as e:
        raise ModelStreamError(f"the model's stream carried an event that is not JSON: {e}") from e
    if not isinstance(event, Mapping):
        raise ModelStreamError("the model's stream carried an event that is not an object")
    if "error" in event:
        raise ModelStreamError(str(event["error"]))
    text = event.get(TEXT_OUTPUT, "")
    if isinstance(text, list):
        text = "".join(str(t) for t in text)
    reason = event.get("finish_reason")
    if isinstance(reason, list):
        reason = reason[0] if reason else None
    return str(text), None if reason is None else str(reason)


@dataclass
class Completion:
    """One answer being assembled, chunk by chunk or whole."""

    request: TextRequest
    created: int
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    chunks: int = 0
    finish_reason: str | None = None
    _text: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self._text)

    def add(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        """Record one response; the streaming chunk that carries it."""
        first = self.chunks == 0
        self.chunks += 1
        self._text.append(text)
        if finish_reason:
            self.finish_reason = finish_reason
        if self.request.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            return self._envelope("chat.completion.chunk", {"delta": delta})
        return self._envelope("text_completion", {"text": text})

    def final_reason(self) -> str:
        if self.finish_reason:
            return self.finish_reason
        limit = self.request.max_tokens
        return "length" if limit is not None and self.chunks >= limit else "stop"

    def last_chunk(self) -> dict[str, Any]:
        """The streaming chunk that carries the finish reason."""
        reason = self.final_reason()
        if self.request.kind == "chat":
            return self._envelope("chat.completion.chunk", {"delta": {}}, reason)
        return self._envelope("text_completion", {"text": ""}, reason)

    def response(self) -> dict[str, Any]:
        """The non-streaming answer: every response's text, in order."""
        reason = self.final_reason()
        if self.request.kind == "chat":
            message = {"role": "assistant", "content": self.text}
            return self._envelope("chat.completion", {"message": message}, reason)
        return self._envelope("text_completion", {"text": self.text}, reason)

    def _envelope(
        self, kind: str, choice: Mapping[str, Any], finish_reason: str | None = None
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.request.model,
            "choices": [{"index": 0, **choice, "logprobs": None, "finish_reason": finish_reason}],
        }


def error_body(message: str, status: int, code: str) -> dict[str, Any]:
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def model_list(entries: Sequence[tuple[str, str, int]]) -> dict[str, Any]:
    """`GET /v1/models` from (id, owner namespace, created) triples."""
    return {
        "object": "list",
        "data": [
            {"id": model_id, "object": "model", "created": created, "owned_by": owner}
            for model_id, owner, created in entries
        ],
    }
