"""`make bench-kv`: a Llama's KV cache in the tiered KV pool, through the real engine.

A small Llama (randomly initialised, built here with transformers: no weights to fetch)
runs over `modelswap_client.kv_cache` and `kv_sessions`, its weights adopted into a
region and its K/V in the pool's blocks, attached to an engine in this process (sim
backend by default; `--backend cuda-vmm` on an NVIDIA GPU, the model then on CUDA). The
client is this process too, vouched for by pid, as tests/gpu/test_gpu_kv_cache.py does.

1. HBM KV bytes against sequence length, with and without `offloadAfterTokens`: one
   conversation grown turn by turn to each length, on a model without a host tier and on
   one with `offloadAfterTokens`; at each length the pool's own accounting (blocks taken
   from each tier times the block size) and, beside it, what the agent was told with the
   heartbeats (`modelswap_kv_blocks{tier}`'s source). Nothing is computed from the length.
2. The time to continue a conversation of `--conversation-tokens` (2,000) after a swap:
   with `kv: preserve`, with `kv: discard` (its prefix computed again from its token ids)
   and with no swap, side by side in every repetition (the order rotates), one untimed
   warm-up round first. Timed: from the follow-up's start (the swap-in, when the model is
   out) to the last generated token. The tokens reused and computed again are the session
   store's counters (what the heartbeats carry to the agent's metrics), and every
   continuation's tokens are checked against plain transformers with no cache tricks.

Needs torch and transformers 5.x (the `cache` argument; the bench stops when the pool
stays empty, as it does under 4.x, which takes `cache` silently). `managed` is no choice:
no engine allocator serves it (the managed mapper is in-process only).

Batch shaping by sequence length (`spec.gateway.batchShaping`) is measured by
`bench/shaping.py` (`make bench-shaping`), not here.

SIGTERM and SIGINT end the run cleanly (the engine closed, the scratch folder removed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import results_schema, scratch

MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("sim", "cuda-vmm")
VOCAB = 1024
TOKENS_PER_BLOCK = 16
#: sim GPU capacity and host-store capacity: room for four small models and their KV
SIM_CAPACITY_BYTES = 512 * MIB
STORE_BYTES = 1024 * MIB
SIM_POOL_CHUNK_BYTES = 32 * MIB
#: how long the agent may take to show what the heartbeats carry (interval 0.1 s)
AGENT_REPORT_DEADLINE_SECONDS = 30.0
HEARTBEAT_INTERVAL_SECONDS = 0.1
SCENARIOS = ("no swap", "preserve", "discard")
#: the agent's KV figures the bench reads
NEEDED = {"device_blocks", "host_blocks", "tokens_reused", "tokens_recomputed"}

NOTES = [
    "Model: a randomly initialised Llama built locally with transformers (4 layers, hidden "
    "256, 8 attention heads, 4 KV heads, vocabulary 1,024, float32): K/V of 4 KiB per token; "
    "pool blocks of 16 tokens (64 KiB). Its weights are adopted into a region "
    "(modelswap_client.torch.adopt), so a swap moves weights and KV alike.",
    "HBM KV bytes: the pool's own accounting (blocks taken from the HBM tier x block bytes), "
    "after a conversation was grown turn by turn to each length; 'agent' is what the agent "
    "was told in the heartbeats (KvSessionStore.report: device_blocks/host_blocks, the source "
    "of modelswap_kv_blocks{tier}) times the block bytes. Both models' KV regions "
    "(spec.model.kvCacheBytes) hold the longest sequence, so only offloadAfterTokens differs.",
    "Continue after a swap: a conversation whose first turn ended at the stated length "
    "(prompt plus generated tokens) gets a follow-up of new user tokens and generates more; "
    "timed from the follow-up's start (swap-in included when the model was swapped out) to "
    "its last token. Swap-out is untimed. 'no swap', 'preserve' and 'discard' run side by "
    "side in every repetition, in a rotating order, after one untimed warm-up round; "
    "'x no swap' is the median over repetitions of each repetition's ratio.",
    "Recomputed and reused tokens: the session store's counters over the follow-up turn (what "
    "the heartbeats carry to the agent's modelswap_kv_tokens_recomputed_total and "
    "reused); 'agent' totals are the agent's view at the end of the run. 'tokens right': "
    "every continuation equals plain transformers' greedy tokens (no pool cache).",
    "Batch shaping by sequence length (spec.gateway.batchShaping) is measured by "
    "make bench-shaping (its own section), not by this bench.",
]

SIM_NOTES = [
    "Backend sim: both KV tiers and the weights are host memory and the model runs on the "
    "CPU, so the byte figures are the pool's placement (which tier each block came from), "
    "not GPU memory; the times are CPU compute plus the sim engine's swap (memfd copies), "
    "not a GPU link. 'discard' costs the prefix's recompute on this CPU; on a GPU the "
    "recompute is faster and the swap-in's copy slower, so the ratio there differs.",
]


def _torch() -> Any:
    import torch  # noqa: PLC0415 - a heavy import, at use

    return torch


def build_model(device: str) -> Any:
    """The bench's Llama, the same weights every call (seed 0)."""
    import transformers  # noqa: PLC0415

    torch = _torch()
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    )
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(config)
    return model.eval().to(device)


