"""`gateway.generation`: the bounds on one generate request (issue 26, item 3), pure."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from modelswap_sidecar.gateway.errors import BadRequestError, GenerationBoundError
from modelswap_sidecar.gateway.generation import (
    ResponseCap,
    check_generate_body,
    check_max_tokens,
    check_prompt,
    utf8_bytes,
)
from tests.support.gateway_fakes import route

LLAMA = dataclasses.replace(route("llama"), max_tokens=100, max_prompt_bytes=10)


def test_max_tokens_within_the_bound_or_absent_passes() -> None:
    assert check_max_tokens(None, LLAMA) is None
    assert check_max_tokens(1, LLAMA) == 1
    assert check_max_tokens(100, LLAMA) == 100


@pytest.mark.parametrize(
    "value", [101, 100_000_000, 2**70, 10**5000], ids=["101", "1e8", "2^70", "1e5000"]
)
def test_max_tokens_above_the_bound_is_refused_naming_field_and_bound(value: int) -> None:
    with pytest.raises(GenerationBoundError) as caught:
        check_max_tokens(value, LLAMA)
    message = caught.value.message
    assert message.startswith("max_tokens: ") and "at most 100 tokens" in message
    assert "spec.gateway.maxTokens" in message and len(message) < 300
    assert caught.value.status == 400 and caught.value.reason == "GenerationBound"


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "10", [10]])
def test_max_tokens_not_a_positive_integer_is_a_bad_request(value: object) -> None:
    with pytest.raises(BadRequestError) as caught:
        check_max_tokens(value, LLAMA)
    assert not isinstance(caught.value, GenerationBoundError)


def test_the_prompt_is_counted_in_utf8_bytes() -> None:
    check_prompt(utf8_bytes("é" * 5), LLAMA, "prompt")  # 10 bytes: at the bound
    with pytest.raises(GenerationBoundError) as caught:
        check_prompt(utf8_bytes("é" * 5 + "x"), LLAMA, "prompt")
    assert caught.value.message.startswith("prompt: the prompt is 11 bytes")
    assert "at most 10 bytes (spec.gateway.maxPromptBytes)" in caught.value.message
    assert utf8_bytes("\ud800") == 3  # a lone surrogate JSON allows does not raise


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text_input": "x" * 11}, "text_input"),
        ({"text_input": ["x" * 6, ["y" * 5]]}, "text_input"),
        ({"text_input": "a", "max_tokens": 101}, "max_tokens"),
        ({"text_input": "a", "parameters": {"max_tokens": 2**70}}, "parameters.max_tokens"),
    ],
)
def test_a_v2_generate_body_past_a_bound_names_its_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(GenerationBoundError) as caught:
        check_generate_body(body, LLAMA)
    assert caught.value.message.startswith(f"{field}: ")


def test_a_v2_generate_body_within_the_bounds_passes() -> None:
    check_generate_body({"text_input": "abc", "max_tokens": 5, "parameters": {"x": 1}}, LLAMA)
    check_generate_body({"other_input": "z" * 100}, LLAMA)  # only text_input is the prompt


def test_the_response_cap_lets_the_bound_through_and_stops_at_the_next() -> None:
    cap = ResponseCap(LLAMA)
    assert all(cap.take() for _ in range(100))
    assert not cap.take()
