"""Local mode's operator: watches the YAML folder and pushes the desired set.

Every `poll_seconds` it compares the folder's YAML files (names, mtimes, sizes) with the
last look. On a change it reads them again (`manifests.read_folder`), reports files it
refuses (each problem once, naming its field), and `PUT /v1/desired`s the full set to the
agent's control API: term 1, the counter one higher each push. A push that fails (the
agent still starting, or restarting) is retried at the next poll; the set is also pushed
again every `resync_seconds`, as the operator re-pushes. A model whose file was removed is
left out of the next push and then forgotten (`DELETE /v1/models/{uid}`: unloaded, its
host bytes freed, no longer listed), as the operator deletes a removed ModelDeployment's
model; a DELETE that fails is sent again after the next push.

It runs in a thread beside the in-process supervisor; `stop()` ends it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from modelswap_sidecar.local.desired import Generations, desired_set
from modelswap_sidecar.local.manifests import LocalModel, Problem, read_folder, yaml_files

log = logging.getLogger(__name__)

Signature = tuple[tuple[str, int, int], ...]


def folder_signature(folder: Path) -> Signature:
    out = []
    for path in yaml_files(folder):
        try:
            info = path.stat()
        except OSError:
            continue
        out.append((path.name, info.st_mtime_ns, info.st_size))
    return tuple(out)


@dataclass
class Applied:
    """What the watcher last read and pushed (for the state file)."""

    models: list[LocalModel] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: uid -> wall seconds of the first push that carried it (the model's AGE).
    first_applied: dict[str, float] = field(default_factory=dict)
    #: uid -> the agent's answer (`applied Loading`, `conflict PolicyInvalid: ...`).
    outcomes: dict[str, str] = field(default_factory=dict)
    pushes: int = 0


class FolderWatcher:
    def __init__(
        self,
        folder: Path,
        defaults: Mapping[str, Any],
        *,
        control_url: str,
        token: str,
        node_name: str,
        poll_seconds: float = 1.0,
        resync_seconds: float = 30.0,
        on_change: Callable[[Applied], None] = lambda applied: None,
    ) -> None:
        self.folder = folder
        self.defaults = defaults
        self.control_url = control_url.rstrip("/")
        self.token = token
        self.node_name = node_name
        self.poll_seconds = poll_seconds
        self.resync_seconds = resync_seconds
        self.on_change = on_change
        self.applied = Applied()
        self._generations = Generations()
        self._counter = 0
        self._signature: Signature | None = None
        self._pending = True
        #: uids gone from the folder, to forget once a push without them is taken
        self._gone: set[str] = set()
        self._last_push = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifetime -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="local-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.is_set():
                try:
                    self.poll(client)
                except Exception:
                    log.exception("local mode: looking at %s failed", self.folder)
                self._stop.wait(self.poll_seconds)

    # -- one look -----------------------------------------------------------------------------

    def read(self) -> None:
        """Read the folder again; report problems that are new."""
        models, problems = read_folder(self.folder, self.defaults)
        models = self._keep_last_valid(models, problems)
        before = {str(p) for p in self.applied.problems}
        for problem in problems:
            if str(problem) not in before:
                log.warning("skipped %s", problem)
        for model in models:
            if model.uid not in {m.uid for m in self.applied.models}:
                log.info("serving %s/%s from %s", model.namespace, model.name, model.file.name)
        gone = {m.uid for m in self.applied.models} - {m.uid for m in models}
        for model in self.applied.models:
            if model.uid in gone:
                log.info("%s/%s is gone from the folder: unloading", model.namespace, model.name)
        self._gone = (self._gone | gone) - {m.uid for m in models}
        self.applied.models, self.applied.problems = models, problems
        self._pending = True

    def _keep_last_valid(
        self, models: list[LocalModel], problems: list[Problem]
    ) -> list[LocalModel]:
        """A served model whose file became invalid keeps its last valid spec, as the API
        server refuses a bad edit and keeps the object; a file removed removes it."""
        uids = {m.uid for m in models}
        refused = {p.file for p in problems}
        kept = [m for m in self.applied.models if m.uid not in uids and m.file in refused]
        for model in kept:
            log.warning(
                "%s/%s keeps its last valid spec until %s is fixed",
                model.namespace,
                model.name,
                model.file.name,
            )
        return [*models, *kept]

    def poll(self, client: httpx.Client) -> None:
        signature = folder_signature(self.folder)
        if signature != self._signature:
            self._signature = signature
            self.read()
            self.on_change(self.applied)
        due = time.monotonic() - self._last_push >= self.resync_seconds
        if (self._pending or due) and self.push(client):
            self._pending = False
            self.forget_gone(client)
            self.on_change(self.applied)

    def forget_gone(self, client: httpx.Client) -> None:
        """DELETE each model gone from the folder (the push just taken left it out)."""
        for uid in sorted(self._gone):
            try:
                response = client.delete(
                    f"{self.control_url}/v1/models/{uid}",
                    headers={"Authorization": f"Bearer {self.token}"},
                )
            except httpx.HTTPError as e:
                log.debug("cannot forget %s yet: %s", uid, e)
                continue
            if response.status_code in (200, 404):
                self._gone.discard(uid)
                self.applied.outcomes.pop(uid, None)
                self.applied.first_applied.pop(uid, None)
            else:
                log.warning("the agent refused to forget %s: %s", uid, response.text)

    def push(self, client: httpx.Client) -> bool:
        self._counter += 1
        body = desired_set(
            self.applied.models,
            self._generations,
            counter=self._counter,
            node_name=self.node_name,
        ).to_dict()
        try:
            response = client.put(
                f"{self.control_url}/v1/desired",
                json=body,
                headers={"Authorization": f"Bearer {self.token}"},
            )
        except httpx.HTTPError as e:
            log.debug("the agent's control API is not answering yet: %s", e)
            return False
        if response.status_code != 200:
            log.warning(
                "the agent refused the desired set: %s %s", response.status_code, response.text
            )
            return False
        self._last_push = time.monotonic()
        self.applied.pushes += 1
        self._note_results(response.json().get("results", []))
        return True

    def _note_results(self, results: Sequence[Mapping[str, Any]]) -> None:
        now = time.time()
        names = {m.uid: f"{m.namespace}/{m.name}" for m in self.applied.models}
        for result in results:
            uid = str(result.get("uid"))
            self.applied.first_applied.setdefault(uid, now)
            outcome = f"{result.get('outcome')} {result.get('reason')}"
            if result.get("message"):
                outcome += f": {result['message']}"
            if self.applied.outcomes.get(uid) != outcome and result.get("outcome") in (
                "conflict",
                "deferred",
                "stale",
            ):
                log.warning("agent: %s %s", names.get(uid, uid), outcome)
            self.applied.outcomes[uid] = outcome
