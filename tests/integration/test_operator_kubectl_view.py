"""What kubectl shows (issue 27, item 8), through the API emulator and the operator.

- `kubectl get md -o wide` and `kubectl get swapnodes -o wide` fill every column: the
  model's name with and without spec.model.name, Ready's reason, sizes as quantities, KV
  bytes per tier (issue 29),
  the node's GPUs, free HBM, models and Lease; `kubectl explain` says what `pinned` does.
- Deleting a namespace whose models' node cannot free them yet (its agent stopped): the
  operator posts at most one Event there (refused 403, the namespace terminating), logs
  no warning or error about it, and every finalizer goes once the node is lost.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from modelswap_api.quantities import format_bytes
from tests.integration.test_operator import EXAMPLES, wait_ready
from tests.support.kube_testing import Kubectl, load_yaml
from tests.support.operator_world import Objects, agents, emulator, operator
from tests.support.waiting import until

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]


def model(name: str, namespace: str = "default") -> dict[str, Any]:
    body = load_yaml(EXAMPLES / "classify-drop-on-idle.yaml")
    body["metadata"] = {"name": name, "namespace": namespace}
    return body


def rows(table: str) -> dict[str, dict[str, str]]:
    """kubectl's table as {name: {COLUMN: cell}}, cut where the header's columns start (an
    empty cell, such as a model's LAST-REQUEST before any request, is "")."""
    header, *lines = [line for line in table.splitlines() if line.strip()]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    found = {}
    for line in lines:
        cells = [
            line[begin:end].strip()
            for begin, end in zip(starts, [*starts[1:], len(line) + 1], strict=True)
        ]
        found[cells[0]] = dict(zip(names, cells, strict=True))
    return found


@pytest.mark.timeout(240)
async def test_kubectl_get_fills_every_column(tmp_path: Path) -> None:
    with emulator() as api:
        objects = Objects(api)
        kubectl = Kubectl(api.kubeconfig_path, api.home)
        try:
            async with agents(api, tmp_path, names=("node-a",)):
                with operator(api):
                    named = model("named")
                    named["spec"]["model"]["name"] = "classify-x"
                    plain = model("plain")
                    del plain["spec"]["model"]["name"]
                    for body in (named, plain):
                        objects.apply(body)
                    for name in ("named", "plain"):
                        await wait_ready(objects, name)

                    def table() -> dict[str, dict[str, str]] | None:
                        out = kubectl.run("get", "md", "-o", "wide", check=True).stdout
                        found = rows(out)
                        if any(row["RESIDENT"] == "0" for row in found.values()):
                            return None  # a status not yet written with its bytes
                        return found

                    shown = await until(table, "both models' bytes in the table")
                    swapnodes = rows(
                        kubectl.run("get", "swapnodes", "-o", "wide", check=True).stdout
                    )
                    statuses = {n: (objects.get(n) or {})["status"] for n in ("named", "plain")}
                    explained = kubectl.run(
                        "explain", "modeldeployments.spec.swapPolicy.idleAfter", check=True
                    ).stdout
        finally:
            objects.close()
    assert shown["named"]["MODEL"] == "classify-x"
    assert shown["plain"]["MODEL"] == "plain"  # spec.model.name omitted: the object's name
    for name, row in shown.items():
        status = statuses[name]
        assert (row["NODE"], row["READY"], row["REASON"]) == ("node-a", "True", "Serving"), row
        assert row["RESIDENT"] == format_bytes(status["residentBytes"]), (row, status)
        assert row["RESIDENT"].endswith(("Ki", "Mi", "Gi")), row  # not a raw byte count
        assert row["HOST"] == format_bytes(status["hostBytes"]), (row, status)
        # no conversations on these models: the KV column is there, and empty per tier
        assert row["KV"] == status["kv"]["shown"] == "0/0", (row, status)
        assert row["SWAP-INS"] == str(status["swapIns"]) and row["GPU"] == status["gpu"]
    node = swapnodes["node-a"]
    assert (node["LEASE"], node["GPUS"], node["MODELS"]) == ("Live", "2", "2"), node
    assert node["HBM-FREE"].endswith("Mi"), node  # two 256Mi sim GPUs, 64Mi+ taken
    assert node["ENDPOINT"].startswith("https://"), node
    assert "pinned" in explained and "pressure" in explained, explained


TEAM = "team-gone"
MODELS = 6


class _Collected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def warnings_logged() -> Iterator[_Collected]:
    """Every WARNING-or-worse record logged inside (the operator runs in a thread of this
    process, kopf's loggers included)."""
    handler = _Collected()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


@pytest.mark.timeout(240)
async def test_deleting_a_namespace_of_models_is_quiet(tmp_path: Path) -> None:
    """The agent of a namespace's models stops as the namespace is deleted: the models stay
    held (the operator cannot free them until the node counts as lost) while the namespace
    refuses new content. The operator posts at most one Event per model there (refused 403:
    those under way when it began refusing), logs no warning or error about it, and every
    finalizer goes once the node is lost."""
    with emulator(namespaces=(TEAM,)) as api:
        objects = Objects(api)
        try:
            async with agents(api, tmp_path, names=("node-a",)) as nodes:
                with operator(api):
                    for i in range(MODELS):
                        objects.apply(model(f"m-{i}", TEAM))
                    for i in range(MODELS):
                        await wait_ready(objects, f"m-{i}", TEAM)
                    api.clear_request_log()
                    with warnings_logged() as logged:
                        await nodes["node-a"].agent.stop()
                        objects.core.delete_namespace(TEAM)

                        def gone() -> bool:
                            try:
                                objects.core.read_namespace(TEAM)
                            except client.ApiException as e:
                                return e.status == 404
                            return False

                        await until(gone, f"namespace {TEAM} deleted", 60)
            refused = [
                (r.verb, r.resource, r.name)
                for r in api.request_log()
                if r.namespace == TEAM and r.code == 403
            ]
        finally:
            objects.close()
    about_team = [
        f"{r.name} {r.levelname}: {r.getMessage()}"
        for r in logged.records
        if TEAM in r.getMessage() or "m-" in r.getMessage()
    ]
    assert about_team == [], "\n".join(about_team[:20])
    # Posts already under way when the namespace began refusing (the models' Events as
    # their agent stopped, sent side by side) are refused too, at most one per model;
    # after the first refusal nothing more is posted there (it was one per model per
    # transition, 4,531 for 200 models, before).
    assert len(refused) <= MODELS, refused[:20]
