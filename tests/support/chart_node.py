"""The chart's node pod as the kubelet and the node image would run it: PID 1 is the real
`modelswap node` (the supervisor) with the rendered args, env and node.yaml; it starts the
real agent (`modelswap sidecar`, the command after `--`) and the real `tritonserver`, each
under the uid node.yaml names.

What differs from a cluster, and why (nothing else is changed):

- paths under the pod's volumes are folders of a temporary pod folder (`Mounts`); the
  rendered node.yaml and agent.yaml are rewritten only there (`local_paths`), and the
  `--config=` arguments name the rewritten copies;
- `kube.inCluster: true` becomes `kube.kubeconfig`: the in-cluster config reads the token
  the kubelet projects under /var/run/secrets; here the same ServiceAccount's node-bound
  token comes in a kubeconfig (group-owned by the fsGroup, mode 0440, as the kubelet
  projects the token with an fsGroup);
- the init container's script runs with those paths (as root; unprivileged, without its
  chown lines: ownership only root can give);
- the image's environment (`ENV` in images/node.Dockerfile: PATH with the agent's venv,
  PYTHONUNBUFFERED, PYTHONDONTWRITEBYTECODE) is this checkout's: `.venv/bin` (the
  `modelswap` script) and `.venv-triton/bin` (`tritonserver`) lead PATH;
- as root, the container's (and the init container's) rendered securityContext is applied
  with `setpriv`: exactly the capabilities it adds (after dropping ALL) and
  `no_new_privs` for `allowPrivilegeEscalation: false`;
- as root the supervisor runs in a mount namespace of its own (`unshare --mount`) that
  plays the image's filesystem: /etc/passwd and /etc/group with the image's users and
  groups added (parsed from the Dockerfile's `groupadd`/`useradd` lines), and this
  machine's Python (under /root, mode 0700) reachable by those uids, as the image's
  /opt/modelswap/venv is. Nothing outside that namespace changes.

Not exercised: the rest of a container runtime (seccomp, read-only root filesystem,
cgroups), the pod's network namespace (its ports are free loopback ports from the chart
values), memory limits, GPUs (the sim backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelswap_sidecar.supervisor.processes import group_members
from modelswap_sidecar.triton.process import SHM_BASE_PREFIX, shm_regions
from modelswap_sidecar.triton.stubs import STUB_PROGRAM
from tests.support.agent_harness import eventually
from tests.support.chart_world import (
    MODELSWAP,
    NAMESPACE,
    NODE_OBJECTS,
    NODE_POD,
    POD_IP,
    POOL,
    Mounts,
    Process,
    Release,
    child_env,
    downward_env,
    expand,
    local_paths,
)
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT
from tests.support.supervisor_state import read_state

NODE_DOCKERFILE = REPO_ROOT / "images" / "node.Dockerfile"
TRITON_BIN = REPO_ROOT / ".venv-triton" / "bin"
#: The image's ENV besides PATH.
IMAGE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
#: PID 1, in messages.
SUPERVISOR = "modelswap node"


# -- the image's users ----------------------------------------------------------------------


@dataclass
class ImageAccounts:
    """The users and groups the node image's `groupadd`/`useradd` lines make."""

    groups: dict[str, int] = field(default_factory=dict)
    #: name -> (uid, primary gid)
    users: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: group name -> its member users (useradd --groups)
    members: dict[str, list[str]] = field(default_factory=dict)

    def gid(self, group: str) -> int:
        return int(group) if group.isdigit() else self.groups[group]

    def supplementary(self, user: str) -> set[int]:
        """The user's groups as initgroups(3) gives them (its primary group among them)."""
        _, gid = self.users[user]
        return {gid} | {self.groups[g] for g, names in self.members.items() if user in names}

    def passwd_lines(self) -> list[str]:
        return [f"{name}:x:{uid}:{gid}::/nonexistent:/usr/sbin/nologin"
                for name, (uid, gid) in self.users.items()]  # fmt: skip

    def group_lines(self) -> list[str]:
        return [f"{name}:x:{gid}:{','.join(self.members.get(name, []))}"
                for name, gid in self.groups.items()]  # fmt: skip


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def image_accounts(dockerfile: Path = NODE_DOCKERFILE) -> ImageAccounts:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    accounts = ImageAccounts()
    commands = [shlex.split(part) for line in text.splitlines() if line.startswith("RUN ")
                for part in line[4:].split("&&")]  # fmt: skip
    for argv in commands:
        if argv and argv[0] == "groupadd":
            accounts.groups[argv[-1]] = int(_option(argv, "--gid") or "")
    for argv in commands:
        if argv and argv[0] == "useradd":
            name, uid = argv[-1], int(_option(argv, "--uid") or "")
            accounts.users[name] = (uid, accounts.gid(_option(argv, "--gid") or ""))
            for group in (_option(argv, "--groups") or "").split(","):
                if group:
                    accounts.members.setdefault(group, []).append(name)
    assert accounts.users, f"{dockerfile.name} makes no users"
    return accounts


