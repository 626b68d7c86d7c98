"""The request log: one record per request, written when its response starts (so a watch
appears while it streams), readable and clearable by tests."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestRecord:
    """One request as the authorizer saw it and how it was answered.

    `user` is "" when the emulator does not authenticate (and for 401s);
    `allowed` is the authorizer's decision (True when it does not authorize);
    `code` the HTTP status of the answer; `fault` names an injected failure (`faults`),
    "" for a request answered as the store says."""

    user: str
    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    allowed: bool
    code: int
    method: str
    path: str
    fault: str = ""

    @property
    def resource_with_subresource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


class RequestLog:
    def __init__(self, max_records: int = 100_000) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=max_records)

    def append(self, record: RequestRecord) -> None:
        self._records.append(record)

    def records(self) -> list[RequestRecord]:
        return list(self._records)

    def clear(self) -> None:
        self._records.clear()
