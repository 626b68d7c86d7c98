"""The agent's pure parts: placement, the policy's node view, settings, source mapping."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from modelswap_api.control import DesiredEntry, SourceCredentials
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeploymentSpec, Source
from modelswap_api.policy import effective_policy
from modelswap_sidecar.agent.core.loading import authorization_of, map_source
from modelswap_sidecar.agent.core.placement import Deferral, Placement, place
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.views import GpuBudget, model_view, node_view
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import load_settings, settings_from_document
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.inputs import PolicySettings, Residency
from modelswap_sidecar.sources.errors import CredentialsInvalid

MIB = 1 << 20


def uid_of(name: str) -> str:
    """A UID (UUID) per test name."""
    return str(uuid.uuid5(uuid.NAMESPACE_DNS, name))


def model(uid: str, gpu: int | None, serving: Serving, *, mib: int = 32, **swap: Any) -> AgentModel:
    spec = {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": f"{mib}Mi"}}
    if swap:
        spec["swapPolicy"] = swap
    entry = DesiredEntry(
        uid=uid_of(uid),
        namespace="ns",
        name=uid,
        generation=1,
        spec=ModelDeploymentSpec.from_dict(spec),
        policy=effective_policy(spec, BUILTIN_DEFAULTS).to_status(),
    )
    m = AgentModel(entry=entry, policy=effective_policy(spec, BUILTIN_DEFAULTS))
    m.gpu, m.serving = gpu, serving
    return m


GPUS = [GpuBudget(ordinal=0, uuid="g0", budget_bytes=96 * MIB),
        GpuBudget(ordinal=1, uuid="g1", budget_bytes=96 * MIB)]  # fmt: skip


def test_view_leaves_out_models_that_claim_no_hbm() -> None:
    models = [
        model("a", 0, Serving.LOADED),
        model("b", 1, Serving.LOADING),
        model("c", None, Serving.DEFERRED),
        model("d", 0, Serving.UNLOADED),
        model("e", 1, Serving.FAILED),
    ]
    view = node_view(models, {models[0].triton_name: EngineState.DRAINING}, GPUS, 10.0)
    assert {m.uid: m.residency for m in view.models} == {
        uid_of("a"): Residency.SWAPPING_OUT,
        uid_of("b"): Residency.LOADING,
    }
    assert view.used_bytes("g0") == view.used_bytes("g1") == 32 * MIB


def test_placement_prefers_the_freer_gpu_and_defers_what_cannot_fit() -> None:
    held = [model("a", 0, Serving.LOADED, pinned=True)]
    view = node_view(held, {held[0].triton_name: EngineState.RESIDENT}, GPUS, 10.0)
    settings = PolicySettings()
    new = model("n", None, Serving.PENDING)
    candidate = model_view(new, Residency.SWAPPED_OUT, "g0", 10.0)
    decision = place(view, candidate, ["g0", "g1"], 10.0, settings)
    assert isinstance(decision, Placement) and decision.gpu == "g1" and not decision.victims

    big = model_view(
        model("big", None, Serving.PENDING, mib=200), Residency.SWAPPED_OUT, "g0", 10.0
    )
    decision = place(view, big, ["g0", "g1"], 10.0, settings)
    assert isinstance(decision, Deferral) and decision.reason == "InsufficientHBM"
    assert "LargerThanBudget" in decision.message


def test_placement_swaps_out_an_idle_victim_but_never_a_pinned_one() -> None:
    held = [
        model("pinned", 0, Serving.LOADED, mib=64, pinned=True),
        model("idle", 1, Serving.LOADED, mib=64, minResident="0s"),
    ]
    states = {m.triton_name: EngineState.RESIDENT for m in held}
    view = node_view(held, states, GPUS, 100.0)
    new = model_view(model("n", None, Serving.PENDING, mib=64), Residency.SWAPPED_OUT, "g0", 100.0)
    decision = place(view, new, ["g0", "g1"], 100.0, PolicySettings())
    assert isinstance(decision, Placement)
    assert decision.gpu == "g1" and [v.uid for v in decision.victims] == [uid_of("idle")]
    decision = place(view, new, ["g0"], 100.0, PolicySettings())
    assert isinstance(decision, Deferral)


def test_mounted_sources_are_mapped_and_urls_left_alone() -> None:
    roots = {"/models": Path("/srv/m"), "/models/special": Path("/other")}
    assert map_source(Source(uri="/models/mlp"), roots).uri == "/srv/m/mlp"
    assert map_source(Source(uri="/models/special/x"), roots).uri == "/other/x"
    assert map_source(Source(uri="/modelsx/y"), roots).uri == "/modelsx/y"
    assert map_source(Source(uri="https://h/m.tar.gz"), roots).uri == "https://h/m.tar.gz"


def test_credentials_become_one_authorization_header() -> None:
    assert authorization_of(None) is None
    assert authorization_of(SourceCredentials(bearer_token="t")) == "Bearer t"
    assert authorization_of(SourceCredentials(username="u", password="p")) == "Basic dTpw"
    assert authorization_of(SourceCredentials(headers={"Authorization": "X y"})) == "X y"


def test_credentials_from_files_are_trimmed_and_line_breaks_refused_unseen() -> None:
    """Issue 12, finding 4: a Secret made from a file ends in a newline."""
    assert authorization_of(SourceCredentials(bearer_token="secret\n")) == "Bearer secret"
    assert authorization_of(SourceCredentials(bearer_token=" secret\r\n")) == "Bearer secret"
    basic = SourceCredentials(username="u\n", password="p\n")
    assert authorization_of(basic) == "Basic dTpw"
    assert authorization_of(SourceCredentials(headers={"authorization": "X y\n"})) == "X y"
    for bad in (
        SourceCredentials(bearer_token="a\nb-secret"),
        SourceCredentials(bearer_token="a\0b-secret"),
        SourceCredentials(username="u", password="a\rb-secret"),
        SourceCredentials(headers={"Authorization": "Bearer a\nb-secret"}),
    ):
        with pytest.raises(CredentialsInvalid) as refused:
            authorization_of(bad)
        message = str(refused.value)
        assert message.startswith("spec.model.source.credentialsSecretRef: ")
        assert "secret" not in message.removeprefix("spec.model.source.credentialsSecretRef")
        assert "a\nb" not in message and "a\rb" not in message


def _doc(**more: Any) -> dict[str, Any]:
    return {
        "nodeName": "n",
        "gpus": [{"capacityBytes": "128Mi"}, {"uuid": "g-1", "capacityBytes": 1 << 27}],
        "hostStore": {"dir": "/s"},
        "socketDir": "/run",
        "stateDir": "/st",
        "sourceCache": {"dir": "/c"},
        "control": {"tokenFile": "/t"},
        "triton": {"url": "127.0.0.1:8000", "repository": "/r"},
        **more,
    }


def test_settings_read_once_with_defaults_and_overrides(tmp_path: Path) -> None:
    settings = settings_from_document(_doc())
    assert settings.gpu_uuids == ("sim-gpu-0", "g-1")
    assert settings.gpus[0].capacity_bytes == 128 * MIB
    assert settings.socket_path == Path("/run/agent.sock")
    # no policy defaults: entries carry their effective policy; an old `defaults` is ignored
    assert not hasattr(settings, "defaults")
    assert settings_from_document(_doc(defaults={"swapPolicy": {}})) == settings
    path = tmp_path / "agent.yaml"
    path.write_text(__import__("yaml").safe_dump(_doc()))
    settings = load_settings(path, {"control.port": 1234, "nodeName": "other", "logLevel": None})
    assert (settings.control_port, settings.node_name) == (1234, "other")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nodeName": None}, "nodeName"),
        ({"gpus": []}, "gpus"),
        ({"gpus": [{"capacityBytes": "1.5Gi"}]}, "gpus[0].capacityBytes"),
        ({"triton": {"repository": "/r"}}, "triton.url"),
        ({"allocator": "cuda"}, "allocator"),
    ],
)
def test_bad_settings_name_the_key(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SettingsError, match=field.replace("[", r"\[").replace("]", r"\]")):
        settings_from_document(_doc(**change))


def test_a_runtime_that_cannot_attach_is_reported_and_served_with_drop_semantics() -> None:
    python = model("py", 0, Serving.LOADED)
    assert python.loaded_reason() == ("Loaded", "") and not python.drops
    onnx = model("onnx", 0, Serving.LOADED)
    onnx.attaches, onnx.runtime_backend = False, "onnxruntime"
    reason, message = onnx.loaded_reason()
    assert reason == "UnsupportedRuntime"
    assert "onnxruntime backend cannot map modelswap memory" in message
    assert "onSwapOut: drop" in message
    assert onnx.drops  # swap-out unloads it from Triton; swap-in reloads from the source
    view = node_view([onnx], {}, GPUS, now_seconds=0.0)
    (seen,) = view.models
    assert seen.residency is Residency.RESIDENT  # charged to its GPU while Triton holds it
