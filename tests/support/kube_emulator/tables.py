"""Server-side `Table` output (`Accept: application/json;as=Table;g=meta.k8s.io;v=v1`).

Custom resources get a Name column and their CRD's additionalPrinterColumns, with cells
formatted as the apiextensions table convertor does (dates as ages, integers as numbers);
a CRD without printer columns gets Name and Age. Built-in types get Name and Age, with a few
well-known extra columns (namespace Status, node Status, lease Holder).
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.kube_emulator import clock, jsonpath
from tests.support.kube_emulator.resources import ResourceType

_NAME_COLUMN = {
    "name": "Name",
    "type": "string",
    "format": "name",
    "description": "Name must be unique within a namespace. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    "priority": 0,
}
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
_BUILTIN_COLUMNS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("", "namespaces"): [{"name": "Status", "type": "string", "jsonPath": ".status.phase"}, _AGE],
    ("", "nodes"): [
        {"name": "Status", "type": "string",
         "jsonPath": '.status.conditions[?(@.type=="Ready")].type'},
        _AGE,
    ],
    ("coordination.k8s.io", "leases"): [
        {"name": "Holder", "type": "string", "jsonPath": ".spec.holderIdentity"}, _AGE,
    ],
    ("", "configmaps"): [{"name": "Data", "type": "integer", "jsonPath": ".data"}, _AGE],
}  # fmt: skip


def accepts_table(accept: str) -> bool:
    return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.split(","))


def columns_for(rt: ResourceType) -> list[dict[str, Any]]:
    if rt.custom:
        return list(rt.printer_columns) or [_AGE]
    return _BUILTIN_COLUMNS.get(rt.key, [_AGE])


def _cell(column: dict[str, Any], obj: dict[str, Any]) -> Any:
    try:
        found = jsonpath.find(obj, column["jsonPath"])
    except ValueError:
        return None
    if not found:
        return None
    value = found[0]
    kind = column.get("type", "string")
    if column.get("name") == "Data" and isinstance(value, dict):
        return len(value)
    if kind == "date":
        return clock.age(value) if isinstance(value, str) else None
    if kind == "integer":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if kind == "boolean":
        return value if isinstance(value, bool) else None
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _row_object(obj: dict[str, Any], include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata", {}),
    }


def table(
    rt: ResourceType,
    objects: list[dict[str, Any]],
    *,
    resource_version: str,
    include_object: str = "Metadata",
    continue_token: str | None = None,
) -> dict[str, Any]:
    columns = columns_for(rt)
    definitions = [_NAME_COLUMN] + [
        {
            "name": c["name"],
            "type": c.get("type", "string"),
            "format": c.get("format", ""),
            "description": c.get("description", ""),
            "priority": c.get("priority", 0),
        }
        for c in columns
    ]
    rows = []
    for obj in objects:
        row: dict[str, Any] = {
            "cells": [obj["metadata"]["name"]] + [_cell(c, obj) for c in columns]
        }
        row_object = _row_object(obj, include_object)
        if row_object is not None:
            row["object"] = row_object
        rows.append(row)
    metadata: dict[str, Any] = {"resourceVersion": resource_version}
    if continue_token:
        metadata["continue"] = continue_token
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    }
