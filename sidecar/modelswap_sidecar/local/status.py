"""`modelswap status`: the columns of `kubectl get md` for local mode.

    NAME        MODEL       NODE   PHASE       RESIDENT   LAST-REQUEST   AGE
    chat-pinned chat        local  Resident    96Mi       4s             2m10s

`-o wide` adds, before LAST-REQUEST, kubectl's wide columns: HOST (bytes kept in host
memory), KV (the KV-cache bytes its conversations hold, GPU/host: `ModelInfo.kvGpuBytes`
and `kvHostBytes`, as `status.kv.shown` in the cluster), SWAP-INS and GPU. Sizes are
`quantities.format_bytes`, as the cluster's `...Size` fields.

The models and their state come from the agent (`GET /v1/models` on its control API,
found through the run directory's state file); AGE counts from the first push that
carried the model. Below the table: why each `Pending` or `Failed` model is so (the
agent's reason and message, as `kubectl describe md` shows them), each model's last
reload on change (`reloaded: toy 4s ago (1/model.py changed; host copy kept): completed
Reloading`, 3 times in all), how to attach as each dev model, then the files local mode
refused. Every cell and line is written through `terminal.printable`: the names and
messages come from the user's YAML and the agent, and a name holding escape codes shows
them escaped instead of acting on the terminal.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from modelswap_api.quantities import format_bytes, parse_bytes
from modelswap_api.terminal import printable

COLUMNS = ("NAME", "MODEL", "NODE", "PHASE", "RESIDENT", "LAST-REQUEST", "AGE")
#: `-o wide`: kubectl's wide columns, before LAST-REQUEST.
WIDE_COLUMNS = (*COLUMNS[:5], "HOST", "KV", "SWAP-INS", "GPU", *COLUMNS[5:])
NONE = "<none>"


def short_age(seconds: float | None) -> str:
    """kubectl's way: 45s, 3m12s, 2h5m, 3d4h."""
    if seconds is None:
        return NONE
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    minutes, s = divmod(s, 60)
    if minutes < 60:
        return f"{minutes}m{s}s" if s and minutes < 10 else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes and hours < 10 else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours and days < 10 else f"{days}d"


def short_bytes(value: int) -> str:
    for unit, shift in (("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if value >= 1 << shift and value % (1 << shift) == 0:
            return f"{value >> shift}{unit}"
    return str(value)


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp()


def rows(
    models: Sequence[Mapping[str, Any]],
    local: Sequence[Mapping[str, Any]],
    *,
    node_name: str,
    now_seconds: float,
    wide: bool = False,
) -> list[tuple[str, ...]]:
    """One row per model the agent reports, in name order; `local` adds what the agent does
    not know (the model's user-facing name, when it was first applied)."""
    by_uid = {str(m.get("uid")): m for m in local}
    namespaces = {str(m.get("namespace")) for m in models}
    out: list[tuple[str, ...]] = []
    for info in sorted(models, key=lambda m: (m.get("namespace", ""), m.get("name", ""))):
        mine = by_uid.get(str(info.get("uid")), {})
        name = str(info.get("name"))
        if len(namespaces) > 1:
            name = f"{info.get('namespace')}/{name}"
        last = parse_time(info.get("lastRequestTime"))
        applied = mine.get("appliedAt")
        row = (
            name,
            str(mine.get("model") or info.get("name")),
            node_name if info.get("desired", True) else NONE,
            str(info.get("phase", "")),
            short_bytes(int(info.get("residentBytes") or 0)),
            *(wide_cells(info) if wide else ()),
            short_age(now_seconds - last) if last is not None else NONE,
            short_age(now_seconds - float(applied)) if applied is not None else NONE,
        )
        out.append(tuple(printable(cell) for cell in row))
    return out


def wide_cells(info: Mapping[str, Any]) -> tuple[str, ...]:
    """HOST, KV (`<gpu>/<host>`), SWAP-INS and GPU of one model."""
    kv_gpu = format_bytes(int(info.get("kvGpuBytes") or 0))
    kv_host = format_bytes(int(info.get("kvHostBytes") or 0))
    return (
        format_bytes(int(info.get("hostBytes") or 0)),
        f"{kv_gpu}/{kv_host}",
        str(int(info.get("swapIns") or 0)),
        str(info.get("gpu") or NONE),
    )


#: Phases a user must be told the reason for: the model does not serve and will not by itself.
EXPLAINED_PHASES = frozenset({"Pending", "Failed"})


def explanations(models: Sequence[Mapping[str, Any]]) -> list[str]:
    """`name: Phase Reason: message` for each model in EXPLAINED_PHASES, in name order."""
    out = []
    for info in sorted(models, key=lambda m: (m.get("namespace", ""), m.get("name", ""))):
        phase = str(info.get("phase", ""))
        if phase not in EXPLAINED_PHASES:
            continue
        reason = info.get("reason") or "NoReason"
        message = info.get("message") or "the agent reported no reason"
        out.append(printable(f"{info.get('name')}: {phase} {reason}: {message}"))
    return out


def table(body: Sequence[tuple[str, ...]], *, wide: bool = False) -> str:
    columns = WIDE_COLUMNS if wide else COLUMNS
    lines = [columns, *body]
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def reload_lines(local: Sequence[Mapping[str, Any]], *, now_seconds: float) -> list[str]:
    """One line per model local mode reloaded because its source folder changed."""
    out = []
    for model in sorted(local, key=lambda m: (m.get("namespace", ""), m.get("name", ""))):
        note = model.get("reloads")
        if not isinstance(note, Mapping) or not note.get("count"):
            continue
        count = int(note["count"])
        times = f", {count} times in all" if count > 1 else ""
        out.append(
            printable(
                f"reloaded: {model.get('name')} "
                f"{short_age(now_seconds - float(note.get('at', 0)))} ago ({note.get('what')}; "
                f"host copy {note.get('hostCopy')}{times}): {note.get('outcome')}"
            )
        )
    return out


def dev_lines(local: Sequence[Mapping[str, Any]], *, socket_path: str) -> list[str]:
    """How a developer's process attaches as each dev model (the dev loop)."""
    dev = [m for m in local if m.get("dev")]
    if not dev:
        return []
    out = [printable(f"dev loop: export MODELSWAP_SOCKET={socket_path}")]
    for model in sorted(dev, key=lambda m: (m.get("namespace", ""), m.get("name", ""))):
        call = attach_call(str(model.get("engineName")), model.get("weightsBytes"))
        out.append(printable(f"dev: {model.get('name')}: {call}"))
    return out


def attach_call(engine_name: str, weights_bytes: Any) -> str:
    """The `modelswap_client.client.attach` call a dev model's process makes: its engine
    name, and one weights region of `spec.model.weightsBytes` (a quantity)."""
    try:
        size = str(parse_bytes(weights_bytes))
    except (TypeError, ValueError):
        size = "<weightsBytes>"
    return (
        f'attach({engine_name!r}, [RegionSpec("weights", {size})])  # weightsBytes: {weights_bytes}'
    )
