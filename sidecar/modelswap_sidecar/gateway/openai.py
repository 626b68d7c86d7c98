"""OpenAI completions and chat completions in terms of Triton's generate extension (pure).

A request becomes one `generate_stream` body: the prompt (chat messages rendered by
`chat_prompt`) in the `text_input` input, and the sampling fields as request parameters,
which a python-backend model reads with `json.loads(request.parameters())`:

    max_tokens (max_completion_tokens too), temperature, top_p, top_k, seed,
    presence_penalty, frequency_penalty     as given (numbers)
    stop                                    a string, or a JSON list of strings
    logprobs                                how many alternatives per token (an integer,
                                            0: the chosen token's only), when asked
    session_id                              the conversation's session, scoped
                                            `namespace/name/id`: the `X-Modelswap-Session`
                                            header, else `user` (`generation.session_of`)

The gateway itself applies `stop` (`stops.StopScanner`; the model may stop earlier, having
the parameter too), `echo` and `max_tokens`' bound, so every model honours them. What
only a model can do it declares in its Triton configuration (`requirements` and
`check_support`, read through `configs.ModelConfigs`):

    parameters { key: "sampling_parameters" value: { string_value: "temperature,top_p" } }
                     the sampling fields above it takes; any other is a 400 naming it
    outputs prompt_tokens (INT [1]), token_ids (INT [-1])
                     token counts: `usage` (and `stream_options.include_usage`)
    outputs tokens (STRING [-1]), logprobs (FP32 [-1])
                     each token's text and log-probability: `logprobs`
    outputs top_tokens (STRING [-1]), top_logprobs (FP32 [-1])
                     `logprobs` (the parameter) alternatives per token, flattened

Each streamed response's `text_output` is one chunk of the completion; `finish_reason`
("stop" or "length"), when the model sends it, says why its text ended. `n` other than 1,
token-id prompts, tools, other unsupported fields and text holding a lone UTF-16 surrogate
(which Triton's reader fails on with a 500) are refused with 400.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from modelswap_sidecar.gateway.errors import BadRequestError, ModelStreamError
from modelswap_sidecar.gateway.stops import StopScanner

Kind = Literal["completion", "chat"]
ParameterValue = str | int | float | bool

TEXT_INPUT = "text_input"
TEXT_OUTPUT = "text_output"
#: The request parameter naming the conversation's session (`generation.SESSION_PARAMETER`).
SESSION_ID = "session_id"
SAMPLING_PARAMETERS = "sampling_parameters"
_NUMBERS = ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty")
#: OpenAI's own bounds: stop sequences per request; alternatives per token.
MAX_STOPS = 4
MAX_TOP_LOGPROBS = 20
USAGE_OUTPUTS = ("prompt_tokens", "token_ids")
LOGPROB_OUTPUTS = ("tokens", "logprobs")
TOP_OUTPUTS = ("top_tokens", "top_logprobs")
#: Fields OpenAI defines that no model here honours, with the value that asks nothing
#: (refused with a 400 naming them otherwise, rather than silently ignored).
_UNSUPPORTED: dict[Kind, dict[str, tuple[Any, ...]]] = {
    "completion": {"suffix": (None, ""), "best_of": (None, 1), "logit_bias": (None, {})},
    "chat": {
        "logit_bias": (None, {}),
        "response_format": (None, {"type": "text"}),
        "tool_choice": (None, "none"),
        "audio": (None,),
        "modalities": (None, ["text"]),
        "prediction": (None,),
        "reasoning_effort": (None,),
        "echo": (None, False),
    },
}


@dataclass(frozen=True)
class TextRequest:
    kind: Kind
    model: str
    prompt: str
    stream: bool
    max_tokens: int | None = None
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    echo: bool = False
    #: alternatives per token when log-probabilities are asked (0: the chosen token's)
    logprobs: int | None = None
    include_usage: bool = False
    #: OpenAI's `user`: names the conversation's session unless a header does
    #: (`generation.session_of`).
    user: str | None = None

    def generate_body(self, session_id: str | None = None) -> dict[str, Any]:
        """The JSON body of `POST /v2/models/{triton name}/generate_stream`; `session_id`
        (already scoped, `generation.scoped_session`) goes in the `session_id` parameter."""
        body: dict[str, Any] = {TEXT_INPUT: self.prompt}
        parameters = dict(self.parameters)
        if session_id is not None:
            parameters[SESSION_ID] = session_id
        if parameters:
            body["parameters"] = parameters
        return body

    def requirements(self) -> list[tuple[str, tuple[str, ...]]]:
        """(request field, outputs or sampling parameters the model must declare) for
        what only the model can do; empty: its configuration need not be read."""
        needs: list[tuple[str, tuple[str, ...]]] = [
            (name, (f"{SAMPLING_PARAMETERS}:{name}",))
            for name in _NUMBERS
            if name in self.parameters
        ]
        if self.logprobs is not None:
            needs.append(("logprobs", LOGPROB_OUTPUTS))
            if self.logprobs > 0:
                top = "logprobs" if self.kind == "completion" else "top_logprobs"
                needs.append((top, TOP_OUTPUTS))
        if self.include_usage:
            needs.append(("stream_options.include_usage", USAGE_OUTPUTS))
        return needs


def check_support(request: TextRequest, config: Any, model: str) -> None:
    """A 400 naming the first field of `request` that `model`'s Triton configuration
    (`config`: its JSON) does not declare it can honour."""
    config = config if isinstance(config, Mapping) else {}
    outputs = {str(o.get("name")) for o in config.get("output") or [] if isinstance(o, Mapping)}
    parameters = config.get("parameters") or {}
    declared = parameters.get(SAMPLING_PARAMETERS) if isinstance(parameters, Mapping) else None
    text = declared.get("string_value", "") if isinstance(declared, Mapping) else ""
    sampling = {p for p in re.split(r"[,\s]+", str(text)) if p}
    for request_field, needed in request.requirements():
        if needed[0].startswith(f"{SAMPLING_PARAMETERS}:"):
            if request_field not in sampling:
                raise BadRequestError(
                    f"{request_field}: model {model!r} does not take it (its configuration's "
                    f"{SAMPLING_PARAMETERS} lists {', '.join(sorted(sampling)) or 'none'})"
                )
            continue
        missing = [name for name in needed if name not in outputs]
        if missing:
            raise BadRequestError(
                f"{request_field}: model {model!r} cannot give it (its configuration has "
                f"no output {', '.join(missing)})"
            )


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


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    strings = [value] if isinstance(value, str) else value
    if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
        raise BadRequestError("stop: must be a string or a list of strings")
    if len(strings) > MAX_STOPS:
        raise BadRequestError(f"stop: at most {MAX_STOPS} sequences, not {len(strings)}")
    for i, s in enumerate(strings):
        where = "stop" if isinstance(value, str) else f"stop[{i}]"
        _text(s, where)
        if not s:
            raise BadRequestError(f"{where}: must not be empty")
    return tuple(strings)


def _common(body: Mapping[str, Any], kind: Kind) -> dict[str, Any]:
    """The fields both routes share, as TextRequest's keyword arguments."""
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequestError("stream: must be true or false")
    n = body.get("n", 1)
    if n not in (1, None) or isinstance(n, bool):
        raise BadRequestError("n: only 1 is supported")
    for name, neutral in _UNSUPPORTED[kind].items():
        if name in body and body[name] not in neutral:
            raise BadRequestError(f"{name}: not supported")
    parameters: dict[str, ParameterValue] = {}
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    if max_tokens is not None:
        if not _integer(max_tokens) or max_tokens < 1:
            raise BadRequestError("max_tokens: must be a positive integer")
        parameters["max_tokens"] = max_tokens
    for name in _NUMBERS:
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise BadRequestError(f"{name}: must be a number")
        parameters[name] = value
    stop = _stops(body.get("stop"))
    if len(stop) == 1 and isinstance(body.get("stop"), str):
        parameters["stop"] = stop[0]
    elif stop:
        parameters["stop"] = json.dumps(list(stop))
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise BadRequestError("stream_options: only with stream: true")
        if not isinstance(options, Mapping):
            raise BadRequestError("stream_options: must be an object")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise BadRequestError("stream_options.include_usage: must be true or false")
    logprobs = _logprobs(body, kind)
    if logprobs is not None:
        parameters["logprobs"] = logprobs
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequestError("user: must be a string")
    return {
        "user": user,
        "stream": stream,
        "max_tokens": max_tokens,
        "parameters": parameters,
        "stop": stop,
        "logprobs": logprobs,
        "include_usage": include_usage,
    }


