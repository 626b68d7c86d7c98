"""What the OpenAI routes quote of a Triton error answer."""

from __future__ import annotations

from modelswap_sidecar.gateway.openai_handlers import triton_message


def test_a_plain_error_object_gives_its_message() -> None:
    assert triton_message(b'{"error": "unknown model"}') == "unknown model"


def test_a_refused_generate_stream_is_unwrapped_from_its_event_line() -> None:
    raw = b'data: {"error":"temperature: must be between 0 and 2"}\n\n'
    assert triton_message(raw) == "temperature: must be between 0 and 2"


def test_anything_else_is_quoted_as_text() -> None:
    assert triton_message(b"data: not json") == "data: not json"
    assert triton_message(b"\xff oops") == "\ufffd oops"
