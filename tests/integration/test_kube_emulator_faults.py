"""The emulator's seeded fault injection (`faults.py`): the answers a client sees, the store
left untouched by a failed write, the request log marking each injected failure, and one
seed giving one sequence."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.kube_emulator.faults import FaultRates
from tests.support.kube_emulator.hosting import EmulatorThread

CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def configmap(i: int) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}}


def create_all(api: EmulatorThread, n: int) -> list[httpx.Response]:
    headers = {"Authorization": f"Bearer {api.token}"}
    with httpx.Client(base_url=api.url, headers=headers, trust_env=False, timeout=30) as http:
        return [http.post(CONFIGMAPS, json=configmap(i)) for i in range(n)]


def test_seeded_faults_fail_requests_leave_the_store_and_are_logged() -> None:
    rates = FaultRates(conflict=0.1, throttle=0.1, internal=0.1, seed=7, retry_after_seconds=2)
    with EmulatorThread(faults=rates) as api:
        answers = create_all(api, 200)
        codes = [r.status_code for r in answers]
        assert set(codes) == {201, 409, 429, 500}
        for r in answers:
            if r.status_code == 429:
                assert r.headers["Retry-After"] == "2"
                assert r.json()["details"]["retryAfterSeconds"] == 2
            if r.status_code != 201:
                assert r.json()["kind"] == "Status" and r.json()["code"] == r.status_code
        headers = {"Authorization": f"Bearer {api.token}"}
        listed = httpx.get(api.url + "/version", headers=headers, trust_env=False)
        assert listed.status_code == 200  # discovery and /version are never failed

        # Only the answered creates exist; every failure is in the log, marked.
        stored = {obj["metadata"]["name"] for obj in _list_all(api)}
        assert stored == {f"cm-{i}" for i, c in enumerate(codes) if c == 201}
        failed = [r for r in api.request_log() if r.fault and r.method == "POST"]
        assert [r.code for r in failed] == [c for c in codes if c != 201]
        assert all(r.fault == f"injected {r.code}" for r in failed)

    with EmulatorThread(faults=rates) as again:  # the same seed: the same sequence
        assert [r.status_code for r in create_all(again, 200)] == codes


def _list_all(api: EmulatorThread) -> list[dict[str, object]]:
    """List until a read goes through (reads are failed at the same rates, but for 409s)."""
    headers = {"Authorization": f"Bearer {api.token}"}
    for _ in range(50):
        r = httpx.get(api.url + CONFIGMAPS, headers=headers, trust_env=False)
        if r.status_code == 200:
            items: list[dict[str, object]] = r.json()["items"]
            return items
    raise AssertionError("no list answered 200 in 50 tries")


def test_a_conflict_is_a_writes_fault_never_a_reads() -> None:
    with EmulatorThread(faults=FaultRates(conflict=1.0)) as api:
        headers = {"Authorization": f"Bearer {api.token}"}
        listed = httpx.get(api.url + CONFIGMAPS, headers=headers, trust_env=False)
        assert listed.status_code == 200
        (created,) = create_all(api, 1)
        assert created.status_code == 409


def test_a_timed_out_request_is_held_then_answered_504() -> None:
    rates = FaultRates(timeout=1.0, timeout_seconds=0.5)
    with EmulatorThread(faults=rates) as api:
        began = time.monotonic()
        (answer,) = create_all(api, 1)
        assert answer.status_code == 504 and answer.json()["reason"] == "Timeout"
        assert time.monotonic() - began >= 0.5
        emulator = api.emulator
        assert emulator is not None
        stored = api.call(lambda: emulator.cluster.store.get(("", "configmaps"), "default", "cm-0"))
        assert stored is None


def test_rates_that_cannot_be_probabilities_are_refused() -> None:
    with pytest.raises(ValueError, match="sum to at most 1"):
        FaultRates(conflict=0.6, internal=0.6)


def test_faults_limited_to_a_path_and_switched_while_serving() -> None:
    with EmulatorThread() as api:
        emulator = api.emulator
        assert emulator is not None
        api.call(lambda: emulator.inject(FaultRates(internal=1.0, paths=("/configmaps/cm-1",))))
        headers = {"Authorization": f"Bearer {api.token}"}
        with httpx.Client(base_url=api.url, headers=headers, trust_env=False) as http:
            assert http.post(CONFIGMAPS, json=configmap(1)).status_code == 201
            assert http.get(f"{CONFIGMAPS}/cm-1").status_code == 500
            api.call(lambda: emulator.inject(None))
            assert http.get(f"{CONFIGMAPS}/cm-1").status_code == 200