def _logprobs(body: Mapping[str, Any], kind: Kind) -> int | None:
    """Alternatives per token asked for (None: no log-probabilities). Completions:
    `logprobs: <int>`; chat: `logprobs: true` and `top_logprobs: <int>`."""
    value = body.get("logprobs")
    if kind == "completion":
        if value is None:
            return None
        if not _integer(value) or not 0 <= value <= MAX_TOP_LOGPROBS:
            raise BadRequestError(f"logprobs: must be an integer from 0 to {MAX_TOP_LOGPROBS}")
        return int(value)
    if value is not None and not isinstance(value, bool):
        raise BadRequestError("logprobs: must be true or false")
    top = body.get("top_logprobs")
    if top is not None and (not _integer(top) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise BadRequestError(f"top_logprobs: must be an integer from 0 to {MAX_TOP_LOGPROBS}")
    if not value:
        if top:
            raise BadRequestError("top_logprobs: needs logprobs: true")
        return None
    return int(top or 0)


def parse_completion(body: Any) -> TextRequest:
    """`POST /v1/completions`."""
    body = request_object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequestError("prompt: must be a string (token ids and batches are not supported)")
    common = _common(body, "completion")
    echo = body.get("echo", False)
    if echo is None:
        echo = False
    if not isinstance(echo, bool):
        raise BadRequestError("echo: must be true or false")
    if echo and common["logprobs"] is not None:
        raise BadRequestError(
            "echo: not with logprobs (the models give no log-probabilities of prompt tokens)"
        )
    prompt = _text(prompt, "prompt")
    return TextRequest("completion", model_field(body), prompt, echo=echo, **common)


def parse_chat(body: Any) -> TextRequest:
    """`POST /v1/chat/completions`."""
    body = request_object(body)
    if body.get("tools") or body.get("functions"):
        raise BadRequestError("tools: not supported")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("messages: a non-empty list is required")
    common = _common(body, "chat")
    prompt = chat_prompt(messages)
    return TextRequest("chat", model_field(body), prompt, **common)


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


# -- the model's responses ---------------------------------------------------------------


@dataclass(frozen=True)
class Piece:
    """One `generate_stream` event: its text and what else the model reported."""

    text: str
    finish_reason: str | None = None
    #: how many tokens it covers (`token_ids`' length; None: not reported)
    token_count: int | None = None
    prompt_tokens: int | None = None
    tokens: tuple[str, ...] = ()
    logprobs: tuple[float, ...] = ()
    top_tokens: tuple[str, ...] = ()
    top_logprobs: tuple[float, ...] = ()


def _list(value: Any) -> list[Any]:
    """A tensor as Triton's generate extension writes it: one element as itself, more as
    a flat list."""
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _bad(what: str) -> ModelStreamError:
    return ModelStreamError(f"the model's stream carried {what}")


def _numbers(value: Any, name: str) -> tuple[float, ...]:
    items = _list(value)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
        raise _bad(f"a {name} that is not numbers")
    return tuple(float(v) for v in items)


def piece_of(data: str) -> Piece:
    """One `generate_stream` event's data. Raises ModelStreamError for an error event or
    one that is not what the contract says."""
    try:
        event = json.loads(data)
    except ValueError as e:
        raise ModelStreamError(f"the model's stream carried an event that is not JSON: {e}") from e
    if not isinstance(event, Mapping):
        raise _bad("an event that is not an object")
    if "error" in event:
        raise ModelStreamError(str(event["error"]))
    text = "".join(str(t) for t in _list(event.get(TEXT_OUTPUT, "")))
    reasons = _list(event.get("finish_reason"))
    reason = str(reasons[0]) if reasons and reasons[0] is not None else None
    count = None
    if "token_ids" in event:
        count = len(_list(event["token_ids"]))
    prompt_tokens = None
    if "prompt_tokens" in event:
        values = _list(event["prompt_tokens"])
        if len(values) != 1 or not _integer(values[0]):
            raise _bad("a prompt_tokens that is not one integer")
        prompt_tokens = int(values[0])
    tokens = tuple(str(t) for t in _list(event.get("tokens")))
    logprobs = _numbers(event.get("logprobs"), "logprobs")
    top_tokens = tuple(str(t) for t in _list(event.get("top_tokens")))
    top_logprobs = _numbers(event.get("top_logprobs"), "top_logprobs")
    if len(tokens) != len(logprobs) or len(top_tokens) != len(top_logprobs):
        raise _bad("tokens and log-probabilities of different lengths")
    return Piece(text, reason, count, prompt_tokens, tokens, logprobs, top_tokens, top_logprobs)


def text_of(data: str) -> tuple[str, str | None]:
    """The text of one `generate_stream` event, and its `finish_reason` when the model
    gives one. Raises ModelStreamError for an error event."""
    piece = piece_of(data)
    return piece.text, piece.finish_reason


_BYTE_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def token_bytes(token: str) -> bytes:
    """A token's bytes: its UTF-8, or for a token that is not whole UTF-8 (part of a
    character), written as OpenAI writes it, `bytes:\\xe2\\x82`, the bytes it spells."""
    if token.startswith("bytes:"):
        return bytes(int(h, 16) for h in _BYTE_ESCAPE.findall(token))
    return token.encode("utf-8")


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]
    #: the characters of the tokens' text before it (their bytes decoded as UTF-8)
    offset: int


