"""`make bench-operator`: the real operator over 2,000 ModelDeployments and 100 SwapNodes.

Three processes besides this one: the API emulator (`tests.support.kube_emulator`, its
own process), 100 fake node agents (`bench.fake_nodes`: the real control API app over
InMemoryBackend, plain HTTP, and the agent's real heartbeat writing SwapNodes and node
Leases) and `modelswap operator --allow-plain-http` as a subprocess. Measured:

- time from the first of 2,000 ModelDeployments created (8 client threads) until every
  one reads Ready=True (polled with a list every 2 s), and the creation alone;
- planner time: the operator's modelswap_operator_plan_duration_seconds (sum, count);
- API writes per second at steady state (after all are Ready, over a window): the
  operator's (modelswap_operator_kube_calls of write helpers) and the agents' (SwapNode
  status writes and Lease renewals);
- the operator's CPU (utime + stime from /proc over the window) and resident memory.

Target: all 2,000 placed and Ready within 120 s.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client as kclient

from bench import results_schema, scratch
from modelswap_api import kube
from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.kube_emulator.hosting import EmulatorProcess, kubeconfig

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "bench-token-" + "x" * 24
GROUP, VERSION, PLURAL = "modelswap.io", "v1alpha1", "modeldeployments"
TARGET_SECONDS = 120.0
WRITE_PREFIXES = ("create", "patch", "replace", "delete", "update", "post", "put")


def cluster_manifest(nodes: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [
        yaml.safe_load(p.read_text()) for p in sorted((ROOT / "crds").glob("*.yaml"))
    ]
    for name in ("modelswap-system", "modelswap-node-leases"):
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for i in range(nodes):
        name = f"node-{i:03d}"
        labels = {"kubernetes.io/hostname": name, "pool": f"pool-{i % 4}"}
        objects.append(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        )

    objects.append({"apiVersion": "v1", "kind": "Secret",
                    "metadata": {"name": "modelswap-control-token",
                                 "namespace": "modelswap-system"},
                    "data": {"token": base64.b64encode(TOKEN.encode()).decode()}})  # fmt: skip
    return objects


def deployment(index: int) -> dict[str, Any]:
    """Weights 1-7 GiB, spread priorities: 2,000 of them fill about 1/8 of 800 x 80 GB."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": f"m{index:04d}", "namespace": "default"},
        "spec": {
            "model": {"runtime": "triton", "source": {"uri": "/models/mlp"},
                      "weightsBytes": f"{1 + index % 7}Gi"},
            "swapPolicy": {"priority": index % 20 * 50},
        },
    }  # fmt: skip


def _metrics(url: str) -> dict[str, float]:
    """Every sample of a Prometheus text page, keyed by its full line name."""
    text = httpx.get(url, timeout=30, trust_env=False).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def _sum(samples: dict[str, float], prefix: str, *, writes: bool = False) -> float:
    total = 0.0
    for k, v in samples.items():
        if not k.startswith(prefix):
            continue
        if writes and not any(f'call="{w}' in k for w in WRITE_PREFIXES):
            continue
        total += v
    return total


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _ready_count(custom: Any) -> tuple[int, int, Counter[str]]:
    """(Ready=True, placed, why the others are not Ready) from one list."""
    items = custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)["items"]
    ready = placed = 0
    why: Counter[str] = Counter()
    for item in items:
        conditions = {c["type"]: c for c in (item.get("status") or {}).get("conditions") or ()}
        is_ready = conditions.get("Ready", {}).get("status") == "True"
        ready += is_ready
        placed += conditions.get("Placed", {}).get("status") == "True"
        if not is_ready:
            why[
                " / ".join(
                    f"{k}={c.get('status')}:{c.get('reason')}"
                    for k, c in sorted(conditions.items())
                )
                or "no status"
            ] += 1
    return ready, placed, why