def _round_up(n: int, to: int = 2 * MIB) -> int:
    return -(-n // to) * to


@dataclass
class Node:
    """An engine in this process, its protocol server and the socket a client attaches to."""

    engine: Any
    socket_path: str
    backend: str
    device: str  # torch's device for the model


@contextmanager
def node(backend: str, workdir: Path, models: list[Any]) -> Iterator[Node]:
    """An engine on `backend` serving `models` (engine `ModelConfig`s) on GPU 0, with this
    process vouched for as each."""
    from modelswap_sidecar.engine.core import Engine, EngineSettings  # noqa: PLC0415
    from modelswap_sidecar.engine.hoststore import HostStore  # noqa: PLC0415
    from modelswap_sidecar.engine.server import EngineServer  # noqa: PLC0415
    from modelswap_sidecar.engine.vouching import RegisteredVoucher  # noqa: PLC0415

    allocator: Any
    if backend == "sim":
        from modelswap_sidecar.allocators.sim import SimAllocator  # noqa: PLC0415

        allocator = SimAllocator(
            capacities_bytes=[SIM_CAPACITY_BYTES], pool_chunk_bytes=SIM_POOL_CHUNK_BYTES
        )
        device = "cpu"
    else:
        from modelswap_sidecar.allocators.cuda_vmm import CudaVmmAllocator  # noqa: PLC0415
        from modelswap_sidecar.gpu.nvml import NvmlMemory  # noqa: PLC0415

        allocator = CudaVmmAllocator(gpus=[0], nvml=NvmlMemory.open(), chunk_bytes=2 * MIB)
        device = "cuda"
    store = HostStore(workdir / "store", {0: STORE_BYTES})
    voucher = RegisteredVoucher()
    engine = Engine(
        allocator,
        store,
        voucher,
        EngineSettings(readopt_grace_seconds=1.0),
        decider=lambda name: engine.swap_in(name),  # noqa: PLW0108 - built by this call
    )
    with ExitStack() as stack:
        stack.callback(allocator.close)
        stack.callback(engine.close)
        engine.recover()
        for config in models:
            voucher.register(os.getpid(), config.name)
            engine.add_model(config)
        sock = workdir / "agent.sock"
        server = EngineServer(engine, sock)
        server.start()
        stack.callback(server.close)
        yield Node(engine, str(sock), backend, device)


class World:
    """One attached model: its region-backed Llama, its KV pool and session store."""

    def __init__(self, node: Node, name: str, kv_region_bytes: int) -> None:
        from modelswap_client import kv_cache  # noqa: PLC0415
        from modelswap_client import torch as mstorch  # noqa: PLC0415
        from modelswap_client.client import RegionSpec, attach  # noqa: PLC0415
        from modelswap_client.kv_sessions import KvSessionStore  # noqa: PLC0415

        self.node = node
        self.name = name
        model = build_model(node.device)
        weights_bytes = _round_up(mstorch.required_bytes(model))
        self.att = attach(
            name,
            [RegionSpec("weights", weights_bytes), RegionSpec("kv", kv_region_bytes, "kv")],
            socket_path=node.socket_path,
            mapper=node.backend,
            timeout_seconds=120,
            heartbeat_interval_seconds=HEARTBEAT_INTERVAL_SECONDS,
        )
        try:
            mstorch.adopt(self.att, model)
            self.model = model
            self.kv = kv_cache.for_attachment(
                self.att, model.config, tokens_per_block=TOKENS_PER_BLOCK
            )
            self.store = KvSessionStore(
                self.kv, namespace="bench", model=name, max_sessions=4, hold=self.att.in_use
            )
            self.att.report_kv(self.store.report)
        except BaseException:
            self.att.close()
            raise

    @property
    def block_bytes(self) -> int:
        return int(self.kv.pool.block_bytes)

    def tier_bytes(self) -> tuple[int, int]:
        """(HBM, host) bytes the pool has handed out: its free lists' own accounting."""
        pool = self.kv.pool
        hbm = (pool.hbm_blocks - pool.hbm_blocks_free) * pool.block_bytes
        host = (pool.host_blocks - pool.host_blocks_free) * pool.block_bytes
        return hbm, host

    def check_cached(self, sid: str, tokens: int) -> None:
        """The pool holds `tokens` of session `sid`: the model wrote its K/V through the
        pool cache. A transformers without the `cache` argument (4.x names it
        `past_key_values`) takes the keyword silently and leaves the pool empty, and every
        byte figure would read 0: refuse that instead of recording it."""
        held = int(self.kv.pool.tokens(sid))
        if held != tokens:
            raise RuntimeError(
                f"{self.name}: the pool holds {held} tokens of {sid}, not {tokens}: the model "
                "did not write its K/V through the pool cache (transformers 5.x, with the "
                "`cache` argument, is needed)"
            )

    def agent_kv(self) -> dict[str, int]:
        """What the agent holds from this model's heartbeats, once it equals what the store
        reports now (the heartbeats run every 0.1 s); raises when it never does."""
        want = self.store.report()
        deadline = time.monotonic() + AGENT_REPORT_DEADLINE_SECONDS
        while True:
            seen = self.node.engine.status(self.name).kv.as_doc()
            # the figures both sides name (a newer client may report more than the agent
            # keeps, or the reverse); blocks and tokens are always among them
            common = seen.keys() & want.keys()
            if common >= NEEDED and all(seen[k] == want[k] for k in common):
                return dict(seen)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: the agent shows {seen}, the store {want}")
            time.sleep(HEARTBEAT_INTERVAL_SECONDS / 2)

    def close(self) -> None:
        self.att.close()


def _prompt(n: int, seed: int, device: str) -> Any:
    torch = _torch()
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (1, n), generator=g).to(device)


