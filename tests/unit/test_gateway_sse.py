"""Event-stream parsing and writing, and Triton's names replaced in its answers (pure)."""

from __future__ import annotations

import json

from modelswap_sidecar.gateway.rewrite import rename_infer_response, rename_json
from modelswap_sidecar.gateway.sse import Event, EventParser, comment, data_event

TRITON = "m-" + "a" * 32


def test_events_split_anywhere_come_out_whole() -> None:
    stream = b'data: {"a":1}\n\n: a comment\n\nevent: error\ndata: x\ndata: y\r\n\r\ndata: tail'
    for size in (1, 2, 5, len(stream)):
        parser = EventParser()
        events = [e for i in range(0, len(stream), size) for e in parser.feed(stream[i : i + size])]
        events += list(parser.close())
        assert events == [Event('{"a":1}'), Event("x\ny", "error"), Event("tail")]


def test_written_events_parse_back() -> None:
    parser = EventParser()
    written = data_event("one\ntwo") + comment("swap-in queued") + data_event("{}", "error")
    assert written.startswith(b"data: one\ndata: two\n\n: swap-in queued\n")
    assert list(parser.feed(written)) == [Event("one\ntwo"), Event("{}", "error")]


def test_names_and_errors_are_renamed_but_not_tensor_data() -> None:
    body = json.dumps(
        {"model_name": TRITON, "outputs": [{"name": "OUTPUT0", "data": [TRITON]}]}
    ).encode()
    renamed = json.loads(rename_json(body, TRITON, "llama"))
    assert renamed["model_name"] == "llama"
    assert renamed["outputs"][0]["data"] == [TRITON]
    error = json.dumps({"error": f"unknown model: '{TRITON}'"}).encode()
    assert json.loads(rename_json(error, TRITON, "llama")) == {"error": "unknown model: 'llama'"}
    assert rename_json(b"not json", TRITON, "llama") == b"not json"
    assert rename_json(b"[1]", TRITON, "llama") == b"[1]"


def test_binary_answers_keep_their_tensors_and_get_a_new_header_length() -> None:
    header = json.dumps({"model_name": TRITON, "outputs": []}).encode()
    tensors = bytes(range(16))
    body, length = rename_infer_response(header + tensors, len(header), TRITON, "llama")
    assert length is not None and body[length:] == tensors
    assert json.loads(body[:length])["model_name"] == "llama"
    assert rename_infer_response(b"xx", 5, TRITON, "llama") == (b"xx", 5)


def test_an_answer_as_triton_writes_it_is_renamed_byte_for_byte() -> None:
    """Triton's compact answer, `model_name` first: only the name changes; every other byte,
    floats as Triton printed them included, passes unchanged."""
    rest = b',"model_version":"1","outputs":[{"name":"OUTPUT0","data":[-0.34005558490753176]}]}'
    body = b'{"model_name":"' + TRITON.encode() + b'"' + rest
    assert rename_json(body, TRITON, "llama") == b'{"model_name":"llama"' + rest
    assert rename_json(body, TRITON, 'say "hi"') == b'{"model_name":"say \\"hi\\""' + rest
    header_length = len(body)
    renamed, length = rename_infer_response(body + b"\x00\x01", header_length, TRITON, "llama")
    assert renamed == b'{"model_name":"llama"' + rest + b"\x00\x01"
    assert length == len(renamed) - 2


def test_an_answer_naming_triton_again_is_renamed_by_parsing() -> None:
    """The Triton name further on (an error message, another field) is renamed as any
    other answer is: the byte shortcut does not apply."""
    again = {"model_name": TRITON, "name": TRITON, "error": f"in {TRITON}", "data": [1.5]}
    body = json.dumps(again, separators=(",", ":")).encode()
    assert json.loads(rename_json(body, TRITON, "llama")) == {
        "model_name": "llama",
        "name": "llama",
        "error": "in llama",
        "data": [1.5],
    }
    other = b'{"model_name":"' + TRITON.encode() + b'x","a":1}'  # a longer name: not ours
    assert rename_json(other, TRITON, "llama") == other