# -- the image's filesystem, for a root supervisor ------------------------------------------


def _hidden_folders(paths: list[Path]) -> dict[Path, set[str]]:
    """For each path, its first ancestor other uids cannot enter, and the name under it
    on the path (e.g. /root -> {.pyenv})."""
    hidden: dict[Path, set[str]] = {}
    for path in paths:
        for parent, child in zip(path.parents[::-1], [*path.parents[::-1][1:], path], strict=True):
            if not parent.stat().st_mode & stat.S_IXOTH:
                hidden.setdefault(parent, set()).add(child.name)
                break
    return hidden


def namespace_prefix(pod_dir: Path, accounts: ImageAccounts) -> list[str]:
    """`unshare --mount` and a script that sets up the image's users and makes this
    machine's Pythons reachable by them, then execs the command after it."""
    etc = pod_dir / "image-etc"
    etc.mkdir(mode=0o755)
    for name, lines in (("passwd", accounts.passwd_lines()), ("group", accounts.group_lines())):
        (etc / name).write_text(Path(f"/etc/{name}").read_text() + "\n".join(lines) + "\n")
        (etc / name).chmod(0o644)
    pythons = [Path(sys.executable).resolve().parent.parent,
               (TRITON_BIN / "python").resolve().parent.parent]  # fmt: skip
    steps = []
    for n, (hidden, names) in enumerate(sorted(_hidden_folders(pythons).items())):
        for name in sorted(names):
            stage = pod_dir / f"image-stage-{n}-{name}"
            stage.mkdir()
            steps.append(f"mount --bind {shlex.quote(str(hidden / name))} {stage}")
        steps.append(f"mount -t tmpfs -o mode=0755,size=1m tmpfs {shlex.quote(str(hidden))}")
        for name in sorted(names):
            target = shlex.quote(str(hidden / name))
            steps += [f"mkdir {target}", f"mount --move {pod_dir}/image-stage-{n}-{name} {target}"]
    for name in ("passwd", "group"):
        steps.append(f"mount --bind {etc / name} /etc/{name}")
    script = "\n".join([*steps, 'exec "$@"'])
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-ec", script, "sh"]


def security_prefix(container: Mapping[str, Any]) -> list[str]:
    """`setpriv` giving a root process exactly the container's capabilities, and
    no_new_privs when privilege escalation is off."""
    security = container["securityContext"]
    capabilities = security["capabilities"]
    assert capabilities["drop"] == ["ALL"], capabilities
    keep = ",".join(f"+{c.lower()}" for c in capabilities.get("add") or ())
    prefix = ["setpriv", "--inh-caps", "-all", "--bounding-set", f"-all{',' if keep else ''}{keep}"]
    if security.get("allowPrivilegeEscalation") is False:
        prefix.append("--no-new-privs")
    return [*prefix, "--"]


# -- the pod --------------------------------------------------------------------------------


def _init_script(init: Mapping[str, Any], mounts: Mounts, privileged: bool) -> str:
    command = init["command"]
    assert command[:2] == ["/bin/sh", "-ec"], command
    script: str = re.sub(r"/[\w./-]+", lambda m: mounts.local(m.group(0)), command[2])
    if not privileged:  # ownership only root can give
        script = re.sub(r"^\s*chown .*$", "", script, flags=re.MULTILINE)
    return script


def _uids(pid: int) -> tuple[int, int, set[int]]:
    """(real uid, real gid, supplementary groups) of a running process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text()
                  .splitlines())  # fmt: skip
    return (int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]),
            {int(g) for g in fields["Groups"].split()})  # fmt: skip


def _shm_prefix(triton_pid: int) -> str:
    """The python backend's shm region prefix on Triton's command line."""
    argv = Path(f"/proc/{triton_pid}/cmdline").read_bytes().decode().split("\0")
    prefix = re.search(r"shm-region-prefix-name=(\S+)", " ".join(argv))
    assert prefix and prefix.group(1).startswith(SHM_BASE_PREFIX), argv
    return prefix.group(1)


def stub_pids(triton_pid: int) -> list[int]:
    """Every python-backend stub under `triton_pid` (direct children of Triton)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat_text = (entry / "stat").read_text()
            ppid = int(stat_text[stat_text.rfind(")") + 2 :].split()[1])
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if ppid == triton_pid and Path(argv[0].decode()).name == STUB_PROGRAM:
                found.append(int(entry.name))
    return found


