"""Settings of `modelswap node`, read once at start from a YAML/JSON file and flags.

The file (camelCase keys, every key optional except `triton.modelRepository`; unknown keys
are refused with their path):

    agent:
      command: [modelswap, sidecar, --config, /etc/modelswap/agent.yaml]
      user: modelswap-agent        # name or uid; used only when started as root
      group: modelswap-agent       # default: the user's primary group
      env: {LOG_LEVEL: info}       # added to the supervisor's environment
      workingDir: /var/lib/modelswap
    triton:
      binary: /opt/tritonserver/bin/tritonserver
      modelRepository: /var/lib/modelswap/repository
      host: 127.0.0.1
      httpPort: 8000
      grpcPort: 8001
      metricsPort: 8002            # omit: Triton's metrics off
      exitTimeoutSeconds: 5
      logVerbose: 0
      extraArgs: []
      shmPrefix: triton_python_backend_shm_region_msnode_   # default: a fresh one per run
      user: modelswap-runtime
      group: modelswap-runtime
      env: {}
      workingDir: /
    restart:
      initialBackoffSeconds: 0.5
      maxBackoffSeconds: 4
      backoffFactor: 2
      healthyAfterSeconds: 10
      giveUpAfterRestarts: 10      # null: never give up
      giveUpWindowSeconds: 600
    stopGraceSeconds: 15
    stateFile: /run/modelswap/supervisor.json

Flags override the file (`SettingsOverrides`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelswap_api import codec
from modelswap_api.errors import ModelError
from modelswap_sidecar.supervisor.errors import SettingsError
from modelswap_sidecar.supervisor.restarts import RestartPolicy
from modelswap_sidecar.triton.process import SHM_BASE_PREFIX, TritonPorts, TritonSettings

DEFAULT_AGENT_COMMAND = ("modelswap", "sidecar")
DEFAULT_TRITON_BINARY = "tritonserver"
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001


@dataclass(frozen=True, kw_only=True)
class ChildSettings:
    """How one child runs: its user (when root), environment additions, working directory."""

    user: str | None = None
    group: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    working_dir: Path | None = None


@dataclass(frozen=True, kw_only=True)
class AgentSettings(ChildSettings):
    command: tuple[str, ...] = DEFAULT_AGENT_COMMAND


@dataclass(frozen=True, kw_only=True)
class RuntimeSettings(ChildSettings):
    triton: TritonSettings
    ports: TritonPorts
    #: None: a fresh prefix per supervisor run (`triton.process.new_shm_prefix`).
    shm_prefix: str | None = None


@dataclass(frozen=True, kw_only=True)
class SupervisorSettings:
    agent: AgentSettings
    runtime: RuntimeSettings
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    stop_grace_seconds: float = 15.0
    #: Where the supervisor writes its state for the agent (None: nowhere).
    state_file: Path | None = None


# The file's shape, decoded by `modelswap_api.codec` (camelCase keys, unknown keys refused).


@dataclass(frozen=True, kw_only=True)
class _AgentFile:
    command: tuple[str, ...] | None = None
    user: str | int | None = None
    group: str | int | None = None
    env: Mapping[str, str] | None = None
    working_dir: str | None = None


@dataclass(frozen=True, kw_only=True)
class _TritonFile:
    binary: str | None = None
    model_repository: str | None = None
    host: str | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    exit_timeout_seconds: int | None = None
    log_verbose: int | None = None
    extra_args: tuple[str, ...] | None = None
    shm_prefix: str | None = None
    user: str | int | None = None
    group: str | int | None = None
    env: Mapping[str, str] | None = None
    working_dir: str | None = None


@dataclass(frozen=True, kw_only=True)
class _RestartFile:
    initial_backoff_seconds: float | None = None
    max_backoff_seconds: float | None = None
    backoff_factor: float | None = None
    healthy_after_seconds: float | None = None
    give_up_after_restarts: int | None = None
    give_up_window_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class _NodeFile:
    agent: _AgentFile | None = None
    triton: _TritonFile | None = None
    restart: _RestartFile | None = None
    stop_grace_seconds: float | None = None
    state_file: str | None = None


@dataclass(frozen=True, kw_only=True)
class SettingsOverrides:
    """Flags of `modelswap node`; None leaves the file's value (or the default)."""

    agent_command: tuple[str, ...] | None = None
    agent_user: str | None = None
    runtime_user: str | None = None
    triton_binary: str | None = None
    model_repository: Path | None = None
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    shm_prefix: str | None = None
    stop_grace_seconds: float | None = None
    state_file: Path | None = None


