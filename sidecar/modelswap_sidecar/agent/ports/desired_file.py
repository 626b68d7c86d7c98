"""The entries the agent was last told to hold, kept in a JSON file so a restarted agent
knows its models before the operator's next push (credentials are never written).

The file holds up to `MAX_ENTRIES` entries (megabytes), so it is written by a
`DesiredFileWriter`: the caller takes a snapshot of the entries under the control lock
and hands it over; the writer writes it in a thread, outside the lock, one write at a
time and in the order taken, and a snapshot that a newer one overtakes before its turn is
never written (a burst of changes costs one or two writes, not one each).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from modelswap_api.control import MAX_GENERATION, DesiredEntry
from modelswap_sidecar.control.errors import DesiredStoreError

log = logging.getLogger(__name__)

_VERSION = 1


def save_entries(path: Path, entries: Sequence[DesiredEntry]) -> None:
    """Write `entries` to `path` atomically: a temporary file, fsynced, renamed over it."""
    doc = {
        "version": _VERSION,
        "entries": [dataclasses.replace(e, credentials=None).to_dict() for e in entries],
    }
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_entries(path: Path) -> list[DesiredEntry]:
    """The saved entries; none when the file is missing or unreadable (logged). An entry
    this agent cannot read (an older agent saved it without its effective policy, or with
    a generation past `MAX_GENERATION`) is left out, logged; the operator's next push
    brings it back."""
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
            entry = DesiredEntry.from_dict(doc)
        except (ValueError, KeyError, TypeError) as problem:
            log.warning("ignoring entry %d of %s: %s", i, path, problem)
            continue
        if not 1 <= entry.generation <= MAX_GENERATION:
            # saved by an agent before the bound: taken back, it would make every later
            # push of this uid `stale`
            log.warning("ignoring entry %d of %s: generation %d", i, path, entry.generation)
            continue
        entries.append(entry)
    return entries


#: Writes one snapshot: `save_entries`, or a test's stand-in.
Write = Callable[[Path, Sequence[DesiredEntry]], None]


class DesiredFileWriter:
    """Writes snapshots of the desired entries to `path` in the background, in order.

    `submit` returns at once (it never waits on the disk, so a caller holding a lock does
    not hold it across the write); the future it returns is done once that snapshot, or a
    newer one that overtook it, is on disk, and carries the write's error otherwise. At
    most one write runs at a time; while it runs, further snapshots replace each other and
    only the newest is written next, so an older snapshot never lands over a newer one.
    """

    def __init__(self, path: Path, write: Write = save_entries) -> None:
        self.path = path
        self._write = write
        #: the newest snapshot not yet being written, and everyone waiting on it
        self._pending: tuple[Sequence[DesiredEntry], list[asyncio.Future[None]]] | None = None
        self._task: asyncio.Task[None] | None = None

    def submit(self, entries: Sequence[DesiredEntry]) -> asyncio.Future[None]:
        """Queue `entries` (a snapshot the caller no longer changes) to be written."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        # Whoever does not wait for the answer must not leave an unretrieved error behind:
        # the failure is logged by the writer.
        done.add_done_callback(_retrieve)
        if self._pending is None:
            self._pending = (tuple(entries), [done])
        else:
            self._pending = (tuple(entries), [*self._pending[1], done])
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._drain(), name="desired-file-writer")
        return done

    async def flush(self) -> None:
        """Wait until every snapshot submitted so far is written (or failed)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def _drain(self) -> None:
        while self._pending is not None:
            entries, waiters = self._pending
            self._pending = None
            error: Exception | None = None
            try:
                await asyncio.to_thread(self._write, self.path, entries)
            except Exception as e:  # the file is a restart cache: say so, keep serving
                error = e
                log.error("cannot write %s (%d entries): %s", self.path, len(entries), e)
            for waiter in waiters:
                if waiter.done():  # its waiter was cancelled
                    continue
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(DesiredStoreError(f"cannot write {self.path}: {error}"))


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