@dataclass
class Completion:
    """One answer being assembled, response by response: stop sequences applied, and
    every token the model reported with its log-probabilities, sent with the first chunk
    that goes out after it (or with the answer): the tokens of the text held back at a
    stop sequence, and the one that completed it or ended the text (EOS), included,
    as `usage.completion_tokens` counts them."""

    request: TextRequest
    created: int
    id: str = field(default_factory=lambda: f"cmpl-{uuid.uuid4().hex}")
    chunks: int = 0
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = 0
    _text: list[str] = field(default_factory=list)
    _tokens: list[TokenLogprob] = field(default_factory=list)
    _token_bytes: bytes = b""
    _tokens_sent: int = 0
    _scanner: StopScanner = field(init=False)

    def __post_init__(self) -> None:
        self._scanner = StopScanner(self.request.stop)

    @property
    def text(self) -> str:
        """The completion's text so far (the prompt first when echoed)."""
        body = "".join(self._text)
        return self.request.prompt + body if self.request.echo else body

    @property
    def stopped(self) -> bool:
        """A stop sequence was seen: the answer ends here (and the generation too)."""
        return self._scanner.stopped

    def opening(self) -> dict[str, Any] | None:
        """The streaming chunk sent before the model's first: the prompt, when echoed."""
        if self.request.echo and self.request.stream:
            return self._envelope("text_completion", {"text": self.request.prompt})
        return None

    def add(self, piece: Piece | str, finish_reason: str | None = None) -> dict[str, Any] | None:
        """Record one response; the streaming chunk that carries it (None: nothing of it
        may be sent yet, it could be the start of a stop sequence)."""
        if isinstance(piece, str):
            piece = Piece(piece, finish_reason)
        if self.stopped:
            return None
        if piece.finish_reason:
            self.finish_reason = piece.finish_reason
        if piece.prompt_tokens is not None:
            self.prompt_tokens = piece.prompt_tokens
        if piece.token_count is None or self.completion_tokens is None:
            self.completion_tokens = None
        else:
            self.completion_tokens += piece.token_count
        self._keep_tokens(piece)
        text = self._scanner.feed(piece.text)
        if self.stopped:
            self.finish_reason = "stop"
        if not text and (piece.text or self.stopped):
            return None  # held back: it may be the start of a stop sequence
        return self._chunk(text)

    def _keep_tokens(self, piece: Piece) -> None:
        k = len(piece.top_tokens) // len(piece.tokens) if piece.tokens else 0
        for i, (token, logprob) in enumerate(zip(piece.tokens, piece.logprobs, strict=True)):
            top = tuple(zip(piece.top_tokens[i * k : (i + 1) * k],
                            piece.top_logprobs[i * k : (i + 1) * k], strict=True))  # fmt: skip
            offset = len(self._token_bytes.decode("utf-8", "replace"))
            self._tokens.append(TokenLogprob(token, logprob, top, offset))
            self._token_bytes += token_bytes(token)

    def _chunk(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        first = self.chunks == 0
        self.chunks += 1
        self._text.append(text)
        # A whole answer (not streamed) carries every token's log-probabilities itself.
        logprobs = self._logprobs(self._due_tokens()) if self.request.stream else None
        if self.request.kind == "chat":
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            if finish_reason is not None and not text:
                delta = {"role": "assistant"} if first else {}
            return self._envelope(
                "chat.completion.chunk", {"delta": delta}, finish_reason, logprobs
            )
        return self._envelope("text_completion", {"text": text}, finish_reason, logprobs)

    def _due_tokens(self) -> list[TokenLogprob]:
        """The tokens not yet sent."""
        due = self._tokens[self._tokens_sent :]
        self._tokens_sent = len(self._tokens)
        return due

    def _logprobs(self, tokens: list[TokenLogprob]) -> dict[str, Any] | None:
        if self.request.logprobs is None:
            return None
        k = self.request.logprobs  # no more alternatives than asked, whatever the model sent
        if self.request.kind == "chat":
            return {
                "content": [
                    {
                        "token": t.token,
                        "logprob": t.logprob,
                        "bytes": list(token_bytes(t.token)),
                        "top_logprobs": [
                            {"token": s, "logprob": lp, "bytes": list(token_bytes(s))}
                            for s, lp in t.top[:k]
                        ],
                    }
                    for t in tokens
                ],
                "refusal": None,
            }
        return {
            "tokens": [t.token for t in tokens],
            "token_logprobs": [t.logprob for t in tokens],
            "top_logprobs": [dict(t.top[:k]) for t in tokens] if k else None,
            "text_offset": [t.offset for t in tokens],
        }

    def final_reason(self) -> str:
        if self.finish_reason:
            return self.finish_reason
        limit = self.request.max_tokens
        produced = self.completion_tokens if self.completion_tokens is not None else self.chunks
        return "length" if limit is not None and produced >= limit else "stop"

    def usage(self) -> dict[str, int] | None:
        """Token counts, when the model reported them (`prompt_tokens` and every
        response's `token_ids`)."""
        if self.prompt_tokens is None or self.completion_tokens is None:
            return None
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def last_chunk(self) -> dict[str, Any]:
        """The streaming chunk that carries the finish reason (and any text held back
        that did not become a stop sequence)."""
        return self._chunk(self._scanner.finish(), self.final_reason())

    def usage_chunk(self) -> dict[str, Any] | None:
        """The streaming chunk after the last, with `usage` (asked by
        `stream_options.include_usage`)."""
        if not self.request.include_usage:
            return None
        kind = "chat.completion.chunk" if self.request.kind == "chat" else "text_completion"
        chunk = self._envelope(kind, {})
        chunk["choices"] = []
        chunk["usage"] = self.usage()
        return chunk

    def response(self) -> dict[str, Any]:
        """The non-streaming answer: every response's text, in order."""
        self._text.append(self._scanner.finish())
        logprobs = self._logprobs(self._due_tokens())
        reason = self.final_reason()
        if self.request.kind == "chat":
            message = {"role": "assistant", "content": self.text}
            answer = self._envelope("chat.completion", {"message": message}, reason, logprobs)
        else:
            answer = self._envelope("text_completion", {"text": self.text}, reason, logprobs)
        answer["usage"] = self.usage()
        return answer

    def _envelope(
        self,
        kind: str,
        choice: Mapping[str, Any],
        finish_reason: str | None = None,
        logprobs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        envelope: dict[str, Any] = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.request.model,
            "choices": [
                {"index": 0, **choice, "logprobs": logprobs, "finish_reason": finish_reason}
            ],
        }
        if self.request.include_usage:
            envelope["usage"] = None
        return envelope


#: A 400's message names the request field it refuses first: `stop[1]: must not be empty`.
_FIELD = re.compile(r"^([A-Za-z_]\w*(?:\[\d+\])*(?:\.\w+(?:\[\d+\])*)*): ")


def error_body(message: str, status: int, code: str) -> dict[str, Any]:
    """OpenAI's error object; `param` is the field a 400 names (the SDK's `e.param`)."""
    kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    named = _FIELD.match(message) if status == 400 else None
    param = named.group(1) if named else None
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def model_list(entries: Sequence[tuple[str, str, int]]) -> dict[str, Any]:
    """`GET /v1/models` from (id, owner namespace, created) triples."""
    return {
        "object": "list",
        "data": [
            {"id": model_id, "object": "model", "created": created, "owned_by": owner}
            for model_id, owner, created in entries
        ],
    }
