"""A stand-alone engine process for integration tests and the benchmark.

    python -m tests.support.engine_agent --socket S --control C --store DIR \
        --gpu-bytes 128M --gpu-bytes 128M --model a:0:preserve --model b:1:discard:drop

The engine serves clients on `--socket`; a test drives it over `--control` (a Unix
stream socket, one JSON object per line each way): vouch, swap_out, swap_in, remove,
status, pool_full.
Vouching is exactly what the test registers (`RegisteredVoucher`).

Fault injection (test-only): `--pause-at NAME` (repeatable; names from
`engine.core.CHECKPOINTS`) makes the engine stop at that checkpoint: the agent prints
`paused NAME` on stdout and blocks that operation forever, so a test kills it exactly
there instead of racing a timer.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modelswap_api.wire import KvMode, SwapOutMode
from modelswap_sidecar.allocators.base import Location
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.core import CHECKPOINTS, Engine, EngineSettings, as_dict
from modelswap_sidecar.engine.errors import EngineError
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import ModelConfig
from modelswap_sidecar.engine.server import EngineServer, harden_process
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.vouching import RegisteredVoucher

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    if text[-1] in UNITS:
        return int(text[:-1]) * UNITS[text[-1]]
    return int(text)


def status_doc(engine: Engine, allocator: SimAllocator) -> dict[str, Any]:
    return {
        "recovering": engine.recovering,
        "recovery_waiters": engine.recovery_waiters,
        "models": {s.name: as_dict(s) for s in engine.statuses()},
        "gpus": [
            {
                "gpu": g,
                "budget_used_bytes": engine.budget(g).used_bytes,
                "budget_bytes": engine.budget(g).budget_bytes,
                "overhead_bytes": engine.budget(g).overhead_bytes,
                "processes": engine.budget(g).processes,
                "allocator_used_bytes": allocator.memory_info(Location.device(g)).used_bytes,
                "pooled_bytes": allocator.pooled_bytes(Location.device(g)),
                "capacity_bytes": allocator.memory_info(Location.device(g)).total_bytes,
                "host_store_bytes": engine.host_store_bytes(g),
            }
            for g in engine.gpus
        ],
    }


def serve_control(
    path: str, engine: Engine, allocator: SimAllocator, voucher: RegisteredVoucher
) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    print("ready", flush=True)

    def session(conn: socket.socket) -> None:
        with conn, conn.makefile("rw") as f:
            for line in f:
                cmd = json.loads(line)
                out: dict[str, Any] = {"ok": True}
                try:
                    op = cmd["cmd"]
                    if op == "vouch":
                        voucher.register(int(cmd["pid"]), str(cmd["model"]))
                    elif op == "swap_out":
                        engine.swap_out(cmd["model"])
                    elif op == "swap_in":
                        lru_decider(engine)(cmd["model"])
                    elif op == "remove":
                        engine.remove_model(cmd["model"])
                    elif op == "status":
                        out["status"] = status_doc(engine, allocator)
                    elif op == "pool_full":
                        out["full"] = allocator.wait_pool_full(float(cmd.get("timeout", 30)))
                except EngineError as e:
                    out = {"ok": False, "code": str(e.code), "error": str(e)}
                f.write(json.dumps(out) + "\n")
                f.flush()

    while True:
        conn, _ = server.accept()
        threading.Thread(target=session, args=(conn,), daemon=True).start()


def residents_by_last_use(engine: Engine, gpu: int) -> list[str]:
    """The resident models on `gpu`, least recently used first, read from the engine's
    model table under its lock (the engine orders no victims itself: the agent's policy
    does)."""
    table = engine._table
    with table.lock:
        resident = [
            m for m in table.records() if m.config.gpu == gpu and m.state is EngineState.RESIDENT
        ]
        resident.sort(key=lambda m: m.last_used)
        return [m.name for m in resident]


def lru_decider(engine: Engine) -> Callable[[str], None]:
    """A client's own swap-in, decided as the engine alone once did: every other resident
    model on the GPU, least recently used first, offered as a victim (the agent asks its
    policy instead)."""

    def decide(name: str) -> None:
        others = [v for v in residents_by_last_use(engine, engine.gpu_of(name)) if v != name]
        engine.swap_in(name, victims=others)

    return decide


def pausing_checkpoint(names: set[str]) -> Callable[[str], None]:
    """A checkpoint that announces itself on stdout and never returns at `names`."""
    unknown = names - set(CHECKPOINTS)
    if unknown:
        raise SystemExit(f"unknown checkpoints {sorted(unknown)}; known: {CHECKPOINTS}")
    forever = threading.Event()

    def checkpoint(name: str) -> None:
        if name in names:
            print(f"paused {name}", flush=True)
            forever.wait()  # until the test kills this process

    return checkpoint


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--control", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--gpu-bytes", action="append", required=True)
    p.add_argument("--store-bytes", default="4G", help="host store capacity per GPU")
    p.add_argument("--pool-chunk-bytes", default="32M")
    p.add_argument("--model", action="append", default=[], help="name:gpu[:kv mode[:onSwapOut]]")
    p.add_argument("--grace", type=float, default=5.0)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument(
        "--kv-tier",
        action="append",
        default=[],
        help="name:offloadAfterTokens:hostBytes (the model's kvCache policy)",
    )
    p.add_argument(
        "--sim-overhead", default=None, help="what the sim allocator measures per process"
    )
    p.add_argument("--overhead-estimate", default="0", help="the engine's per-process estimate")
    p.add_argument("--heartbeat-timeout", type=float, default=30.0)
    p.add_argument(
        "--pace-gbps",
        action="append",
        default=[],
        help="gpu:GB/s — that GPU's clients pace their copies (the agent's gpus[].paceGBps)",
    )
    p.add_argument("--pause-at", action="append", default=[], help="a checkpoint to stop at")
    defaults = EngineSettings()
    p.add_argument("--max-connections", type=int, default=defaults.max_connections)
    p.add_argument(
        "--max-connections-per-process", type=int, default=defaults.max_connections_per_process
    )
    p.add_argument("--register-timeout", type=float, default=defaults.register_timeout_seconds)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="agent %(levelname)s %(name)s: %(message)s")
    harden_process()
    capacities = [parse_bytes(g) for g in args.gpu_bytes]
    allocator = SimAllocator(
        capacities_bytes=capacities,
        pool_chunk_bytes=parse_bytes(args.pool_chunk_bytes),
        overhead_bytes_per_process=(
            None if args.sim_overhead is None else parse_bytes(args.sim_overhead)
        ),
    )
    store = HostStore(
        Path(args.store), dict.fromkeys(range(len(capacities)), parse_bytes(args.store_bytes))
    )
    voucher = RegisteredVoucher()
    settings = EngineSettings(
        readopt_grace_seconds=args.grace,
        drain_timeout_seconds=args.drain_timeout,
        overhead_bytes_per_process=parse_bytes(args.overhead_estimate),
        heartbeat_timeout_seconds=args.heartbeat_timeout,
        max_connections=args.max_connections,
        max_connections_per_process=args.max_connections_per_process,
        register_timeout_seconds=args.register_timeout,
        pace_bytes_per_second={
            int(gpu): float(gbps) * 1e9 for gpu, gbps in (p.split(":") for p in args.pace_gbps)
        },
    )
    engine = Engine(
        allocator,
        store,
        voucher,
        settings,
        pausing_checkpoint(set(args.pause_at)),
        decider=lambda name: lru_decider(engine)(name),  # noqa: PLW0108 - engine built here
    )
    engine.recover()
    kv_tiers: dict[str, tuple[int | None, int]] = {}
    for spec in args.kv_tier:
        name, offload, host = spec.split(":")
        kv_tiers[name] = (int(offload), parse_bytes(host))
    for spec in args.model:
        name, gpu, *rest = spec.split(":")
        kv = KvMode(rest[0]) if rest else KvMode.DISCARD
        on_swap_out = SwapOutMode(rest[1]) if len(rest) > 1 else SwapOutMode.HOST
        offload, host_bytes = kv_tiers.get(name, (None, 0))
        engine.add_model(
            ModelConfig(
                name,
                int(gpu),
                kv,
                on_swap_out=on_swap_out,
                kv_offload_after_tokens=offload,
                kv_host_bytes=host_bytes,
            )
        )
    server = EngineServer(engine, Path(args.socket))
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    serve_control(args.control, engine, allocator, voucher)
    return 0


if __name__ == "__main__":
    sys.exit(main())
