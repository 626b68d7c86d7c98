"""`make bench-kv` kept honest: a small run of bench.kv end to end (a real engine on the sim
backend, a Llama over the tiered pool) writes every figure, and the figures agree with
each other — with offloadAfterTokens the HBM tier's bytes stop growing there and the rest
lands in the host tier; the agent's view (the heartbeats) equals the pool's accounting;
`preserve` recomputes no prefix token and `discard` the whole prefix; every continuation
has plain transformers' tokens. No timing is asserted. The render's reading of the doc,
and the checks the bench itself makes, are tested on doctored figures."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import kv, render, results_schema

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = (16, 32, 48, 64, 96)
OFFLOAD = 32
CONVERSATION = 80
FOLLOW, NEW, REPEATS = 8, 4, 2


def _shm() -> set[Path]:
    return set(Path("/dev/shm").glob("modelswap-bench-kv-*"))


@pytest.fixture(scope="module")
def bench_doc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("bench-kv") / "kv.json"
    before = _shm()
    done = subprocess.run(
        [sys.executable, "-m", "bench.kv", "--lengths", ",".join(map(str, LENGTHS)),
         "--offload-after-tokens", str(OFFLOAD), "--conversation-tokens", str(CONVERSATION),
         "--follow-tokens", str(FOLLOW), "--new-tokens", str(NEW), "--repeats", str(REPEATS),
         "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not _shm() - before  # its scratch folder (the host store) is gone
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["_stdout"] = done.stdout
    return doc


def _sizes(doc: dict[str, Any], offload: int | None) -> dict[int, dict[str, Any]]:
    return {
        r["params"]["sequence_tokens"]: r
        for r in doc["results"]
        if r["name"] == "kv_bytes_at_length" and r["params"]["offload_after_tokens"] == offload
    }


def _continuations(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        r["params"]["scenario"]: r for r in doc["results"] if r["name"] == "continue_after_swap"
    }


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_kv_bytes_stop_growing_in_hbm_past_offload_after_tokens(bench_doc: dict[str, Any]) -> None:
    doc = bench_doc
    assert doc["schema"] == results_schema.SCHEMA and doc["bench"] == "kv"
    assert doc["backend"] == "sim" and doc["machine"]["gpu"] == "none"
    assert "--offload-after-tokens 32" in doc["command"] and "--out" not in doc["command"]
    off, on = _sizes(doc, None), _sizes(doc, OFFLOAD)
    assert sorted(off) == sorted(on) == list(LENGTHS)
    block = on[LENGTHS[0]]["params"]["block_bytes"]
    per_block = on[LENGTHS[0]]["params"]["tokens_per_block"]
    for length in LENGTHS:
        a, b = off[length]["metrics"], on[length]["metrics"]
        assert off[length]["params"]["cached_tokens"] == on[length]["params"]["cached_tokens"]
        assert off[length]["params"]["cached_tokens"] == length
        # without a host tier every block is in HBM; with one, the same blocks in all
        assert a["host_bytes"] == 0 and a["hbm_bytes"] == -(-length // per_block) * block
        assert b["hbm_bytes"] + b["host_bytes"] == a["hbm_bytes"]
        if length <= OFFLOAD:
            assert b["host_bytes"] == 0 and b["hbm_bytes"] == a["hbm_bytes"]
        else:  # HBM holds offloadAfterTokens' blocks, no more
            assert b["hbm_bytes"] == OFFLOAD // per_block * block and b["host_bytes"] > 0
        for m in (a, b):  # the agent was told what the pool holds
            assert m["agent_hbm_bytes"] == m["hbm_bytes"] == m["session_hbm_bytes"]
            assert m["agent_host_bytes"] == m["host_bytes"]
    past = [on[n]["metrics"] for n in LENGTHS if n > OFFLOAD]
    assert all(x["host_bytes"] < y["host_bytes"] for x, y in itertools.pairwise(past))


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_preserve_reuses_the_prefix_and_discard_recomputes_it(bench_doc: dict[str, Any]) -> None:
    conts = _continuations(bench_doc)
    assert list(conts) == ["no swap", "preserve", "discard"]
    prefix = CONVERSATION - 1  # the last token's K/V is never computed
    for name, r in conts.items():
        m, p = r["metrics"], r["params"]
        assert len(r["samples"]) == REPEATS and all(s > 0 for s in r["samples"])
        assert m["tokens_right"] == 1.0, name
        assert p["conversation_tokens"] == CONVERSATION
        if name == "discard":
            assert p["recomputed_tokens_each"] == [prefix] * REPEATS
            assert p["reused_tokens_each"] == [0] * REPEATS
            assert m["swap_out_seconds"] > 0 and m["swap_in_seconds"] > 0
        else:
            assert p["recomputed_tokens_each"] == [0] * REPEATS
            assert p["reused_tokens_each"] == [prefix] * REPEATS
    assert conts["no swap"]["metrics"]["swap_out_seconds"] == 0
    assert conts["no swap"]["metrics"]["ratio_to_no_swap"] == 1.0
    # the agent's counters (the metrics' source), warm-up round included: the discard
    # model recomputed every prefix it had, the preserve model none
    assert conts["discard"]["metrics"]["agent_tokens_recomputed"] == prefix * (REPEATS + 1)
    assert conts["preserve"]["metrics"]["agent_tokens_recomputed"] == 0
    # no swap and preserve share one model: both rounds' follow-ups and first turns reused
    assert conts["preserve"]["metrics"]["agent_tokens_reused"] >= 2 * prefix * (REPEATS + 1)


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_render_reads_the_run(bench_doc: dict[str, Any]) -> None:
    page = "\n".join(render.render_doc(bench_doc))
    assert "## `kv` on " in page
    assert f"stay at {OFFLOAD * 4096 / 2**20:.3f} MiB from {OFFLOAD} tokens on" in page
    assert "is measured by make bench-shaping (its own section), not by this bench" in page
    assert "**no**" not in page and "do not stay flat" not in page
    for scenario in ("no swap", "preserve", "discard"):
        assert f"| {scenario} | " in page


def _doctored(doc: dict[str, Any]) -> dict[str, Any]:
    """The run's doc with the HBM tier growing past offloadAfterTokens, the agent's view
    disagreeing at one length and one continuation's tokens wrong."""
    bad = copy.deepcopy(doc)
    on = _sizes(bad, OFFLOAD)
    for key in ("hbm_bytes", "agent_hbm_bytes"):  # grown, and the agent agreeing
        on[LENGTHS[-1]]["metrics"][key] += 1 << 20
    on[LENGTHS[-2]]["metrics"]["agent_host_bytes"] += 1
    _continuations(bad)["discard"]["metrics"]["tokens_right"] = 0.0
    return bad


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_render_says_when_the_figures_are_wrong(bench_doc: dict[str, Any]) -> None:
    page = "\n".join(render.render_doc(_doctored(bench_doc)))
    assert "**do not stay flat** past offloadAfterTokens" in page
    assert page.count("| **no** |") == 2  # the agent's disagreement, the wrong tokens