# -- 1. HBM KV bytes against sequence length ---------------------------------------------------


def sweep(world: World, lengths: list[int], offload: int | None) -> list[dict[str, Any]]:
    """Grow one conversation turn by turn to each length; the tiers' bytes at each."""
    torch = _torch()
    ids = _prompt(max(lengths), seed=7, device=world.node.device)
    rows = []
    for length in lengths:
        with world.store.turn("sweep", ids[:, :length], world.model) as turn, torch.no_grad():
            held = turn.cache.tokens
            world.model(input_ids=ids[:, held:length], cache=turn.cache, use_cache=True)
            turn.keep(ids[:, :length])
        world.check_cached("sweep", length)
        hbm, host = world.tier_bytes()
        agent = world.agent_kv()
        stats = world.store.stats()
        rows.append(
            results_schema.result(
                "kv_bytes_at_length",
                {
                    "offload_after_tokens": offload,
                    "sequence_tokens": length,
                    "cached_tokens": int(world.kv.pool.tokens("sweep")),
                    "kv_region_bytes": int(world.kv.pool.hbm_bytes),
                    "host_tier_bytes": int(world.kv.pool.host_blocks * world.block_bytes),
                    "block_bytes": world.block_bytes,
                    "tokens_per_block": TOKENS_PER_BLOCK,
                },
                [float(hbm)],
                unit="bytes",
                hbm_bytes=hbm,
                host_bytes=host,
                session_hbm_bytes=stats.device_blocks * world.block_bytes,
                agent_hbm_bytes=agent["device_blocks"] * world.block_bytes,
                agent_host_bytes=agent["host_blocks"] * world.block_bytes,
            )
        )
        print(
            f"offloadAfterTokens {offload if offload is not None else 'off':>5}: "
            f"{length:5d} tokens: HBM {hbm / MIB:7.3f} MiB, host {host / MIB:7.3f} MiB "
            f"(agent: HBM {agent['device_blocks'] * world.block_bytes / MIB:7.3f} MiB, "
            f"host {agent['host_blocks'] * world.block_bytes / MIB:7.3f} MiB)",
            flush=True,
        )
    world.store.forget("sweep")
    return rows