class ProfiledEmulator:
    """The emulator as EmulatorProcess runs it, but under cProfile (`--profile`): the same
    module and manifest; SIGINT ends it so cProfile writes its file."""

    def __init__(self, manifest: Path, work: Path) -> None:
        self.profile = work / "emulator.pstats"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cProfile", "-o", str(self.profile),
             "-m", "tests.support.kube_emulator", "--manifest", str(manifest)],
            cwd=ROOT, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready = json.loads(self.proc.stdout.readline())
        self.kubeconfig_path = work / "kubeconfig"
        self.kubeconfig_path.write_text(json.dumps(kubeconfig(ready["url"], ready["token"])))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


#: the event loop's idle wait and thread joins: time with nothing to do, not work
_IDLE = ("poll' of 'select.epoll", "acquire' of '_thread.lock", "'wait' of", "sleep")


def profile_summary(path: Path, who: str, own: str) -> str:
    """Top functions of `path` (pstats) by own time, and `own` code's by cumulative time."""
    if not path.exists():
        return f"{who}: no profile written"
    stats = pstats.Stats(str(path))
    items = [
        kv
        for kv in stats.stats.items()  # type: ignore[attr-defined]
        if not any(idle in kv[0][2] for idle in _IDLE)
    ]
    total = sum(v[2] for _, v in items)

    def name(key: tuple[str, int, str]) -> str:
        file, line, func = key
        short = "/".join(Path(file).parts[-2:]) if line else file
        return f"{func} ({short}:{line})"

    by_own = sorted(items, key=lambda kv: kv[1][2], reverse=True)[:10]
    mine = sorted((kv for kv in items if own in kv[0][0]), key=lambda kv: kv[1][3], reverse=True)[
        :10
    ]
    return (
        f"{who}: {total:.1f} s of CPU in its main thread (profiled run; idle waits left out). "
        "By own time: "
        + "; ".join(f"{name(k)} {v[2]:.1f} s ({v[1]} calls)" for k, v in by_own)
        + f". Its own code ({own}) by cumulative time: "
        + "; ".join(f"{name(k)} {v[3]:.1f} s" for k, v in mine)
    )


