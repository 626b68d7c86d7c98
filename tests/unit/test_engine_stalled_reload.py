"""A dropped model swapped in and waiting for the request that loads its weights (engine
LOADING, every live instance mapped, nothing committed): a swap-out or a caller's victim
list takes it and drops it, losing nothing; the policy weighs it as resident (issue 12,
finding 7). The swapper in-process, as in test_engine_swapper."""

from __future__ import annotations

from typing import cast

import pytest

from modelswap_api.wire import Op
from modelswap_sidecar.engine.errors import ClientFailed, WrongState
from modelswap_sidecar.engine.events import SwapKind
from modelswap_sidecar.engine.records import ModelRecord
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.swaps import awaiting_reload
from modelswap_sidecar.model_states import Serving, charged_residency
from modelswap_sidecar.policy.inputs import Residency
from tests.unit.test_engine_swapper import (  # noqa: F401 - `parts` is a fixture
    MIB,
    Parts,
    parts,
    resident,
    used,
)

S = EngineState


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Parts:
    """test_engine_swapper's `parts`: a 12 MiB sim GPU, a host store, a fake transport."""
    return cast(Parts, request.getfixturevalue("parts"))


def reloading(p: Parts, name: str) -> ModelRecord:
    """As a drop's swap-in leaves it: fresh chunks mapped, no host copy, not committed."""
    m = resident(p, name)
    p.swapper.discard_host_copies(m)
    m.state = S.LOADING
    return m


def test_a_reload_waiting_for_its_request_is_dropped_by_a_swap_out(engine: Parts) -> None:
    m = reloading(engine, "a")
    assert awaiting_reload(m) and used(engine) == 8 * MIB
    engine.swapper.swap_out_locked(m, "ReloadTimedOut")
    assert m.state is S.DROPPED and used(engine) == 0
    assert engine.transport.ops["0"] == [Op.QUIESCE, Op.UNMAP]
    assert [(e.kind, e.dropped) for e in engine.events] == [(SwapKind.OUT, True)]


def test_a_reload_waiting_for_its_request_is_a_victim(engine: Parts) -> None:
    b = resident(engine, "b")
    engine.swapper.swap_out_locked(b)
    a = reloading(engine, "a")
    engine.events.clear()
    engine.swapper.swap_in_locked(b, victims=["a"])
    assert a.state is S.DROPPED and b.state is S.RESIDENT and used(engine) == 8 * MIB


def test_a_refused_drop_of_a_waiting_reload_leaves_it_loading(engine: Parts) -> None:
    m = reloading(engine, "a")
    engine.transport.refuse = {("0", Op.QUIESCE)}
    with pytest.raises(ClientFailed):
        engine.swapper.swap_out_locked(m)
    assert m.state is S.LOADING and used(engine) == 8 * MIB


def test_a_load_with_no_instance_mapped_is_not_swapped_out(engine: Parts) -> None:
    m = reloading(engine, "a")
    m.instances["0"].mapped = False
    assert not awaiting_reload(m)
    with pytest.raises(WrongState):
        engine.swapper.swap_out_locked(m)


def test_the_policy_weighs_a_loaded_model_the_engine_reloads_as_resident() -> None:
    residency = charged_residency(Serving.LOADED, attaches=True, engine_state=S.LOADING)
    assert residency is Residency.RESIDENT