# -- 2. continuing a conversation after a swap -------------------------------------------------


@dataclass
class Continuation:
    total_seconds: float
    swap_in_seconds: float
    turn_seconds: float
    swap_out_seconds: float
    reused_tokens: int
    recomputed_tokens: int
    tokens_right: bool


def _generate(world: World, ids: Any, cache: Any, new: int) -> Any:
    torch = _torch()
    with torch.no_grad():
        return world.model.generate(
            ids, cache=cache, max_new_tokens=new, min_new_tokens=new, do_sample=False
        )


def continue_once(
    world: World,
    scenario: str,
    sid: str,
    *,
    first_ids: Any,
    follow_new: Any,
    new: int,
    expected: Callable[[Any], Any],
) -> Continuation:
    """A conversation's first turn (untimed), the swap the scenario names (untimed), then
    the follow-up turn, timed from its start to its last token."""
    torch = _torch()
    with world.store.turn(sid, first_ids, world.model) as turn:
        first = _generate(world, first_ids, turn.cache, new)
        turn.keep(first)
    world.check_cached(sid, first.shape[1] - 1)  # the last token's K/V is never computed
    swap_out_seconds = 0.0
    if scenario != "no swap":
        started = time.perf_counter()
        world.node.engine.swap_out(world.name)
        swap_out_seconds = time.perf_counter() - started
    follow = torch.cat([first, follow_new], dim=1)
    before = world.store.stats()
    started = time.perf_counter()
    with world.att.in_use():  # the swap-in, when the model is out
        resident = time.perf_counter()
    with world.store.turn(sid, follow, world.model) as turn:
        out = _generate(world, follow, turn.cache, new)
        turn.keep(out)
    ended = time.perf_counter()
    after = world.store.stats()
    world.store.forget(sid)
    return Continuation(
        total_seconds=ended - started,
        swap_in_seconds=resident - started,
        turn_seconds=ended - resident,
        swap_out_seconds=swap_out_seconds,
        reused_tokens=after.tokens_reused - before.tokens_reused,
        recomputed_tokens=after.tokens_recomputed - before.tokens_recomputed,
        tokens_right=bool(torch.equal(out, expected(follow))),
    )


