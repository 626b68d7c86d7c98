"""Which uid each child runs as (DESIGN.md §1 "Trust": the agent and the runtime apart).

Started as root, the supervisor runs each child as its configured user (a name or a
number) and group (default: the user's primary group, else the uid), with that user's
supplementary groups and nothing of root's. Started as anyone else it cannot switch, so
both children run as the current user, and `plan_identities` says so in a note the
supervisor logs as a warning. A root supervisor with a child left without a user, or two
children given the same uid, also gets a note: that is allowed, but it is no separation.

`plan_identities` is pure; the user database is passed in (`SystemUsers` reads the real
one), so tests need neither root nor real accounts.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass
from typing import Protocol

from modelswap_sidecar.supervisor.errors import IdentityError

ROOT_UID = 0


@dataclass(frozen=True)
class UserEntry:
    name: str
    uid: int
    gid: int
    home: str


@dataclass(frozen=True)
class RunAs:
    """A uid to switch to, with its groups; `name`/`home` when the user database knows it."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str | None = None
    home: str | None = None

    def describe(self) -> str:
        who = f"{self.name} " if self.name else ""
        return f"{who}(uid {self.uid}, gid {self.gid})"


@dataclass(frozen=True)
class Identity:
    """Whom a child runs as: `run_as` None means the supervisor's own user (no switch)."""

    run_as: RunAs | None
    #: The user set in the settings, for messages.
    configured: str | None


@dataclass(frozen=True)
class IdentityPlan:
    agent: Identity
    runtime: Identity
    #: Things the operator of the node should know (logged as warnings).
    notes: tuple[str, ...]


class UserDatabase(Protocol):
    def user_by_name(self, name: str) -> UserEntry | None: ...

    def user_by_uid(self, uid: int) -> UserEntry | None: ...

    def gid_by_name(self, name: str) -> int | None: ...

    def groups_of(self, user: UserEntry) -> tuple[int, ...]: ...


class SystemUsers:
    """The real user database (passwd and group, through NSS)."""

    def user_by_name(self, name: str) -> UserEntry | None:
        try:
            return _entry(pwd.getpwnam(name))
        except KeyError:
            return None

    def user_by_uid(self, uid: int) -> UserEntry | None:
        try:
            return _entry(pwd.getpwuid(uid))
        except KeyError:
            return None

    def gid_by_name(self, name: str) -> int | None:
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            return None

    def groups_of(self, user: UserEntry) -> tuple[int, ...]:
        return tuple(os.getgrouplist(user.name, user.gid))


def _entry(p: pwd.struct_passwd) -> UserEntry:
    return UserEntry(name=p.pw_name, uid=p.pw_uid, gid=p.pw_gid, home=p.pw_dir)


def resolve(user: str, group: str | None, users: UserDatabase) -> RunAs:
    """The RunAs of `user` (a name or a number) and optional `group` (a name or a number)."""
    entry: UserEntry | None
    if user.isdigit():
        uid = int(user)
        entry = users.user_by_uid(uid)
    else:
        entry = users.user_by_name(user)
        if entry is None:
            raise IdentityError(f"user {user!r} does not exist")
        uid = entry.uid
    if group is not None:
        if group.isdigit():
            gid = int(group)
        else:
            found = users.gid_by_name(group)
            if found is None:
                raise IdentityError(f"group {group!r} does not exist")
            gid = found
    else:
        gid = entry.gid if entry is not None else uid
    if entry is None:
        return RunAs(uid=uid, gid=gid, groups=(gid,))
    # Like initgroups(3): the user's groups (its primary group among them), plus `gid`.
    groups = tuple(sorted({gid, *users.groups_of(entry)}))
    return RunAs(uid=uid, gid=gid, groups=groups, name=entry.name, home=entry.home)


def plan_identities(
    *,
    euid: int,
    agent_user: str | None,
    agent_group: str | None,
    runtime_user: str | None,
    runtime_group: str | None,
    users: UserDatabase,
) -> IdentityPlan:
    """Whom the agent and the runtime run as, given the supervisor's effective uid."""
    if euid != ROOT_UID:
        current = users.user_by_uid(euid)
        who = f"{current.name} (uid {euid})" if current else f"uid {euid}"
        notes = [
            f"not started as root: the agent and the runtime both run as {who}, "
            "without uid separation between them"
        ]
        configured = [u for u in (agent_user, runtime_user) if u is not None]
        if configured:
            ignored = ", ".join(configured)
            notes.append(f"configured users ignored (switching needs root): {ignored}")
        return IdentityPlan(
            agent=Identity(None, agent_user),
            runtime=Identity(None, runtime_user),
            notes=tuple(notes),
        )
    notes = []
    identities = []
    for role, user, group in (
        ("agent", agent_user, agent_group),
        ("runtime", runtime_user, runtime_group),
    ):
        run_as = resolve(user, group, users) if user is not None else None
        if run_as is None or run_as.uid == ROOT_UID:
            notes.append(f"the {role} runs as root: set its user to separate it")
        identities.append(Identity(run_as, user))
    agent, runtime = identities
    agent_uid = agent.run_as.uid if agent.run_as else ROOT_UID
    runtime_uid = runtime.run_as.uid if runtime.run_as else ROOT_UID
    if agent_uid == runtime_uid and agent_uid != ROOT_UID:
        notes.append(
            f"the agent and the runtime share uid {agent_uid}: the runtime can reach the "
            "agent's memory and host store"
        )
    return IdentityPlan(agent=agent, runtime=runtime, notes=tuple(notes))


def child_environment(base: dict[str, str], run_as: RunAs | None) -> dict[str, str]:
    """`base` with HOME, USER and LOGNAME of the user switched to (HOME `/` and no USER for
    a uid without a passwd entry: root's values must not follow it)."""
    env = dict(base)
    if run_as is not None:
        env["HOME"] = run_as.home or "/"
        if run_as.name:
            env["USER"] = env["LOGNAME"] = run_as.name
        else:
            env.pop("USER", None)
            env.pop("LOGNAME", None)
    return env
