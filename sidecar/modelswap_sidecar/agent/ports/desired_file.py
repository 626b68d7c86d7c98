"""The entries the agent was last told to hold, kept in a small JSON file so a restarted
agent knows its models before the operator's next push (credentials are never written)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from modelswap_api.control import DesiredEntry

log = logging.getLogger(__name__)

_VERSION = 1


def save_entries(path: Path, entries: Iterable[DesiredEntry]) -> None:
    doc = {
        "version": _VERSION,
        "entries": [dataclasses.replace(e, credentials=None).to_dict() for e in entries],
    }
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_entries(path: Path) -> list[DesiredEntry]:
    """The saved entries; none when the file is missing or unreadable (logged). An entry
    this agent cannot read (an older agent saved it without its effective policy) is left
    out, logged; the operator's next push brings it back."""
    try:
        doc = json.loads(path.read_text())
        if doc.get("version") != _VERSION:
            raise ValueError(f"version {doc.get('version')!r}")
        saved = list(doc["entries"])
    except FileNotFoundError:
        return []
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring %s: %s", path, e)
        return []
    entries: list[DesiredEntry] = []
    for i, doc in enumerate(saved):
        try:
            entries.append(DesiredEntry.from_dict(doc))
        except (ValueError, KeyError, TypeError) as problem:
            log.warning("ignoring entry %d of %s: %s", i, path, problem)
    return entries
