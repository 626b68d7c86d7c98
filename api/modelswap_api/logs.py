"""JSON log lines for the operator and the node (one object per line, for log shippers).

    {"time": "2026-11-22T18:00:00.123Z", "level": "info", "logger": "modelswap_sidecar.x",
     "message": "...", "exception": "Traceback ...", ...extra fields}

Fields passed with `extra={...}` are kept (values JSON cannot hold are written as text).
`configure_logging` is called once at start with the level from the settings.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any, TextIO

#: Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=str, ensure_ascii=False)


def _timestamp(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def configure_logging(
    level: int | str = logging.INFO, *, json_lines: bool = True, stream: TextIO | None = None
) -> logging.Handler:
    """Send the root logger's records to `stream` (stderr), as JSON lines or plain text.

    Replaces the root logger's handlers, so calling it again does not double lines.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    if json_lines:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    return handler
