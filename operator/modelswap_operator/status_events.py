"""Whether a built status says anything new, and the Events its changes deserve: one for
each condition whose status or reason changed (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from modelswap_operator.status import CREDENTIALS_NOT_OPTED_IN, CREDENTIALS_UNAVAILABLE

#: Reasons worth a Warning Event even on a True condition: something a user must fix.
WARNING_REASONS = frozenset({CREDENTIALS_UNAVAILABLE, CREDENTIALS_NOT_OPTED_IN})
#: Reasons of a False condition that mean "on its way", worth a Normal Event, not a Warning.
PROGRESS_REASONS = frozenset(
    {
        "Loading",
        "Placed",
        "NotReported",
        "NotLoaded",
        "NotRouted",
        "NotPlaced",
        "Deleting",
        "Pending",
        "Dropped",
        "RollingOut",
    }
)


def status_changed(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether `new` says anything `old` does not (keys with None values are absent)."""
    return bool(_pruned(new) != _pruned(old or {}))


def _pruned(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _pruned(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_pruned(v) for v in value]
    return value


@dataclass(frozen=True)
class EventNote:
    type: str  # Normal | Warning
    reason: str
    message: str


def events_between(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[EventNote]:
    """An Event for each condition whose status or reason changed. A condition seen for the
    first time gets one only when it says something: placement, or a Warning."""
    before = {c.get("type"): c for c in (old or {}).get("conditions") or ()}
    notes = []
    for condition in new.get("conditions") or ():
        prior = before.get(condition["type"]) or {}
        if (prior.get("status"), prior.get("reason")) == (condition["status"], condition["reason"]):
            continue
        if condition["reason"] in WARNING_REASONS:
            kind = "Warning"
        elif condition["status"] == "True" or condition["reason"] in PROGRESS_REASONS:
            kind = "Normal"
        else:
            kind = "Warning"
        if not prior and kind == "Normal" and condition["type"] != "Placed":
            continue
        message = f"{condition['type']}={condition['status']}: {condition.get('message') or ''}"
        notes.append(EventNote(kind, condition["reason"], message.rstrip(": ")))
    return notes