def continuations(
    worlds: dict[str, World],
    reference: Any,
    *,
    conversation_tokens: int,
    follow_tokens: int,
    new_tokens: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """Every scenario once per repetition, side by side, after one untimed round."""
    torch = _torch()
    device = reference.device

    def plain(ids: Any) -> Any:
        with torch.no_grad():
            return reference.generate(
                ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
            )

    runs: dict[str, list[Continuation]] = {s: [] for s in SCENARIOS}
    for rep in range(-1, repeats):  # rep -1: warm-up, discarded
        first_ids = _prompt(conversation_tokens - new_tokens, seed=100 + rep, device=device)
        follow_new = _prompt(follow_tokens, seed=200 + rep, device=device)
        shift = rep % len(SCENARIOS)
        for scenario in SCENARIOS[shift:] + SCENARIOS[:shift]:
            world = worlds["discard" if scenario == "discard" else "preserve"]
            c = continue_once(
                world,
                scenario,
                f"{scenario}-{rep}",
                first_ids=first_ids,
                follow_new=follow_new,
                new=new_tokens,
                expected=plain,
            )
            if rep >= 0:
                runs[scenario].append(c)
            print(
                f"{'warm-up' if rep < 0 else f'rep {rep}'}: {scenario:8s} continue "
                f"{c.total_seconds * 1e3:8.1f} ms (swap-in {c.swap_in_seconds * 1e3:7.1f} ms, "
                f"turn {c.turn_seconds * 1e3:8.1f} ms), reused {c.reused_tokens}, "
                f"recomputed {c.recomputed_tokens}, tokens right: {c.tokens_right}",
                flush=True,
            )
    agent = {name: w.agent_kv() for name, w in worlds.items()}
    rows = []
    for scenario in SCENARIOS:
        cs = runs[scenario]
        ratios = [
            c.total_seconds / base.total_seconds
            for c, base in zip(cs, runs["no swap"], strict=True)
        ]
        model = "discard" if scenario == "discard" else "preserve"
        rows.append(
            results_schema.result(
                "continue_after_swap",
                {
                    "scenario": scenario,
                    "model": model,
                    "conversation_tokens": conversation_tokens,
                    "follow_tokens": follow_tokens,
                    "new_tokens": new_tokens,
                    "repeats": repeats,
                    "reused_tokens_each": [c.reused_tokens for c in cs],
                    "recomputed_tokens_each": [c.recomputed_tokens for c in cs],
                },
                [c.total_seconds for c in cs],
                swap_in_seconds=statistics.median(c.swap_in_seconds for c in cs),
                turn_seconds=statistics.median(c.turn_seconds for c in cs),
                swap_out_seconds=statistics.median(c.swap_out_seconds for c in cs),
                ratio_to_no_swap=statistics.median(ratios),
                reused_tokens=statistics.median(c.reused_tokens for c in cs),
                recomputed_tokens=statistics.median(c.recomputed_tokens for c in cs),
                tokens_right=float(all(c.tokens_right for c in cs)),
                agent_tokens_recomputed=agent[model]["tokens_recomputed"],
                agent_tokens_reused=agent[model]["tokens_reused"],
            )
        )
        rows[-1]["metrics"].update(results_schema.spread([c.total_seconds for c in cs]))
    return rows


# -- the run -----------------------------------------------------------------------------------


def run(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    from modelswap_api.wire import KvMode  # noqa: PLC0415
    from modelswap_client.kv_cache import kv_shape_of  # noqa: PLC0415
    from modelswap_sidecar.engine.records import ModelConfig  # noqa: PLC0415

    torch = _torch()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    lengths = sorted({int(x) for x in args.lengths.split(",")})  # one conversation, grown
    offload = args.offload_after_tokens
    shape = kv_shape_of(build_model("cpu").config, tokens_per_block=TOKENS_PER_BLOCK)
    # every tier holds the longest sequence (and the conversation with its follow-up): only
    # offloadAfterTokens decides where a block goes
    longest = max(*lengths, args.conversation_tokens + args.follow_tokens + args.new_tokens)
    kv_region_bytes = _round_up(shape.bytes_for(longest + TOKENS_PER_BLOCK))
    host_bytes = _round_up(shape.bytes_for(longest + TOKENS_PER_BLOCK))
    preserve, discard = KvMode.PRESERVE, KvMode.DISCARD
    models = [ModelConfig("hbm-only", 0, preserve)] + [
        ModelConfig(name, 0, mode, kv_offload_after_tokens=offload, kv_host_bytes=host_bytes)
        for name, mode in (("offload", preserve), ("preserve", preserve), ("discard", discard))
    ]
    results: list[dict[str, Any]] = []
    with node(args.backend, workdir, models) as n, ExitStack() as worlds_open:

        def world(name: str) -> World:
            w = World(n, name, kv_region_bytes)
            worlds_open.callback(w.close)
            return w

        for name, tier in (("hbm-only", None), ("offload", offload)):
            w = world(name)
            got = w.att.kv_offload_after_tokens
            if got != tier:
                raise RuntimeError(f"{name}: the agent gave offloadAfterTokens {got}, not {tier}")
            results += sweep(w, lengths, tier)
        worlds = {name: world(name) for name in ("preserve", "discard")}
        reference = build_model(n.device)  # plain transformers, never in a region
        rows = continuations(
            worlds,
            reference,
            conversation_tokens=args.conversation_tokens,
            follow_tokens=args.follow_tokens,
            new_tokens=args.new_tokens,
            repeats=args.repeats,
        )
        results += rows
        for r in rows:
            m = r["metrics"]
            print(
                f"{r['params']['scenario']:8s}: continue {r['median'] * 1e3:8.1f} ms "
                f"(x{m['ratio_to_no_swap']:.2f} no swap; swap-in {m['swap_in_seconds'] * 1e3:.1f} "
                f"ms), recomputed {m['recomputed_tokens']:g}, reused {m['reused_tokens']:g}, "
                f"tokens right {bool(m['tokens_right'])}",
                flush=True,
            )
    return results


def _gpu_name(backend: str) -> str:
    if backend == "sim":
        return "none"
    return str(_torch().cuda.get_device_name(0))


def write(args: argparse.Namespace, results: list[dict[str, Any]], load: list[float]) -> Path:
    options = "".join(f" {a}" for a in args.argv)
    return results_schema.write(
        "kv",
        f"python -m bench.kv{options}" if options else "make bench-kv (python -m bench.kv)",
        results,
        NOTES + (SIM_NOTES if args.backend == "sim" else []),
        backend=args.backend,
        scaled=False,
        load_average_start=load,
        gpu=_gpu_name(args.backend),
        out=Path(args.out) if args.out else None,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--backend", choices=BACKENDS, default="sim")
    p.add_argument("--lengths", default="64,128,256,384,512,768,1024,1536,2048")
    p.add_argument("--offload-after-tokens", type=int, default=512)
    p.add_argument("--conversation-tokens", type=int, default=2000)
    p.add_argument("--follow-tokens", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=11)
    p.add_argument("--out", default="", help="write the result here instead of bench/results")
    p.add_argument("--no-results", action="store_true", help="print only; write no result file")
    args = p.parse_args(argv)
    given = list(sys.argv[1:] if argv is None else argv)
    # the command recorded: the options that shape the figures, not where they went
    args.argv = []
    skip = False
    for a in given:
        if skip or a == "--no-results" or a.startswith("--out="):
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        args.argv.append(a)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        lengths = []
    if not lengths or min(lengths) < 1:
        p.error(f"--lengths: token counts above 0, comma-separated, not {args.lengths!r}")
    if args.repeats < 1 or args.conversation_tokens <= args.new_tokens:
        p.error("need --repeats >= 1 and --conversation-tokens above --new-tokens")
    scratch.unwind_on_signals()
    load = results_schema.load_average()
    with scratch.directory("modelswap-bench-kv-", "/dev/shm") as tmp:
        print(f"workdir {tmp}", flush=True)
        results = run(args, Path(tmp))
    if args.no_results:
        return 0
    path = write(args, results, load)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
