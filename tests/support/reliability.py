"""What the reliability suite records for docs/RELIABILITY.md.

A test calls `record(section, **row)` with what it tried and what held (an input and the
limit that refused it, a fault and its recovery time, a load phase's figures). When
`MODELSWAP_RELIABILITY_OUT` names a folder, each call appends one JSON line to
`<folder>/<section>.jsonl`; otherwise (a plain `make test`) nothing is written. The document
is rendered from those files only, so every figure in it comes from the run that made it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

OUT_ENV = "MODELSWAP_RELIABILITY_OUT"
_lock = threading.Lock()


def record(section: str, **row: Any) -> None:
    folder = os.environ.get(OUT_ENV)
    if not folder:
        return
    path = Path(folder) / f"{section}.jsonl"
    line = json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0], **row})
    with _lock:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(line + "\n")
