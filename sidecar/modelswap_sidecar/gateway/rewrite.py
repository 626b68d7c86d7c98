"""Triton's answers with the UID-derived name replaced by the name users call (pure).

Triton puts its model name in metadata and configuration (`name`), statistics
(`model_stats[].name`), inference and generate answers (`model_name`) and error messages.
The gateway shows users their own name instead; only those fields change, never tensor
data. Bodies that are not JSON (or not what is expected) pass unchanged.

Inference and generate answers take a shortcut that is exact: Triton writes them compact
with `model_name` first, `{"model_name":"m-<hex>",...`, and a Triton name is plain ASCII
that JSON never escapes. When a body begins so and the name occurs nowhere else in it (no
other field or error message to rename), the rename is those bytes swapped; everything
after them passes byte for byte. Parsing and encoding the answer instead cost more of the
gateway's CPU than anything else it does per request, and re-encoded Triton's floats.

Error messages are also made fit for a client (`public_message`): the python backend
puts the stub's traceback in a failed model's message (`At:` then one
`/path/to/model.py(21): execute` line per frame), and messages name files by their
absolute paths (the node's model repository, its run folder). Tracebacks are cut and
each absolute path is shortened to its last component (`model.py`).
"""

from __future__ import annotations

import json
import re
from typing import Any

NAME_FIELDS = ("name", "model_name")
#: The python backend's stub traceback: `At:` on its own line, then indented frames.
_STUB_TRACEBACK = re.compile(r"\s*\bAt:\n(?:[ \t]+[^\n]*(?:\n|$))*")
#: Python's own traceback: its title and its indented lines (the last line, the error, stays).
_PYTHON_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\n(?:[ \t]+[^\n]*\n?)*")
#: An absolute path of two or more components, not inside a URL; group 1 is its last.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/'\"():,;\[\]]+/)+([^\s/'\"():,;\[\]]*)")


def public_message(message: str) -> str:
    """An error message without tracebacks or absolute paths (see the module)."""
    text = _STUB_TRACEBACK.sub("", message)
    text = _PYTHON_TRACEBACK.sub("", text)
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1) or "/", text).strip()


def triton_message(raw: bytes) -> str:
    """The message of Triton's error answer (`{"error": message}`), or its text, fit for a
    client (`public_message`). A refused `generate_stream` answers with that object as one
    event-stream line (`data: {...}`): unwrapped too."""
    text = raw.strip()
    if text.startswith(b"data:"):
        text = text[len(b"data:") :].strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return public_message(raw.decode("utf-8", errors="replace"))
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), str):
        return public_message(str(parsed["error"]))
    return public_message(raw.decode("utf-8", errors="replace"))


def _rename(value: Any, triton_name: str, user_name: str) -> Any:
    if not isinstance(value, dict):
        return value
    renamed = dict(value)
    for key in NAME_FIELDS:
        if renamed.get(key) == triton_name:
            renamed[key] = user_name
    error = renamed.get("error")
    if isinstance(error, str):
        renamed["error"] = public_message(error.replace(triton_name, user_name))
    return renamed


def _renamed_prefix(body: bytes, triton_name: str, user_name: str) -> bytes | None:
    """The body with its leading `{"model_name":"<triton name>"` renamed, or None when it
    does not begin so or names the Triton name again further on."""
    name = triton_name.encode()
    prefix = b'{"model_name":"' + name + b'"'
    if not body.startswith(prefix) or body.find(name, len(prefix)) >= 0:
        return None
    return b'{"model_name":' + json.dumps(user_name).encode() + body[len(prefix) :]


def rename_json(body: bytes, triton_name: str, user_name: str) -> bytes:
    """A JSON object's name fields and error message renamed; anything else unchanged."""
    quick = _renamed_prefix(body, triton_name, user_name)
    if quick is not None:
        return quick
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    renamed = _rename(parsed, triton_name, user_name)
    if renamed == parsed:
        return body
    return json.dumps(renamed, separators=(",", ":")).encode()


def rename_infer_response(
    body: bytes, header_length: int | None, triton_name: str, user_name: str
) -> tuple[bytes, int | None]:
    """An inference answer renamed. With the binary tensor extension the JSON header is the
    first `header_length` bytes (`Inference-Header-Content-Length`); the new length is
    returned with the body."""
    if header_length is None:
        return rename_json(body, triton_name, user_name), None
    if not 0 <= header_length <= len(body):
        return body, header_length
    header = rename_json(body[:header_length], triton_name, user_name)
    return header + body[header_length:], len(header)


def rename_stats(body: bytes, triton_name: str, user_name: str) -> bytes:
    """Triton's statistics answer (`model_stats[].name`) renamed, errors as `rename_json`."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body
    if not isinstance(parsed, dict) or not isinstance(parsed.get("model_stats"), list):
        return rename_json(body, triton_name, user_name)
    parsed["model_stats"] = [_rename(m, triton_name, user_name) for m in parsed["model_stats"]]
    return json.dumps(parsed, separators=(",", ":")).encode()