class NodePod:
    """The pool's node pod on one node, its PID 1 the supervisor."""

    def __init__(self, api: EmulatorThread, release: Release, pod_dir: Path, node_name: str):
        pod = release.pod("DaemonSet", f"{NODE_OBJECTS}-{POOL}")
        (self.container,) = pod["containers"]
        container = self.container
        (self.init,) = pod["initContainers"]
        assert "command" not in container  # the image's entrypoint: `modelswap node`
        self.dir = pod_dir
        #: Root can switch uids (and chown); an unprivileged run cannot.
        self.privileged = os.geteuid() == 0
        self.mounts = Mounts(api, NAMESPACE, pod, container, pod_dir)
        self.init_mounts = Mounts(api, NAMESPACE, pod, self.init, pod_dir)
        self.fs_group: int = pod["securityContext"]["fsGroup"]
        self.env = downward_env(container, {"spec.nodeName": node_name, "status.podIP": POD_IP,
                                            "metadata.name": NODE_POD})  # fmt: skip
        self.args = [expand(a, self.env) for a in container["args"]]
        self.kubeconfig = api.write_kubeconfig_for(NAMESPACE, pod["serviceAccountName"], node_name)
        self.accounts = image_accounts()
        self.node_settings: dict[str, Any] = {}
        self.settings: dict[str, Any] = {}
        self.process: Process | None = None
        self.pgids: set[int] = set()
        self.shm_prefix: str | None = None

    # -- preparing ----------------------------------------------------------------------

    def _config_arg(self, args: list[str]) -> tuple[int, Path]:
        index = next(i for i, a in enumerate(args) if a.startswith("--config="))
        return index, Path(self.mounts.local(args[index].split("=", 1)[1]))

    def _readable(self, path: Path, text: str, *, secret: bool = False) -> Path:
        path.write_text(text)
        path.chmod(0o440 if secret else 0o644)
        if secret and self.privileged:
            os.chown(path, 0, self.fs_group)
        return path

    def prepare(self) -> None:
        """Project the ConfigMap and the control token Secret (it must exist: the operator
        makes it), run the init container, write the rewritten settings files."""
        assert self.mounts.project() == [], "the control token Secret is not there yet"
        rewritten = self.dir / "rewritten"
        rewritten.mkdir(mode=0o755)
        separator = self.args.index("--")
        supervisor_args, agent_args = self.args[:separator], self.args[separator + 1 :]
        assert agent_args[:2] == ["modelswap", "sidecar"], agent_args

        index, node_file = self._config_arg(supervisor_args)
        self.node_settings = local_paths(yaml.safe_load(node_file.read_text()), self.mounts)
        supervisor_args[index] = f"--config={rewritten / 'node.yaml'}"
        self._readable(rewritten / "node.yaml", yaml.safe_dump(self.node_settings))

        index, agent_file = self._config_arg(agent_args)
        settings: dict[str, Any] = local_paths(yaml.safe_load(agent_file.read_text()), self.mounts)
        kube_section = dict(settings["kube"])
        assert kube_section.pop("inCluster") is True
        kubeconfig = self._readable(rewritten / "kubeconfig", self.kubeconfig.read_text(),
                                    secret=True)  # fmt: skip
        settings["kube"] = {**kube_section, "kubeconfig": str(kubeconfig)}
        self.settings = settings
        agent_args[index] = f"--config={rewritten / 'agent.yaml'}"
        self._readable(rewritten / "agent.yaml", yaml.safe_dump(settings))
        self.args = [*supervisor_args, "--", *agent_args]

        script = _init_script(self.init, self.init_mounts, self.privileged)
        command = ["/bin/sh", "-ec", script]
        if self.privileged:
            command = [*security_prefix(self.init), *command]
        done = Process(command, self.dir / "init.log", child_env())
        code = done.popen.wait(30)
        assert code == 0, f"the init container failed ({code}): {done.log_tail()}"

    # -- running ------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return Path(self.node_settings["stateFile"])

    def state(self) -> dict[str, Any]:
        return read_state(self.state_file, self.pgids)

    def child(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.state().get("children", {}).get(name, {})
        return found

    def start(self) -> None:
        command = [str(MODELSWAP), "node", *self.args]
        if self.privileged:
            command = [*namespace_prefix(self.dir, self.accounts),
                       *security_prefix(self.container), *command]  # fmt: skip
        path = os.pathsep.join([str(MODELSWAP.parent), str(TRITON_BIN), os.environ["PATH"]])
        env = child_env(**self.env, **IMAGE_ENV, PATH=path)
        self.process = Process(command, self.dir / "node.log", env)

    def _check_running(self) -> None:
        if self.process is None or not self.process.running():
            tail = self.process.log_tail() if self.process else ""
            raise AssertionError(f"{SUPERVISOR} exited: {tail}")

    async def agent_serving(self, *, not_pid: int | None = None) -> int:
        """The agent's pid once the agent the supervisor runs now has written its
        endpoints file."""
        endpoints = Path(self.settings["stateDir"]) / "agent.json"

        async def serving() -> int | None:
            self._check_running()
            agent = self.child("agent")
            pid = agent.get("pid")
            if not agent.get("running") or not pid or pid == not_pid:
                return None
            try:
                return pid if json.loads(endpoints.read_text())["pid"] == pid else None
            except (FileNotFoundError, ValueError, KeyError):
                return None

        pid = await eventually(serving, timeout_seconds=60, what="the agent to serve")
        runtime = await eventually(self._runtime_pid, timeout_seconds=30, what="Triton running")
        assert pid is not None and runtime is not None  # eventually answers a truthy value
        self.shm_prefix = _shm_prefix(runtime)
        return pid

    async def _runtime_pid(self) -> int | None:
        self._check_running()
        runtime = self.child("runtime")
        pid: int | None = runtime.get("pid") if runtime.get("running") else None
        return pid

    @property
    def token(self) -> str:
        return Path(self.settings["control"]["tokenFile"]).read_text()

    async def restart_agent(self) -> None:
        """kill -9 of the agent's group (a crash): the supervisor starts a new one;
        Triton and the models keep serving."""
        agent, runtime = self.child("agent"), self.child("runtime")
        os.killpg(agent["pid"], signal.SIGKILL)
        await self.agent_serving(not_pid=agent["pid"])
        assert self.child("agent")["restarts"] == agent["restarts"] + 1
        assert self.child("runtime")["pid"] == runtime["pid"], "Triton was restarted"

    # -- uids -----------------------------------------------------------------------------

    def expected_identity(self, role: str) -> tuple[int, int, set[int]]:
        """(uid, gid, groups) node.yaml's user and group for `role` (agent, triton) have
        in the image."""
        section = self.node_settings[role]
        uid, gid = self.accounts.users[section["user"]]
        if section.get("group"):
            gid = self.accounts.gid(str(section["group"]))
        return uid, gid, {gid} | self.accounts.supplementary(section["user"])

    def identities(self) -> dict[str, tuple[int, int, set[int]]]:
        """The uids the agent, Triton and every model stub run as now."""
        found = {name: _uids(self.child(name)["pid"]) for name in ("agent", "runtime")}
        for pid in stub_pids(self.child("runtime")["pid"]):
            found[f"stub {pid}"] = _uids(pid)
        return found

    # -- stopping ---------------------------------------------------------------------------

    def stop(self, timeout_seconds: float = 40.0) -> int | None:
        """SIGTERM to PID 1, as the kubelet stops the pod: the supervisor's exit status
        (None when it had to be killed)."""
        self.state()
        if self.process is None:
            return None
        process, self.process = self.process, None
        return process.stop(timeout_seconds)

    def leftovers(self) -> list[str]:
        """Processes of any child group, or Triton shm regions, still there."""
        left = [f"group {g}: {group_members(g)}" for g in self.pgids if group_members(g)]
        if self.shm_prefix:
            left += [str(p) for p in shm_regions(self.shm_prefix)]
        return left

    def kill_all(self) -> None:
        for pgid in self.pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

    def log_tail(self, n: int = 8000) -> str:
        path = self.dir / "node.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""


def _pod_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="ms-pod-"))
    folder.chmod(0o755)
    return folder


@contextlib.asynccontextmanager
async def node_pod(api: EmulatorThread, release: Release, node_name: str) -> AsyncIterator[NodePod]:
    """The node pod, its supervisor started and its agent serving; after: SIGTERM, exit 0,
    nothing left running, the pod folder removed."""
    # Not under pytest's tmp_path (mode 0700 folders): the agent's and Triton's uids must
    # reach the pod's volumes, as they reach a pod's.
    pod_dir = _pod_dir()
    pod = NodePod(api, release, pod_dir, node_name)
    failed = False
    try:
        pod.prepare()
        pod.start()
        await pod.agent_serving()
        yield pod
    except BaseException:
        failed = True
        sys.stderr.write(f"--- {SUPERVISOR} log ---\n{pod.log_tail()}\n")
        raise
    finally:
        try:
            code = await asyncio.to_thread(pod.stop)
            if not failed:
                assert code == 0, f"{SUPERVISOR} exit status {code}: {pod.log_tail()}"
                assert pod.leftovers() == [], pod.leftovers()
        finally:
            pod.kill_all()
            shutil.rmtree(pod_dir, ignore_errors=True)
