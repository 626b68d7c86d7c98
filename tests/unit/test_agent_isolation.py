"""One record's fault stays that record's (issue 12, finding 1): a record the agent cannot
hold is never made, and a model whose report, view or route raises is reported `Failed`
with reason `AgentError` while every other model is handled as usual."""

from __future__ import annotations

import logging
import uuid
from typing import Any, cast

import pytest

from modelswap_api.control import DesiredEntry
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeploymentSpec
from modelswap_api.policy import effective_policy
from modelswap_sidecar.agent.core.isolation import each_record
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.views import GpuBudget, node_view
from modelswap_sidecar.agent.ports import reports
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.model_states import Serving

MIB = 1 << 20
SPEC = {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}}
GPUS = [GpuBudget(ordinal=0, uuid="g0", budget_bytes=96 * MIB)]


def model(name: str, uid: str | None = None) -> AgentModel:
    entry = DesiredEntry(
        uid=uid or str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        namespace="ns",
        name=name,
        generation=1,
        spec=ModelDeploymentSpec.from_dict(SPEC),
        policy=effective_policy(SPEC, BUILTIN_DEFAULTS).to_status(),
    )
    m = AgentModel(entry=entry, policy=effective_policy(SPEC, BUILTIN_DEFAULTS))
    m.gpu, m.serving = 0, Serving.LOADING
    return m


class FlakyEngine:
    """Knows no model; `status` of the names in `broken` raises an unexpected error."""

    def __init__(self, *broken: str) -> None:
        self.broken = set(broken)

    def status(self, name: str) -> Any:
        if name in self.broken:
            raise RuntimeError("engine bookkeeping broke")
        raise UnknownModel(name)

    def host_bytes_of(self, name: str) -> int:
        raise UnknownModel(name)


def test_a_record_whose_uid_is_not_a_uuid_is_never_made() -> None:
    with pytest.raises(ValueError, match="not a UID"):
        model("bad", uid="not-a-uuid")


def test_a_model_whose_report_fails_is_listed_failed_and_the_others_as_usual(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good, bad = model("good"), model("bad")
    engine = FlakyEngine(bad.triton_name)
    with caplog.at_level(logging.DEBUG, logger="modelswap_sidecar.agent.core.isolation"):
        for _ in range(3):  # every policy tick and every GET reads them again
            infos = reports.model_infos(cast(Engine, engine), [bad, good], ("g0",))
    assert [(i.uid, i.phase) for i in infos] == [(bad.uid, "Failed"), (good.uid, "Loading")]
    assert infos[0].reason == "AgentError" and "RuntimeError" in (infos[0].message or "")
    assert "bookkeeping" not in (infos[0].message or "")  # the exception's text stays out
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(logged) == 1 and logged[0].exc_info is not None  # once, with its traceback

    engine.broken.clear()  # it works again: reported as it is
    infos = reports.model_infos(cast(Engine, engine), [bad, good], ("g0",))
    assert (infos[0].uid, infos[0].phase, infos[0].reason) == (bad.uid, "Loading", None)


def test_the_hbm_view_weighs_the_others_when_one_model_cannot_be_weighed() -> None:
    class Unweighable(AgentModel):
        @property
        def weights_bytes(self) -> int:
            raise KeyError("weightsBytes")

    good, bad = model("good"), model("bad")
    broken = Unweighable(entry=bad.entry, policy=bad.policy, gpu=0, serving=Serving.LOADING)
    view = node_view([broken, good], {}, GPUS, 10.0)
    assert [m.uid for m in view.models] == [good.uid]
    assert broken.faults and not good.faults


def test_each_record_goes_on_past_a_failing_record() -> None:
    a, b, c = model("a"), model("b"), model("c")

    def work(m: AgentModel) -> str:
        if m is b:
            raise ValueError("no")
        return m.entry.name

    assert each_record([a, b, c], "visit", work) == ["a", "c"]
    assert set(b.faults) == {"visit"}
