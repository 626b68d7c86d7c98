"""The gateway's request path under cProfile, for `bench.gateway`'s notes.

`python -m bench.gateway_profiled TRITON_URL UID OUT`: serves the gateway app as the agent
does (`modelswap_sidecar.gateway.app.make_app` + `start`, on the agent's event loop) in
front of TRITON_URL, routing `default/tiny` to UID (always resident: a directory that
never swaps), and prints its URL. Until SIGUSR1 it serves unprofiled and counts the
process's CPU time (user + system) per answered request; from SIGUSR1 it profiles its
event loop until SIGTERM; then it writes both to OUT, the profile as the top functions by
own time. The agent's gateway shares its process with the engine and the policy loop; this
one runs alone, so both show the gateway's own cost per request.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import signal
import sys
from pathlib import Path

from modelswap_sidecar.agent.running import new_event_loop
from tests.support.gateway_fakes import FakeDirectory, route, served_gateway

#: the event loop's idle wait: time with nothing to do, not work
_IDLE = frozenset({"<method 'poll' of 'select.epoll' objects>"})


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


async def serve(triton_url: str, uid: str) -> str:
    directory = FakeDirectory([route("tiny", "default", uid=uid)], resident=[uid])
    profile_now, stop = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, profile_now.set)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    profiler = cProfile.Profile()
    labels = {"uid": uid, "namespace": "default", "model": "tiny", "code": "200"}
    async with served_gateway(directory, triton_url, local_mode=True) as served:
        print(served.url, flush=True)
        cpu_from = _cpu_seconds()
        await profile_now.wait()
        cpu_seconds = _cpu_seconds() - cpu_from
        unprofiled = served.metric("modelswap_gateway_requests_total", **labels)
        profiler.enable()
        await stop.wait()
        profiler.disable()
        # answered requests (each records its model's use twice: arrival and answer)
        requests = int(served.metric("modelswap_gateway_requests_total", **labels) - unprofiled)
    requests = requests or 1
    stats = pstats.Stats(profiler)
    rows = sorted(
        (kv for kv in stats.stats.items() if kv[0][2] not in _IDLE),  # type: ignore[attr-defined]
        key=lambda kv: kv[1][2],
        reverse=True,
    )[:12]
    busy = sum(v[2] for k, v in stats.stats.items() if k[2] not in _IDLE)  # type: ignore[attr-defined]
    parts = [
        f"{func} ({Path(file).name}:{line}) {tt / requests * 1e6:.0f} us"
        for (file, line, func), (_cc, _nc, tt, _ct, _callers) in rows
    ]
    return (
        f"unprofiled: {int(unprofiled)} requests, {cpu_seconds / max(unprofiled, 1) * 1e6:.0f} us "
        f"of the gateway process's CPU time (user + system) per request; profiled: {requests} "
        f"requests, {busy / requests * 1e3:.2f} ms of its event loop per request (profiler "
        "overhead included); by own time per request: " + "; ".join(parts)
    )


def main() -> int:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:  # the agent's event loop
        text = runner.run(serve(sys.argv[1], sys.argv[2]))
    Path(sys.argv[3]).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