def read_file(path: Path) -> Mapping[str, Any]:
    """The settings file as a mapping (YAML, which includes JSON); empty file → {}."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SettingsError(f"{path}: cannot read settings: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SettingsError(f"{path}: settings must be a mapping, got {type(data).__name__}")
    return data


def _str(value: str | int | None) -> str | None:
    return None if value is None else str(value)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def build_settings(
    data: Mapping[str, Any], overrides: SettingsOverrides | None = None
) -> SupervisorSettings:
    """Settings from the file's mapping and the flags; SettingsError names a wrong field."""
    flags = overrides or SettingsOverrides()
    try:
        raw = codec.from_dict(_NodeFile, data)
    except ModelError as e:
        raise SettingsError(f"settings: {e}") from e
    agent_file = raw.agent or _AgentFile()
    triton_file = raw.triton or _TritonFile()
    restart_file = raw.restart or _RestartFile()

    agent = AgentSettings(
        command=_first(flags.agent_command, agent_file.command, DEFAULT_AGENT_COMMAND),
        user=_first(flags.agent_user, _str(agent_file.user)),
        group=_str(agent_file.group),
        env=dict(agent_file.env or {}),
        working_dir=Path(agent_file.working_dir) if agent_file.working_dir else None,
    )
    if not agent.command:
        raise SettingsError("agent.command: must not be empty")

    repository = _first(flags.model_repository, triton_file.model_repository)
    if repository is None:
        raise SettingsError("triton.modelRepository: required (or --model-repository)")
    metrics_port = _first(flags.metrics_port, triton_file.metrics_port)
    ports = TritonPorts(
        http=_first(flags.http_port, triton_file.http_port, DEFAULT_HTTP_PORT),
        grpc=_first(flags.grpc_port, triton_file.grpc_port, DEFAULT_GRPC_PORT),
        metrics=metrics_port,
    )
    for name, port in (("httpPort", ports.http), ("grpcPort", ports.grpc)):
        _check_port(f"triton.{name}", port)
    if ports.metrics is not None:
        _check_port("triton.metricsPort", ports.metrics)
    used = [p for p in (ports.http, ports.grpc, ports.metrics) if p is not None]
    if len(set(used)) != len(used):
        raise SettingsError("triton: httpPort, grpcPort and metricsPort must differ")
    triton_defaults = TritonSettings(binary=Path(DEFAULT_TRITON_BINARY), model_repository=Path("."))
    triton = TritonSettings(
        binary=_executable(_first(flags.triton_binary, triton_file.binary, DEFAULT_TRITON_BINARY)),
        model_repository=Path(repository),
        host=_first(triton_file.host, triton_defaults.host),
        metrics=ports.metrics is not None,
        exit_timeout_seconds=_first(
            triton_file.exit_timeout_seconds, triton_defaults.exit_timeout_seconds
        ),
        log_verbose=_first(triton_file.log_verbose, triton_defaults.log_verbose),
        extra_args=tuple(triton_file.extra_args or ()),
    )
    shm_prefix = _first(flags.shm_prefix, triton_file.shm_prefix)
    if shm_prefix is not None and (not shm_prefix.startswith(SHM_BASE_PREFIX) or "/" in shm_prefix):
        raise SettingsError(
            f"triton.shmPrefix: {shm_prefix!r} must start with {SHM_BASE_PREFIX!r} and hold no '/'"
        )
    runtime = RuntimeSettings(
        triton=triton,
        ports=ports,
        shm_prefix=shm_prefix,
        user=_first(flags.runtime_user, _str(triton_file.user)),
        group=_str(triton_file.group),
        env=dict(triton_file.env or {}),
        working_dir=Path(triton_file.working_dir) if triton_file.working_dir else None,
    )

    restart_values = {
        f.name: getattr(restart_file, f.name)
        for f in dataclasses.fields(restart_file)
        if getattr(restart_file, f.name) is not None
    }
    restart_data = data.get("restart")
    if isinstance(restart_data, Mapping) and "giveUpAfterRestarts" in restart_data:
        # An explicit null means: never give up.
        restart_values["give_up_after_restarts"] = restart_file.give_up_after_restarts
    try:
        restart = RestartPolicy(**restart_values)
    except ValueError as e:
        message = str(e)
        for f in dataclasses.fields(RestartPolicy):  # the file's names, not Python's
            message = message.replace(f.name, codec.camel(f.name))
        raise SettingsError(f"restart: {message}") from e

    stop_grace = _first(flags.stop_grace_seconds, raw.stop_grace_seconds, 15.0)
    if stop_grace < 0:
        raise SettingsError("stopGraceSeconds: must not be negative")
    state_file = _first(flags.state_file, raw.state_file)
    return SupervisorSettings(
        agent=agent,
        runtime=runtime,
        restart=restart,
        stop_grace_seconds=float(stop_grace),
        state_file=Path(state_file) if state_file is not None else None,
    )


def _check_port(name: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise SettingsError(f"{name}: {port} is not a TCP port")


def _executable(text: str) -> Path:
    """A bare name is looked up on PATH at start; a path with a '/' is made absolute now
    (`Path` would turn `./tritonserver` into a bare name)."""
    return Path(text).absolute() if "/" in text else Path(text)
