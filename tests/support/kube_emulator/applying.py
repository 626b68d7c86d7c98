"""Server-side apply, simplified.

Each field manager's last applied configuration is kept per object. An apply removes the
fields that manager applied before and applies no longer, then merges the new configuration
(lists are atomic). There is no field ownership across managers: no conflicts (409) and no
`managedFields`; fields that other writers set are left alone unless the configuration sets
them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from tests.support.kube_emulator.patching import merge_patch

_IDENTITY = (("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"))


class AppliedConfigs:
    def __init__(self) -> None:
        self._by_uid: dict[str, dict[str, dict[str, Any]]] = {}

    def previous(self, uid: str, manager: str) -> dict[str, Any]:
        return copy.deepcopy(self._by_uid.get(uid, {}).get(manager, {}))

    def record(self, uid: str, manager: str, config: dict[str, Any]) -> None:
        self._by_uid.setdefault(uid, {})[manager] = copy.deepcopy(config)

    def forget(self, uid: str) -> None:
        self._by_uid.pop(uid, None)


def _leaf_paths(value: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from _leaf_paths(child, (*prefix, key))
    elif prefix:
        yield prefix


def _has(value: Any, path: tuple[str, ...]) -> bool:
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return False
        value = value[part]
    return True


def _delete(value: Any, path: tuple[str, ...]) -> None:
    for part in path[:-1]:
        if not isinstance(value, dict) or part not in value:
            return
        value = value[part]
    if isinstance(value, dict):
        value.pop(path[-1], None)


def apply(current: dict[str, Any], previous: dict[str, Any], config: dict[str, Any]) -> Any:
    """`current` with the fields `previous` applied and `config` drops removed, then merged."""
    result = copy.deepcopy(current)
    for path in _leaf_paths(previous):
        if path not in _IDENTITY and not _has(config, path):
            _delete(result, path)
    return merge_patch(result, config)
