"""Object storage with one global resourceVersion counter, an event history and watchers.

This plays etcd's part: every write gets the next resourceVersion, every change is kept in
a bounded history so watches can resume from a resourceVersion, and a resume from before the
history's start is "too old" (410). Everything runs on the server's event loop, so each
method is atomic with respect to the others.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.support.kube_emulator.copying import clone

Key = tuple[str, str]  # (group, plural)
ObjectKey = tuple[str, str]  # (namespace or "", name)


@dataclass(frozen=True)
class Event:
    type: str  # ADDED | MODIFIED | DELETED
    rv: int
    key: Key
    object: dict[str, Any]
    old: dict[str, Any] | None = None


@dataclass(eq=False)
class Watcher:
    key: Key
    namespace: str | None
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)

    def wants(self, event: Event) -> bool:
        if event.key != self.key:
            return False
        return self.namespace is None or event.object["metadata"].get("namespace") == self.namespace


class TooOldError(Exception):
    """A watch asked to resume from a resourceVersion the history no longer holds."""

    def __init__(self, requested: int, oldest: int) -> None:
        super().__init__(f"too old resource version: {requested} ({oldest})")


def object_key(obj: dict[str, Any]) -> ObjectKey:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


class Store:
    def __init__(self, history_size: int = 10_000) -> None:
        self.rv = 1
        self._objects: dict[Key, dict[ObjectKey, dict[str, Any]]] = {}
        self._history: deque[Event] = deque(maxlen=history_size)
        self._compacted_rv = 1  # events after this resourceVersion are in the history
        self._watchers: set[Watcher] = set()

    def get(self, key: Key, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self._objects.get(key, {}).get((namespace, name))
        return clone(obj) if obj is not None else None

    def items(self, key: Key, namespace: str | None = None) -> list[dict[str, Any]]:
        """Copies in etcd's order (namespace, then name)."""
        found = self._objects.get(key, {})
        return [clone(found[k]) for k in sorted(found) if namespace is None or k[0] == namespace]

    def views(self, key: Key, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored objects themselves, in etcd's order, for a response serialised at
        once (a list): never change them or keep them past the request."""
        found = self._objects.get(key, {})
        return [found[k] for k in sorted(found) if namespace is None or k[0] == namespace]

    def count(self, key: Key, namespace: str | None = None) -> int:
        return sum(1 for k in self._objects.get(key, {}) if namespace is None or k[0] == namespace)

    def namespaces_in_use(self, namespace: str) -> Iterator[Key]:
        for key, objs in self._objects.items():
            if any(k[0] == namespace for k in objs):
                yield key

    def all_objects(self) -> Iterator[tuple[Key, dict[str, Any]]]:
        for key, objs in list(self._objects.items()):
            for obj in list(objs.values()):
                yield key, obj

    def put(self, key: Key, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` under the next resourceVersion; return a copy of what is stored."""
        self.rv += 1
        stored = clone(obj)
        stored["metadata"]["resourceVersion"] = str(self.rv)
        objs = self._objects.setdefault(key, {})
        old = objs.get(object_key(stored))
        objs[object_key(stored)] = stored
        self._record(Event("MODIFIED" if old else "ADDED", self.rv, key, stored, old))
        return clone(stored)

    def remove(self, key: Key, namespace: str, name: str) -> dict[str, Any]:
        """Delete; the DELETED event's object carries the deletion's resourceVersion."""
        old = self._objects[key].pop((namespace, name))
        self.rv += 1
        gone = clone(old)
        gone["metadata"]["resourceVersion"] = str(self.rv)
        self._record(Event("DELETED", self.rv, key, gone, old))
        return clone(gone)

    def close_watches(self, key: Key) -> None:
        """End every watch of `key` (its resource type went away)."""
        for watcher in [w for w in self._watchers if w.key == key]:
            watcher.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the history, as etcd compaction does: older resumes get 410 Gone."""
        self._history.clear()
        self._compacted_rv = self.rv

    def _record(self, event: Event) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted_rv = self._history[0].rv
        self._history.append(event)
        for watcher in self._watchers:
            if watcher.wants(event):
                watcher.queue.put_nowait(event)

    def watch(self, key: Key, namespace: str | None, since: int | None) -> Watcher:
        """Register a watcher; with `since`, queue the history after it first."""
        watcher = Watcher(key, namespace)
        if since is not None:
            if since < self._compacted_rv:
                raise TooOldError(since, self._compacted_rv + 1)
            for event in self._history:
                if event.rv > since and watcher.wants(event):
                    watcher.queue.put_nowait(event)
        self._watchers.add(watcher)
        return watcher

    def watcher_count(self, key: Key) -> int:
        return sum(1 for w in self._watchers if w.key == key)

    def unwatch(self, watcher: Watcher) -> None:
        self._watchers.discard(watcher)
