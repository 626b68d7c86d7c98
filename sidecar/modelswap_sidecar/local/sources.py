"""Noticing that a served model's source folder changed, and deciding when to reload it.

    tree, truncated = folder_tree(folder)          # {relative path: (size, mtime_ns)}
    change = watch.observe(uid, folder, tree, now_seconds)   # a Change when one is due
    watch.taken(change, now_seconds)               # once the agent took the reload

A folder is looked at through its files' names, sizes and mtimes (stat calls only, never
their bytes), at most `MAX_FILES` files and `MAX_DEPTH` levels deep. Files no model is
made of are left out: hidden ones (`.x.swp`, `.git/`), `__pycache__/` and `*.pyc` (the
stub writes them when it imports model.py: counting them would reload a model after every
load), and editors' temporaries (`x~`, `*.swp`, `*.tmp`, `*.part`).

Files removed alone reload nothing: there is nothing new to load, and the model keeps
serving what it loaded (its host copy answers even with its weight files moved away); the
next file added or changed reloads it.

Debounced: an editor saves in several steps (write a temporary, rename it; or truncate,
then write), so a change is due once the folder has been quiet for `settle_seconds` —
or, for a folder that never goes quiet, `max_delay_seconds` after its first unreloaded
change — and a model is reloaded at most once per `min_interval_seconds`.

Which host copy a reload keeps: a change to code and configuration (`CODE_SUFFIXES`:
model.py, config.pbtxt, config.json, tokenizer files, ...) keeps it — the client binds it
again only when its layout fingerprint still matches; a change to any other file (the
weights: `*.safetensors`, `*.bin`, `weights.f32`, ...) drops it, since its bytes may
differ with the same layout. Pure apart from `folder_tree`'s stat calls.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

#: relative path -> (size in bytes, mtime in ns)
Tree = Mapping[str, tuple[int, int]]

MAX_FILES = 10_000
MAX_DEPTH = 8
#: Files a model's code and configuration are made of: a change to them alone keeps the
#: host copy (the client library rebinds it only if the layout fingerprint matches).
CODE_SUFFIXES = frozenset(
    {".py", ".pbtxt", ".json", ".yaml", ".yml", ".txt", ".md", ".toml", ".cfg", ".ini",
     ".jinja", ".tiktoken", ".vocab", ".merges"}
)  # fmt: skip
_IGNORED_DIRS = frozenset({"__pycache__"})
_IGNORED_SUFFIXES = (".pyc", "~", ".swp", ".swx", ".tmp", ".part")


def ignored(name: str) -> bool:
    """A file or folder name no model is made of (see the module's docstring)."""
    return name.startswith(".") or name in _IGNORED_DIRS or name.endswith(_IGNORED_SUFFIXES)


def folder_tree(
    folder: Path, *, max_files: int = MAX_FILES, max_depth: int = MAX_DEPTH
) -> tuple[dict[str, tuple[int, int]], bool]:
    """The folder's files (relative POSIX path -> (size, mtime_ns)), and whether the walk
    stopped at `max_files` or `max_depth`. A missing folder is empty. Symlinked files are
    followed (their target's size and mtime); symlinked folders are not entered."""
    tree: dict[str, tuple[int, int]] = {}
    truncated = False
    stack: list[tuple[Path, PurePosixPath, int]] = [(folder, PurePosixPath(), 0)]
    while stack:
        here, rel, depth = stack.pop()
        try:
            entries = sorted(os.scandir(here), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            if ignored(entry.name):
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 >= max_depth:
                        truncated = True
                    else:
                        stack.append((Path(entry.path), rel / entry.name, depth + 1))
                    continue
                info = entry.stat()  # follows a symlinked file to its target
            except OSError:
                continue  # gone between the listing and the stat: the next look sees it
            if len(tree) >= max_files:
                return tree, True
            tree[str(rel / entry.name)] = (info.st_size, info.st_mtime_ns)
    return tree, truncated


def changed_paths(old: Tree, new: Tree) -> tuple[str, ...]:
    """Paths added, removed or changed (size or mtime), sorted."""
    return tuple(sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p)))


