"""Local mode's operator: watches the YAML folder and pushes the desired set.

Every `poll_seconds` it compares the folder's YAML files (names, mtimes, sizes) with the
last look. On a change it reads them again (`manifests.read_folder`), reports files it
refuses (each problem once, naming its field), and `PUT /v1/desired`s the full set to the
agent's control API: term 1, the counter one higher each push. A push that fails (the
agent still starting, or restarting) is retried at the next poll; one the agent refuses as
a bad request (400, 413: the same body would be refused again) is logged and sent again at
the next change or resync; the set is also pushed again every `resync_seconds`, as the
operator re-pushes. At most `MAX_LOCAL_MODELS` models are pushed (`manifests.cap_models`:
files in name order; the files past the cap are refused by name).

A model whose file was removed is left out of the next push and then forgotten (`DELETE
/v1/models/{uid}`: unloaded, its host bytes freed, no longer listed), as the operator
deletes a removed ModelDeployment's model; a DELETE that fails is sent again after the
next push. Deletions are debounced: a model whose file vanished or holds no document any
more (an editor truncating it before writing it again) is kept, unchanged, for
`deletion_grace_seconds` (5 s); its file back within the grace changes nothing, and only
once the grace has passed is it left out and forgotten. A model taken out of a file that
still holds documents is removed at once.

Reload on change (`source_watch`): every look also stats each served model's source
folder (a mounted path; `sources.py` says what is looked at and when a change is due).
A change that has settled is sent to the agent as `POST /v1/models/{uid}/reload`, with
`hostCopy=keep` when only code or configuration changed and `hostCopy=drop` when a weight
file did; the agent unloads it from Triton and loads it again. Each reload is logged and
kept in `Applied.reloads` (the state file; `modelswap status` prints it). A reload the
agent cannot be reached for is sent again at the next look.

The dev loop (`dev_models_file`): models annotated `modelswap.io/dev: "true"` are allowed;
before each push their engine names are written to the file the agent's dev voucher
reads, and a model that became (or stopped being) a dev model is reloaded with its host
copy dropped once the push is taken. Dev models' sources are not watched: their process
is the developer's.

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
from modelswap_sidecar.local.manifests import (
    MAX_LOCAL_MODELS,
    LocalModel,
    Problem,
    cap_models,
    read_folder,
    yaml_files,
)
from modelswap_sidecar.local.rundir import write_json
from modelswap_sidecar.local.sources import Change, SourceWatch, folder_tree
from modelswap_sidecar.triton.naming import triton_model_name

log = logging.getLogger(__name__)

Signature = tuple[tuple[str, int, int], ...]
#: How long the agent may take to answer a reload (Triton's unload of the model included).
RELOAD_ANSWER_SECONDS = 120.0
#: How long a model whose file vanished or became empty is kept before it is removed: an
#: editor's save may truncate the file, or remove it and write it anew, for a moment.
DELETION_GRACE_SECONDS = 5.0
#: The agent's answers to a push that the same body would get again: not asked again until
#: the folder changes or the resync is due.
_REFUSED_PUSH_STATUSES = (400, 413)


def folder_signature(folder: Path) -> Signature:
    out = []
    for path in yaml_files(folder):
        try:
            info = path.stat()
        except OSError:
            continue
        out.append((path.name, info.st_mtime_ns, info.st_size))
    return tuple(out)


def source_folder(spec: Mapping[str, Any], model_root: Path, prefix: str) -> Path | None:
    """The folder a model's `spec.model.source` names on this machine (`<prefix>/<x>` ->
    `<model_root>/<x>`, as the agent maps it); None for an http(s) source (a fetched copy:
    not watched)."""
    uri = str(spec.get("model", {}).get("source", {}).get("uri", ""))
    if not uri.startswith("/"):
        return None
    stem = prefix.rstrip("/")
    if uri == stem or uri.startswith(stem + "/"):
        return model_root / uri[len(stem) :].lstrip("/")
    return Path(uri)


@dataclass
class ReloadNote:
    """A model's reloads on change (for the state file and `modelswap status`)."""

    count: int = 0
    #: wall seconds of the last one
    at: float = 0.0
    #: `1/model.py changed`
    what: str = ""
    #: "kept" or "dropped"
    host_copy: str = ""
    #: the agent's answer (`completed Reloading`, `refused ...`)
    outcome: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "at": self.at,
            "what": self.what,
            "hostCopy": self.host_copy,
            "outcome": self.outcome,
        }


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
    #: uid -> its reloads on change
    reloads: dict[str, ReloadNote] = field(default_factory=dict)


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
        model_root: Path | None = None,
        models_prefix: str = "/models",
        source_watch: SourceWatch | None = None,
        dev_models_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        deletion_grace_seconds: float = DELETION_GRACE_SECONDS,
        max_models: int = MAX_LOCAL_MODELS,
    ) -> None:
        """`source_watch` with `model_root`: reload on change (mounted sources under
        `models_prefix` are in `model_root`); `dev_models_file`: the dev loop is on."""
        self.folder = folder
        self.defaults = defaults
        self.control_url = control_url.rstrip("/")
        self.token = token
        self.node_name = node_name
        self.poll_seconds = poll_seconds
        self.resync_seconds = resync_seconds
        self.on_change = on_change
        self.model_root = model_root
        self.models_prefix = models_prefix
        self.source_watch = source_watch
        self.dev_models_file = dev_models_file
        self.clock = clock
        self.wall_clock = wall_clock
        self.deletion_grace_seconds = deletion_grace_seconds
        self.max_models = max_models
        #: uid -> `clock()` when its file was first seen vanished or empty (kept meanwhile)
        self._vanishing: dict[str, float] = {}
        self.applied = Applied()
        #: uids that became, or stopped being, dev models: reloaded afresh after the push
        self._flipped: set[str] = set()
        #: folders whose walk was cut short, warned about once
        self._truncated: set[Path] = set()
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
        models, problems = read_folder(
            self.folder, self.defaults, dev_loop=self.dev_models_file is not None, max_models=None
        )
        read_files = {m.file for m in models} | {p.file for p in problems}
        models = self._keep_last_valid(models, problems)
        models = self._keep_vanishing(models, read_files)
        # capped last: the models kept above count too
        models, over = cap_models(models, self.max_models)
        problems = [*problems, *over]
        before_dev = {m.uid: m.dev for m in self.applied.models}
        for model in models:
            was_dev = before_dev.get(model.uid)
            if was_dev is not None and was_dev != model.dev:
                now = "a dev model" if model.dev else "a Triton model"
                log.info("%s/%s is now %s: loading it afresh", model.namespace, model.name, now)
                self._flipped.add(model.uid)
        before = {str(p) for p in self.applied.problems}
        for problem in problems:
            if str(problem) not in before:
                log.warning("skipped %s", problem)
        for model in models:
            if model.uid not in {m.uid for m in self.applied.models}:
                log.info("serving %s/%s from %s", model.namespace, model.name, model.file.name)
                if model.dev:
                    log.info(
                        "dev model %s/%s: attach from your own process as model %r "
                        "(MODELSWAP_SOCKET: the agent's socket; `modelswap status` shows it)",
                        model.namespace,
                        model.name,
                        triton_model_name(model.uid),
                    )
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

    def _keep_vanishing(self, models: list[LocalModel], read_files: set[Path]) -> list[LocalModel]:
        """A served model whose file vanished or holds no document (`read_files`: the files
        that gave a model or a problem) is kept for `deletion_grace_seconds` from when that
        was first seen; a file back within the grace finds it unchanged."""
        now = self.clock()
        uids = {m.uid for m in models}
        kept: list[LocalModel] = []
        vanishing: dict[str, float] = {}
        for model in self.applied.models:
            if model.uid in uids or model.file in read_files:
                continue  # still served, or taken out of a file that holds documents
            since = self._vanishing.get(model.uid)
            if since is None:
                since = now
                log.info(
                    "%s is gone or empty: keeping %s/%s for %g s in case it is being written again",
                    model.file.name,
                    model.namespace,
                    model.name,
                    self.deletion_grace_seconds,
                )
            if now - since < self.deletion_grace_seconds:
                kept.append(model)
                vanishing[model.uid] = since
        self._vanishing = vanishing
        return [*models, *kept]

    def _grace_passed(self) -> bool:
        """A model kept while its file is gone or empty is due to be removed."""
        now = self.clock()
        return any(now - since >= self.deletion_grace_seconds for since in self._vanishing.values())

    def poll(self, client: httpx.Client) -> None:
        signature = folder_signature(self.folder)
        if signature != self._signature or self._grace_passed():
            self._signature = signature
            self.read()
            self.on_change(self.applied)
        due = time.monotonic() - self._last_push >= self.resync_seconds
        if (self._pending or due) and self.push(client):
            self._pending = False
            self.forget_gone(client)
            self.reload_flipped(client)
            self.on_change(self.applied)
        if self.source_watch is not None and self.model_root is not None:
            self.check_sources(client)

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

    # -- reload on change -----------------------------------------------------------------------

    def check_sources(self, client: httpx.Client) -> None:
        """Look at each served model's source folder; reload those whose change is due."""
        watch, root = self.source_watch, self.model_root
        assert watch is not None and root is not None
        watched = []
        for model in self.applied.models:
            folder = None if model.dev else source_folder(model.spec, root, self.models_prefix)
            if folder is None or model.uid not in self.applied.outcomes:
                continue  # a dev model, a fetched source, or not taken by the agent yet
            watched.append(model.uid)
            tree, truncated = folder_tree(folder)
            if truncated and folder not in self._truncated:
                self._truncated.add(folder)
                log.warning(
                    "%s/%s: %s holds more files than local mode looks at; a change past "
                    "them is not noticed",
                    model.namespace,
                    model.name,
                    folder,
                )
            change = watch.observe(model.uid, folder, tree, self.clock())
            if change is not None and self.reload(client, model, change):
                watch.taken(change, self.clock())
                self.on_change(self.applied)
        watch.keep_only(watched)

    def reload(self, client: httpx.Client, model: LocalModel, change: Change) -> bool:
        """Ask the agent to reload `model`; False when it cannot be reached (asked again at
        the next look). A refusal is logged and recorded, and not asked again."""
        kept = "kept" if change.keep_host_copy else "dropped"
        why = change.summary()
        log.info(
            "%s/%s: %s: reloading it (host copy %s%s)",
            model.namespace,
            model.name,
            why,
            kept,
            ": the client binds it only if its layout fingerprint matches"
            if change.keep_host_copy
            else ": a weight file changed",
        )
        outcome = self._post_reload(client, model.uid, keep_host_copy=change.keep_host_copy)
        if outcome is None:
            return False
        note = self.applied.reloads.setdefault(model.uid, ReloadNote())
        note.count += 1
        note.at, note.what, note.host_copy, note.outcome = self.wall_clock(), why, kept, outcome
        if not outcome.startswith(("completed", "unchanged")):
            log.warning(
                "%s/%s: the agent did not reload it: %s", model.namespace, model.name, outcome
            )
        return True

    def reload_flipped(self, client: httpx.Client) -> None:
        """Load afresh each model that became, or stopped being, a dev model."""
        for uid in sorted(self._flipped):
            if self._post_reload(client, uid, keep_host_copy=False) is not None:
                self._flipped.discard(uid)

    def _post_reload(self, client: httpx.Client, uid: str, *, keep_host_copy: bool) -> str | None:
        """`POST /v1/models/{uid}/reload`: the agent's answer (`completed Reloading`), or
        None when it cannot be reached."""
        try:
            response = client.post(
                f"{self.control_url}/v1/models/{uid}/reload",
                params={"hostCopy": "keep" if keep_host_copy else "drop"},
                headers={"Authorization": f"Bearer {self.token}"},
                # the agent answers once the model is out of Triton (its stub's finalize):
                # a shorter wait would ask again while the first reload still runs
                timeout=RELOAD_ANSWER_SECONDS,
            )
        except httpx.HTTPError as e:
            log.debug("cannot reload %s yet: %s", uid, e)
            return None
        try:
            body = response.json()
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        if response.status_code == 404:
            return "unchanged NotHeld"
        if response.status_code == 503:  # the agent is starting (no token yet): ask again
            return None
        if response.status_code not in (200, 409):  # 400, 401, 403: asking again won't help
            body = {
                **body,
                "outcome": "refused",
                "reason": body.get("reason", response.status_code),
            }
        outcome = f"{body.get('outcome', 'refused')} {body.get('reason', '')}".strip()
        if body.get("message"):
            outcome += f": {body['message']}"
        return outcome

    def write_dev_models(self) -> None:
        """The dev models' engine names, for the agent's dev voucher (before each push)."""
        if self.dev_models_file is None:
            return
        names = sorted(triton_model_name(m.uid) for m in self.applied.models if m.dev)
        write_json(self.dev_models_file, {"models": names})

    def push(self, client: httpx.Client) -> bool:
        self.write_dev_models()
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
                "the agent refused the desired set: %s %s",
                response.status_code,
                response.text[:2000],
            )
            if response.status_code in _REFUSED_PUSH_STATUSES:
                # the same body would be refused again: wait for a change or the resync
                self._pending = False
                self._last_push = time.monotonic()
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