class _Status:
    def __init__(self, doc: dict[str, int]) -> None:
        self.kv = self
        self._doc = doc

    def as_doc(self) -> dict[str, int]:
        return self._doc


def test_the_bench_refuses_an_agent_that_never_shows_the_pools_figures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the agent was told must catch up with the store within the deadline, or the
    bench stops instead of recording an unconfirmed figure."""
    monkeypatch.setattr(kv, "AGENT_REPORT_DEADLINE_SECONDS", 0.3)
    world = object.__new__(kv.World)
    world.name = "m"
    want = {"device_blocks": 3, "host_blocks": 1, "tokens_reused": 5, "tokens_recomputed": 0}
    world.store = type("Store", (), {"report": lambda self: {**want, "hits": 1}})()
    seen = {**want, "device_blocks": 2}
    engine = type("Engine", (), {"status": lambda self, name: _Status(seen)})()
    world.node = kv.Node(engine, "", "sim", "cpu")
    with pytest.raises(RuntimeError, match="the agent shows"):
        world.agent_kv()
    del seen["tokens_recomputed"]  # a figure the agent does not keep is no agreement
    seen["device_blocks"] = 3
    with pytest.raises(RuntimeError, match="the agent shows"):
        world.agent_kv()
    seen["tokens_recomputed"] = 0  # the store's extra figure (hits) is not compared
    assert world.agent_kv() == want


def test_the_bench_refuses_a_model_that_bypassed_the_pool_cache() -> None:
    """A transformers that ignores the `cache` keyword leaves the pool empty: the bench
    stops rather than record 0 bytes (seen on a GPU machine with transformers 4.x)."""
    world = object.__new__(kv.World)
    world.name = "m"
    held = {"s": 0}
    pool = type("Pool", (), {"tokens": lambda self, sid: held[sid]})()
    world.kv = type("Kv", (), {"pool": pool})()
    with pytest.raises(RuntimeError, match="did not write its K/V through the pool cache"):
        world.check_cached("s", 64)
    held["s"] = 64
    world.check_cached("s", 64)


@pytest.mark.parametrize(
    "argv", [["--repeats", "0"], ["--conversation-tokens", "4", "--new-tokens", "8"],
             ["--backend", "managed"], ["--lengths", "0,16"], ["--lengths", "16,x"]],
)  # fmt: skip
def test_bad_arguments_are_refused_before_anything_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        kv.main(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err