def keeps_host_copy(paths: Iterable[str]) -> bool:
    """True when every changed path is code or configuration (`CODE_SUFFIXES`)."""
    return all(PurePosixPath(p).suffix.lower() in CODE_SUFFIXES for p in paths)


@dataclass(frozen=True)
class Change:
    """A reload that is due: the paths changed since the last reload (or the first look)."""

    uid: str
    paths: tuple[str, ...]
    keep_host_copy: bool
    #: The folder as it is now: the baseline once the reload is taken.
    tree: Tree

    def summary(self, at_most: int = 3) -> str:
        """`1/model.py changed`, `1/model.py, 1/weights.f32 and 2 more changed`."""
        shown = list(self.paths[:at_most])
        more = len(self.paths) - len(shown)
        if more:
            return f"{', '.join(shown)} and {more} more changed"
        if len(shown) > 1:
            return f"{', '.join(shown[:-1])} and {shown[-1]} changed"
        return f"{shown[0] if shown else 'the folder'} changed"


@dataclass
class _Watched:
    folder: Path
    baseline: Tree
    pending: Tree | None = None
    first_change_seconds: float = 0.0
    last_change_seconds: float = 0.0
    last_reload_seconds: float = -math.inf


class SourceWatch:
    """Per model: the folder as last loaded (its baseline) and a change waiting to settle."""

    def __init__(
        self,
        *,
        settle_seconds: float = 1.0,
        max_delay_seconds: float = 10.0,
        min_interval_seconds: float = 2.0,
    ) -> None:
        self.settle_seconds = settle_seconds
        self.max_delay_seconds = max_delay_seconds
        self.min_interval_seconds = min_interval_seconds
        self._watched: dict[str, _Watched] = {}

    def observe(self, uid: str, folder: Path, tree: Tree, now_seconds: float) -> Change | None:
        """Look at `uid`'s folder as it is now; the change to reload, when one is due.
        The first look at a model (or at a new folder of it) is its baseline: nothing is
        due for a folder that has not changed since."""
        w = self._watched.get(uid)
        if w is None or w.folder != folder:
            self._watched[uid] = _Watched(folder, dict(tree))
            return None
        if tree == w.baseline:  # changed and changed back (or reloaded already)
            w.pending = None
            return None
        if set(tree.items()) <= set(w.baseline.items()):
            # files removed, none added or changed: there is nothing new to load (and the
            # model may need what is gone: its weights moved away, it serves from its host
            # copy). The folder as it is becomes the baseline; the next file written
            # reloads the model.
            w.baseline, w.pending = dict(tree), None
            return None
        if tree != w.pending:
            if w.pending is None:
                w.first_change_seconds = now_seconds
            w.pending = dict(tree)
            w.last_change_seconds = now_seconds
        quiet = now_seconds - w.last_change_seconds >= self.settle_seconds
        overdue = now_seconds - w.first_change_seconds >= self.max_delay_seconds
        if not (quiet or overdue):
            return None
        if now_seconds - w.last_reload_seconds < self.min_interval_seconds:
            return None
        paths = changed_paths(w.baseline, tree)
        return Change(uid, paths, keeps_host_copy(paths), dict(tree))

    def taken(self, change: Change, now_seconds: float) -> None:
        """The agent took `change`'s reload (or answered for good): its folder as it was
        then is the new baseline."""
        w = self._watched.get(change.uid)
        if w is None:
            return
        w.baseline = change.tree
        w.pending = None
        w.last_reload_seconds = now_seconds

    def keep_only(self, uids: Iterable[str]) -> None:
        """Forget every model but `uids` (a model gone from the folder, or now a dev model)."""
        keep = set(uids)
        for uid in [u for u in self._watched if u not in keep]:
            del self._watched[uid]
