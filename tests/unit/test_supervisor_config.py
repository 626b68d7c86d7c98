"""The supervisor's pure parts: restart decisions, settings, the node's child specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelswap_sidecar.supervisor.children import (
    STATE_FILE_ENV,
    TRITON_GRPC_ENV,
    TRITON_HTTP_ENV,
    node_children,
)
from modelswap_sidecar.supervisor.errors import SettingsError
from modelswap_sidecar.supervisor.identity import RunAs, UserEntry
from modelswap_sidecar.supervisor.restarts import (
    GiveUp,
    Restart,
    RestartHistory,
    RestartPolicy,
    after_exit,
)
from modelswap_sidecar.supervisor.settings import SettingsOverrides, build_settings
from modelswap_sidecar.supervisor.specs import ExitStatus
from tests.unit.test_supervisor_identity import FakeUsers

POLICY = RestartPolicy(
    initial_backoff_seconds=0.5,
    max_backoff_seconds=4.0,
    backoff_factor=2.0,
    healthy_after_seconds=60.0,
    give_up_after_restarts=5,
    give_up_window_seconds=100.0,
)


def crash_loop(
    policy: RestartPolicy, times: list[float], ran_seconds: float = 1.0
) -> list[Restart | GiveUp]:
    history = RestartHistory()
    decisions: list[Restart | GiveUp] = []
    for t in times:
        decision = after_exit(policy, history, started_seconds=t - ran_seconds, exited_seconds=t)
        decisions.append(decision)
        if isinstance(decision, Restart):
            history = decision.history
    return decisions


def test_quick_exits_back_off_exponentially_up_to_the_maximum() -> None:
    decisions = crash_loop(POLICY, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert [d.delay_seconds for d in decisions if isinstance(d, Restart)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        4.0,
    ]


def test_a_child_that_ran_long_enough_starts_over_at_the_initial_backoff() -> None:
    quick = crash_loop(POLICY, [1.0, 2.0, 3.0])
    history = quick[-1].history  # type: ignore[union-attr]
    healthy = after_exit(POLICY, history, started_seconds=10.0, exited_seconds=75.0)
    assert isinstance(healthy, Restart) and healthy.delay_seconds == 0.5
    again = after_exit(POLICY, healthy.history, started_seconds=76.0, exited_seconds=77.0)
    assert isinstance(again, Restart) and again.delay_seconds == 1.0


def test_gives_up_after_too_many_restarts_within_the_window() -> None:
    decisions = crash_loop(POLICY, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert all(isinstance(d, Restart) for d in decisions[:5])
    last = decisions[5]
    assert isinstance(last, GiveUp) and "restarted 5 times in the last 100 s" in last.reason


def test_restarts_outside_the_window_do_not_count() -> None:
    decisions = crash_loop(POLICY, [1.0, 30.0, 60.0, 90.0, 120.0, 150.0, 180.0, 210.0])
    assert all(isinstance(d, Restart) for d in decisions)


def test_never_give_up_and_no_overflow_after_many_quick_exits() -> None:
    policy = RestartPolicy(give_up_after_restarts=None, max_backoff_seconds=30.0)
    decisions = crash_loop(policy, [float(t) for t in range(2000)])
    assert all(isinstance(d, Restart) for d in decisions)
    assert decisions[-1].delay_seconds == 30.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_backoff_seconds": -1.0},
        {"initial_backoff_seconds": 5.0, "max_backoff_seconds": 1.0},
        {"backoff_factor": 0.5},
        {"give_up_after_restarts": 0},
        {"give_up_window_seconds": 0.0},
    ],
)
def test_restart_policy_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


def test_exit_status_from_wait_status() -> None:
    assert ExitStatus.from_wait_status(3 << 8) == ExitStatus(code=3)
    killed = ExitStatus.from_wait_status(9)
    assert killed == ExitStatus(signal=9) and killed.returncode == -9
    assert killed.describe() == "killed by SIGKILL"
    assert ExitStatus(code=1).describe() == "exited with status 1"


# Settings ---------------------------------------------------------------------------


FULL_FILE = {
    "agent": {
        "command": ["modelswap", "sidecar", "--config", "/etc/agent.yaml"],
        "user": "agent",
        "env": {"LOG_LEVEL": "debug"},
        "workingDir": "/var/lib/modelswap",
    },
    "triton": {
        "binary": "/opt/tritonserver/bin/tritonserver",
        "modelRepository": "/var/lib/modelswap/repository",
        "httpPort": 9000,
        "grpcPort": 9001,
        "metricsPort": 9002,
        "exitTimeoutSeconds": 3,
        "extraArgs": ["--log-info=true"],
        "shmPrefix": "triton_python_backend_shm_region_msnode_",
        "user": 1001,
        "group": "runtime",
    },
    "restart": {"initialBackoffSeconds": 1, "giveUpAfterRestarts": None},
    "stopGraceSeconds": 20,
    "stateFile": "/run/modelswap/supervisor.json",
}


def test_settings_file_is_read_into_typed_settings() -> None:
    settings = build_settings(FULL_FILE)
    assert settings.agent.command == ("modelswap", "sidecar", "--config", "/etc/agent.yaml")
    assert settings.agent.user == "agent" and settings.agent.env == {"LOG_LEVEL": "debug"}
    assert settings.agent.working_dir == Path("/var/lib/modelswap")
    runtime = settings.runtime
    assert runtime.user == "1001" and runtime.group == "runtime"
    assert runtime.triton.binary == Path("/opt/tritonserver/bin/tritonserver")
    assert runtime.triton.metrics and runtime.ports.metrics == 9002
    assert runtime.triton.exit_timeout_seconds == 3
    assert runtime.triton.extra_args == ("--log-info=true",)
    assert settings.restart.initial_backoff_seconds == 1.0
    assert settings.restart.give_up_after_restarts is None  # explicit null: never
    assert settings.stop_grace_seconds == 20.0
    assert settings.state_file == Path("/run/modelswap/supervisor.json")


def test_flags_override_the_file_and_defaults_fill_the_rest() -> None:
    overrides = SettingsOverrides(
        agent_command=("python", "-m", "agent"),
        runtime_user="nobody",
        http_port=7000,
        triton_binary="./bin/tritonserver",
        stop_grace_seconds=1.0,
    )
    settings = build_settings(FULL_FILE, overrides)
    assert settings.agent.command == ("python", "-m", "agent")
    assert settings.runtime.user == "nobody" and settings.runtime.ports.http == 7000
    assert settings.runtime.triton.binary == Path.cwd() / "bin" / "tritonserver"
    assert settings.stop_grace_seconds == 1.0
    minimal = build_settings({"triton": {"modelRepository": "/repo"}})
    assert minimal.agent.command == ("modelswap", "sidecar")
    assert minimal.runtime.triton.binary == Path("tritonserver")  # looked up on PATH
    assert (minimal.runtime.ports.http, minimal.runtime.ports.grpc) == (8000, 8001)
    assert minimal.runtime.ports.metrics is None and not minimal.runtime.triton.metrics
    assert minimal.restart.give_up_after_restarts == 10 and minimal.state_file is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "triton.modelRepository: required"),
        ({"triton": {"modelRepository": "/r", "colour": "red"}}, "triton.colour: unknown field"),
        ({"triton": {"modelRepository": "/r", "httpPort": "x"}}, "triton.httpPort: expected int"),
        (
            {"triton": {"modelRepository": "/r", "httpPort": 70000}},
            "triton.httpPort: 70000 is not a TCP port",
        ),
        ({"triton": {"modelRepository": "/r", "grpcPort": 8000}}, "must differ"),
        ({"triton": {"modelRepository": "/r", "shmPrefix": "mine_"}}, "triton.shmPrefix"),
        (
            {"triton": {"modelRepository": "/r"}, "restart": {"backoffFactor": 0.1}},
            "restart: backoffFactor must be at least 1",
        ),
        (
            {"triton": {"modelRepository": "/r"}, "agent": {"command": []}},
            "agent.command: must not be empty",
        ),
    ],
)
def test_bad_settings_name_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace(".", r"\.")):
        build_settings(data)


# Child specs ------------------------------------------------------------------------


def test_node_children_carry_triton_command_shm_cleanup_and_agent_environment(
    tmp_path: Path,
) -> None:
    users = FakeUsers([UserEntry("agent", 1000, 1000, "/home/agent")], groups={"runtime": 1002})
    settings = build_settings(FULL_FILE)
    children = node_children(
        settings, environ={"PATH": "/usr/bin", "USER": "root"}, euid=0, users=users
    )
    agent, runtime = children.specs
    assert agent.name == "agent" and agent.argv == settings.agent.command
    assert agent.run_as == RunAs(
        uid=1000, gid=1000, groups=(1000,), name="agent", home="/home/agent"
    )
    assert agent.env["LOG_LEVEL"] == "debug" and agent.env["PATH"] == "/usr/bin"
    assert agent.env["HOME"] == "/home/agent" and agent.env["USER"] == "agent"
    assert agent.env[TRITON_HTTP_ENV] == "127.0.0.1:9000"
    assert agent.env[TRITON_GRPC_ENV] == "127.0.0.1:9001"
    assert agent.env[STATE_FILE_ENV] == "/run/modelswap/supervisor.json"
    assert agent.cwd == Path("/var/lib/modelswap") and agent.cleanup is None

    assert runtime.run_as == RunAs(uid=1001, gid=1002, groups=(1002,))
    assert "USER" not in runtime.env and TRITON_HTTP_ENV not in runtime.env
    # Agent and Triton number GPUs alike (the agent pins Triton's instances to ordinals).
    assert agent.env["CUDA_DEVICE_ORDER"] == runtime.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    argv = runtime.argv
    assert argv[0] == "/opt/tritonserver/bin/tritonserver"
    assert "--model-control-mode=explicit" in argv and "--http-port=9000" in argv
    assert "--metrics-port=9002" in argv and argv[-1] == "--log-info=true"
    assert children.shm_prefix == "triton_python_backend_shm_region_msnode_"
    assert f"--backend-config=python,shm-region-prefix-name={children.shm_prefix}" in argv
    assert runtime.cleanup is not None
    assert children.notes == ()


def test_runtime_cleanup_removes_exactly_its_own_shm_regions() -> None:
    import uuid

    prefix = f"triton_python_backend_shm_region_mstest{uuid.uuid4().hex[:8]}_"
    other = Path("/dev/shm") / f"triton_python_backend_shm_region_mstest{uuid.uuid4().hex[:8]}_1"
    mine = Path("/dev/shm") / f"{prefix}1"
    settings = build_settings({"triton": {"modelRepository": "/r", "shmPrefix": prefix}})
    children = node_children(settings, environ={}, euid=1234, users=FakeUsers([]))
    try:
        mine.write_bytes(b"region")
        other.write_bytes(b"region")
        assert children.runtime.cleanup is not None
        children.runtime.cleanup()
        assert not mine.exists() and other.exists()
    finally:
        mine.unlink(missing_ok=True)
        other.unlink(missing_ok=True)


def test_without_a_configured_prefix_each_run_gets_a_fresh_one() -> None:
    settings = build_settings({"triton": {"modelRepository": "/r"}})
    a = node_children(settings, environ={}, euid=1234, users=FakeUsers([]))
    b = node_children(settings, environ={}, euid=1234, users=FakeUsers([]))
    assert a.shm_prefix != b.shm_prefix
    assert a.shm_prefix.startswith("triton_python_backend_shm_region_ms")
    assert a.agent.env.get(STATE_FILE_ENV) is None
