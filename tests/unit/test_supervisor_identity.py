"""Uid separation of the agent and the runtime (pure: a fake user database)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from modelswap_sidecar.supervisor.errors import IdentityError
from modelswap_sidecar.supervisor.identity import (
    RunAs,
    UserEntry,
    child_environment,
    plan_identities,
    resolve,
)


class FakeUsers:
    def __init__(
        self,
        entries: Sequence[UserEntry],
        *,
        groups: Mapping[str, int] | None = None,
        memberships: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        self._entries = list(entries)
        self._groups = dict(groups or {})
        self._memberships = dict(memberships or {})

    def user_by_name(self, name: str) -> UserEntry | None:
        return next((e for e in self._entries if e.name == name), None)

    def user_by_uid(self, uid: int) -> UserEntry | None:
        return next((e for e in self._entries if e.uid == uid), None)

    def gid_by_name(self, name: str) -> int | None:
        return self._groups.get(name)

    def groups_of(self, user: UserEntry) -> tuple[int, ...]:
        return (user.gid, *self._memberships.get(user.name, ()))


USERS = FakeUsers(
    [
        UserEntry("root", 0, 0, "/root"),
        UserEntry("agent", 1000, 1000, "/home/agent"),
        UserEntry("runtime", 1001, 1001, "/nonexistent"),
        UserEntry("dev", 4242, 4242, "/home/dev"),
    ],
    groups={"video": 44, "render": 105},
    memberships={"runtime": (44, 105)},
)


def plan(euid: int, agent: str | None, runtime: str | None, **groups: str | None):  # type: ignore[no-untyped-def]
    return plan_identities(
        euid=euid,
        agent_user=agent,
        agent_group=groups.get("agent_group"),
        runtime_user=runtime,
        runtime_group=groups.get("runtime_group"),
        users=USERS,
    )


def test_root_runs_each_child_under_its_own_uid_with_its_groups() -> None:
    result = plan(0, "agent", "runtime")
    assert result.agent.run_as == RunAs(1000, 1000, (1000,), "agent", "/home/agent")
    # The runtime keeps its supplementary groups (GPU device nodes), and nothing of root's.
    assert result.runtime.run_as == RunAs(1001, 1001, (44, 105, 1001), "runtime", "/nonexistent")
    assert result.notes == ()


def test_numeric_users_and_groups_need_no_passwd_entry() -> None:
    result = plan(0, "2000", "2001", runtime_group="video")
    assert result.agent.run_as == RunAs(2000, 2000, (2000,))
    assert result.runtime.run_as == RunAs(2001, 44, (44,))
    known = resolve("1000", "render", USERS)  # a known uid by number: its name and groups
    assert known == RunAs(1000, 105, (105, 1000), "agent", "/home/agent")


def test_not_root_runs_both_as_the_current_user_and_says_so() -> None:
    result = plan(4242, "agent", "runtime")
    assert result.agent.run_as is None and result.runtime.run_as is None
    assert any(
        "not started as root" in n and "dev (uid 4242)" in n and "without uid separation" in n
        for n in result.notes
    )
    assert any("configured users ignored" in n and "agent, runtime" in n for n in result.notes)
    assert plan(4242, None, None).notes == (
        "not started as root: the agent and the runtime both run as dev (uid 4242), "
        "without uid separation between them",
    )


def test_root_without_users_or_with_one_shared_uid_is_allowed_but_noted() -> None:
    unset = plan(0, None, "runtime")
    assert unset.agent.run_as is None
    assert unset.notes == ("the agent runs as root: set its user to separate it",)
    shared = plan(0, "agent", "1000")
    assert any("share uid 1000" in n for n in shared.notes)
    as_root = plan(0, "root", "runtime")
    assert as_root.agent.run_as is not None and as_root.agent.run_as.uid == 0
    assert "the agent runs as root" in as_root.notes[0]


def test_unknown_users_and_groups_are_errors() -> None:
    with pytest.raises(IdentityError, match="user 'ghost' does not exist"):
        plan(0, "ghost", "runtime")
    with pytest.raises(IdentityError, match="group 'ghosts' does not exist"):
        plan(0, "agent", "runtime", runtime_group="ghosts")


def test_child_environment_follows_the_user() -> None:
    base = {"HOME": "/root", "USER": "root", "LOGNAME": "root", "PATH": "/bin"}
    assert child_environment(base, None) == base
    named = child_environment(base, RunAs(1000, 1000, (1000,), "agent", "/home/agent"))
    assert named == {"HOME": "/home/agent", "USER": "agent", "LOGNAME": "agent", "PATH": "/bin"}
    anonymous = child_environment(base, RunAs(2000, 2000, (2000,)))
    assert anonymous == {"HOME": "/", "PATH": "/bin"}
