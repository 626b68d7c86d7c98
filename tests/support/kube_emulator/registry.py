"""The index of served resource types, by group/version/plural, kind and short name."""

from __future__ import annotations

from collections.abc import Iterator

from tests.support.kube_emulator.resources import ResourceType, builtin_types


class TypeRegistry:
    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._group_order: list[str] = []
        for rt in builtin_types():
            self.add(rt)

    def add(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt
        if rt.group not in self._group_order:
            self._group_order.append(rt.group)

    def remove_key(self, group: str, plural: str) -> None:
        for k in [k for k in self._types if k[0] == group and k[2] == plural]:
            del self._types[k]

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        return next(
            (
                t
                for t in self._types.values()
                if (t.group, t.version, t.kind) == (group, version, kind)
            ),
            None,
        )

    def storage_type(self, group: str, plural: str) -> ResourceType | None:
        """Any served version of the resource (all versions share one store)."""
        return next(
            (t for t in self._types.values() if (t.group, t.plural) == (group, plural)), None
        )

    def groups(self) -> list[tuple[str, list[str]]]:
        """Non-core groups in registration order, each with its versions."""
        out = []
        for group in self._group_order:
            versions = [k[1] for k in self._types if k[0] == group]
            if group and versions:
                out.append((group, list(dict.fromkeys(versions))))
        return out

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for t in self._types.values() if (t.group, t.version) == (group, version)]

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(list(self._types.values()))
