"""JSON log lines: one object per line, with level, logger, %-formatted message, extras."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest

from modelswap_api.logs import JsonFormatter, configure_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_a_record_becomes_one_json_line_with_extras(restore_root: None) -> None:
    stream = io.StringIO()
    configure_logging("DEBUG", stream=stream)
    configure_logging("DEBUG", stream=stream)  # again: still one handler
    logger = logging.getLogger("modelswap_sidecar.test")
    logger.info("swapped %s out in %.2fs", "llama", 0.25, extra={"uid": "u-1", "bytes": 1 << 30})
    (line,) = stream.getvalue().splitlines()
    entry = json.loads(line)
    assert entry["level"] == "info"
    assert entry["logger"] == "modelswap_sidecar.test"
    assert entry["message"] == "swapped llama out in 0.25s"
    assert (entry["uid"], entry["bytes"]) == ("u-1", 1 << 30)
    assert entry["time"].endswith("Z") and "T" in entry["time"]
    assert "args" not in entry and "msg" not in entry


def test_exceptions_and_unserializable_extras_are_kept_as_text() -> None:
    formatter = JsonFormatter()
    try:
        raise ValueError("bad weights")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x",
            logging.ERROR,
            __file__,
            1,
            "load failed",
            (),
            exc_info=sys.exc_info(),
            extra={"path": object()},
        )
    entry = json.loads(formatter.format(record))
    assert entry["level"] == "error"
    assert "ValueError: bad weights" in entry["exception"]
    assert entry["path"].startswith("<object object")
    assert "\n" not in formatter.format(record)
