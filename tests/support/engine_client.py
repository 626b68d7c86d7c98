"""A model process for integration tests: the client library driven over stdin/stdout.

One JSON command per stdin line, one JSON answer per stdout line:
    {"cmd": "attach", "model", "instance", "socket", "regions": [[tag, bytes, kind], ...],
     "pace_gbps": optional: the sim mapper paces copies to this emulated link (GB/s)}
    {"cmd": "fill", "tag", "seed"}        random bytes into the region (under in_use) → sha256
    {"cmd": "hash", "tag"}                sha256 of the region, under in_use (swaps in)
    {"cmd": "raw_hash", "tag", "address"} sha256 at a captured address, without in_use
    {"cmd": "commit"} {"cmd": "state"} {"cmd": "hold"} {"cmd": "release"}
    {"cmd": "stray_read", "address"}      a forked child reads it; → its exit signal
    {"cmd": "kv_pool", "tag", "block_bytes", "tokens_per_block"}   att.kv_pool(...)
    {"cmd": "kv_append", "seq", "tokens"} grow a sequence; each new block is written
        through (real memory) → its blocks' tiers and addresses, evictions, free blocks
    {"cmd": "kv_free", "seq"}
    {"cmd": "close"}
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import random
import sys
import threading
from typing import Any

from modelswap_client.client import Attachment, ClientError, RegionSpec, attach
from modelswap_client.kvpool import KvPoolFull, TieredKvPool
from modelswap_client.mappers.base import get_mapper


def fill(att: Attachment, tag: str, seed: int) -> str:
    region = att.regions[tag]
    data = random.Random(seed).randbytes(region.size_bytes)
    with att.in_use():
        ctypes.memmove(region.address, data, len(data))
    return hashlib.sha256(data).hexdigest()


def region_hash(att: Attachment, tag: str) -> str:
    region = att.regions[tag]
    with att.in_use():
        return hashlib.sha256(ctypes.string_at(region.address, region.size_bytes)).hexdigest()


def stray_read(address: int) -> int:
    pid = os.fork()
    if pid == 0:  # the child touches memory that is no longer mapped
        ctypes.string_at(address, 1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0


def main() -> int:
    att: Attachment | None = None
    pool: TieredKvPool | None = None
    hold_entered = threading.Event()
    hold_release = threading.Event()
    out = sys.stdout
    for line in sys.stdin:
        cmd: dict[str, Any] = json.loads(line)
        answer: dict[str, Any] = {"ok": True}
        try:
            op = cmd["cmd"]
            if op == "attach":
                pace = float(cmd.get("pace_gbps", 0))
                att = attach(
                    cmd["model"],
                    [RegionSpec(t, int(n), k) for t, n, k in cmd["regions"]],
                    instance=cmd.get("instance", "0"),
                    socket_path=cmd["socket"],
                    timeout_seconds=float(cmd.get("timeout", 60)),
                    heartbeat_interval_seconds=float(cmd.get("heartbeat", 5.0)),
                    mapper=get_mapper("sim", bandwidth_bytes_per_second=pace * 1e9),
                )
                answer["restored"] = att.restored
                answer["addresses"] = {t: r.address for t, r in att.regions.items()}
            elif att is None:
                raise RuntimeError("attach first")
            elif op == "fill":
                answer["sha256"] = fill(att, cmd["tag"], int(cmd["seed"]))
            elif op == "hash":
                answer["sha256"] = region_hash(att, cmd["tag"])
            elif op == "raw_hash":
                size = att.regions[cmd["tag"]].size_bytes
                raw = ctypes.string_at(int(cmd["address"]), size)
                answer["sha256"] = hashlib.sha256(raw).hexdigest()
            elif op == "commit":
                att.commit()
            elif op == "state":
                answer["state"] = str(att.state)
                answer["kv_discarded"] = att.kv_discarded
                answer["epoch"] = att.epoch
                answer["dropped"] = att.dropped
                answer["restored"] = att.restored
                answer["committed"] = att.committed
            elif op == "hold":
                hold_entered.clear()
                hold_release.clear()

                def holder(a: Attachment = att) -> None:
                    with a.in_use():
                        hold_entered.set()
                        hold_release.wait()

                threading.Thread(target=holder, daemon=True).start()
                hold_entered.wait(60)
                answer["held"] = hold_entered.is_set()
            elif op == "release":
                hold_release.set()
            elif op == "stray_read":
                answer["signal"] = stray_read(int(cmd["address"]))
            elif op == "kv_pool":
                pool = att.kv_pool(
                    cmd["tag"],
                    block_bytes=int(cmd["block_bytes"]),
                    tokens_per_block=int(cmd["tokens_per_block"]),
                )
            elif op == "kv_append":
                assert pool is not None
                added = pool.append_tokens(cmd["seq"], int(cmd["tokens"]))
                for b in added:
                    ctypes.memset(b.address, 0x5A, pool.block_bytes)
                answer["added"] = [[str(b.tier), b.address] for b in added]
                answer["blocks"] = [[str(b.tier), b.address] for b in pool.blocks(cmd["seq"])]
                answer["evicted"] = list(pool.evicted)
                answer["hbm_free"] = pool.hbm_blocks_free
                answer["host_free"] = pool.host_blocks_free
            elif op == "kv_free":
                assert pool is not None
                pool.free(cmd["seq"])
            elif op == "close":
                att.close()
                att = None
        except (ClientError, RuntimeError, TimeoutError, OSError, KvPoolFull) as e:
            answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            if isinstance(e, ClientError):
                answer["code"] = str(e.code)
        out.write(json.dumps(answer) + "\n")
        out.flush()
    if att is not None:
        with contextlib.suppress(Exception):
            att.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
