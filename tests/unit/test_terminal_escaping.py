"""Model names and messages with terminal escape codes are printed escaped by `modelswap
status` and `modelswap validate` (issue 26, item 10): a name like `"\\e]0;owned\\a"` retitled
the user's terminal, and `"\\e[2J"` cleared it."""

from __future__ import annotations

import io
from pathlib import Path

from modelswap_api.terminal import printable
from modelswap_api.validate_command import validate_paths
from modelswap_sidecar.local.status import dev_lines, explanations, reload_lines, rows, table

HOSTILE = "chat\x1b]0;owned\x07\x1b[2J\r\n\u202eevil\x9b31m"
SHOWN = "chat\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x0a\\u202eevil\\x9b31m"


def test_printable_escapes_controls_format_characters_and_separators() -> None:
    assert printable(HOSTILE) == SHOWN
    assert printable("llama-7b é ☃ 模型\u00a0x\ttab") == "llama-7b é ☃ 模型\u00a0x\\x09tab"
    assert printable("line\u2028sep\ud800") == "line\\u2028sep\\ud800"
    assert printable("\U000e0001tag") == "\\U000e0001tag"


def _safe(text: str) -> bool:
    return all(c.isprintable() or c == "\n" for c in text)


def test_status_escapes_every_cell_and_line() -> None:
    models = [{"uid": "u1", "namespace": "default", "name": HOSTILE, "phase": "Failed",
               "reason": "LoadFailed\x1b[8m", "message": "bad\x1b[0m", "residentBytes": 0}]  # fmt: skip
    local = [{"uid": "u1", "name": HOSTILE, "model": HOSTILE, "dev": True,
              "engineName": "e\x1b", "weightsBytes": "1Mi",
              "reloads": {"count": 2, "at": 0, "what": "x\x1b", "hostCopy": "kept",
                          "outcome": "ok\x07"}}]  # fmt: skip
    shown = table(rows(models, local, node_name="local", now_seconds=10.0))
    assert _safe(shown) and SHOWN in shown
    lines = [
        *explanations(models),
        *reload_lines(local, now_seconds=10.0),
        *dev_lines(local, socket_path="/run/s\x1b"),
    ]
    assert lines[0] == f"{SHOWN}: Failed LoadFailed\\x1b[8m: bad\\x1b[0m"
    assert all(_safe(line) for line in lines)
    assert lines[1].startswith(f"reloaded: {SHOWN} 10s ago (x\\x1b;")
    assert lines[2] == "dev loop: export MODELSWAP_SOCKET=/run/s\\x1b"


def test_validate_prints_a_hostile_name_escaped(tmp_path: Path) -> None:
    manifest = tmp_path / "hostile.yaml"
    manifest.write_text(
        "apiVersion: modelswap.io/v1alpha1\nkind: ModelDeployment\n"
        'metadata: {name: "chat\\e]0;owned\\a\\e[2J", namespace: default}\n'
        "spec: {}\n"
    )
    out = io.StringIO()
    assert validate_paths([manifest], out) == 1
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and _safe(text)
    assert "chat\\x1b]0;owned\\x07\\x1b[2J" in text
