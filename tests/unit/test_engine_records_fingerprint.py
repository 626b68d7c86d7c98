"""The fingerprint a client commits its weights with survives the agent's state file."""

from __future__ import annotations

from modelswap_api.wire import KvMode, RegionKind
from modelswap_sidecar.engine.records import (
    InstanceRecord,
    ModelConfig,
    ModelRecord,
    RegionRecord,
    from_doc,
    to_doc,
)
from modelswap_sidecar.engine.states import EngineState


def test_fingerprint_round_trips_and_an_older_state_file_reads_as_none() -> None:
    m = ModelRecord(ModelConfig("m", 0, KvMode.DISCARD), EngineState.RESIDENT, 3)
    inst = InstanceRecord("0", committed=True, fingerprint="v1;layout=ab;source=cd")
    inst.regions["weights"] = RegionRecord("weights", 2 << 20, RegionKind.WEIGHTS, 1 << 30)
    m.instances["0"] = inst
    doc = to_doc({"m": m})
    assert from_doc(doc)["m"].instances["0"].fingerprint == "v1;layout=ab;source=cd"
    del doc["models"]["m"]["instances"]["0"]["fingerprint"]  # written by an older agent
    assert from_doc(doc)["m"].instances["0"].fingerprint == ""
