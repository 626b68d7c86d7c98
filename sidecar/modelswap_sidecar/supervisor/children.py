"""The node's two children, built from the settings: the agent and `tritonserver`.

Pure apart from the user database passed in: the environment and the effective uid are
arguments, so `modelswap node` reads them once at start.

The agent's environment gets, on top of the supervisor's and its configured additions:

    MODELSWAP_TRITON_HTTP_ADDRESS   host:port of Triton's HTTP API (as tritonclient wants it)
    MODELSWAP_TRITON_GRPC_ADDRESS   host:port of Triton's gRPC API
    MODELSWAP_SUPERVISOR_STATE_FILE the supervisor's state file (Triton's pid, restarts)

Both children run with `CUDA_DEVICE_ORDER=PCI_BUS_ID`, so the agent (which keys GPUs by
UUID and maps them to ordinals in that order) and Triton (whose instance groups are pinned
to those ordinals) number the GPUs alike; CUDA's default order is fastest-first.

Triton's command line is `triton.process.triton_command` with the configured ports and
one shm region prefix for the supervisor's lifetime; its cleanup removes the regions with
that prefix after every Triton exit (and once before the first start).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from modelswap_sidecar.gpu.devices import DEVICE_ORDER
from modelswap_sidecar.supervisor.identity import (
    Identity,
    UserDatabase,
    child_environment,
    plan_identities,
)
from modelswap_sidecar.supervisor.settings import ChildSettings, SupervisorSettings
from modelswap_sidecar.supervisor.specs import ChildSpec
from modelswap_sidecar.triton.process import new_shm_prefix, remove_shm_regions, triton_command

AGENT = "agent"
RUNTIME = "runtime"
TRITON_HTTP_ENV = "MODELSWAP_TRITON_HTTP_ADDRESS"
TRITON_GRPC_ENV = "MODELSWAP_TRITON_GRPC_ADDRESS"
STATE_FILE_ENV = "MODELSWAP_SUPERVISOR_STATE_FILE"
DEVICE_ORDER_ENV = "CUDA_DEVICE_ORDER"


@dataclass(frozen=True)
class NodeChildren:
    agent: ChildSpec
    runtime: ChildSpec
    shm_prefix: str
    #: Facts about uid separation the supervisor logs as warnings.
    notes: tuple[str, ...]

    @property
    def specs(self) -> tuple[ChildSpec, ChildSpec]:
        return (self.agent, self.runtime)


def _remove_regions(prefix: str) -> None:
    remove_shm_regions(prefix)


def node_children(
    settings: SupervisorSettings,
    *,
    environ: Mapping[str, str],
    euid: int,
    users: UserDatabase,
    shm_prefix_factory: Callable[[], str] = new_shm_prefix,
) -> NodeChildren:
    """The agent's and Triton's specs; IdentityError for an unknown user or group."""
    plan = plan_identities(
        euid=euid,
        agent_user=settings.agent.user,
        agent_group=settings.agent.group,
        runtime_user=settings.runtime.user,
        runtime_group=settings.runtime.group,
        users=users,
    )
    runtime = settings.runtime
    shm_prefix = runtime.shm_prefix or shm_prefix_factory()
    host = runtime.triton.host
    supervisor_env = {
        DEVICE_ORDER_ENV: DEVICE_ORDER,
        TRITON_HTTP_ENV: f"{host}:{runtime.ports.http}",
        TRITON_GRPC_ENV: f"{host}:{runtime.ports.grpc}",
    }
    if settings.state_file is not None:
        supervisor_env[STATE_FILE_ENV] = str(settings.state_file)
    agent = _spec(
        AGENT,
        settings.agent.command,
        settings.agent,
        plan.agent,
        {**environ, **settings.agent.env, **supervisor_env},
    )
    triton = _spec(
        RUNTIME,
        tuple(triton_command(runtime.triton, runtime.ports, shm_prefix=shm_prefix)),
        runtime,
        plan.runtime,
        {**environ, **runtime.env, DEVICE_ORDER_ENV: DEVICE_ORDER},
        cleanup=functools.partial(_remove_regions, shm_prefix),
    )
    return NodeChildren(agent=agent, runtime=triton, shm_prefix=shm_prefix, notes=plan.notes)


def _spec(
    name: str,
    argv: tuple[str, ...],
    settings: ChildSettings,
    identity: Identity,
    env: dict[str, str],
    *,
    cleanup: Callable[[], None] | None = None,
) -> ChildSpec:
    return ChildSpec(
        name=name,
        argv=argv,
        env=child_environment(env, identity.run_as),
        run_as=identity.run_as,
        cwd=settings.working_dir,
        cleanup=cleanup,
    )
