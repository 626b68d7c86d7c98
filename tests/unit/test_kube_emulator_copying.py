"""The emulator's copy of stored objects is as deep as copy.deepcopy: nested dicts and
lists are new, scalars are shared, anything else (a YAML timestamp) is deep-copied."""

from __future__ import annotations

import datetime
from typing import Any

from tests.support.kube_emulator.copying import clone


def test_a_document_is_copied_all_the_way_down() -> None:
    shared = {"k": [1, 2]}
    doc: dict[str, Any] = {"metadata": {"name": "a", "labels": {"x": "y"}}, "items": [shared, shared],
           "n": 1.5, "flag": True, "none": None}  # fmt: skip
    copied: dict[str, Any] = clone(doc)
    assert copied == doc
    assert copied is not doc and copied["metadata"] is not doc["metadata"]
    assert copied["items"][0] is not shared and copied["items"][1] is not shared
    copied["items"][0]["k"].append(3)
    assert shared == {"k": [1, 2]} and copied["items"][1] == {"k": [1, 2]}


def test_values_that_are_not_json_are_deep_copied() -> None:
    class Box:
        def __init__(self, inner: list[int]) -> None:
            self.inner = inner

    stamp = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    box = Box([1])
    copied: dict[str, Any] = clone({"when": stamp, "box": box, "pair": (1, [2])})
    assert copied["when"] == stamp
    assert copied["box"] is not box and copied["box"].inner == [1]
    assert copied["box"].inner is not box.inner
    assert copied["pair"] == (1, [2])


def test_a_list_view_answers_as_select_does_without_touching_the_store() -> None:
    from tests.support.kube_emulator.operations import Cluster

    cluster = Cluster()
    rt = cluster.types.get("", "v1", "configmaps")
    assert rt is not None
    for name in ("b", "a"):
        cluster.create(rt, "default", {"metadata": {"name": name}, "data": {"k": name}})
    everything: Any = lambda obj: True  # noqa: E731 - a predicate
    view = cluster.select_view(rt, "default", everything)
    assert view == cluster.select(rt, "default", everything)
    assert [o["metadata"]["name"] for o in view] == ["a", "b"]
    view[0]["kind"] = "Changed"  # the item itself is the view's own
    assert cluster.get(rt, "default", "a")["kind"] == "ConfigMap"