def run(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    with scratch.directory("modelswap-bench-operator-") as tmp:
        work = Path(tmp)
        manifest = work / "cluster.yaml"
        manifest.write_text(yaml.safe_dump_all(cluster_manifest(args.nodes)))
        token_file = work / "token"
        token_file.write_text(TOKEN)
        with contextlib.ExitStack() as stack:
            if args.profile:
                emu: Any = ProfiledEmulator(manifest, work)
                stack.callback(emu.stop)
                emulator_pid = emu.proc.pid
            else:
                emu = stack.enter_context(EmulatorProcess(manifests=[manifest], start_timeout_s=60))
                emulator_pid = emu._proc.pid  # its pid: for CPU
            kubeconfig_path = str(emu.kubeconfig_path)
            stats = work / "fakes.json"
            logs = {n: (work / f"{n}.log").open("wb") for n in ("fakes", "operator")}
            fakes = subprocess.Popen(
                [sys.executable, "-m", "bench.fake_nodes", "--kubeconfig", kubeconfig_path,
                 "--token-file", str(token_file), "--state-dir", str(work / "state"),
                 "--nodes", str(args.nodes), "--stats", str(stats)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=logs["fakes"], start_new_session=True,
            )  # fmt: skip
            port = free_loopback_port()
            profiler = (
                ["-m", "cProfile", "-o", str(work / "operator.pstats")] if args.profile else []
            )
            operator = subprocess.Popen(
                [sys.executable, *profiler, "-m", "modelswap_api.cli", "operator",
                 "--kubeconfig", kubeconfig_path,
                 "--all-namespaces", "--allow-plain-http", "--grace-seconds", "30",
                 "--http-port", str(port), "--plain-logs", "--log-level", "warning",
                 "--identity", "bench-operator",
                 # under the profilers every call is slower: a longer leader Lease keeps a
                 # slow renewal from ending the run (the timed run keeps the defaults)
                 *(["--leader-lease-seconds", "120", "--leader-renew-seconds", "10"]
                   if args.profile else [])],
                cwd=ROOT, stdout=logs["operator"], stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            metrics_url = f"http://127.0.0.1:{port}/metrics"
            try:
                assert fakes.stdout is not None
                if fakes.stdout.readline().strip() != b"ready":
                    raise RuntimeError(f"fakes: {(work / 'fakes.log').read_text()[-3000:]}")
                _wait(
                    lambda: _live_nodes(metrics_url) >= args.nodes,
                    180,
                    "every node live at the operator",
                    operator,
                    work,
                )
                pids = {"operator": operator.pid, "emulator": emulator_pid, "fakes": fakes.pid}
                rows, notes = _measure(
                    args, kubeconfig_path, metrics_url, operator, stats, pids=pids
                )
            except BaseException:
                sys.stderr.write((work / "operator.log").read_text()[-4000:])
                sys.stderr.write((work / "fakes.log").read_text()[-4000:])
                raise
            finally:
                # SIGINT first: the operator exits 0 and cProfile writes its file
                _stop(operator, signal.SIGINT if args.profile else signal.SIGTERM)
                _stop(fakes)
                for f in logs.values():
                    f.close()
            if args.profile:
                emu.stop()
                if args.profile_dir is not None:  # the raw profiles, for pstats
                    args.profile_dir.mkdir(parents=True, exist_ok=True)
                    for name in ("operator.pstats", "emulator.pstats"):
                        if (work / name).exists():
                            shutil.copy(work / name, args.profile_dir / name)
                notes = [
                    profile_summary(work / "operator.pstats", "operator", "modelswap_operator"),
                    profile_summary(work / "emulator.pstats", "emulator", "kube_emulator"),
                ]
    return rows, notes


def _live_nodes(metrics_url: str) -> float:
    with contextlib.suppress(httpx.HTTPError):
        return _metrics(metrics_url).get('modelswap_operator_nodes{live="true"}', 0.0)
    return 0.0


def _wait(probe: Any, timeout: float, what: str, proc: subprocess.Popen[bytes], work: Path) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if proc.poll() is not None:
            raise RuntimeError(f"operator exited: {(work / 'operator.log').read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _measure(
    args: argparse.Namespace,
    kubeconfig: str,
    metrics_url: str,
    operator: subprocess.Popen[bytes],
    stats: Path,
    *,
    pids: dict[str, int],
) -> tuple[list[dict[str, Any]], list[str]]:
    api = kube.api_client(kubeconfig)
    custom = kclient.CustomObjectsApi(api)
    idle_window = args.window_seconds
    # the operator idle with only the nodes: CPU and memory before any model
    cpu0, t0 = _cpu_seconds(operator.pid), time.monotonic()
    time.sleep(idle_window / 2)
    cpu_empty = (_cpu_seconds(operator.pid) - cpu0) / (time.monotonic() - t0)
    before = _metrics(metrics_url)
    # who used the CPU while the models arrived: the bottleneck is whoever saturates it
    cpu_before = {name: _cpu_seconds(pid) for name, pid in pids.items()}
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: custom.create_namespaced_custom_object(
                    GROUP, VERSION, "default", PLURAL, deployment(i)
                ),
                range(args.models),
            )
        )
    created = time.monotonic() - started
    print(f"created {args.models} in {created:.1f} s", flush=True)
    ready = placed = 0
    progress: list[tuple[float, int]] = []
    deadline = started + args.timeout_seconds
    while time.monotonic() < deadline:
        ready, placed, why = _ready_count(custom)
        progress.append((time.monotonic() - started, ready))
        if ready >= args.models:
            break
        if operator.poll() is not None:
            if args.profile:  # keep what the profiles saw up to its exit, and say so
                print(f"the operator exited ({operator.returncode})", flush=True)
                break
            raise RuntimeError("the operator exited")
        time.sleep(2.0)
    all_ready = time.monotonic() - started
    cpu_ramp = {name: _cpu_seconds(pid) - cpu_before[name] for name, pid in pids.items()}
    print(f"ready {ready}/{args.models} (placed {placed}) after {all_ready:.1f} s", flush=True)
    for reason, n in why.most_common(5):
        print(f"  not ready: {n} x {reason}", flush=True)
    if operator.poll() is not None:  # profiled run that ended early: the CPU figures only
        row = results_schema.result(
            "all_placed_and_ready",
            {"models": args.models, "nodes": args.nodes},
            [all_ready],
            ready=float(ready),
            placed=float(placed),
            operator_exit_status=float(operator.returncode),
        )
        return [row], []
    after_ramp = _metrics(metrics_url)
    # steady state: nothing changes; count writes and CPU over a window
    fakes0 = json.loads(stats.read_text())
    cpu0, t0 = _cpu_seconds(operator.pid), time.monotonic()
    m0 = _metrics(metrics_url)
    time.sleep(idle_window)
    m1 = _metrics(metrics_url)
    fakes1 = json.loads(stats.read_text())
    window = time.monotonic() - t0
    cpu_idle = (_cpu_seconds(operator.pid) - cpu0) / window
    rss = _rss_bytes(operator.pid)
    op_writes = (
        _sum(m1, "modelswap_operator_kube_calls_total", writes=True)
        - _sum(m0, "modelswap_operator_kube_calls_total", writes=True)
    ) / window
    op_calls = (
        _sum(m1, "modelswap_operator_kube_calls_total")
        - _sum(m0, "modelswap_operator_kube_calls_total")
    ) / window
    agent_writes = (
        fakes1["status_writes"] + fakes1["lease_renewals"]
        - fakes0["status_writes"] - fakes0["lease_renewals"]
    ) / window  # fmt: skip
    pushes = (
        _sum(m1, "modelswap_operator_pushes_total") - _sum(m0, "modelswap_operator_pushes_total")
    ) / window
    plan_sum = _sum(after_ramp, "modelswap_operator_plan_duration_seconds_sum") - _sum(
        before, "modelswap_operator_plan_duration_seconds_sum"
    )
    plan_count = _sum(after_ramp, "modelswap_operator_plan_duration_seconds_count") - _sum(
        before, "modelswap_operator_plan_duration_seconds_count"
    )
    ramp_calls = {
        k.split('call="')[1].split('"')[0]: v - before.get(k, 0.0)
        for k, v in after_ramp.items()
        if k.startswith("modelswap_operator_kube_calls_total")
    }
    ramp_writes = sum(v for k, v in ramp_calls.items() if k.startswith(WRITE_PREFIXES))
    turn_sum = _sum(after_ramp, "modelswap_operator_reconcile_duration_seconds_sum") - _sum(
        before, "modelswap_operator_reconcile_duration_seconds_sum"
    )
    params = {"models": args.models, "nodes": args.nodes, "gpus_per_node": 8}
    ready_row = results_schema.result(
        "all_placed_and_ready",
        params,
        [all_ready],
        ready=float(ready),
        placed=float(placed),
        create_seconds=created,
        **{f"cpu_seconds_{name}": v for name, v in cpu_ramp.items()},
        **{f"ready_at_{int(t)}s": float(n) for t, n in progress[:: max(1, len(progress) // 8)]},
    )
    results_schema.target(
        ready_row, "median", "<=", TARGET_SECONDS, "2,000 models placed and Ready <= 120 s"
    )
    rows = [
        ready_row,
        results_schema.result(
            "planner_during_ramp",
            params,
            [plan_sum / plan_count if plan_count else 0.0],
            plans=plan_count,
            plan_seconds_total=plan_sum,
            reconcile_seconds_total=turn_sum,
            reconcile_turns=_sum(after_ramp, "modelswap_operator_reconcile_turns_total")
            - _sum(before, "modelswap_operator_reconcile_turns_total"),
        ),
        results_schema.result(
            "operator_kube_calls_during_ramp",
            params,
            [ramp_writes / all_ready],
            unit="writes/s",
            writes=ramp_writes,
            **{f"calls_{k}": v for k, v in sorted(ramp_calls.items()) if v},
        ),
        results_schema.result(
            "steady_state",
            {**params, "window_seconds": window},
            [op_writes],
            unit="writes/s",
            operator_writes_per_second=op_writes,
            operator_kube_calls_per_second=op_calls,
            operator_pushes_per_second=pushes,
            agent_writes_per_second=agent_writes,
            operator_cpu_fraction_idle=cpu_idle,
            operator_cpu_fraction_no_models=cpu_empty,
            operator_rss_bytes=float(rss),
        ),
    ]
    return rows, []


NOTES = [
    "Three processes on this machine besides the bench: the API emulator "
    "(tests/support/kube_emulator, plain HTTP), 100 fake agents in one process "
    "(bench/fake_nodes.py: the real control API app and ControlService over InMemoryBackend, "
    "8 GPUs x 80 GiB each, and the agent's real Heartbeat writing each SwapNode's status "
    "from that backend and renewing its Lease every 5 s), and `modelswap operator "
    "--allow-plain-http --grace-seconds 30` (defaults otherwise: batch 0.2 s, tick 1 s).",
    "all_placed_and_ready: from the first create (8 threads of the official client) until a "
    "list shows every ModelDeployment Ready=True; polled every 2 s, so up to 2 s late. "
    "create_seconds is the creation alone; ready_at_<t>s samples the progress; "
    "cpu_seconds_<process> is each process's CPU (utime+stime) over that time: the one "
    "nearest the elapsed seconds (one core each; two cores in all) is the bottleneck.",
    "planner_during_ramp: the operator's plan_duration_seconds histogram between the first "
    "create and all Ready: mean seconds per plan (the median column), plans, total.",
    "steady_state: over a window after all are Ready: the operator's Kubernetes writes per "
    "second (kube_calls of create/patch/replace/delete helpers), all its calls, its pushes "
    "to agents, the agents' writes (SwapNode status and Lease renewals), the operator's "
    "CPU (fraction of one core, /proc utime+stime) and resident memory; and its CPU idle "
    "with the 100 nodes and no model (operator_cpu_fraction_no_models).",
]


PROFILE_NOTES = [
    "The same run as `operator`, with the operator (`python -m cProfile -m modelswap_api.cli "
    "operator`) and the emulator (`python -m cProfile -m tests.support.kube_emulator`) "
    "under cProfile, to show where the time to Ready goes. cProfile sees each process's "
    "main thread (the operator's event loop; its Kubernetes calls run in a thread pool, "
    "whose work shows on the emulator's side). Times are inflated by the profilers.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--models", type=int, default=2000)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--window-seconds", type=float, default=30.0)
    p.add_argument("--timeout-seconds", type=float, default=600.0)
    p.add_argument(
        "--profile",
        action="store_true",
        help="run the operator and the emulator under cProfile; writes operator-profile.json "
        "(its times are slowed by the profilers: notes only)",
    )
    p.add_argument(
        "--profile-dir", type=Path, default=None, help="with --profile: keep the .pstats here"
    )
    p.add_argument("--no-results", action="store_true", help="print only (tests)")
    args = p.parse_args(argv)
    # SIGTERM (make, timeout) unwinds through the finally blocks that stop the children
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    load_start = results_schema.load_average()
    rows, notes = run(args)
    for r in rows:
        print(r["name"], f"{r['median']:.3f}", json.dumps(r["metrics"]), flush=True)
    for n in notes:
        print(n, flush=True)
    if args.no_results:
        return 0
    if args.profile:
        # one figure only, labelled: the ramp under both profilers (not the measurement)
        rows = [r for r in rows if r["name"] == "all_placed_and_ready"]
        rows[0]["name"] = "all_ready_under_profilers"
        rows[0].pop("targets", None)
    path = results_schema.write(
        "operator-profile" if args.profile else "operator",
        "make bench-operator-profile (python -m bench.operator_scale --profile)"
        if args.profile
        else "make bench-operator (python -m bench.operator_scale)",
        rows,
        (PROFILE_NOTES if args.profile else NOTES) + notes,
        backend="none",
        scaled=False,
        load_average_start=load_start,
    )
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
